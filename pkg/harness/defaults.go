package harness

import (
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/compaction"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/shell"
)

// DefaultCapabilities returns fresh default capabilities: Filesystem
// (apply_patch, view_image), Shell (exec_command, write_stdin) and
// Compaction (server-side context compaction sized to the model).
func DefaultCapabilities() []capability.Capability {
	return []capability.Capability{
		filesystem.New(filesystem.Options{}),
		shell.New(shell.Options{}),
		compaction.New(compaction.Options{}),
	}
}
