package harness

import (
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/shell"
)

// DefaultCapabilities returns fresh default capabilities: Filesystem
// (apply_patch, view_image) and Shell (exec_command, write_stdin).
func DefaultCapabilities() []capability.Capability {
	return []capability.Capability{filesystem.New(filesystem.Options{}), shell.New(shell.Options{})}
}
