package kubernetes

import (
	"context"
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

var _ compute.Pauser = (*Provider)(nil)

// Pause refuses: a Kubernetes sandbox cannot be paused with its memory
// and processes yet. It would need the kubelet's container checkpoint API
// (POST /checkpoint/{namespace}/{pod}/{container}, the
// ContainerCheckpoint feature, a CRI runtime that implements
// CheckpointContainer: CRI-O with CRIU, or a gVisor runtime handler) and
// a way to restore the archive into a new Pod, which Kubernetes does not
// offer as an API yet. Nothing is touched: Stop persists the workspace,
// Close deletes the Pod.
func (p *Provider) Pause(context.Context, compute.Sandbox, compute.PauseSpec) (*compute.PauseInfo, error) {
	return nil, fmt.Errorf("%w: kubernetes sandboxes cannot be paused with their memory and processes: that needs the kubelet's "+
		"container checkpoint (the ContainerCheckpoint feature and a CRI runtime with CheckpointContainer: CRI-O with CRIU, or gVisor) "+
		"and a restore of the archive into a new Pod, which Kubernetes has no API for yet; only the workspace is kept "+
		"(Stop, Close, Resume from the snapshot)", compute.ErrUnimplemented)
}
