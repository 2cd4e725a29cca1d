package manager

import (
	"context"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// Commands and processes in a tenant's sandbox (an API sandbox or a
// run's). Each runs as the sandbox's account or a user its manifest
// declares (resolveUser), in the workspace, with a clean environment and
// a timeout bounded by the policy.

// processSpec checks c against the policy and sess's manifest and returns
// what the sandbox runs.
func (m *Manager) processSpec(sess *compute.Session, c CommandSpec) (compute.ProcessSpec, error) {
	pol := m.api.policy
	timeout, err := bounded("timeout", c.Timeout, pol.DefaultCommandTimeout, 0, pol.MaxCommandTimeout)
	if err != nil {
		return compute.ProcessSpec{}, err
	}
	user, err := resolveUser(sess.Manifest(), c.User)
	if err != nil {
		return compute.ProcessSpec{}, err
	}
	return compute.ProcessSpec{Argv: slices.Clone(c.Argv), Command: c.Command, Cwd: c.Cwd, User: user,
		Env: cloneEnv(c.Env), Stdin: c.KeepStdin, Timeout: timeout}, nil
}

func cloneEnv(env map[string]string) map[string]string {
	if len(env) == 0 {
		return nil
	}
	out := make(map[string]string, len(env))
	for k, v := range env {
		out[k] = v
	}
	return out
}

// command opens a tenant's sandbox for a command and checks it: the
// session, what it runs, and the func that ends the sandbox's use.
func (m *Manager) command(ctx context.Context, tenant, sandboxID string, c CommandSpec) (*compute.Session, compute.ProcessSpec, func(), error) {
	if err := checkCommand(c); err != nil {
		return nil, compute.ProcessSpec{}, nil, err
	}
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, compute.ProcessSpec{}, nil, err
	}
	spec, err := m.processSpec(sess, c)
	if err != nil {
		done()
		return nil, compute.ProcessSpec{}, nil, err
	}
	return sess, spec, done, nil
}

func exitOf(e *compute.ExitStatus, dropped int64) *ProcessExit {
	if e == nil {
		return nil
	}
	return &ProcessExit{ExitCode: e.ExitCode, Signal: e.Signal, TimedOut: e.TimedOut, Dropped: dropped, At: e.ExitedAt}
}

func streamOf(s compute.OutputStream) OutputStream {
	if s == compute.StreamStderr {
		return Stderr
	}
	return Stdout // stdout, and a terminal's
}

func chunksOf(cs []compute.OutputChunk) []OutputChunk {
	out := make([]OutputChunk, 0, len(cs))
	for _, c := range cs {
		out = append(out, OutputChunk{Stream: streamOf(c.Stream), Data: slices.Clone(c.Data)})
	}
	return out
}

// capped keeps the first max bytes written to it and counts the rest.
type capped struct {
	buf     []byte
	max     int64
	dropped int64
}

func (c *capped) write(p []byte) {
	room := c.max - int64(len(c.buf))
	if room <= 0 {
		c.dropped += int64(len(p))
		return
	}
	if int64(len(p)) > room {
		c.dropped += int64(len(p)) - room
		p = p[:room]
	}
	c.buf = append(c.buf, p...)
}

// bytes is what was kept: when bytes were dropped past the cap and the
// cut split a UTF-8 character of otherwise valid text, the character's
// start is dropped too, so text stays text.
func (c *capped) bytes() []byte {
	if c.dropped == 0 || utf8.Valid(c.buf) {
		return c.buf
	}
	for cut := 1; cut < utf8.UTFMax && cut <= len(c.buf); cut++ {
		if head := c.buf[:len(c.buf)-cut]; utf8.Valid(head) && utf8.RuneStart(c.buf[len(c.buf)-cut]) {
			c.dropped += int64(cut)
			return head
		}
	}
	return c.buf
}

