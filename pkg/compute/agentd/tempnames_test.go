package agentd

import (
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/archive"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/workspace"
)

// The archive engine no longer imports the workspace, so it keeps its own
// copy of the workspace's temporary-name prefix: an archive must skip (and a
// restore refuse) exactly the names the workspace's atomic writes use.
func TestArchiveAndWorkspaceAgreeOnTempNames(t *testing.T) {
	if archive.TempPrefix != workspace.TempPrefix {
		t.Fatalf("archive.TempPrefix = %q, workspace.TempPrefix = %q: they must be equal", archive.TempPrefix, workspace.TempPrefix)
	}
}
