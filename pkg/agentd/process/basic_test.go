package process

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestStartPipesSeparateStreams(t *testing.T) {
	m := newTestManager(t, Config{})
	o := run(t, m, StartOptions{Argv: []string{"sh", "-c", "echo out; echo err >&2; echo out2; exit 3"}})
	if got := o.stdout.String(); got != "out\nout2\n" {
		t.Errorf("stdout = %q", got)
	}
	if got := o.stderr.String(); got != "err\n" {
		t.Errorf("stderr = %q", got)
	}
	if o.exit.Code != 3 || o.exit.Signal != "" || o.exit.TimedOut || o.exit.ExitedAt.IsZero() {
		t.Errorf("exit = %+v", o.exit)
	}
}

func TestShellCommandAndLogin(t *testing.T) {
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Command: "echo $((6*7))", Login: true})
	if want := []string{"/bin/sh", "-lc", "echo $((6*7))"}; !slices.Equal(info.Argv, want) {
		t.Errorf("argv = %q, want %q", info.Argv, want)
	}
	if o := collect(t, m, info.ID); o.stdout.String() != "42\n" {
		t.Errorf("stdout = %q", o.stdout.String())
	}
	info = mustStart(t, m, StartOptions{Command: "echo $0", Shell: "bash"})
	if want := []string{"bash", "-c", "echo $0"}; !slices.Equal(info.Argv, want) {
		t.Errorf("argv = %q, want %q", info.Argv, want)
	}
	if o := collect(t, m, info.ID); o.stdout.String() != "bash\n" {
		t.Errorf("stdout = %q", o.stdout.String())
	}
}

func TestCleanEnvironment(t *testing.T) {
	t.Setenv("BULKHEAD_TEST_SECRET", "hunter2-do-not-leak")
	m := newTestManager(t, Config{})
	o := run(t, m, StartOptions{Argv: []string{"env"}, Env: map[string]string{"FOO": "bar", "LANG": "C"}})
	env := strings.Split(strings.TrimSpace(o.stdout.String()), "\n")
	if strings.Contains(o.stdout.String(), "hunter2") || strings.Contains(o.stdout.String(), "BULKHEAD_TEST_SECRET") {
		t.Fatalf("the daemon's environment leaked into the child: %q", env)
	}
	for _, want := range []string{"PATH=" + DefaultPath, "FOO=bar", "LANG=C"} {
		if !slices.Contains(env, want) {
			t.Errorf("env lacks %q: %q", want, env)
		}
	}
	if slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "TERM=") }) {
		t.Errorf("pipe-mode process got a TERM: %q", env)
	}

	m2 := newTestManager(t, Config{BaseEnv: map[string]string{"PATH": "/usr/bin:/bin", "ONLY": "base"}})
	o = run(t, m2, StartOptions{Argv: []string{"env"}, TTY: true})
	for _, want := range []string{"PATH=/usr/bin:/bin", "ONLY=base", "TERM=" + defaultTerm} {
		if !strings.Contains(o.pty.String(), want) {
			t.Errorf("env lacks %q: %q", want, o.pty.String())
		}
	}
	if strings.Contains(o.pty.String(), "LANG=") {
		t.Errorf("a BaseEnv should replace the defaults: %q", o.pty.String())
	}
}

