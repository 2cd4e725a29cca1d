package workspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Config configures a Workspace.
type Config struct {
	// Root is the absolute path of the workspace directory. It must exist.
	Root string
	// MaxReadBytes bounds the bytes one ReadFile returns (0: no limit). A
	// longer read is cut short and reported as Truncated.
	MaxReadBytes int64
	// MaxWriteBytes bounds the bytes one WriteFile or one Commit change may
	// write (0: no limit). A larger write fails with
	// errkind.ErrResourceExhausted and changes nothing.
	MaxWriteBytes int64
	// Users names file owners in FileInfo (nil: numeric ids only).
	Users *userdb.DB
	// Logger receives diagnostics (paths and errors, never contents).
	// Nil means no logging.
	Logger *zap.Logger
}

// Grant is an extra directory outside the workspace root that paths may
// name. Grants are configured by the harness (SetGrants), never by the model.
type Grant struct {
	// Path is absolute and not "/".
	Path string
	// ReadOnly refuses every change below Path with errkind.ErrReadOnly.
	ReadOnly bool
}

// Workspace is the confined filesystem of one sandbox. It is safe for
// concurrent use.
type Workspace struct {
	log      *zap.Logger
	users    *userdb.DB
	maxRead  int64
	maxWrite int64
	euid     uint32
	egid     uint32
	// credSwitch is how runAs acts as a user: probed once, in New.
	credSwitch credSwitch

	ws     *mount                 // the workspace root; immutable
	mounts atomic.Pointer[mounts] // ws plus the current grants
	mu     sync.Mutex             // serialises SetGrants and Close
	closed bool

	// hooks are failure-injection points for tests; nil in production.
	hooks *testHooks
}

// testHooks lets tests inject failures at precise points.
type testHooks struct {
	// beforeCommitStep is called before Commit applies step i; a non-nil
	// error makes the step fail.
	beforeCommitStep func(i int) error
}

// mount is the workspace root or one grant.
type mount struct {
	abs      string   // cleaned absolute path as configured
	aliases  []string // abs, plus its symlink-free form when that differs
	root     *os.Root
	readOnly bool
	grant    bool
}

// mounts is an immutable snapshot of the workspace and its grants.
type mounts struct {
	list []*mount // the workspace first
}

// New opens the workspace described by cfg.
func New(cfg Config) (*Workspace, error) {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.MaxReadBytes < 0 || cfg.MaxWriteBytes < 0 {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "workspace limits must not be negative")
	}
	ws, err := openMount(cfg.Root, false, false)
	if err != nil {
		return nil, fmt.Errorf("open workspace root: %w", err)
	}
	w := &Workspace{
		log:        log.Named("workspace"),
		users:      cfg.Users,
		maxRead:    cfg.MaxReadBytes,
		maxWrite:   cfg.MaxWriteBytes,
		euid:       uint32(os.Geteuid()),
		egid:       uint32(os.Getegid()),
		ws:         ws,
		credSwitch: probeCredSwitch(),
	}
	w.mounts.Store(&mounts{list: []*mount{ws}})
	return w, nil
}

// openMount validates and opens a workspace or grant directory.
func openMount(path string, readOnly, grant bool) (*mount, error) {
	if !filepath.IsAbs(path) {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "%q is not an absolute path", path)
	}
	if strings.IndexByte(path, 0) >= 0 {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "path contains a NUL byte")
	}
	abs := filepath.Clean(path)
	if abs == "/" {
		return nil, errkind.Errorf(errkind.ErrInvalidArgument, "/ cannot be a workspace root or a grant")
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", abs, classify(err))
	}
	m := &mount{abs: abs, aliases: []string{abs}, root: root, readOnly: readOnly, grant: grant}
	if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs && real != "/" {
		m.aliases = append(m.aliases, real)
	}
	return m, nil
}

// RootPath returns the absolute path of the workspace root.
func (w *Workspace) RootPath() string { return w.ws.abs }

