// Package materializer turns a manifest into a daemon Materialize call, on
// the harness side of the trust boundary: inline files and directories are
// sent as they are; host sources (local_file, local_dir) are read here,
// confined to a trusted base directory; git repositories are fetched here
// with the harness's credentials and streamed in as files. The sandbox only
// ever receives bytes.
package materializer

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Options says where host sources come from and how much runs at once.
type Options struct {
	// BaseDir is the trusted host directory that local_file and local_dir
	// sources are relative to. Required when the manifest has relative host
	// sources.
	BaseDir string
	// HostGrants are further host directories, absolute, that the
	// application allows absolute local_file and local_dir sources to be
	// read from (the innermost grant holding a source is its root: nothing
	// outside it is reached, and symbolic links below it are refused as
	// below BaseDir). A manifest cannot add to them.
	HostGrants []string
	// Git fetches git_repo entries; nil means the git command line
	// (GitCLI{}). For Untrusted manifests it must be a PinnedGitFetcher.
	Git GitFetcher
	// Untrusted says the manifests come from tenants (`harness serve`),
	// not from the application: their git_repo entries are fetched only
	// as GitPolicy allows (an allowed host name, public addresses resolved
	// once and connected to as checked, the operator's credential for the
	// host, never a token the manifest names), and a fetch that fails says
	// "git fetch of HOST/REPO failed" without the network's details (they
	// are logged at debug level).
	Untrusted bool
	// GitPolicy is what Untrusted manifests may fetch; the zero value
	// allows no git host. It does not apply to trusted manifests.
	GitPolicy GitPolicy
	// Concurrency bounds git fetches and host directory walks running at
	// once (default 4).
	Concurrency int
	// Owner owns the materialized entries that declare no group; "" means
	// the manifest's RunAs (the agent's account owns its workspace), or the
	// daemon's identity. Entries that declare a group are shared through
	// it: they belong to the daemon's identity (root in a sandbox) and that
	// group, so their group and other bits decide what accounts may do, and
	// no account can change their mode (a read-only data room stays
	// read-only).
	Owner string
	// Include, when set, selects the entries to apply (for example only
	// the ephemeral ones after a restore); a directory not included is
	// skipped with everything below it. Accounts and grants are always in
	// the plan.
	Include func(path string, e *manifest.Entry) bool
	// Mounts reads the remote storage of mount entries (package
	// compute/mount); nil refuses every mount entry with ErrUnimplemented.
	Mounts Mounter
	// Secrets resolves the secret references of the manifest's environment
	// that the manifest copy does not hold resolved already
	// (manifest.ResolveSecrets); nil refuses such a reference with
	// ErrFailedPrecondition. mount.EnvSecrets reads them from the harness's
	// environment. The values reach the daemon's memory only.
	Secrets manifest.SecretResolver
	// Session names the session being materialized, for the Mounter's
	// per-session state (compute.Session sets it).
	Session string
	// Log receives progress; nil means no logging.
	Log *zap.Logger
}

// Mounter expands mount entries on the harness side: it lists the storage
// with the harness's credentials and yields the objects' bytes while the
// tar stream is written. The sandbox only ever receives bytes.
type Mounter interface {
	// PlanMount lists the storage behind one mount entry. It fails before
	// anything is written when the storage cannot be read or is too large.
	PlanMount(ctx context.Context, req MountRequest) (*MountPlan, error)
}

// MountRequest is one mount entry to expand.
type MountRequest struct {
	// Session is Options.Session.
	Session string
	// Path is the entry's workspace-relative path.
	Path  string
	Entry *manifest.Entry
	// Owner is the account that owns what the workspace's agent may
	// change ("" for the daemon's identity): see Options.Owner.
	Owner string
}