func TestStartValidation(t *testing.T) {
	m := newTestManager(t, Config{})
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		opts     StartOptions
		sentinel error
		subs     []string
	}{
		{"nothing", StartOptions{}, errkind.ErrInvalidArgument, nil},
		{"both", StartOptions{Argv: []string{"true"}, Command: "true"}, errkind.ErrInvalidArgument, nil},
		{"empty argv0", StartOptions{Argv: []string{""}}, errkind.ErrInvalidArgument, nil},
		{"relative dir", StartOptions{Argv: []string{"true"}, Dir: "tmp"}, errkind.ErrInvalidArgument, []string{"chdir tmp", "not absolute"}},
		{"missing dir", StartOptions{Argv: []string{"true"}, Dir: "/no/such/dir"}, errkind.ErrNotFound, []string{"/no/such/dir", "does not exist"}},
		{"file as dir", StartOptions{Argv: []string{"true"}, Dir: file}, errkind.ErrNotDirectory, []string{file}},
		{"missing binary", StartOptions{Argv: []string{"no-such-binary-xyz", "-v"}}, errkind.ErrNotFound, []string{"no-such-binary-xyz"}},
		{"missing path", StartOptions{Argv: []string{"/opt/nope/tool"}}, errkind.ErrNotFound, []string{"/opt/nope/tool"}},
		{"missing shell", StartOptions{Command: "true", Shell: "/no/shell"}, errkind.ErrNotFound, []string{"/no/shell"}},
		{"not executable", StartOptions{Argv: []string{file}}, errkind.ErrPermissionDenied, []string{file}},
		{"directory", StartOptions{Argv: []string{"/tmp"}}, errkind.ErrInvalidArgument, []string{"/tmp"}},
		{"bad env", StartOptions{Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, errkind.ErrInvalidArgument, nil},
		{"negative timeout", StartOptions{Argv: []string{"true"}, Timeout: -time.Second}, errkind.ErrInvalidArgument, nil},
		{"size without tty", StartOptions{Argv: []string{"true"}, Rows: 10}, errkind.ErrInvalidArgument, nil},
		{"unknown user", StartOptions{Argv: []string{"true"}, User: "no-such-user-xyz"}, errkind.ErrNotFound, []string{"no-such-user-xyz"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := m.Start(testCtx(t), c.opts)
			wantErr(t, err, c.sentinel, c.subs...)
		})
	}
	if n := len(m.List()); n != 0 {
		t.Errorf("failed starts left %d processes", n)
	}
}

func TestExecFailureAfterLookup(t *testing.T) {
	// A script whose interpreter is missing passes the lookup but fails in
	// execve: still a NotFound naming the program.
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/no/such/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := newTestManager(t, Config{})
	_, err := m.Start(testCtx(t), StartOptions{Argv: []string{script}})
	wantErr(t, err, errkind.ErrNotFound, script, "interpreter")
}

func TestWorkingDirectoryAndDefaults(t *testing.T) {
	m := newTestManager(t, Config{})
	dir := t.TempDir()
	o := run(t, m, StartOptions{Argv: []string{"pwd"}, Dir: dir})
	if got := strings.TrimSpace(o.stdout.String()); got != dir {
		t.Errorf("pwd = %q, want %q", got, dir)
	}
	// A relative program path is relative to the working directory.
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if o := run(t, m, StartOptions{Argv: []string{"./hello"}, Dir: dir}); o.stdout.String() != "hello\n" {
		t.Errorf("./hello printed %q", o.stdout.String())
	}
}

func TestStdinIsDevNullByDefault(t *testing.T) {
	m := newTestManager(t, Config{})
	o := run(t, m, StartOptions{Argv: []string{"cat"}})
	if o.stdout.Len() != 0 || o.exit.Code != 0 {
		t.Errorf("cat without stdin: %q %+v", o.stdout.String(), o.exit)
	}
	info := mustStart(t, m, StartOptions{Argv: []string{"true"}})
	_, err := m.WriteStdin(testCtx(t), info.ID, 0, []byte("x"))
	wantErr(t, err, errkind.ErrFailedPrecondition, "without stdin")
	wantErr(t, m.CloseStdin(info.ID), errkind.ErrFailedPrecondition, "without stdin")
}

