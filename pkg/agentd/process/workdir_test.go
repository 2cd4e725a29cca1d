package process

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// A failed start says what is at fault by its type, not its text: a
// working directory failure is a PathError on the directory, a program
// failure has no path, and an unknown user is ErrUserNotFound.
func TestStartFailuresSayWhatIsAtFault(t *testing.T) {
	m := newTestManager(t, Config{})
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		opts     StartOptions
		sentinel error
		workdir  string // the PathError's path; "" for none
	}{
		{"missing dir", StartOptions{Argv: []string{"true"}, Dir: "/no/such/dir"}, errkind.ErrNotFound, "/no/such/dir"},
		{"file as dir", StartOptions{Argv: []string{"true"}, Dir: file}, errkind.ErrNotDirectory, file},
		{"parent is a file", StartOptions{Argv: []string{"true"}, Dir: file + "/sub"}, errkind.ErrNotDirectory, file + "/sub"},
		{"relative dir", StartOptions{Argv: []string{"true"}, Dir: "tmp"}, errkind.ErrInvalidArgument, "tmp"},
		{"missing program", StartOptions{Argv: []string{"/no/such/program"}}, errkind.ErrNotFound, ""},
		{"unknown user", StartOptions{Argv: []string{"true"}, User: "no-such-user-xyz"}, errkind.ErrUserNotFound, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := m.Start(testCtx(t), c.opts)
			if !errors.Is(err, c.sentinel) {
				t.Fatalf("error = %v, want %v", err, c.sentinel)
			}
			var pe *errkind.PathError
			isPath := errors.As(err, &pe)
			switch {
			case c.workdir == "" && isPath:
				t.Errorf("a PathError on %q for a failure of no directory: %v", pe.Path, err)
			case c.workdir != "" && (!isPath || pe.Path != c.workdir || pe.Op != "chdir"):
				t.Errorf("want a chdir PathError on %q, got %v", c.workdir, err)
			}
			if c.sentinel != errkind.ErrUserNotFound && errors.Is(err, errkind.ErrUserNotFound) {
				t.Errorf("%v is an unknown user", err)
			}
		})
	}
}

// A program named by its path is started without checking it or the
// working directory first (plan.checkLater); a failed start must still
// blame the same thing, in the same order, as the checks made up front.
func TestStartFailuresByPathSayWhatIsAtFault(t *testing.T) {
	m := newTestManager(t, Config{})
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		opts     StartOptions
		sentinel error
		workdir  string // the PathError's path; "" for none
		subs     []string
	}{
		{"missing dir", StartOptions{Argv: []string{"/bin/true"}, Dir: "/no/such/dir"}, errkind.ErrNotFound, "/no/such/dir", []string{"does not exist"}},
		{"file as dir", StartOptions{Argv: []string{"/bin/true"}, Dir: file}, errkind.ErrNotDirectory, file, nil},
		{"parent is a file", StartOptions{Argv: []string{"/bin/true"}, Dir: file + "/sub"}, errkind.ErrNotDirectory, file + "/sub", nil},
		{"missing dir wins over a missing program", StartOptions{Argv: []string{"/no/such/program"}, Dir: "/no/such/dir"}, errkind.ErrNotFound, "/no/such/dir", nil},
		{"missing program", StartOptions{Argv: []string{"/no/such/program"}, Dir: dir}, errkind.ErrNotFound, "", []string{"/no/such/program", "does not exist"}},
		{"relative missing program", StartOptions{Argv: []string{"./nothing"}, Dir: dir}, errkind.ErrNotFound, "", []string{"nothing"}},
		{"not executable", StartOptions{Argv: []string{file}, Dir: dir}, errkind.ErrPermissionDenied, "", []string{file, "not executable"}},
		{"a directory", StartOptions{Argv: []string{dir}, Dir: dir}, errkind.ErrInvalidArgument, "", []string{"is a directory"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := m.Start(testCtx(t), c.opts)
			wantErr(t, err, c.sentinel, c.subs...)
			var pe *errkind.PathError
			isPath := errors.As(err, &pe)
			switch {
			case c.workdir == "" && isPath:
				t.Errorf("a PathError on %q for a failure of no directory: %v", pe.Path, err)
			case c.workdir != "" && (!isPath || pe.Path != c.workdir || pe.Op != "chdir"):
				t.Errorf("want a chdir PathError on %q, got %v", c.workdir, err)
			}
		})
	}
	if n := len(m.List()); n != 0 {
		t.Errorf("failed starts left %d processes", n)
	}
}
