// Package capability defines the unit a sandbox agent's abilities come in:
// a set of tools, the instruction fragment that tells the model how to use
// them, and any change they need in the run's manifest. The defaults are
// Filesystem (apply_patch, view_image) and Shell (exec_command,
// write_stdin), in the subpackages of the same names.
package capability

import (
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Capability is one ability of a sandbox agent.
//
// A capability value configured on an agent is a template: the runner
// calls Clone once per run, so per-run state (a process table, a cache)
// never leaks between runs, and calls the other methods on the clone.
type Capability interface {
	// Name identifies the capability ("shell", "filesystem", ...).
	Name() string
	// Clone returns a fresh copy for one run.
	Clone() Capability
	// Tools returns the tools given to the model in this run.
	Tools(env Env) []tool.Tool
	// Instructions returns the fragment added to the model's instructions
	// ("" for none).
	Instructions(env Env) string
	// ProcessManifest returns the manifest the run's session is created
	// with, possibly changed (an entry the capability needs). It must not
	// modify m; return m itself when nothing changes.
	ProcessManifest(m *manifest.Manifest) (*manifest.Manifest, error)
}

// Env describes the run a capability is used in.
type Env struct {
	// HasSession is set when the run has a sandbox session.
	HasSession bool
	// Model is the model's name (for model-specific tool shapes).
	Model string
}

// Closer is implemented by capabilities holding per-run resources (running
// processes); the runner calls Close when the run ends.
type Closer interface {
	Close() error
}
