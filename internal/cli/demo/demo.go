// Package demo drives a local sandbox through every part of the agentd API
// and prints what happens, step by step and with no model: `harness demo`
// (`make demo`). Running an agent on a task is `harness run` (`make run`).
package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Config configures the demo.
type Config struct {
	AgentdPath string
	Verbose    bool
}

// Run starts a local sandbox, runs the tour, and always stops the sandbox.
func Run(ctx context.Context, cfg Config, out io.Writer, log *zap.Logger) (err error) {
	opts := local.Options{AgentdPath: cfg.AgentdPath}
	if cfg.Verbose {
		opts.Stderr = os.Stderr
	}
	sb, err := local.Start(ctx, opts, log)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if cerr := sb.Close(cctx); cerr != nil && err == nil {
			err = fmt.Errorf("stop sandbox: %w", cerr)
		}
	}()
	t := &tour{c: sb.Client, out: out}
	for _, step := range []struct {
		title string
		run   func(context.Context) error
	}{
		{"daemon", t.info},
		{"exec", t.exec},
		{"streaming a long command, reattaching from a cursor", t.stream},
		{"interactive terminal", t.pty},
		{"files", t.files},
		{"apply_patch (all-or-nothing)", t.patch},
		{"the workspace boundary", t.boundary},
		{"process-group kill", t.kill},
	} {
		fmt.Fprintf(out, "\n== %s\n", step.title)
		if err := step.run(ctx); err != nil {
			return fmt.Errorf("%s: %w", step.title, err)
		}
	}
	fmt.Fprintln(out, "\nall steps passed; stopping the sandbox")
	return nil
}

type tour struct {
	c   *agentclient.Client
	out io.Writer
}

func (t *tour) printf(format string, args ...any) { fmt.Fprintf(t.out, format, args...) }

func (t *tour) info(ctx context.Context) error {
	info, err := t.c.Info(ctx)
	if err != nil {
		return err
	}
	t.printf("sandbox-agentd %s, workspace %s, pid %d, root=%v\nfeatures: %s\n",
		info.Version, info.WorkspaceRoot, info.PID, info.RunningAsRoot, strings.Join(info.Features, " "))
	return nil
}

func (t *tour) exec(ctx context.Context) error {
	res, err := t.c.Exec(ctx, agentclient.ProcessSpec{
		Command: `echo "hello from $(id -un) in $PWD"; echo "env has $(env | wc -l) variables"; echo oops >&2; exit 3`,
	}, agentclient.ExecOptions{}, nil)
	if err != nil {
		return err
	}
	t.printf("stdout: %sstderr: %sexit code: %d\n", res.Stdout, res.Stderr, res.Exit.ExitCode)
	if res.Exit.ExitCode != 3 {
		return fmt.Errorf("want exit code 3, got %d", res.Exit.ExitCode)
	}
	return nil
}

func (t *tour) stream(ctx context.Context) error {
	st, err := t.c.Start(ctx, agentclient.ProcessSpec{Command: `for i in 1 2 3 4 5; do echo "tick $i"; sleep 0.1; done`}, agentclient.StartOptions{})
	if err != nil {
		return err
	}
	id := st.Process.ProcessID
	// Read part of it, then "reconnect" from the cursor we got.
	first, err := t.c.ReadOutput(ctx, id, agentclient.ReadOutputOptions{YieldTime: 250 * time.Millisecond})
	if err != nil {
		return err
	}
	t.printf("first read (%d bytes, cursor %d):\n%s", first.NextCursor, first.NextCursor, joinChunks(first.Chunks))
	exit, err := t.c.Follow(ctx, id, agentclient.FollowOptions{Cursor: first.NextCursor}, func(m *agentclient.Output) error {
		t.printf("%s", joinChunks(m.Chunks))
		return nil
	})
	if err != nil {
		return err
	}
	t.printf("exited with %d\n", exit.ExitCode)
	return nil
}

