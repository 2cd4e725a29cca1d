package process

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// defaultTerm is TERM for PTY processes whose environment names none.
const defaultTerm = "xterm-256color"

// checkEnvVar rejects names and values the kernel cannot carry.
func checkEnvVar(k, v string) error {
	switch {
	case k == "":
		return errkind.Errorf(errkind.ErrInvalidArgument, "empty environment variable name")
	case strings.ContainsAny(k, "=\x00"):
		return errkind.Errorf(errkind.ErrInvalidArgument, "environment variable name %q contains '=' or NUL", k)
	case strings.ContainsRune(v, 0):
		return errkind.Errorf(errkind.ErrInvalidArgument, "environment variable %q has a NUL byte in its value", k)
	}
	return nil
}

// buildEnv layers the base environment, the user's identity variables, the
// sandbox environment (the manifest's, Manager.SetEnvironment) and the
// request's variables (later wins) into a sorted KEY=VALUE list. The
// daemon's own environment is never consulted.
func buildEnv(base map[string]string, u *userdb.User, sandbox, req map[string]string, tty bool) []string {
	env := maps.Clone(base)
	if u != nil {
		if u.Home != "" {
			env["HOME"] = u.Home
		}
		env["USER"] = u.Name
		env["LOGNAME"] = u.Name
		if u.Shell != "" {
			env["SHELL"] = u.Shell
		}
	}
	maps.Copy(env, sandbox)
	maps.Copy(env, req)
	if _, ok := env["TERM"]; tty && !ok {
		env["TERM"] = defaultTerm
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// envValue returns the value of key in a KEY=VALUE list.
func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds the program the child will execute, the way execvp would
// for the child: a name with a slash is taken as is (relative to dir), a
// bare name is searched in pathEnv, the child's PATH. Relative PATH entries
// are ignored.
func lookPath(file, pathEnv, dir string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", err
		}
		return file, nil
	}
	var firstErr error
	for _, d := range filepath.SplitList(pathEnv) {
		if !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, file)
		err := checkExecutable(p)
		if err == nil {
			return p, nil
		}
		if firstErr == nil && !errors.Is(err, errkind.ErrNotFound) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return "", firstErr
	}
	return "", errkind.Errorf(errkind.ErrNotFound, "executable %q not found in the process's PATH", file)
}

// checkExecutable reports why path cannot be executed, if it cannot.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR)):
		return errkind.Errorf(errkind.ErrNotFound, "executable %q does not exist", path)
	case err != nil:
		return errkind.Errorf(errkind.ErrPermissionDenied, "executable %q: %v", path, err)
	case fi.IsDir():
		return errkind.Errorf(errkind.ErrInvalidArgument, "executable %q is a directory", path)
	case fi.Mode()&0o111 == 0:
		return errkind.Errorf(errkind.ErrPermissionDenied, "%q is not executable", path)
	}
	return nil
}

// CheckEnvVar reports whether an environment variable can be given to a
// process: a non-empty name without '=' or NUL and a value without NUL.
func CheckEnvVar(name, value string) error { return checkEnvVar(name, value) }
