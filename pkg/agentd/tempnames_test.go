package agentd

import (
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
	"github.com/bulkhead-dev/bulkhead/pkg/archive"
)

// The archive engine no longer imports the workspace, so it keeps its own
// copy of the workspace's temporary-name prefix: an archive must skip (and a
// restore refuse) exactly the names the workspace's atomic writes use.
func TestArchiveAndWorkspaceAgreeOnTempNames(t *testing.T) {
	if archive.TempPrefix != workspace.TempPrefix {
		t.Fatalf("archive.TempPrefix = %q, workspace.TempPrefix = %q: they must be equal", archive.TempPrefix, workspace.TempPrefix)
	}
}

// A restore keeps its journal, stage and backup in names with the
// archive's reserved prefix; the workspace refuses requests that would
// touch them, so both must mean the same names.
func TestArchiveAndWorkspaceAgreeOnReservedNames(t *testing.T) {
	if archive.ReservedPrefix != workspace.ReservedPrefix {
		t.Fatalf("archive.ReservedPrefix = %q, workspace.ReservedPrefix = %q: they must be equal", archive.ReservedPrefix, workspace.ReservedPrefix)
	}
}