// RunCommand runs a command in a tenant's sandbox to completion and
// returns its output, each stream up to the policy's MaxOutputBytes (the
// rest is counted in Dropped), and how it ended.
func (m *Manager) RunCommand(ctx context.Context, tenant, sandboxID string, c CommandSpec) (*CommandResult, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	ctx, cancel := m.bound(ctx)
	defer cancel()
	c.KeepStdin = false
	sess, spec, done, err := m.command(ctx, tenant, sandboxID, c)
	if err != nil {
		return nil, err
	}
	defer done()
	limit := m.api.policy.MaxOutputBytes
	stdout, stderr := &capped{max: limit}, &capped{max: limit}
	res, err := sess.Exec(ctx, spec, compute.ExecOptions{Stdin: c.Stdin, RequestID: newID("api-")}, func(ev *compute.ExecEvent) error {
		for _, ch := range ev.Chunks {
			if ch.Stream == compute.StreamStderr {
				stderr.write(ch.Data)
			} else {
				stdout.write(ch.Data)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := &CommandResult{Stdout: stdout.bytes(), Stderr: stderr.bytes(), Exit: *exitOf(&res.Exit, res.Dropped)}
	out.Dropped = stdout.dropped + stderr.dropped + out.Exit.Dropped
	return out, nil
}

// Exec runs a command in a tenant's sandbox and sends its events to send
// as they come: the start, output, the exit (the last). The process is
// killed when ctx ends or send fails. send is called from the calling
// goroutine, and its Output data is the caller's.
func (m *Manager) Exec(ctx context.Context, tenant, sandboxID string, c CommandSpec, send func(ExecEvent) error) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	ctx, cancel := m.bound(ctx)
	defer cancel()
	c.KeepStdin = false
	sess, spec, done, err := m.command(ctx, tenant, sandboxID, c)
	if err != nil {
		return err
	}
	defer done()
	var lost int64
	_, err = sess.Exec(ctx, spec, compute.ExecOptions{Stdin: c.Stdin, RequestID: newID("api-")}, func(ev *compute.ExecEvent) error {
		lost += ev.DroppedBytes
		out := ExecEvent{}
		if ev.Started != nil {
			out.ProcessID = ev.Started.ProcessID
		}
		if len(ev.Chunks) > 0 {
			out.Output = chunksOf(ev.Chunks)
		}
		out.Exit = exitOf(ev.Exit, lost)
		if out.ProcessID == "" && out.Output == nil && out.Exit == nil {
			return nil
		}
		return send(out)
	})
	return err
}

// processOf is a process as a tenant sees it.
func processOf(p compute.ProcessInfo) Process {
	out := Process{ID: p.ProcessID, Argv: slices.Clone(p.Argv), Cwd: p.Cwd, User: p.User,
		Running: p.State == compute.ProcessRunning, Started: p.StartedAt}
	if p.Exit != nil {
		out.Exit = exitOf(p.Exit, 0)
	}
	return out
}

// StartProcess starts a command in a tenant's sandbox and returns at
// once (c.KeepStdin keeps a stdin pipe for WriteStdin; c.Stdin is not
// used).
func (m *Manager) StartProcess(ctx context.Context, tenant, sandboxID string, c CommandSpec) (*Process, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	ctx, cancel := m.bound(ctx)
	defer cancel()
	c.Stdin = nil
	sess, spec, done, err := m.command(ctx, tenant, sandboxID, c)
	if err != nil {
		return nil, err
	}
	defer done()
	res, err := sess.StartProcess(ctx, spec, compute.StartOptions{RequestID: newID("api-")})
	if err != nil {
		return nil, err
	}
	p := processOf(res.Process)
	return &p, nil
}

// ReadProcessOutput reads a process's output from cursor, waiting up to
// wait (at most 30s) for some.
func (m *Manager) ReadProcessOutput(ctx context.Context, tenant, sandboxID, processID string, cursor int64, wait time.Duration) (*ProcessOutput, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := checkProcessID(processID); err != nil {
		return nil, err
	}
	if cursor < 0 {
		return nil, badField("cursor", "must not be negative")
	}
	if wait < 0 || wait > maxOutputWait {
		return nil, badField("wait", "%s: between 0 and %s", wait, maxOutputWait)
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	defer done()
	o, err := sess.ReadOutput(ctx, processID, compute.ReadOutputOptions{Cursor: cursor, YieldTime: wait,
		MaxBytes: int(min(m.api.policy.MaxOutputBytes, 4<<20))})
	if err != nil {
		return nil, err
	}
	return &ProcessOutput{Output: chunksOf(o.Chunks), NextCursor: o.NextCursor, Dropped: o.DroppedBytes,
		Exit: exitOf(o.Exit, 0)}, nil
}

// WriteStdin writes data to a process's stdin at offset (the stdin offset
// of data's first byte: a resent write is not applied twice), closes it
// after when closeAfter, and returns the offset after data.
func (m *Manager) WriteStdin(ctx context.Context, tenant, sandboxID, processID string, offset int64, data []byte, closeAfter bool) (int64, error) {
	if err := m.enter(tenant); err != nil {
		return 0, err
	}
	defer m.leave()
	if err := checkProcessID(processID); err != nil {
		return 0, err
	}
	if offset < 0 {
		return 0, badField("offset", "must not be negative")
	}
	if len(data) > maxStdinBytes {
		return 0, badField("data", "%d bytes; the limit is %d", len(data), maxStdinBytes)
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return 0, err
	}
	defer done()
	next := offset
	if len(data) > 0 {
		if next, err = sess.WriteStdin(ctx, processID, offset, data); err != nil {
			return 0, err
		}
	}
	if closeAfter {
		if err := sess.CloseStdin(ctx, processID); err != nil {
			return 0, err
		}
	}
	return next, nil
}

// SignalProcess sends a signal (SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT,
// SIGUSR1, SIGUSR2, SIGSTOP, SIGCONT; the SIG prefix may be left out) to
// a process's whole process group.
func (m *Manager) SignalProcess(ctx context.Context, tenant, sandboxID, processID, signal string) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	if err := checkProcessID(processID); err != nil {
		return err
	}
	sig, err := checkSignal(signal)
	if err != nil {
		return err
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return err
	}
	defer done()
	return sess.Signal(ctx, processID, sig)
}

// ListProcesses lists a tenant's sandbox's processes: running, or exited
// and not reaped yet.
func (m *Manager) ListProcesses(ctx context.Context, tenant, sandboxID string) ([]Process, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	defer done()
	ps, err := sess.ListProcesses(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, processOf(p))
	}
	return out, nil
}
