// Package memory is the Memory capability: notes an agent keeps in its
// workspace across runs, so that what one run learned (how the project
// builds, what failed, what the user prefers) helps the next.
//
// At the start of a run the capability reads the memory summary from the
// workspace (bounded by Options.MaxReadBytes) and adds it to the model's
// instructions, marked as data from the workspace. At the end of a
// successful run it makes one model call that merges what the run taught
// into the summary, and writes the result back through the sandbox daemon
// (atomically, as the run's run_as account). Because memories live in the
// workspace, snapshots and resumed sessions carry them.
//
// The layout follows the OpenAI Agents SDK's sandbox memory where it
// overlaps: the memory directory (default "memories") holds
// memory_summary.md, the file shown to the model at the start of each run;
// MEMORY.md and rollout_summaries/, when someone keeps them there, are
// pointed to but not read. Memory can be read-only (read, never updated)
// or disabled.
package memory

import (
	"fmt"
	"path"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Name is the capability's name.
const Name = "memory"

// Layout and defaults.
const (
	// DefaultDir is the memory directory, relative to the workspace root.
	DefaultDir = "memories"
	// SummaryFile is the file read at the start of a run and rewritten at
	// its end, inside the memory directory.
	SummaryFile = "memory_summary.md"
	// RegistryFile and RolloutSummariesDir are the reference layout's
	// detailed notes; they are mentioned to the model when present.
	RegistryFile        = "MEMORY.md"
	RolloutSummariesDir = "rollout_summaries"

	// DefaultMaxReadBytes bounds the memory added to the instructions.
	DefaultMaxReadBytes = 32 << 10
	// DefaultMaxItemBytes bounds each tool call's arguments and each tool
	// output in the transcript given to the summary call.
	DefaultMaxItemBytes = 2 << 10
	// DefaultMaxTranscriptBytes bounds the whole transcript.
	DefaultMaxTranscriptBytes = 128 << 10
)

// Mode says what the capability does with memories.
type Mode int

// Modes.
const (
	// ReadWrite reads memories at the start of a run and updates them at
	// its end (the default).
	ReadWrite Mode = iota
	// ReadOnly reads memories but never updates them (and never calls the
	// model).
	ReadOnly
	// Disabled does nothing at all.
	Disabled
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case ReadWrite:
		return "read-write"
	case ReadOnly:
		return "read-only"
	case Disabled:
		return "disabled"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Options configure the capability. The zero value reads and updates
// memories in DefaultDir with the run's own model.
type Options struct {
	// Dir is the memory directory, relative to the workspace root
	// (default DefaultDir).
	Dir string
	// Mode is ReadWrite (default), ReadOnly or Disabled.
	Mode Mode
	// MaxReadBytes bounds the memory added to the instructions; a longer
	// summary keeps its beginning and end (default DefaultMaxReadBytes).
	// The summary call is asked to stay well under it.
	MaxReadBytes int
	// SummaryModel names the model of the summary call; "" uses the run's
	// model name.
	SummaryModel string
	// SummaryPrompt replaces the summary call's instructions (DefaultPrompt
	// with its size limit filled in).
	SummaryPrompt string
	// MaxItemBytes bounds each tool call's arguments and each tool output
	// in the transcript (default DefaultMaxItemBytes).
	MaxItemBytes int
	// MaxTranscriptBytes bounds the whole transcript; a longer one keeps
	// its beginning and end (default DefaultMaxTranscriptBytes).
	MaxTranscriptBytes int
}

// withDefaults fills in the defaults.
func (o Options) withDefaults() Options {
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.MaxReadBytes <= 0 {
		o.MaxReadBytes = DefaultMaxReadBytes
	}
	if o.MaxItemBytes <= 0 {
		o.MaxItemBytes = DefaultMaxItemBytes
	}
	if o.MaxTranscriptBytes <= 0 {
		o.MaxTranscriptBytes = DefaultMaxTranscriptBytes
	}
	return o
}

// Memory is the capability. It keeps no per-run state.
type Memory struct {
	opts Options
	// dir is opts.Dir cleaned; cfgErr says why the options are unusable.
	dir    string
	cfgErr error
}

var (
	_ capability.RunStarter = (*Memory)(nil)
	_ capability.RunEnder   = (*Memory)(nil)
)

// New returns the Memory capability configured by opts.
func New(opts Options) capability.Capability {
	return newMemory(opts)
}

func newMemory(opts Options) *Memory {
	m := &Memory{opts: opts.withDefaults()}
	m.dir, m.cfgErr = cleanDir(m.opts.Dir)
	if m.cfgErr == nil && (m.opts.Mode < ReadWrite || m.opts.Mode > Disabled) {
		m.cfgErr = fmt.Errorf("memory: unknown mode %d", int(m.opts.Mode))
	}
	return m
}

// cleanDir checks that dir is a workspace-relative path inside the
// workspace and returns it cleaned.
func cleanDir(dir string) (string, error) {
	c := path.Clean(dir)
	if path.IsAbs(c) || c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("memory: directory %q must be a path inside the workspace, relative to its root", dir)
	}
	return c, nil
}

// Name implements capability.Capability.
func (m *Memory) Name() string { return Name }

// Clone implements capability.Capability.
func (m *Memory) Clone() capability.Capability {
	c := *m
	return &c
}

// Tools implements capability.Capability: memory has no tools.
func (m *Memory) Tools(capability.Env) []tool.Tool { return nil }

// ProcessManifest implements capability.Capability: the manifest is kept
// as it is (the memory directory is created when first written).
func (m *Memory) ProcessManifest(mf *manifest.Manifest) (*manifest.Manifest, error) {
	if m.cfgErr != nil {
		return nil, m.cfgErr
	}
	return mf, nil
}

// Instructions implements capability.Capability: a short note on where
// memories live and how they are kept.
func (m *Memory) Instructions(env capability.Env) string {
	if !env.HasSession || m.opts.Mode == Disabled || m.cfgErr != nil {
		return ""
	}
	s := fmt.Sprintf("Memory: notes that earlier runs left about this workspace are kept in `%s/` (relative to the workspace root); "+
		"when there are any, their summary is shown at the end of these instructions.", m.dir)
	switch m.opts.Mode {
	case ReadOnly:
		s += " The memory is read-only: do not create, edit or delete files there."
	default:
		s += " It is updated automatically from this conversation after your final answer, so you do not need to write memory files yourself."
	}
	return s
}

// summaryPath is the workspace-relative path of the summary file.
func (m *Memory) summaryPath() string { return path.Join(m.dir, SummaryFile) }
