package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// sandbox is one live Pod as a Session sees it.
type sandbox struct {
	p      *Provider
	client *agentclient.Client
	state  State
	kept   bool

	closeOnce sync.Once
	closeErr  error
}

var _ compute.Sandbox = (*sandbox)(nil)

// Agent is the connected daemon client.
func (s *sandbox) Agent() *agentclient.Client { return s.client }

// State finds the Pod again; it holds no token.
func (s *sandbox) State() (json.RawMessage, error) { return s.state.encode() }

// WorkspaceKept is true after Reattach, or after Launch with a Prior whose
// workspace PVC was kept.
func (s *sandbox) WorkspaceKept() bool { return s.kept }

// Touch records activity now in the Pod's last-active annotation.
func (s *sandbox) Touch(ctx context.Context) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		AnnotationLastActive: time.Now().UTC().Format(time.RFC3339Nano),
	}}})
	if err != nil {
		return fmt.Errorf("kubernetes: activity patch: %w", err)
	}
	_, err = s.p.client.CoreV1().Pods(s.state.Namespace).Patch(ctx, s.state.Pod, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return s.p.apiErr("patch", "pods", s.state.Pod, err)
	}
	return nil
}

// Shutdown deletes the Pod (its processes end after the daemon drains; a
// Pod cannot be stopped and started again). Its workspace PVC, if any,
// stays for a replacement; Destroy removes the rest.
func (s *sandbox) Shutdown(ctx context.Context) error {
	fg := metav1.DeletePropagationForeground
	err := s.p.client.CoreV1().Pods(s.state.Namespace).Delete(ctx, s.state.Pod, metav1.DeleteOptions{PropagationPolicy: &fg})
	if err != nil && !apierrors.IsNotFound(err) {
		return s.p.apiErr("delete", "pods", s.state.Pod, err)
	}
	return nil
}

// Close closes the gRPC connection and leaves the Pod as it is.
func (s *sandbox) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.client.Close() })
	return s.closeErr
}