func TestStdinOffsets(t *testing.T) {
	m := newTestManager(t, Config{})
	ctx := testCtx(t)
	info := mustStart(t, m, StartOptions{Argv: []string{"cat"}, Stdin: true})
	steps := []struct {
		off  int64
		data string
		next int64
	}{
		{0, "abc", 3},
		{0, "abc", 3},   // resent: nothing applied twice
		{1, "bcdef", 6}, // overlapping: only "def" is new
		{2, "cd", 6},    // entirely old
		{6, "", 6},      // empty
		{6, "\n", 7},
	}
	for _, s := range steps {
		next, err := m.WriteStdin(ctx, info.ID, s.off, []byte(s.data))
		if err != nil || next != s.next {
			t.Fatalf("WriteStdin(%d, %q) = %d, %v; want %d", s.off, s.data, next, err, s.next)
		}
	}
	next, err := m.WriteStdin(ctx, info.ID, 9, []byte("x"))
	wantErr(t, err, errkind.ErrConflict, "9", "7")
	if next != 7 {
		t.Errorf("conflict returned next %d, want 7", next)
	}
	_, err = m.WriteStdin(ctx, info.ID, -1, []byte("x"))
	wantErr(t, err, errkind.ErrInvalidArgument)

	if err := m.CloseStdin(info.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.CloseStdin(info.ID); err != nil {
		t.Fatalf("second CloseStdin: %v", err)
	}
	_, err = m.WriteStdin(ctx, info.ID, 7, []byte("x"))
	wantErr(t, err, errkind.ErrFailedPrecondition, "closed")

	o := collect(t, m, info.ID)
	if got := o.stdout.String(); got != "abcdef\n" {
		t.Errorf("cat echoed %q", got)
	}
	_, err = m.WriteStdin(ctx, info.ID, 7, []byte("x"))
	wantErr(t, err, errkind.ErrFailedPrecondition, "exited")
}

func TestWriteStdinHonoursContext(t *testing.T) {
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Argv: []string{"sleep", "100"}, Stdin: true})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	big := make([]byte, 4<<20) // far more than a pipe holds; sleep never reads
	next, err := m.WriteStdin(ctx, info.ID, 0, big)
	wantErr(t, err, errkind.ErrDeadlineExceeded)
	if next <= 0 || next >= int64(len(big)) {
		t.Fatalf("partial write accepted %d bytes", next)
	}
	// The stale deadline must not affect a later write with a live context.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if n, err := m.WriteStdin(ctx2, info.ID, next, nil); err != nil || n != next {
		t.Fatalf("empty resume = %d, %v", n, err)
	}
	if err := m.Signal(info.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Wait(testCtx(t), info.ID); err != nil {
		t.Fatal(err)
	}
}

