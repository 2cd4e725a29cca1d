package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// The sandboxes of a tenant: its runs', live or kept for finished runs,
// and those it made through the API (apisandbox.go). Files are read and
// written, and terminals and commands run, as the sandbox's account (the
// run's run_as, the manifest's) or a user its manifest declares, never as
// root, and paths are workspace-relative.

// errNoSandbox: the id names no live sandbox of the tenant (not found, as
// another tenant's: the message says sandbox, not the run store's "run
// not found").
var errNoSandbox = withKind(errkind.ErrNotFound, errors.New("sandbox not found"))

// manifestErr says an error is the request manifest's, once: the
// operator's policy may name the manifest already.
func manifestErr(err error) error {
	if strings.HasPrefix(err.Error(), "manifest") {
		return err
	}
	return fmt.Errorf("manifest: %w", err)
}

// sandbox returns the live session of a tenant's run's sandbox (open
// finds API sandboxes too). Another tenant's sandbox and a deleted sandbox
// answer not found; a malformed id invalid argument.
func (m *Manager) sandbox(ctx context.Context, tenant, id string) (*compute.Session, error) {
	if err := checkSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	runID := runIDOf(id)
	if runID == "" {
		return nil, errNoSandbox
	}
	rec, err := m.cfg.Store.GetRun(ctx, tenant, runID)
	if err != nil {
		return nil, errNoSandbox
	}
	if rec.SandboxID != id || rec.SandboxGone {
		return nil, errNoSandbox
	}
	m.mu.Lock()
	h := m.sessions[runID]
	lr := m.runs[runID]
	_, kept := m.retained[runID]
	m.mu.Unlock()
	switch {
	case h != nil:
		return h.sess, nil
	case lr != nil:
		// An active run recovered from an earlier manager: reattach.
		return m.acquireSession(ctx, tenant, rec, lr.spec)
	case kept:
		// Kept for a finished run by an earlier manager: reattach (its
		// deadline stands).
		return m.acquireSession(ctx, tenant, rec, nil)
	}
	// A finished run whose sandbox this manager does not hold.
	return nil, errNoSandbox
}

func fileType(t compute.FileType) FileType {
	switch t {
	case compute.FileRegular:
		return FileRegular
	case compute.FileDirectory:
		return FileDirectory
	case compute.FileSymlink:
		return FileSymlink
	}
	return FileOther
}

// ListDir lists a directory of a tenant's sandbox ("" is the workspace
// root), sorted by name, up to about 10,000 entries.
func (m *Manager) ListDir(ctx context.Context, tenant, sandboxID, path string) ([]FileEntry, error) {
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
	p, err := cleanPath(path)
	if err != nil {
		return nil, err
	}
	var out []FileEntry
	token := ""
	for {
		resp, err := sess.ListDir(ctx, p, compute.ListDirOptions{User: sess.Manifest().RunAs, PageToken: token})
		if err != nil {
			return nil, err
		}
		for _, e := range resp.Entries {
			rel := e.Name
			if p != "." {
				rel = strings.TrimSuffix(p, "/") + "/" + e.Name
			}
			out = append(out, FileEntry{Name: e.Name, Path: rel, Type: fileType(e.Type),
				Size: e.Size, Mode: e.Mode, Modified: e.ModifiedAt})
		}
		if token = resp.NextPageToken; token == "" || len(out) > 10000 {
			break
		}
	}
	slices.SortFunc(out, func(x, y FileEntry) int { return strings.Compare(x.Name, y.Name) })
	return out, nil
}

// ReadFile writes limit bytes (0: all) of a tenant's sandbox file from
// offset to w.
func (m *Manager) ReadFile(ctx context.Context, tenant, sandboxID, path string, offset, limit int64, w io.Writer) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return err
	}
	defer done()
	p, err := cleanPath(path)
	if err != nil {
		return err
	}
	if offset < 0 || limit < 0 {
		return badField("offset, limit", "must not be negative")
	}
	_, err = sess.ReadFile(ctx, p, compute.ReadFileOptions{Offset: offset, Limit: limit, User: sess.Manifest().RunAs}, w)
	return err
}

// Download writes a tenant's sandbox file, a regular file, to the writer
// start returns once the file is found (start is given its size first,
// and not called when there is no such file). An error after start
// returned means the bytes written are short.
func (m *Manager) Download(ctx context.Context, tenant, sandboxID, path string, start func(FileInfo) io.Writer) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return err
	}
	defer done()
	p, err := cleanPath(path)
	if err != nil {
		return err
	}
	info, err := sess.Stat(ctx, p, compute.StatOptions{User: sess.Manifest().RunAs})
	if err != nil {
		return err
	}
	if info.Type != compute.FileRegular {
		return badField("path", "%s is not a regular file", p)
	}
	w := start(FileInfo{Path: p, Size: info.Size})
	_, err = sess.ReadFile(ctx, p, compute.ReadFileOptions{User: sess.Manifest().RunAs}, w)
	return err
}