func (t *tour) pty(ctx context.Context) error {
	st, err := t.c.Start(ctx, agentclient.ProcessSpec{
		Argv: []string{"/bin/sh", "-i"},
		Tty:  true,
		Size: agentclient.TerminalSize{Rows: 24, Cols: 80},
		Env:  map[string]string{"PS1": "$ "},
	}, agentclient.StartOptions{})
	if err != nil {
		return err
	}
	id := st.Process.ProcessID
	var offset int64
	for _, line := range []string{"stty size\n", "echo $((6 * 7))\n", "sleep 30\n", "\x03", "exit\n"} {
		w, err := t.c.WriteStdin(ctx, id, offset, []byte(line))
		if err != nil {
			return err
		}
		offset = w
		time.Sleep(150 * time.Millisecond)
	}
	var screen bytes.Buffer
	exit, err := t.c.Follow(ctx, id, agentclient.FollowOptions{}, func(m *agentclient.Output) error {
		screen.WriteString(joinChunks(m.Chunks))
		return nil
	})
	if err != nil {
		return err
	}
	t.printf("%s\n(shell exited with %d; Ctrl-C interrupted the sleep)\n", strings.ReplaceAll(screen.String(), "\r", ""), exit.ExitCode)
	if !strings.Contains(screen.String(), "42") {
		return errors.New("the shell did not answer")
	}
	return nil
}

func (t *tour) files(ctx context.Context) error {
	content := "def total(xs):\n    return sum(xs) - 1\n"
	w, err := t.c.WriteFile(ctx, "src/calc.py", agentclient.WriteFileOptions{CreateParents: true, ComputeSHA256: true}, strings.NewReader(content))
	if err != nil {
		return err
	}
	t.printf("wrote %s: %d bytes, mode %o, sha256 %x…\n", w.Info.Path, w.Info.Size, w.Info.Mode, w.SHA256[:6])
	list, err := t.c.ListDir(ctx, "src", agentclient.ListDirOptions{})
	if err != nil {
		return err
	}
	for _, e := range list.Entries {
		t.printf("  %s %s %d\n", e.Type, e.Name, e.Size)
	}
	var back bytes.Buffer
	if _, err := t.c.ReadFile(ctx, "src/calc.py", agentclient.ReadFileOptions{}, &back); err != nil {
		return err
	}
	if back.String() != content {
		return errors.New("read back different content")
	}
	t.printf("read back %d identical bytes\n", back.Len())
	return nil
}

func (t *tour) patch(ctx context.Context) error {
	bad := "*** Begin Patch\n*** Add File: notes.md\n+fixed the bug\n*** Update File: src/calc.py\n@@\n-    return sum(xs) + 1\n+    return sum(xs)\n*** End Patch\n"
	_, err := t.c.ApplyPatch(ctx, bad, agentclient.ApplyPatchOptions{})
	if !errors.Is(err, errkind.ErrPatchRejected) {
		return fmt.Errorf("a patch with wrong context should be rejected, got %v", err)
	}
	t.printf("rejected as expected: %v\n", err)
	if _, serr := t.c.Stat(ctx, "notes.md", agentclient.StatOptions{}); !errors.Is(serr, errkind.ErrNotFound) {
		return fmt.Errorf("the rejected patch must not have created notes.md (stat: %v)", serr)
	}
	t.printf("notes.md was not created: nothing of the rejected patch was applied\n")
	good := strings.Replace(bad, "+ 1", "- 1", 1)
	resp, err := t.c.ApplyPatch(ctx, good, agentclient.ApplyPatchOptions{})
	if err != nil {
		return err
	}
	for _, ch := range resp.Changes {
		t.printf("  %s %s\n", ch.Kind, ch.Path)
	}
	return nil
}

func (t *tour) boundary(ctx context.Context) error {
	for _, p := range []string{"../../etc/passwd", "/etc/passwd"} {
		_, err := t.c.ReadFile(ctx, p, agentclient.ReadFileOptions{}, io.Discard)
		if !errors.Is(err, errkind.ErrPathEscape) {
			return fmt.Errorf("read %s: want a path escape error, got %v", p, err)
		}
		t.printf("read %s: refused (%v)\n", p, err)
	}
	return nil
}

func (t *tour) kill(ctx context.Context) error {
	st, err := t.c.Start(ctx, agentclient.ProcessSpec{Command: "sleep 1000 & sleep 1000"}, agentclient.StartOptions{})
	if err != nil {
		return err
	}
	id := st.Process.ProcessID
	if err := t.c.Signal(ctx, id, "KILL"); err != nil {
		return err
	}
	waited, err := t.c.Wait(ctx, id)
	if err != nil {
		return err
	}
	t.printf("killed the group of %q: %s\n", "sleep 1000 & sleep 1000", waited.Signal)
	return nil
}

func joinChunks(chunks []agentclient.OutputChunk) string {
	var b strings.Builder
	for _, c := range chunks {
		b.Write(c.Data)
	}
	return b.String()
}
