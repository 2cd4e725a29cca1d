package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
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

	// activeAt is when this process last recorded activity in the Pod's
	// last-active annotation (the create, the claim, a Touch); zero when
	// it has not.
	activeMu sync.Mutex
	activeAt time.Time

	// promoted, when not nil, is closed once the claim's promotion of its
	// token in the Secret, run after Launch returned, has ended
	// (promoteLater).
	promoted chan struct{}

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

// touchSkip is how recent the activity this process recorded on the Pod
// may be for Touch to write nothing: the create and the claim record it,
// and the session's start, right after, would write it again (one more
// request to the API server on the way to the first command); idle
// timeouts are minutes.
const touchSkip = 5 * time.Second

// Touch records activity now in the Pod's last-active annotation, unless
// this process recorded it less than touchSkip ago.
func (s *sandbox) Touch(ctx context.Context) error {
	now := time.Now()
	s.activeMu.Lock()
	recent := !s.activeAt.IsZero() && now.Sub(s.activeAt) < touchSkip
	s.activeMu.Unlock()
	if recent {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		AnnotationLastActive: now.UTC().Format(time.RFC3339Nano),
	}}})
	if err != nil {
		return fmt.Errorf("kubernetes: activity patch: %w", err)
	}
	_, err = s.p.client.CoreV1().Pods(s.state.Namespace).Patch(ctx, s.state.Pod, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return s.p.apiErr("patch", "pods", s.state.Pod, err)
	}
	s.recordedActive(now)
	return nil
}

// recordedActive notes that the Pod's last-active annotation says at.
func (s *sandbox) recordedActive(at time.Time) {
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	if at.After(s.activeAt) {
		s.activeAt = at
	}
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

// Close waits for the claim's token promotion, if one is under way,
// closes the gRPC connection and leaves the Pod as it is.
func (s *sandbox) Close() error {
	s.closeOnce.Do(func() {
		s.waitPromoted()
		s.closeErr = s.client.Close()
	})
	return s.closeErr
}

// waitPromoted waits until the claim's token promotion, if any, has ended.
func (s *sandbox) waitPromoted() {
	if s.promoted != nil {
		<-s.promoted
	}
}

// attachAttempts bounds how often attach reads the token Secret again
// after another process changed the token under it.
const attachAttempts = 4

// attach connects to a live sandbox Pod with the token its Secret holds,
// and finishes a token rotation that a crashed (or concurrent) claimer
// left half done (the steps are described in pool.go):
//
//   - the daemon refuses the Secret's token and accepts the staged one:
//     the staged token is promoted;
//   - a token is staged and the daemon still accepts the current one: the
//     daemon is rotated to the staged token, which is then promoted;
//   - a claimed pool Pod whose Secret is not marked rotated: a whole
//     rotation, so that no session works with a pool token.
//
// When the token changes meanwhile (a refused token, a lost race to stage
// or to rotate), the Secret is read again, a bounded number of times.
func (p *Provider) attach(ctx context.Context, st State, pod *corev1.Pod) (*sandbox, error) {
	var lastErr error
	lastRV := ""
	for range attachAttempts {
		sec, err := p.client.CoreV1().Secrets(st.Namespace).Get(ctx, secretName(st.Key), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubernetes: sandbox %s: %w: its token Secret is gone", st.Pod, compute.ErrNotFound)
		}
		if err != nil {
			return nil, p.apiErr("get", "secrets", secretName(st.Key), err)
		}
		ts := readTokenSecret(sec)
		if len(ts.token) != 64 || (ts.next != "" && len(ts.next) != 64) {
			return nil, fmt.Errorf("kubernetes: sandbox %s: %w: its token Secret is malformed", st.Pod, compute.ErrNotFound)
		}
		if lastErr != nil && ts.rv == lastRV && ts.next == "" {
			// Nothing changed since the last refusal: it is not a race.
			// (With a token staged, the daemon may have moved to it under
			// the last attempt before its rotator promoted it: the next
			// attempt finds out.)
			return nil, lastErr
		}
		lastRV = ts.rv
		sb, err := p.connect(ctx, st, pod, ts.token, true)
		switch {
		case err == nil:
			runRotateHook(ctx, stepAttached, st)
			if err = p.settle(ctx, sb, pod, ts); err == nil {
				return sb, nil
			}
			_ = sb.Close()
		case errors.Is(err, compute.ErrUnauthenticated) && ts.next != "":
			// Crashed between RotateToken and the promotion.
			if sb, err = p.connect(ctx, st, pod, ts.next, true); err == nil {
				p.log.Info("finishing an interrupted token rotation: the daemon has the staged token; promoting it", zap.String("pod", st.Pod))
				if err = p.promoteToken(ctx, st.Key, ts.next); err == nil {
					return sb, nil
				}
				_ = sb.Close()
			}
		}
		if !errors.Is(err, compute.ErrUnauthenticated) && !errors.Is(err, compute.ErrConflict) {
			return nil, err
		}
		lastErr = err
	}
	return nil, fmt.Errorf("kubernetes: sandbox %s: the token changed under every attempt to reattach: %w", st.Pod, lastErr)
}

// settle finishes, for a sandbox connected with ts.token, a rotation
// that was left half done; it does nothing for a settled one.
func (p *Provider) settle(ctx context.Context, sb *sandbox, pod *corev1.Pod, ts tokenSecret) error {
	switch {
	case ts.next != "":
		// Crashed between staging and RotateToken.
		p.log.Info("finishing an interrupted token rotation: giving the daemon the staged token", zap.String("pod", sb.state.Pod))
		return p.rotateTo(ctx, sb, ts.next)
	case pod.Labels[LabelPool] != "" && pod.Labels[LabelClaimed] == "true" && !ts.rotated:
		// Crashed between the claim and staging.
		p.log.Info("a claimed warm pod still has its pool token; rotating it", zap.String("pod", sb.state.Pod))
		if err := p.rotate(ctx, sb, ts); err != nil {
			return fmt.Errorf("kubernetes: sandbox %s: it still has its pool token and could not be given a session token: %w", sb.state.Pod, err)
		}
	}
	return nil
}