// Grants returns the grants currently configured.
func (w *Workspace) Grants() []Grant {
	var out []Grant
	for _, m := range w.mounts.Load().list {
		if m.grant {
			out = append(out, Grant{Path: m.abs, ReadOnly: m.readOnly})
		}
	}
	return out
}

// SetGrants replaces the configured grants. It is called by the daemon from
// its harness-provided configuration, never on behalf of the model.
//
// Every grant must be an existing directory given by an absolute path other
// than "/". A read-only grant may not lie inside the workspace root or inside
// a writable grant: the writable tree could reach it without going through
// the grant, so read-only could not be enforced. Grant roots that disappear
// from the list are closed; operations already running on them finish,
// later ones fail.
func (w *Workspace) SetGrants(grants []Grant) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errkind.Errorf(errkind.ErrFailedPrecondition, "workspace is closed")
	}
	old := w.mounts.Load()
	reuse := map[Grant]*mount{}
	for _, m := range old.list {
		if m.grant {
			reuse[Grant{Path: m.abs, ReadOnly: m.readOnly}] = m
		}
	}
	next := []*mount{w.ws}
	var opened []*mount
	fail := func(err error) error {
		for _, m := range opened {
			_ = m.root.Close()
		}
		return err
	}
	seen := map[string]bool{}
	for _, g := range grants {
		if !filepath.IsAbs(g.Path) || filepath.Clean(g.Path) == "/" {
			return fail(errkind.Errorf(errkind.ErrInvalidArgument, "grant %q must be an absolute path other than /", g.Path))
		}
		g.Path = filepath.Clean(g.Path)
		if seen[g.Path] || g.Path == w.ws.abs {
			return fail(errkind.Errorf(errkind.ErrInvalidArgument, "grant %q is given twice or is the workspace root", g.Path))
		}
		seen[g.Path] = true
		if m, ok := reuse[g]; ok {
			next = append(next, m)
			delete(reuse, g)
			continue
		}
		m, err := openMount(g.Path, g.ReadOnly, true)
		if err != nil {
			return fail(fmt.Errorf("grant %s: %w", g.Path, err))
		}
		opened = append(opened, m)
		next = append(next, m)
	}
	for _, ro := range next {
		if !ro.readOnly {
			continue
		}
		for _, rw := range next {
			if rw == ro || rw.readOnly {
				continue
			}
			if _, inside := within(rw.aliases, ro.abs); inside {
				return fail(errkind.Errorf(errkind.ErrInvalidArgument,
					"read-only grant %q lies inside writable %q and could not be enforced", ro.abs, rw.abs))
			}
		}
	}
	w.mounts.Store(&mounts{list: next})
	for _, m := range reuse {
		_ = m.root.Close()
	}
	return nil
}

// Close releases the workspace and grant roots. Operations running
// concurrently finish; later ones fail.
func (w *Workspace) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	var errs []error
	for _, m := range w.mounts.Load().list {
		errs = append(errs, m.root.Close())
	}
	return errors.Join(errs...)
}

// within reports whether abs lies at or below one of the aliases and returns
// the length of the matching alias.
func within(aliases []string, abs string) (int, bool) {
	best, ok := 0, false
	for _, a := range aliases {
		if abs == a || strings.HasPrefix(abs, a+"/") {
			if len(a) > best || !ok {
				best, ok = len(a), true
			}
		}
	}
	return best, ok
}

// find returns the innermost mount holding the absolute, clean path abs and
// the path relative to it ("." for the mount root itself).
func (ms *mounts) find(abs string) (*mount, string) {
	var best *mount
	bestLen := -1
	for _, m := range ms.list {
		if n, ok := within(m.aliases, abs); ok && n > bestLen {
			best, bestLen = m, n
		}
	}
	if best == nil {
		return nil, ""
	}
	rel := strings.TrimPrefix(abs[bestLen:], "/")
	if rel == "" {
		rel = "."
	}
	return best, rel
}