func TestIdempotentStart(t *testing.T) {
	m := newTestManager(t, Config{})
	opts := StartOptions{RequestID: "req-1", Command: "echo once", Env: map[string]string{"A": "1"}}
	a := mustStart(t, m, opts)
	b := mustStart(t, m, opts)
	if a.ID != b.ID || a.PID != b.PID {
		t.Fatalf("retried start made a second process: %v vs %v", a, b)
	}
	if a.RequestID != "req-1" {
		t.Errorf("RequestID = %q", a.RequestID)
	}
	other := opts
	other.Command = "echo twice"
	_, err := m.Start(testCtx(t), other)
	wantErr(t, err, errkind.ErrConflict, "req-1")
	if o := collect(t, m, a.ID); o.stdout.String() != "once\n" {
		t.Errorf("stdout = %q", o.stdout.String())
	}

	// Concurrent retries: all get the same process.
	opts = StartOptions{RequestID: "req-2", Argv: []string{"true"}}
	var wg sync.WaitGroup
	ids := make([]string, 16)
	for i := range ids {
		wg.Go(func() {
			info, err := m.Start(testCtx(t), opts)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = info.ID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent retries started different processes: %q", ids)
		}
	}
	if n := len(m.List()); n != 2 {
		t.Errorf("List has %d processes, want 2", n)
	}
}

func TestMaxProcesses(t *testing.T) {
	m := newTestManager(t, Config{MaxProcesses: 2})
	a := mustStart(t, m, StartOptions{Argv: []string{"sleep", "100"}})
	mustStart(t, m, StartOptions{Argv: []string{"sleep", "100"}})
	_, err := m.Start(testCtx(t), StartOptions{Argv: []string{"true"}})
	wantErr(t, err, errkind.ErrResourceExhausted, "2")
	if err := m.Signal(a.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Wait(testCtx(t), a.ID); err != nil {
		t.Fatal(err)
	}
	mustStart(t, m, StartOptions{Argv: []string{"true"}})
}

func TestUnknownProcess(t *testing.T) {
	m := newTestManager(t, Config{})
	ctx := testCtx(t)
	_, err := m.Read(ctx, "proc_nope", 0, 0, 0)
	wantErr(t, err, errkind.ErrNotFound, "proc_nope")
	_, err = m.Wait(ctx, "proc_nope")
	wantErr(t, err, errkind.ErrNotFound)
	_, err = m.WriteStdin(ctx, "proc_nope", 0, nil)
	wantErr(t, err, errkind.ErrNotFound)
	wantErr(t, m.Signal("proc_nope", "TERM"), errkind.ErrNotFound)
	wantErr(t, m.Resize("proc_nope", 1, 1), errkind.ErrNotFound)
	wantErr(t, m.CloseStdin("proc_nope"), errkind.ErrNotFound)
	_, err = m.Get("proc_nope")
	wantErr(t, err, errkind.ErrNotFound)
}

func TestSurvivesStartContextAndListWait(t *testing.T) {
	m := newTestManager(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	info, err := m.Start(ctx, StartOptions{Command: "sleep 0.3; echo done"})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	l := m.List()
	if len(l) != 1 || l[0].ID != info.ID || !l[0].Running || l[0].PID <= 0 || l[0].StartedAt.IsZero() || l[0].User == "" {
		t.Fatalf("List = %+v", l)
	}
	// A Wait whose context ends does not affect the process either.
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	_, err = m.Wait(short, info.ID)
	wantErr(t, err, errkind.ErrDeadlineExceeded)

	e, err := m.Wait(testCtx(t), info.ID)
	if err != nil || e.Code != 0 {
		t.Fatalf("Wait = %+v, %v", e, err)
	}
	e2, err := m.Wait(testCtx(t), info.ID)
	if err != nil || e2 != e {
		t.Fatalf("second Wait = %+v, %v; want %+v", e2, err, e)
	}
	if o := collect(t, m, info.ID); o.stdout.String() != "done\n" {
		t.Errorf("stdout = %q", o.stdout.String())
	}
	got, err := m.Get(info.ID)
	if err != nil || got.Running || got.Exit == nil || *got.Exit != e {
		t.Fatalf("Get after exit = %+v, %v", got, err)
	}
	canceled, cancel3 := context.WithCancel(context.Background())
	cancel3()
	_, err = m.Start(canceled, StartOptions{Argv: []string{"true"}})
	wantErr(t, err, errkind.ErrCanceled)
}

func TestExitRetention(t *testing.T) {
	m := newTestManager(t, Config{ExitRetention: 300 * time.Millisecond, MaxExited: 2})
	a := mustStart(t, m, StartOptions{Argv: []string{"true"}})
	if _, err := m.Wait(testCtx(t), a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(a.ID); err != nil {
		t.Fatalf("exited process forgotten too early: %v", err)
	}
	eventually(t, 5*time.Second, "retention to pass", func() bool {
		_, err := m.Get(a.ID)
		return err != nil
	})
	_, err := m.Wait(testCtx(t), a.ID)
	wantErr(t, err, errkind.ErrNotFound)

	// Beyond MaxExited the oldest exited processes go first.
	m2 := newTestManager(t, Config{MaxExited: 2})
	var ids []string
	for range 3 {
		info := mustStart(t, m2, StartOptions{Argv: []string{"true"}, RequestID: "r"})
		ids = append(ids, info.ID)
		if _, err := m2.Wait(testCtx(t), info.ID); err != nil {
			t.Fatal(err)
		}
		if len(ids) == 1 {
			// The same RequestID finds the exited process while it is kept.
			if again := mustStart(t, m2, StartOptions{Argv: []string{"true"}, RequestID: "r"}); again.ID != info.ID {
				t.Fatalf("retry after exit started anew")
			}
		}
		m2.mu.Lock()
		delete(m2.byRequest, "r") // let the next iteration start a new process
		m2.mu.Unlock()
	}
	if _, err := m2.Get(ids[0]); err == nil {
		t.Errorf("oldest exited process was kept beyond MaxExited")
	}
	for _, id := range ids[1:] {
		if _, err := m2.Get(id); err != nil {
			t.Errorf("newer exited process %s forgotten: %v", id, err)
		}
	}
}

// TestStdioBlocks checks the child's stdin, stdout and stderr are in
// blocking mode (the daemon's own ends are non-blocking, for its poller): a
// program writing to a non-blocking pipe would see EAGAIN.
func TestStdioBlocks(t *testing.T) {
	m := newTestManager(t, Config{})
	for _, stdin := range []bool{false, true} {
		o := run(t, m, StartOptions{Command: "grep -h '^flags' /proc/self/fdinfo/0 /proc/self/fdinfo/1 /proc/self/fdinfo/2", Stdin: stdin, Dir: "/"})
		lines := strings.Fields(o.stdout.String())
		if len(lines) != 6 {
			t.Fatalf("stdin %v: fdinfo flags %q (stderr %q)", stdin, o.stdout.String(), o.stderr.String())
		}
		for i := 1; i < len(lines); i += 2 {
			flags, err := strconv.ParseUint(lines[i], 8, 64)
			if err != nil {
				t.Fatal(err)
			}
			if flags&unix.O_NONBLOCK != 0 {
				t.Errorf("stdin %v: fd %d is non-blocking (flags %s)", stdin, i/2, lines[i])
			}
		}
	}
}
