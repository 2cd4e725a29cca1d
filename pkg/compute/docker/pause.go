package docker

import (
	"context"
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

var _ compute.Pauser = (*Provider)(nil)

// Pause refuses: a Docker sandbox cannot be paused with its memory and
// processes yet. It would need the engine's experimental checkpoints
// (`docker checkpoint create`, CRIU on the host, an engine started with
// --experimental), or a gVisor runtime's own checkpoint (runsc through
// the engine's runtime), neither of which this provider drives. Nothing is
// touched: Stop persists the workspace, Close shuts the container down.
func (p *Provider) Pause(context.Context, compute.Sandbox, compute.PauseSpec) (*compute.PauseInfo, error) {
	return nil, fmt.Errorf("%w: docker sandboxes cannot be paused with their memory and processes: that needs Docker's checkpoints "+
		"(CRIU on the host, an --experimental engine: `docker checkpoint create`), which this provider does not drive; "+
		"only the workspace is kept (Stop, Close, Resume from the snapshot)", compute.ErrUnimplemented)
}
