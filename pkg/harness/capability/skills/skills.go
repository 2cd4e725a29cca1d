// Package skills is the Skills capability of a sandbox agent: packaged
// instructions ("skills") the model can pick up when a task calls for them.
//
// A skill is a bundle: a directory holding a SKILL.md file, whose YAML
// frontmatter gives the skill's name and a one-line description, and any
// other files the instructions refer to (scripts/, references/, assets/).
// The harness reads bundles from a host directory and/or from a git
// repository it fetches itself (with its own credentials; nothing but the
// bundles' bytes reaches the sandbox). Every bundle is validated when the
// capability is built and kept in memory from then on.
//
// The model gets an index of the skills (name, description, directory)
// in its instructions. Skills are staged in the workspace under
// DefaultPath/<name>/ (".agents/skills/<name>/"), either lazily, the
// default, when the model calls the load_skill tool for one, or eagerly as
// inline manifest entries created with the session.
package skills

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Name is the capability's name.
const Name = "skills"

// Defaults.
const (
	// DefaultPath is the workspace-relative directory skills are staged
	// under, one subdirectory per skill.
	DefaultPath = ".agents/skills"
	// SkillFile is the file that defines a bundle.
	SkillFile = "SKILL.md"
	// DefaultMaxSkillFileBytes bounds a bundle's SKILL.md.
	DefaultMaxSkillFileBytes = 256 << 10
	// DefaultMaxBundleBytes bounds the bytes of all files of one bundle.
	DefaultMaxBundleBytes = 8 << 20
	// DefaultMaxBundleFiles bounds the number of files in one bundle.
	DefaultMaxBundleFiles = 512
	// DefaultMaxTotalBytes bounds the bytes of all bundles together (they
	// are held in memory).
	DefaultMaxTotalBytes = 64 << 20
	// DefaultFetchTimeout bounds the git fetch of New.
	DefaultFetchTimeout = 5 * time.Minute
	// MaxNameBytes and MaxDescriptionBytes bound the frontmatter fields.
	MaxNameBytes        = 64
	MaxDescriptionBytes = 1024
)

// Mode says when skills are staged in the workspace.
type Mode int