// MountPlan is what a mount entry expands to.
type MountPlan struct {
	// Entries are the directories and files at and below the entry's path
	// (the root first, parents before children), with their owners and
	// modes; file entries carry their exact sizes.
	Entries []*agentclient.MaterializeEntry
	// Open returns the bytes of the file entry at a path and their size.
	// WriteTar calls it once per file, in the order of Entries.
	Open func(path string) (io.ReadCloser, int64, error)
	// Applied, when set, is called after the daemon wrote the whole plan,
	// with its report of the files below the entry.
	Applied func(ctx context.Context, c *agentclient.Client, files []agentclient.MaterializedFile) error
	// Close, when set, releases what the plan holds (downloads ahead).
	Close func()
}

// GitFetcher checks out a repository at a ref into an empty directory.
type GitFetcher interface {
	Fetch(ctx context.Context, repo *manifest.GitRepo, dir string) error
}

// Prepared is a plan ready to stream: the wire plan and the sources of its
// files' bytes. Close removes the temporary checkouts it holds.
type Prepared struct {
	Plan    *agentclient.MaterializePlan
	files   []source // in plan order
	cleanup []func()
	mounts  []mountApplied
}

// mountApplied is a mount plan's callback after the daemon wrote it.
type mountApplied struct {
	path string
	fn   func(ctx context.Context, c *agentclient.Client, files []agentclient.MaterializedFile) error
}

// source yields the bytes of one file entry.
type source struct {
	path string
	size int64
	open func() (io.ReadCloser, int64, error) // reader and its size (re-checked)
}

// Close releases temporary checkouts.
func (p *Prepared) Close() error {
	for _, c := range p.cleanup {
		c()
	}
	p.cleanup = nil
	return nil
}

// Apply prepares the manifest and materializes it through the daemon
// client, returning the daemon's report (each file with its sha256).
func Apply(ctx context.Context, c *agentclient.Client, m *manifest.Manifest, opts Options) (*agentclient.MaterializeResult, error) {
	p, err := Prepare(ctx, m, opts)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(p.WriteTar(ctx, pw)) }()
	resp, err := c.Materialize(ctx, p.Plan, pr)
	pr.Close()
	if err != nil {
		return nil, fmt.Errorf("materialize: %w", err)
	}
	for _, m := range p.mounts {
		var files []agentclient.MaterializedFile
		for _, f := range resp.Files {
			if f.Path == m.path || strings.HasPrefix(f.Path, m.path+"/") {
				files = append(files, f)
			}
		}
		if err := m.fn(ctx, c, files); err != nil {
			return nil, fmt.Errorf("materialize: mount %s: %w", m.path, err)
		}
	}
	return resp, nil
}

// Prepare validates the manifest, fetches git repositories, walks host
// directories and builds the plan. Nothing is read into memory but inline
// content; file bytes are read when the tar stream is written.
func Prepare(ctx context.Context, m *manifest.Manifest, opts Options) (*Prepared, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	owner := opts.Owner
	if owner == "" && m.RunAs != "root" {
		owner = m.RunAs
	}
	if opts.Untrusted {
		if err := opts.GitPolicy.Validate(); err != nil {
			return nil, fmt.Errorf("materializer.Options.GitPolicy: %w", err)
		}
	}
	grants := make([]string, 0, len(opts.HostGrants))
	for _, g := range opts.HostGrants {
		if g = path.Clean(g); !path.IsAbs(g) || g == "/" {
			return nil, errkind.Errorf(errkind.ErrInvalidArgument, "host grant %q must be an absolute directory other than /", g)
		}
		grants = append(grants, g)
	}
	// The environment is resolved first: a secret that cannot be resolved
	// fails the plan before anything is fetched or written.
	env, err := environment(ctx, m, opts.Secrets)
	if err != nil {
		return nil, err
	}
	// Every plan, the ephemeral-only one after a restore included, sets
	// the environment: the daemon keeps it in memory only, so a replacement
	// sandbox gets it back this way.
	b := &builder{ctx: ctx, opts: opts, grants: grants, owner: owner, log: log, p: &Prepared{Plan: &agentclient.MaterializePlan{
		Environment: env, SetEnvironment: true,
	}}}
	for _, g := range m.Groups {
		b.p.Plan.Groups = append(b.p.Plan.Groups, agentclient.MaterializeGroup{Name: g.Name, GID: g.GID})
	}
	for _, u := range m.Users {
		b.p.Plan.Users = append(b.p.Plan.Users, agentclient.MaterializeUser{Name: u.Name, UID: u.UID, Groups: u.Groups, Home: u.Home, Shell: u.Shell})
	}
	// The run_as user owns its workspace root, so it can create files at
	// the top of it (entries without a group belong to it likewise).
	b.p.Plan.RootUser = owner
	b.p.Plan.SetGrants = true
	for _, g := range m.ExtraPathGrants {
		b.p.Plan.Grants = append(b.p.Plan.Grants, agentclient.MaterializeGrant{Path: g.Path, ReadOnly: g.ReadOnly})
	}
	if err := b.collect(m); err != nil {
		b.p.Close()
		return nil, err
	}
	return b.p, nil
}

