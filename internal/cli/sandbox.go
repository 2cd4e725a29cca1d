package cli

// `harness sandbox ...` drives sandboxes directly. Sessions are found by id
// through the session states saved in <state>/sessions/<id>.json; every
// command that reconnects resumes the session from its state and releases
// it at the end, so the sandbox keeps running between commands.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// cleanupTimeout bounds the cleanup done after a failure or an interrupt
// (deleting a half-made sandbox, hanging up a shell).
const cleanupTimeout = 30 * time.Second

// newSandboxCmd returns `harness sandbox` and its subcommands.
func newSandboxCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Create, use, snapshot, resume and remove sandboxes directly",
		Long: `Drive sandboxes directly. A session is named by its id; its state is saved under the state
directory (sessions/<id>.json), so later commands (from this process or another) find the
sandbox again. The sandbox keeps running between commands until it is removed.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(
		newSandboxCreateCmd(g),
		newSandboxLsCmd(g),
		newSandboxExecCmd(g),
		newSandboxShellCmd(g),
		newSandboxCpCmd(g),
		newSandboxSnapshotCmd(g),
		newSandboxResumeCmd(g),
		newSandboxPauseCmd(g),
		newSandboxRmCmd(g),
		newSandboxSyncCmd(g),
		newSandboxForkCmd(g),
	)
	return cmd
}

// statePath returns where the state of session id is saved. The id is
// checked first, so it can never name a path outside the directory.
func statePath(g *globals, id string) (string, error) {
	if err := snapshot.ValidateID(id); err != nil {
		return "", usageErr(compute.ErrInvalidArgument, "%q is not a session id (1-128 characters from [A-Za-z0-9._-])", id)
	}
	dir, err := g.dir("sessions")
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, id+".json"), nil
}

// loadState reads the saved state of session id. The session's own
// provider and saved settings (see adoptSession) are used from here on,
// where flags do not say otherwise.
func loadState(cmd *cobra.Command, g *globals, id string) (*compute.State, error) {
	p, err := statePath(g, id)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, usageErr(compute.ErrNotFound, "no sandbox session %q (no saved state in %s; `harness sandbox ls` lists them)", id, filepath.Dir(p))
	}
	if err != nil {
		return nil, fmt.Errorf("read the state of session %s: %w", id, err)
	}
	st, err := compute.DecodeState(data)
	if err != nil {
		return nil, fmt.Errorf("state of session %s (%s): %w", id, p, err)
	}
	if st.SessionID != id {
		return nil, usageErr(compute.ErrInvalidArgument, "%s holds session %q, not %q", p, st.SessionID, id)
	}
	if err := adoptSession(cmd, g, id, st.Provider); err != nil {
		return nil, err
	}
	return st, nil
}

// adoptProvider switches to a session's provider when --provider was not
// given explicitly.
func adoptProvider(cmd *cobra.Command, g *globals, provider string) {
	if f := cmd.Flag("provider"); f != nil && !f.Changed && provider != "" {
		g.provider = provider
	}
}

// removeState deletes the saved state of session id and its settings
// (absent is fine).
func removeState(g *globals, id string) error {
	if err := removeSettings(g, id); err != nil {
		return err
	}
	p, err := statePath(g, id)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the state of session %s: %w", id, err)
	}
	return nil
}

// reconnected is a saved session resumed by a command.
type reconnected struct {
	client *compute.Client
	sess   *compute.Session
	// reattached is set when the running sandbox was found again; otherwise
	// a replacement was launched and its workspace rebuilt.
	reattached bool
	// fromSnapshot is set when a rebuilt workspace came from the snapshot
	// (otherwise from the manifest).
	fromSnapshot bool
	release      func()
}

// reconnect resumes session id from its saved state and makes it ready:
// it reattaches to the running sandbox, or launches a replacement and
// rebuilds its workspace from the snapshot (then the new state is saved).
// Call release at the end: the connection is dropped and the sandbox keeps
// running.
func reconnect(cmd *cobra.Command, g *globals, id string, mat materializer.Options, opts ...compute.ResumeOption) (*reconnected, error) {
	ctx := cmd.Context()
	st, err := loadState(cmd, g, id)
	if err != nil {
		return nil, err
	}
	store, err := g.snapshots()
	if err != nil {
		return nil, err
	}
	client, release, err := g.client(mat)
	if err != nil {
		return nil, err
	}
	s, err := client.Resume(ctx, st, opts...)
	if err != nil {
		release()
		return nil, err
	}
	r := &reconnected{client: client, sess: s, release: func() { _ = s.Release(); release() }}
	before, err := s.State()
	if err != nil {
		r.release()
		return nil, err
	}
	r.reattached = before.Started
	if !r.reattached {
		snap := before.SnapshotID
		if r.fromSnapshot, err = store.Exists(ctx, snap); err != nil {
			r.release()
			return nil, fmt.Errorf("resume session %s: snapshot %s: %w", id, snap, err)
		}
	}
	if err := s.Start(ctx); err != nil {
		if !r.reattached {
			// A replacement that is not ready must not be taken for a ready
			// sandbox later: stop it (a later resume rebuilds it again).
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			_ = s.Shutdown(sctx)
			cancel()
		}
		r.release()
		return nil, err
	}
	if !r.reattached || s.Restored() {
		// A new sandbox, or one no longer paused.
		if err := saveSession(g, s); err != nil {
			r.release()
			return nil, err
		}
	}
	return r, nil
}

// noteRebuilt tells the user (on stderr) that a command found its sandbox
// gone and rebuilt it, or paused and restored it.
func (r *reconnected) noteRebuilt(w io.Writer) {
	if r.sess.Restored() {
		fmt.Fprintf(w, "note: the sandbox of session %s was paused; restored it with its processes\n", r.sess.ID())
	}
	if !r.reattached {
		fmt.Fprintf(w, "note: the sandbox of session %s was gone; %s\n", r.sess.ID(), r.rebuiltHow())
	}
}

// rebuiltHow says where a rebuilt workspace came from.
func (r *reconnected) rebuiltHow() string {
	if r.fromSnapshot {
		st, err := r.sess.State()
		if err == nil {
			return "rebuilt it from snapshot " + st.SnapshotID
		}
		return "rebuilt it from its snapshot"
	}
	return "rebuilt it from its manifest (there is no snapshot)"
}

// saveSession saves a session's current state.
func saveSession(g *globals, s *compute.Session) error {
	st, err := s.State()
	if err != nil {
		return err
	}
	if _, err := saveState(g, st); err != nil {
		return err
	}
	return nil
}

// fdOf returns the file descriptor behind a stream when it is a terminal.
func fdOf(v any) (int, bool) {
	f, ok := v.(interface{ Fd() uintptr })
	if !ok {
		return 0, false
	}
	fd := int(f.Fd())
	return fd, term.IsTerminal(fd)
}

// kindError is an error of the command line itself: its message is shown
// as is, and errors.Is still matches its compute sentinel.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// usageErr returns a kindError of the given sentinel.
func usageErr(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}