// Modes.
const (
	// Lazy stages a skill when the model calls load_skill for it (the
	// default): the instructions carry only the index.
	Lazy Mode = iota
	// Eager adds every skill to the session's manifest, so all of them
	// are in the workspace from the start; there is no load_skill tool.
	Eager
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case Lazy:
		return "lazy"
	case Eager:
		return "eager"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Options configure the capability. At least one source (Dir or Git) is
// required; when both are set, their skills are combined (and a name found
// in both is an error).
type Options struct {
	// Dir is a host directory whose immediate subdirectories are skill
	// bundles. Files directly in Dir and subdirectories whose name starts
	// with "." are ignored; every other subdirectory must be a valid
	// bundle.
	Dir string
	// Git is a repository the harness fetches into a temporary directory
	// to read bundles from: Repo, Ref ("" fetches the default branch),
	// Host, Subpath (the directory holding the bundles; "" is the
	// repository's top) and Token (a secret reference the application has
	// resolved, see manifest.SecretRef.WithValue).
	Git *manifest.GitRepo
	// Fetcher fetches Git; nil means materializer.GitCLI{} (the git
	// command line on the harness host).
	Fetcher materializer.GitFetcher
	// TempDir is where the repository is fetched ("" is os.TempDir());
	// the checkout is removed once its bundles are read.
	TempDir string
	// FetchTimeout bounds the fetch made by New (default
	// DefaultFetchTimeout); Load is bounded by its context instead.
	FetchTimeout time.Duration

	// Path is the workspace-relative directory skills are staged under
	// (default DefaultPath).
	Path string
	// Mode is Lazy (the default) or Eager.
	Mode Mode

	// Limits; zero or less means the default.
	MaxSkillFileBytes int64
	MaxBundleBytes    int64
	MaxBundleFiles    int
	MaxTotalBytes     int64

	// Log receives what was discovered (names and sizes, never contents);
	// nil means no logging.
	Log *zap.Logger
}

// withDefaults fills unset options.
func (o Options) withDefaults() Options {
	if o.Path == "" {
		o.Path = DefaultPath
	}
	if o.FetchTimeout <= 0 {
		o.FetchTimeout = DefaultFetchTimeout
	}
	if o.MaxSkillFileBytes <= 0 {
		o.MaxSkillFileBytes = DefaultMaxSkillFileBytes
	}
	if o.MaxBundleBytes <= 0 {
		o.MaxBundleBytes = DefaultMaxBundleBytes
	}
	if o.MaxBundleFiles <= 0 {
		o.MaxBundleFiles = DefaultMaxBundleFiles
	}
	if o.MaxTotalBytes <= 0 {
		o.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if o.Fetcher == nil {
		o.Fetcher = materializer.GitCLI{}
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return o
}

// Bundle describes one skill.
type Bundle struct {
	// Name and Description come from the frontmatter.
	Name        string
	Description string
	// Path is the workspace-relative directory the skill is staged in.
	Path string
	// Files lists the bundle's files relative to Path, SKILL.md included,
	// sorted.
	Files []string
	// Size is the bytes of all files.
	Size int64
}

// Skills is the capability. The bundles are read once and shared by every
// clone; a clone remembers which skills it staged in its run.
type Skills struct {
	opts    Options
	bundles []*bundle          // sorted by name; never modified
	byName  map[string]*bundle // never modified

	mu     sync.Mutex // serializes load_skill calls of one run
	loaded map[string]bool
}

var _ capability.Capability = (*Skills)(nil)

// New reads and validates the skills of opts, fetching the git source (if
// any) within opts.FetchTimeout, and returns the capability.
func New(opts Options) (capability.Capability, error) {
	opts = opts.withDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), opts.FetchTimeout)
	defer cancel()
	return Load(ctx, opts)
}

// Load is New with a context bounding the git fetch, returning the
// concrete type (for Bundles).
func Load(ctx context.Context, opts Options) (*Skills, error) {
	opts = opts.withDefaults()
	if err := manifest.ValidateEntryPath(opts.Path); err != nil {
		return nil, fmt.Errorf("skills: staging path %q: %w", opts.Path, err)
	}
	if opts.Mode != Lazy && opts.Mode != Eager {
		return nil, fmt.Errorf("skills: unknown mode %v", opts.Mode)
	}
	if opts.Dir == "" && opts.Git == nil {
		return nil, errors.New("skills: no source: set Options.Dir, Options.Git, or both")
	}
	lim := limits{skillFile: opts.MaxSkillFileBytes, bundle: opts.MaxBundleBytes, files: opts.MaxBundleFiles,
		total: opts.MaxTotalBytes}
	var all []*bundle
	if opts.Dir != "" {
		bs, err := readDir(opts.Dir, &lim)
		if err != nil {
			return nil, err
		}
		all = append(all, bs...)
	}
	if opts.Git != nil {
		bs, err := readGit(ctx, opts, &lim)
		if err != nil {
			return nil, err
		}
		all = append(all, bs...)
	}
	s := &Skills{opts: opts, byName: map[string]*bundle{}, loaded: map[string]bool{}}
	for _, b := range all {
		if prev, dup := s.byName[b.name]; dup {
			return nil, fmt.Errorf("skills: two bundles are named %q (in %s and in %s)", b.name, prev.source, b.source)
		}
		s.byName[b.name] = b
	}
	s.bundles = all
	slices.SortFunc(s.bundles, func(a, b *bundle) int { return strings.Compare(a.name, b.name) })
	names := make([]string, len(s.bundles))
	for i, b := range s.bundles {
		names[i] = b.name
	}
	opts.Log.Info("skills discovered", zap.Strings("skills", names), zap.Int64("bytes", lim.used),
		zap.Stringer("mode", opts.Mode))
	return s, nil
}

// Bundles describes the skills, sorted by name.
func (s *Skills) Bundles() []Bundle {
	out := make([]Bundle, len(s.bundles))
	for i, b := range s.bundles {
		files := make([]string, len(b.files))
		for j, f := range b.files {
			files[j] = f.path
		}
		out[i] = Bundle{Name: b.name, Description: b.description, Path: s.dir(b), Files: files, Size: b.size}
	}
	return out
}

// dir is the workspace-relative directory of b.
func (s *Skills) dir(b *bundle) string { return path.Join(s.opts.Path, b.name) }

// Name returns "skills".
func (s *Skills) Name() string { return Name }

// Clone returns a copy for one run, sharing the bundles, with nothing
// staged yet.
func (s *Skills) Clone() capability.Capability {
	return &Skills{opts: s.opts, bundles: s.bundles, byName: s.byName, loaded: map[string]bool{}}
}

// Tools returns load_skill in lazy mode for a run with a sandbox session,
// and nothing otherwise.
func (s *Skills) Tools(env capability.Env) []tool.Tool {
	if !env.HasSession || s.opts.Mode != Lazy {
		return nil
	}
	return []tool.Tool{&loadSkillTool{s: s}}
}

// Instructions returns the index of the skills and how to use them ("" for
// a run without a sandbox session).
func (s *Skills) Instructions(env capability.Env) string {
	if !env.HasSession {
		return ""
	}
	return s.index()
}