// builder accumulates a plan.
type builder struct {
	ctx    context.Context
	opts   Options
	grants []string // opts.HostGrants, cleaned and checked
	owner  string
	log    *zap.Logger
	p      *Prepared
}

// expansion is the entries one host-backed manifest entry expands to,
// computed concurrently and appended in manifest order.
type expansion struct {
	entries []*agentclient.MaterializeEntry
	sources map[string]source // by path, for file entries
	cleanup []func()
	applied func(ctx context.Context, c *agentclient.Client, files []agentclient.MaterializedFile) error // mounts
	err     error
}

func (b *builder) collect(m *manifest.Manifest) error {
	type slot struct {
		path string
		e    *manifest.Entry
		x    *expansion
	}
	var slots []slot
	err := m.Walk(func(p string, e *manifest.Entry) error {
		if b.opts.Include != nil && !b.opts.Include(p, e) {
			if e.Type.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		slots = append(slots, slot{path: p, e: e})
		return nil
	})
	if err != nil {
		return err
	}
	// Host-backed entries expand concurrently, bounded.
	limit := b.opts.Concurrency
	if limit <= 0 {
		limit = 4
	}
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i := range slots {
		s := &slots[i]
		if s.e.Type != manifest.TypeLocalDir && s.e.Type != manifest.TypeGitRepo && s.e.Type != manifest.TypeLocalFile &&
			(!s.e.Type.IsMount() || b.opts.Mounts == nil) {
			continue
		}
		s.x = &expansion{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			b.expand(s.path, s.e, s.x)
		}()
	}
	wg.Wait()
	var firstErr error
	for _, s := range slots {
		if s.x != nil {
			b.p.cleanup = append(b.p.cleanup, s.x.cleanup...)
			if s.x.err != nil && firstErr == nil {
				firstErr = s.x.err
			}
		}
	}
	if firstErr != nil {
		return firstErr
	}
	for _, s := range slots {
		perm := s.e.EffectivePermissions()
		mode := uint32(perm.Perm())
		switch {
		case s.e.Type == manifest.TypeFile:
			content := s.e.Content
			b.add(&agentclient.MaterializeEntry{Path: s.path, Kind: agentclient.EntryFile,
				Mode: mode, User: b.ownerOf(s.e), Group: s.e.Group, Size: int64(len(content))},
				source{path: s.path, size: int64(len(content)), open: func() (io.ReadCloser, int64, error) {
					return io.NopCloser(bytesReader(content)), int64(len(content)), nil
				}})
		case s.e.Type == manifest.TypeDir:
			b.add(&agentclient.MaterializeEntry{Path: s.path, Kind: agentclient.EntryDirectory,
				Mode: mode, User: b.ownerOf(s.e), Group: s.e.Group})
		case s.e.Type.IsMount() && s.x == nil:
			// Without a Mounter no mount works: refusing keeps a run from
			// starting with a workspace that silently lacks the data it
			// asked for.
			return errkind.Errorf(errkind.ErrUnimplemented, "entry %s: %s mounts are not supported here (no mount reader configured: materializer.Options.Mounts); remove the entry or copy the data in with a file, dir or git entry", s.path, s.e.Type)
		case s.e.Type.IsMount():
			// The Mounter decided owners and modes (read-only or not).
			for _, we := range s.x.entries {
				if src, ok := s.x.sources[we.Path]; ok {
					b.add(we, src)
				} else {
					b.add(we)
				}
			}
			if s.x.applied != nil {
				b.p.mounts = append(b.p.mounts, mountApplied{path: s.path, fn: s.x.applied})
			}
		case s.x != nil:
			for _, we := range s.x.entries {
				// The manifest entry's owner, group and permissions apply to
				// its root; what lies below keeps the host's mode bits.
				if we.Kind != agentclient.EntrySymlink {
					we.User, we.Group = b.ownerOf(s.e), s.e.Group
					if we.Path == s.path {
						we.Mode = mode
					}
				}
				if src, ok := s.x.sources[we.Path]; ok {
					b.add(we, src)
				} else {
					b.add(we)
				}
			}
		default:
			return errkind.Errorf(errkind.ErrUnimplemented, "entry %s: type %s cannot be materialized", s.path, s.e.Type)
		}
	}
	return nil
}

// ownerOf is the user owning an entry (see Options.Owner).
func (b *builder) ownerOf(e *manifest.Entry) string {
	if e.Group != "" {
		return ""
	}
	return b.owner
}

// hostRoot returns the trusted directory a host source is read from and the
// source's path relative to it: BaseDir for a relative source, the
// innermost host grant holding an absolute one.
func (b *builder) hostRoot(src string) (root, rel string, err error) {
	if !path.IsAbs(src) {
		if b.opts.BaseDir == "" {
			return "", "", errkind.Errorf(errkind.ErrFailedPrecondition, "host sources need a trusted base directory (materializer.Options.BaseDir)")
		}
		return b.opts.BaseDir, src, nil
	}
	for _, g := range b.grants {
		if (src == g || strings.HasPrefix(src, g+"/")) && len(g) > len(root) {
			root = g
		}
	}
	if root == "" {
		// The path is the manifest's; it is not repeated (errors reach logs).
		return "", "", errkind.Errorf(errkind.ErrPermissionDenied, "the absolute host source is in none of the application's host grants (materializer.Options.HostGrants)")
	}
	if rel = strings.TrimPrefix(strings.TrimPrefix(src, root), "/"); rel == "" {
		rel = "."
	}
	return root, rel, nil
}

// add appends an entry (and its bytes' source, for files) to the plan.
func (b *builder) add(e *agentclient.MaterializeEntry, src ...source) {
	b.p.Plan.Entries = append(b.p.Plan.Entries, e)
	b.p.files = append(b.p.files, src...)
}

// expand reads a host-backed entry into x.
func (b *builder) expand(p string, e *manifest.Entry, x *expansion) {
	switch e.Type {
	case manifest.TypeLocalFile, manifest.TypeLocalDir:
		if e.Src == "" {
			x.err = errkind.Errorf(errkind.ErrFailedPrecondition, "entry %s: the host source was redacted; resume with the trusted manifest", p)
			return
		}
		base, src, err := b.hostRoot(e.Src)
		if err != nil {
			x.err = fmt.Errorf("entry %s: %w", p, err)
			return
		}
		x.entries, x.sources, x.err = walkHost(b.ctx, base, src, p, e.Type == manifest.TypeLocalDir, false, &x.cleanup)
	case manifest.TypeS3Mount, manifest.TypeR2Mount, manifest.TypeGCSMount, manifest.TypeAzureBlobMount, manifest.TypeS3FilesMount:
		mp, err := b.opts.Mounts.PlanMount(b.ctx, MountRequest{Session: b.opts.Session, Path: p, Entry: e, Owner: b.ownerOf(e)})
		if err != nil {
			x.err = fmt.Errorf("entry %s: %w", p, err)
			return
		}
		if mp.Close != nil {
			x.cleanup = append(x.cleanup, mp.Close)
		}
		x.entries, x.sources, x.applied = mp.Entries, map[string]source{}, mp.Applied
		for _, we := range mp.Entries {
			we.Volatile = true // fetched again at every start: not flushed to disk
			if we.Path != p && !strings.HasPrefix(we.Path, p+"/") {
				x.err = errkind.Errorf(errkind.ErrInternal, "entry %s: the mount planned %q outside its path", p, we.Path)
				return
			}
			if we.Kind == agentclient.EntryFile {
				wp := we.Path
				x.sources[wp] = source{path: wp, size: we.Size, open: func() (io.ReadCloser, int64, error) { return mp.Open(wp) }}
			}
		}
	case manifest.TypeGitRepo:
		dir, err := os.MkdirTemp("", "bulkhead-git-")
		if err != nil {
			x.err = fmt.Errorf("entry %s: %w", p, err)
			return
		}
		x.cleanup = append(x.cleanup, func() { _ = os.RemoveAll(dir) })
		git := b.opts.Git
		if git == nil {
			git = GitCLI{}
		}
		if b.opts.Untrusted {
			err = fetchUntrusted(b.ctx, b.log, b.opts.GitPolicy, git, p, e.Git, dir)
		} else if err = git.Fetch(b.ctx, e.Git, dir); err != nil {
			err = fmt.Errorf("fetch %s: %w", e.Git.Repo, err)
		}
		if err != nil {
			x.err = fmt.Errorf("entry %s: %w", p, err)
			return
		}
		src := "."
		if sub := path.Clean(e.Git.Subpath); e.Git.Subpath != "" && sub != "." {
			src = sub
		}
		x.entries, x.sources, x.err = walkHost(b.ctx, dir, src, p, true, true, &x.cleanup)
	}
}

// WriteTar writes the tar stream of the plan's files, in plan order, to w.
// A host file that changed size since it was planned is an error.
func (p *Prepared) WriteTar(ctx context.Context, w io.Writer) error {
	tw := tar.NewWriter(w)
	for _, f := range p.files {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, size, err := f.open()
		if err != nil {
			return fmt.Errorf("read source of %s: %w", f.path, err)
		}
		if size != f.size {
			r.Close()
			return errkind.Errorf(errkind.ErrConflict, "source of %s changed size while materializing (%d -> %d bytes)", f.path, f.size, size)
		}
		err = tw.WriteHeader(&tar.Header{Name: f.path, Typeflag: tar.TypeReg, Size: f.size, Mode: 0o644, Format: tar.FormatPAX})
		if err == nil {
			var n int64
			n, err = io.Copy(tw, io.LimitReader(r, f.size))
			if err == nil && n != f.size {
				err = errkind.Errorf(errkind.ErrConflict, "source of %s shrank while materializing", f.path)
			}
		}
		r.Close()
		if err != nil {
			return fmt.Errorf("stream %s: %w", f.path, err)
		}
	}
	return tw.Close()
}

// environment resolves the manifest's environment: literals as they are,
// secret references from the manifest copy when it holds them resolved,
// else through secrets. Errors name the variable and the secret, never a
// value; each distinct secret is looked up once.
func environment(ctx context.Context, m *manifest.Manifest, secrets manifest.SecretResolver) (map[string]string, error) {
	out := make(map[string]string, len(m.Environment))
	cache := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(m.Environment)) {
		v := m.Environment[name]
		if v.Secret == nil {
			out[name] = v.Value
			continue
		}
		if val, ok := v.Secret.Value(); ok {
			out[name] = val
			continue
		}
		secret := v.Secret.Name
		if val, ok := cache[secret]; ok {
			out[name] = val
			continue
		}
		if secrets == nil {
			return nil, errkind.Errorf(errkind.ErrFailedPrecondition,
				"environment variable %s: secret %q is not resolved and the harness has no secret resolver (materializer.Options.Secrets)", name, secret)
		}
		val, err := secrets.ResolveSecret(ctx, secret)
		if err != nil {
			return nil, fmt.Errorf("environment variable %s: resolving secret %q: %w", name, secret, err)
		}
		cache[secret] = val
		out[name] = val
	}
	return out, nil
}
