// Package capability defines the unit a sandbox agent's abilities come in:
// a set of tools, the instruction fragment that tells the model how to use
// them, and any change they need in the run's manifest. The defaults are
// Filesystem (apply_patch, view_image) and Shell (exec_command,
// write_stdin), in the subpackages of the same names.
package capability

import (
	"context"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
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

// The optional interfaces below let a capability take part in more of a
// run. The runner checks for each with a type assertion on the run's clone.

// Requirer names capabilities that must be present in the same run (by
// Name); the run fails before any model call when one is missing.
type Requirer interface {
	Requires() []string
}

// RequestAdjuster changes every model request of the run before it is
// sent: sampling parameters, context management, extra instructions.
type RequestAdjuster interface {
	AdjustRequest(req *model.Request)
}

// InputFilter rewrites the conversation sent to the model (for example,
// dropping items a compaction made obsolete). It must not modify items in
// place; it returns the items to send.
type InputFilter interface {
	FilterInput(items []model.Item) []model.Item
}

// RunInfo is what start and end hooks see of a run.
type RunInfo struct {
	// Session is the run's sandbox session (nil without one) and Agent its
	// daemon client.
	Session *compute.Session
	Agent   *agentclient.Client
	// Model and ModelName are the run's model, for capabilities that make
	// model calls of their own (memory summaries).
	Model     model.Model
	ModelName string
	RunAs     string
	Workdir   string
	// Items is the conversation so far (at the end: the whole run).
	Items []model.Item
	// FinalOutput is set at the end of a successful run.
	FinalOutput string
	Log         *zap.Logger
}

// RunStarter is called once the run's session is ready, before the first
// model call; the text it returns is added to the instructions (for
// example, memories read from the workspace).
type RunStarter interface {
	OnRunStart(ctx context.Context, info RunInfo) (instructions string, err error)
}

// RunEnder is called when a run ends successfully, before its session is
// persisted (for example, to write memory files into the workspace).
type RunEnder interface {
	OnRunEnd(ctx context.Context, info RunInfo) error
}
