package process

import (
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// readUntil reads PTY output from *cursor until it contains want.
func readUntil(t *testing.T, m *Manager, id string, cursor *int64, want string) string {
	t.Helper()
	var sb strings.Builder
	ctx := testCtx(t)
	for !strings.Contains(sb.String(), want) {
		r, err := m.Read(ctx, id, *cursor, time.Second, 0)
		if err != nil {
			t.Fatalf("Read: %v (so far %q)", err, sb.String())
		}
		for _, c := range r.Chunks {
			if c.Stream != PTY {
				t.Fatalf("stream %v in TTY mode", c.Stream)
			}
			sb.Write(c.Data)
		}
		*cursor = r.NextCursor
		if r.Exited && !strings.Contains(sb.String(), want) {
			t.Fatalf("exited before printing %q: %q", want, sb.String())
		}
	}
	return sb.String()
}

func TestPTYCtrlCInterrupts(t *testing.T) {
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Argv: []string{"sleep", "100"}, TTY: true})
	if !info.TTY {
		t.Fatal("Info.TTY not set")
	}
	if _, err := m.WriteStdin(testCtx(t), info.ID, 0, []byte("\x03")); err != nil {
		t.Fatal(err)
	}
	e, err := m.Wait(testCtx(t), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if e.Signal != "SIGINT" || e.Code != 130 {
		t.Errorf("exit = %+v, want SIGINT", e)
	}
	wantErr(t, m.CloseStdin(info.ID), errkind.ErrFailedPrecondition, "Ctrl-D")
}

func TestPTYSizeAndResize(t *testing.T) {
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Command: "stty size; read x; stty size; read y", TTY: true, Rows: 30, Cols: 100})
	var cur int64
	readUntil(t, m, info.ID, &cur, "30 100")

	wantErr(t, m.Resize(info.ID, 0, 10), errkind.ErrInvalidArgument)
	if err := m.Resize(info.ID, 40, 120); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WriteStdin(testCtx(t), info.ID, 0, []byte("\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, m, info.ID, &cur, "40 120")
	// Ctrl-D at the start of a line ends the last read.
	if _, err := m.WriteStdin(testCtx(t), info.ID, 1, []byte("\x04")); err != nil {
		t.Fatal(err)
	}
	if e, err := m.Wait(testCtx(t), info.ID); err != nil || e.Code != 1 {
		t.Fatalf("exit = %+v, %v (read at EOF returns 1)", e, err)
	}
	wantErr(t, m.Resize(info.ID, 10, 10), errkind.ErrFailedPrecondition, "exited")

	pipe := mustStart(t, m, StartOptions{Argv: []string{"sleep", "100"}})
	wantErr(t, m.Resize(pipe.ID, 10, 10), errkind.ErrFailedPrecondition, "tty")
}

func TestPTYDefaultSizeAndOutput(t *testing.T) {
	m := newTestManager(t, Config{})
	o := run(t, m, StartOptions{Command: "stty size; tty; echo err >&2", TTY: true})
	out := o.pty.String()
	if o.stdout.Len()+o.stderr.Len() != 0 {
		t.Errorf("TTY output on pipe streams")
	}
	for _, want := range []string{"24 80", "/dev/pts/", "err"} {
		if !strings.Contains(out, want) {
			t.Errorf("PTY output %q lacks %q", out, want)
		}
	}
}

func TestPTYJobControlShellKilledOnTimeout(t *testing.T) {
	// An interactive shell puts its jobs into process groups of their own;
	// a timeout must still kill them all.
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Argv: []string{"bash", "--norc", "-i"}, TTY: true, Timeout: 2 * time.Second})
	if _, err := m.WriteStdin(testCtx(t), info.ID, 0, []byte("sleep 1000 &\nsleep 1001\n")); err != nil {
		t.Fatal(err)
	}
	var jobs []int
	eventually(t, 5*time.Second, "jobs to start", func() bool {
		jobs = jobs[:0]
		for _, g := range sessionGroups(info.PID) {
			if g != info.PID {
				jobs = append(jobs, groupMembers(g)...)
			}
		}
		return len(jobs) >= 2
	})
	e, err := m.Wait(testCtx(t), info.ID)
	if err != nil || !e.TimedOut {
		t.Fatalf("exit = %+v, %v", e, err)
	}
	noSurvivors(t, jobs)
}
