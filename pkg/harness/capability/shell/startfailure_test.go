package shell

import (
	"errors"
	"fmt"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// A failed start is told to the model by the error's class and shape
// alone: the daemon's text (here full of misleading words) never decides
// and never reaches the model.
func TestStartFailureUsesClassAndShapeOnly(t *testing.T) {
	const noise = "run_as working directory /host/secret"
	start := func(err error) error { return &errkind.ProcessError{Op: "start", Err: err} }
	workdir := func(s error) error {
		return start(&errkind.PathError{Op: "chdir", Path: "sub", Err: errkind.Errorf(s, noise)})
	}
	wd := "sub"
	spec := agentclient.ProcessSpec{User: "agent", Shell: "/bin/zsh"}
	for _, c := range []struct {
		name string
		err  error
		want string
		ok   bool
	}{
		{"unknown user", start(fmt.Errorf("run_as: %w", errkind.Errorf(errkind.ErrUserNotFound, noise))),
			`the user "agent" that commands run as does not exist in the sandbox`, true},
		{"missing workdir", workdir(errkind.ErrNotFound), `workdir "sub" does not exist`, true},
		{"workdir not a directory", workdir(errkind.ErrNotDirectory), `workdir "sub" is not a directory`, true},
		{"workdir not enterable", workdir(errkind.ErrPermissionDenied), `workdir "sub" cannot be entered by the user commands run as`, true},
		{"workdir escapes", workdir(errkind.ErrPathEscape), `workdir "sub" is outside the workspace`, true},
		{"missing shell", start(errkind.Errorf(errkind.ErrNotFound, noise)), `shell "/bin/zsh" does not exist in the sandbox`, true},
		{"shell not runnable", start(errkind.Errorf(errkind.ErrPermissionDenied, noise)),
			`permission denied: shell "/bin/zsh" cannot be run by the user commands run as in this directory`, true},
		{"internal", start(errkind.Errorf(errkind.ErrInternal, noise)), "", false},
		{"unclassified", errors.New(noise), "", false},
	} {
		got, ok := startFailure(c.err, &wd, spec)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %q, %v; want %q, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