// Terminal is a terminal about to start in a sandbox (OpenTerminal).
type Terminal struct {
	m         *Manager
	sess      *compute.Session
	sandboxID string
	start     TerminalOptions
}

// OpenTerminal checks a terminal's options and finds its sandbox, before
// anything is exchanged with the client (a transport answers its errors
// in its own way, an HTTP status say); Run starts it.
func (m *Manager) OpenTerminal(ctx context.Context, tenant, sandboxID string, o TerminalOptions) (*Terminal, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := checkTerminal(sandboxID, o); err != nil {
		return nil, err
	}
	o.Command = slices.Clone(o.Command)
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	done()
	return &Terminal{m: m, sess: sess, sandboxID: sandboxID, start: o}, nil
}

// Run runs the terminal's PTY process in the sandbox and pumps bytes both
// ways until the process exits (nil, once Exited was sent), the client
// leaves (the process is then killed), ctx is done or the manager shuts
// down. Neither of its goroutines touches tio after it returns, except a
// Recv blocked when the manager shut down, which returns when the
// transport ends the client's stream.
func (t *Terminal) Run(ctx context.Context, tio TerminalIO) error {
	m := t.m
	if !m.tasks.enter() {
		return errShutDown
	}
	defer m.tasks.leave()
	defer m.busyBox(t.sandboxID)()
	ctx, stop := m.bound(ctx)
	defer stop()
	return m.runTerminal(ctx, t.sess, t.start, tio)
}

// runTerminal runs a PTY process in the sandbox and pumps bytes both ways
// until the process exits or the client leaves (the process is then
// killed).
func (m *Manager) runTerminal(ctx context.Context, sess *compute.Session, start TerminalOptions, tio TerminalIO) error {
	spec := compute.ProcessSpec{Tty: true, User: sess.Manifest().RunAs,
		Size: compute.TerminalSize{Cols: max(start.Cols, 20), Rows: max(start.Rows, 5)},
		Env:  map[string]string{"TERM": "xterm-256color"}}
	if len(start.Command) > 0 {
		spec.Argv = start.Command
	} else {
		spec.Command, spec.Login = "exec ${SHELL:-/bin/sh}", true
	}
	agent := sess.Agent()
	resp, err := agent.Start(ctx, spec, compute.StartOptions{RequestID: newID("term-")})
	if err != nil {
		return fmt.Errorf("start terminal: %w", err)
	}
	pid := resp.Process.ProcessID
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sendMu sync.Mutex
	inDone := make(chan error, 1)
	input := func() {
		var offset int64
		for {
			data, rs, err := tio.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				inDone <- err
				return
			}
			if rs != nil {
				if err := checkTerminalSize(*rs); err != nil {
					inDone <- err
					return
				}
				if err := agent.Resize(ctx, pid, compute.TerminalSize{Rows: rs.Rows, Cols: rs.Cols}); err != nil {
					inDone <- err
					return
				}
			}
			if len(data) > 0 {
				next, err := agent.WriteStdin(ctx, pid, offset, data)
				if err != nil {
					inDone <- err
					return
				}
				offset = next
			}
		}
	}
	outDone := make(chan error, 1)
	output := func() {
		exit, err := agent.Follow(ctx, pid, compute.FollowOptions{}, func(m *compute.Output) error {
			sendMu.Lock()
			defer sendMu.Unlock()
			for _, c := range m.Chunks {
				if err := tio.Output(slices.Clone(c.Data)); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil && exit != nil {
			sendMu.Lock()
			err = tio.Exited(TerminalExit{ExitCode: int32(exit.ExitCode), Signal: exit.Signal})
			sendMu.Unlock()
		}
		outDone <- err
	}
	kill := func() {
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer kcancel()
		_ = agent.Signal(kctx, pid, "SIGKILL")
	}
	// The pumps are the manager's goroutines (this call is tracked, so
	// the group is open while it runs).
	if !m.tasks.goTracked(input) {
		kill()
		return errShutDown
	}
	if !m.tasks.goTracked(output) {
		outDone <- errShutDown
	}
	// Neither goroutine may touch the stream after this returns.
	select {
	case err = <-outDone:
		// The process exited (or the manager stops): stop reading (a
		// WebSocket read can be ended) or give a gRPC client time to
		// close its side.
		if err != nil {
			kill()
		}
		cancel()
		if tio.StopInput != nil {
			tio.StopInput()
		}
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-inDone:
		case <-t.C:
		case <-m.stopped:
			// Shutting down: the transport ends the client's stream
			// when this returns, and the blocked Recv with it.
		}
	case err = <-inDone:
		// The client left (or failed): end the process.
		kill()
		cancel()
		<-outDone
	}
	return err
}
