package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// errNoWarmPod says a claim found nothing to claim (Launch then creates
// the sandbox cold).
var errNoWarmPod = errors.New("no ready pod in the pool")

// poolResync is how often the pool runner checks its pools when no claim
// prompted it.
const poolResync = 5 * time.Second

// poolRunner is the background work of StartPools.
type poolRunner struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   map[string]chan struct{}
}

// StartPools keeps every configured pool filled in the background until
// StopPools or Close: unclaimed Pods that died are replaced, claimed ones
// are replaced as soon as they are claimed. Calling it twice is a no-op.
func (p *Provider) StartPools(ctx context.Context) {
	p.poolMu.Lock()
	defer p.poolMu.Unlock()
	if p.poolRun != nil || len(p.cfg.Pools) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &poolRunner{cancel: cancel, kick: map[string]chan struct{}{}}
	for _, pool := range p.cfg.Pools {
		kick := make(chan struct{}, 1)
		r.kick[pool.Name] = kick
		r.wg.Add(1)
		go func(pool Pool) {
			defer r.wg.Done()
			t := time.NewTicker(poolResync)
			defer t.Stop()
			for {
				if _, err := p.FillPool(ctx, pool.Name); err != nil && ctx.Err() == nil {
					p.log.Warn("filling the warm pool", zap.String("pool", pool.Name), zap.Error(err))
				}
				select {
				case <-ctx.Done():
					return
				case <-kick:
				case <-t.C:
				}
			}
		}(pool)
	}
	p.poolRun = r
}

// StopPools stops the background work StartPools began (pool Pods stay).
func (p *Provider) StopPools() {
	p.poolMu.Lock()
	r := p.poolRun
	p.poolRun = nil
	p.poolMu.Unlock()
	if r != nil {
		r.cancel()
		r.wg.Wait()
	}
}

// kickPool asks the background runner, if any, to refill a pool now.
func (p *Provider) kickPool(name string) {
	p.poolMu.Lock()
	defer p.poolMu.Unlock()
	if p.poolRun == nil {
		return
	}
	select {
	case p.poolRun.kick[name] <- struct{}{}:
	default:
	}
}

// poolPods lists a pool's Pods not yet claimed, oldest first.
func (p *Provider) poolPods(ctx context.Context, name string) ([]corev1.Pod, string, error) {
	return p.listPool(ctx, name, "")
}

// claimablePods is poolPods as the API server's cache has them
// (resourceVersion 0: no read from etcd, nor a wait for the cache to
// catch up with it, on a claim's path). A Pod the list shows that was
// claimed or changed meanwhile fails the claim's update with a conflict,
// as it would a moment after a fresh list.
func (p *Provider) claimablePods(ctx context.Context, name string) ([]corev1.Pod, error) {
	pods, _, err := p.listPool(ctx, name, "0")
	return pods, err
}

func (p *Provider) listPool(ctx context.Context, name, rv string) ([]corev1.Pod, string, error) {
	list, err := p.client.CoreV1().Pods(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: p.selector(map[string]string{LabelPool: name, LabelClaimed: "false"}), ResourceVersion: rv})
	if err != nil {
		return nil, "", p.apiErr("list", "pods", "", err)
	}
	items := list.Items
	sort.SliceStable(items, func(i, j int) bool {
		if a, b := items[i].CreationTimestamp, items[j].CreationTimestamp; !a.Equal(&b) {
			return a.Before(&b)
		}
		return items[i].Name < items[j].Name
	})
	return items, list.ResourceVersion, nil
}

// FillPool makes one pass over a pool: unclaimed Pods that died are
// deleted, and new ones are created until the pool has Size unclaimed Pods
// (ready or starting). It returns how many it created. A pool held back
// (Config.PoolCooldown) gets no new Pods until its cooldown ends.
func (p *Provider) FillPool(ctx context.Context, name string) (int, error) {
	pool, ok := p.cfg.pool(name)
	if !ok {
		return 0, fmt.Errorf("kubernetes: %w: no pool named %q", compute.ErrInvalidArgument, name)
	}
	pods, _, err := p.poolPods(ctx, name)
	if err != nil {
		return 0, err
	}
	alive := 0
	for i := range pods {
		if why := podDead(&pods[i]); why != "" {
			if pods[i].DeletionTimestamp == nil {
				p.log.Info("replacing a dead warm pod", zap.String("pool", name), zap.String("pod", pods[i].Name), zap.String("why", why))
				_ = p.deleteSandbox(ctx, stateOf(&pods[i]), true)
			}
			continue
		}
		alive++
	}
	if _, held := p.poolHeld(pool); held {
		return 0, nil
	}
	made := 0
	var errs []error
	for ; alive+made < pool.Size; made++ {
		if err := p.createPoolPod(ctx, pool); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return made, errors.Join(errs...)
}

// createPoolPod creates one warm Pod of pool, with its own token Secret
// and NetworkPolicy, like a cold sandbox without a session (the policy,
// the Secret, the Pod, then the Pod's ownership of both).
func (p *Provider) createPoolPod(ctx context.Context, pool Pool) error {
	set, err := p.cfg.settings(&pool.Template.Options)
	if err != nil {
		return err
	}
	key, err := randomHex(8)
	if err != nil {
		return err
	}
	objLabels := p.ownerLabels(nil)
	objLabels[LabelSandbox] = "1"
	objLabels[LabelKey] = key
	objLabels[LabelPool] = pool.Name
	objLabels[LabelClaimed] = "false"
	annots := map[string]string{AnnotationWorkspace: pool.Template.WorkspaceRoot, AnnotationRunAs: pool.Template.RunAs}
	var cleanup []func(context.Context)
	fail := func(err error) error {
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i](bg)
		}
		return err
	}
	if boolOr(p.cfg.NetworkPolicy, true) {
		np := p.policyFor(key, objLabels)
		cleanup = append(cleanup, func(bg context.Context) { p.deleteRetrying(bg, "networkpolicies", policyName(key)) })
		if _, err := p.client.NetworkingV1().NetworkPolicies(p.cfg.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return fail(p.apiErr("create", "networkpolicies", np.Name, err))
		}
	}
	cleanup = append(cleanup, func(bg context.Context) { p.deleteRetrying(bg, "secrets", secretName(key)) })
	if _, err := p.createToken(ctx, key, objLabels, true); err != nil {
		return fail(err)
	}
	pod := p.podFor(podParams{key: key, set: set, root: pool.Template.WorkspaceRoot, runAs: pool.Template.RunAs, labels: objLabels, annots: annots, readiness: true})
	cleanup = append(cleanup, func(bg context.Context) { p.deleteRetrying(bg, "pods", pod.Name) })
	created, err := p.client.CoreV1().Pods(p.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fail(p.apiErr("create", "pods", pod.Name, err))
	}
	if err := p.adopt(ctx, created, key); err != nil {
		return fail(err)
	}
	return nil
}

// poolCooldown holds a pool back after a claim found that its image's
// daemon cannot rotate tokens (Config.PoolCooldown).
type poolCooldown struct {
	image string // the image whose daemon refused RotateToken
	until time.Time
}

// startCooldown holds pool back until Config.PoolCooldown from now,
// because a Pod of image could not rotate its token. It returns the end
// of the cooldown, and false when one for the same image was running
// already (a concurrent claim found out first).
func (p *Provider) startCooldown(pool, image string) (time.Time, bool) {
	p.coolMu.Lock()
	defer p.coolMu.Unlock()
	now := p.now()
	if cd, ok := p.cooling[pool]; ok && cd.image == image && now.Before(cd.until) {
		return cd.until, false
	}
	if p.cooling == nil {
		p.cooling = map[string]poolCooldown{}
	}
	cd := poolCooldown{image: image, until: now.Add(p.cfg.PoolCooldown)}
	p.cooling[pool] = cd
	return cd.until, true
}

// cooldown returns the pool's running cooldown; one that has ended is
// forgotten, and its end logged.
func (p *Provider) cooldown(pool string) (poolCooldown, bool) {
	p.coolMu.Lock()
	defer p.coolMu.Unlock()
	cd, ok := p.cooling[pool]
	if !ok {
		return cd, false
	}
	if p.now().Before(cd.until) {
		return cd, true
	}
	delete(p.cooling, pool)
	p.log.Info("the warm pool's cooldown is over: the next claim tries it again", zap.String("pool", pool), zap.String("image", cd.image))
	return poolCooldown{}, false
}

// poolHeld reports the pool's cooldown when it holds back the Pods the
// pool's template makes (the failed image is the template's).
func (p *Provider) poolHeld(pool Pool) (poolCooldown, bool) {
	cd, ok := p.cooldown(pool.Name)
	if !ok {
		return cd, false
	}
	set, err := p.cfg.settings(&pool.Template.Options)
	return cd, err == nil && set.image == cd.image
}

// podReady reports the Pod's Ready condition (its daemon answers the
// kubelet's gRPC health probe).
func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitPoolReady watches until the pool has at least n ready unclaimed Pods.
func (p *Provider) WaitPoolReady(ctx context.Context, name string, n int) error {
	for {
		pods, rv, err := p.poolPods(ctx, name)
		if err != nil {
			return err
		}
		ready := 0
		for i := range pods {
			if podReady(&pods[i]) {
				ready++
			}
		}
		if ready >= n {
			return nil
		}
		w, err := p.client.CoreV1().Pods(p.cfg.Namespace).Watch(ctx, metav1.ListOptions{
			LabelSelector: p.selector(map[string]string{LabelPool: name}), ResourceVersion: rv,
		})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("kubernetes: pool %s: %w: %d of %d pods ready", name, compute.ErrDeadlineExceeded, ready, n)
			}
			return p.apiErr("watch", "pods", "", err)
		}
		func() {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok || ev.Type == watch.Error {
						return
					}
					if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Modified && podReady(pod) {
						return // count again
					}
				}
			}
		}()
		if ctx.Err() != nil {
			return fmt.Errorf("kubernetes: pool %s: %w: %d of %d pods ready", name, compute.ErrDeadlineExceeded, ready, n)
		}
	}
}

// DrainPool deletes a pool's unclaimed Pods (and what they own).
func (p *Provider) DrainPool(ctx context.Context, name string) error {
	pods, _, err := p.poolPods(ctx, name)
	if err != nil {
		return err
	}
	var errs []error
	for i := range pods {
		errs = append(errs, p.deleteSandbox(ctx, stateOf(&pods[i]), true))
	}
	return errors.Join(errs...)
}

// Token rotation of a claimed warm Pod, crash-safe.
//
// A warm Pod's daemon starts with a pool token (in its Secret under
// tokenKey). The claimer moves it to a fresh session token in three
// steps, each of which leaves a state that any harness process can
// recover from with Reattach (see Provider.attach):
//
//  1. stage: the new token goes into the Secret under nextTokenKey, at
//     the resourceVersion the claimer read (so of two processes rotating
//     the same sandbox, one stages and the other gets a conflict);
//  2. rotate: SystemService.RotateToken, authenticated with the current
//     token; from then on the daemon refuses the old one;
//  3. promote: one patch writes the new token under tokenKey, removes
//     nextTokenKey and marks the Secret AnnotationTokenRotated.
//
// A claim hands the sandbox out after step 2 and promotes in the
// background (promoteLater; the sandbox's Close waits for it): its path
// is then the claim's update, the staging and RotateToken, while the
// Secret read and the connection to the daemon with the pool token are
// made during the update (preconnect).
//
// A crash after 1 leaves a staged token the daemon does not know yet
// (Reattach connects with the current token and finishes 2 and 3); after
// 2, a daemon that refuses the token in tokenKey and accepts the staged
// one (Reattach promotes it); before 1, a claimed pool Pod whose Secret
// is not marked rotated (Reattach rotates it before handing it out). No
// step leaves a Secret that holds no token the daemon accepts, and no
// path hands out a claimed sandbox still on its pool token.
const (
	// nextTokenKey is the Secret key of a token being rotated in.
	nextTokenKey = "next"
	// AnnotationTokenRotated marks a pool sandbox's Secret whose token is
	// its session's (the claim's rotation completed); its value is the
	// time of the promotion.
	AnnotationTokenRotated = labelPrefix + "token-rotated"
)

// rotateStep names the points between rotation steps (rotateHook).
type rotateStep string

const (
	// stepClaimed: the Pod is claimed; Secret and daemon hold the pool token.
	stepClaimed rotateStep = "claimed"
	// stepStaged: the Secret also holds the new token under nextTokenKey.
	stepStaged rotateStep = "staged"
	// stepRotated: the daemon accepts only the new token; the Secret has it
	// under nextTokenKey only.
	stepRotated rotateStep = "rotated"
	// stepAttached: a reattach connected with the Secret's token and is
	// about to finish whatever rotation the Secret shows (attach).
	stepAttached rotateStep = "attached"
)

// rotateHook is called between the steps of a rotation, with the
// sandbox's state. Tests put one in the context (withRotateHook) to stop
// the process there, as a crash would; production code never sets one.
type rotateHook func(step rotateStep, st State)

type rotateHookKey struct{}

// withRotateHook returns ctx carrying h for the rotations done under it.
func withRotateHook(ctx context.Context, h rotateHook) context.Context {
	return context.WithValue(ctx, rotateHookKey{}, h)
}

func runRotateHook(ctx context.Context, step rotateStep, st State) {
	if h, ok := ctx.Value(rotateHookKey{}).(rotateHook); ok && h != nil {
		h(step, st)
	}
}

// tokenSecret is what rotation reads of a sandbox's Secret.
type tokenSecret struct {
	token   string // tokenKey
	next    string // nextTokenKey, "" when no rotation is under way
	rotated bool   // AnnotationTokenRotated is set
	rv      string // the Secret's resourceVersion
}

func readTokenSecret(sec *corev1.Secret) tokenSecret {
	_, rotated := sec.Annotations[AnnotationTokenRotated]
	return tokenSecret{
		token:   strings.TrimSpace(string(sec.Data[tokenKey])),
		next:    strings.TrimSpace(string(sec.Data[nextTokenKey])),
		rotated: rotated,
		rv:      sec.ResourceVersion,
	}
}

// stageToken writes token into the sandbox's Secret under nextTokenKey,
// provided the Secret is still at resourceVersion rv (a merge patch that
// names a resourceVersion is refused with a conflict when the object has
// moved on).
func (p *Provider) stageToken(ctx context.Context, key, rv, token string) error {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": rv},
		"data":     map[string][]byte{nextTokenKey: []byte(token)},
	})
	if err != nil {
		return fmt.Errorf("kubernetes: token patch: %w", err)
	}
	name := secretName(key)
	if _, err := p.client.CoreV1().Secrets(p.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return p.apiErr("patch", "secrets", name, err)
	}
	return nil
}

// promoteToken makes token (which the daemon accepts) the Secret's token,
// removes the staged one and marks the Secret rotated. It is idempotent,
// so two processes finishing the same rotation both succeed.
func (p *Provider) promoteToken(ctx context.Context, key, token string) error {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{AnnotationTokenRotated: time.Now().UTC().Format(time.RFC3339Nano)}},
		"data":     map[string]any{tokenKey: []byte(token), nextTokenKey: nil},
	})
	if err != nil {
		return fmt.Errorf("kubernetes: token patch: %w", err)
	}
	name := secretName(key)
	if _, err := p.client.CoreV1().Secrets(p.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return p.apiErr("patch", "secrets", name, err)
	}
	return nil
}

// rotateTo gives the daemon sb is connected to the staged token (steps 2
// and 3). sb's client uses the new token from then on.
func (p *Provider) rotateTo(ctx context.Context, sb *sandbox, token string) error {
	if err := p.rotateDaemon(ctx, sb, token); err != nil {
		return err
	}
	return p.promoteToken(ctx, sb.state.Key, token)
}

// rotateDaemon is step 2: the daemon takes the staged token and refuses
// the one sb connected with.
func (p *Provider) rotateDaemon(ctx context.Context, sb *sandbox, token string) error {
	if err := sb.client.RotateToken(ctx, token); err != nil {
		return fmt.Errorf("kubernetes: pod %s: giving the daemon the session's token: %w", sb.state.Pod, err)
	}
	runRotateHook(ctx, stepRotated, sb.state)
	return nil
}

// promoteTimeout bounds a claim's promotion run after Launch returned
// (promoteLater), retries included.
const promoteTimeout = 30 * time.Second

// promoteLater runs step 3 of a claim's rotation in the background, so
// that the claim's path ends at the daemon taking the token: until it is
// done the Secret is in the state a crash after step 2 leaves (the daemon
// takes only the staged token), which any Reattach finishes (attach), as
// it would the promotion of a claimer that died there. Transient errors
// are retried; sb.Close waits for it.
func (p *Provider) promoteLater(ctx context.Context, sb *sandbox, token string) {
	done := make(chan struct{})
	sb.promoted = done
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), promoteTimeout)
	go func() {
		defer close(done)
		defer cancel()
		for delay := 50 * time.Millisecond; ; delay = min(delay*2, 2*time.Second) {
			err := p.promoteToken(ctx, sb.state.Key, token)
			if err == nil {
				return
			}
			if !compute.Retryable(err) || errors.Is(err, compute.ErrNotFound) {
				p.log.Warn("recording the session's token in the claimed pod's Secret failed; a reattach finishes it", zap.String("pod", sb.state.Pod), zap.Error(err))
				return
			}
			select {
			case <-ctx.Done():
				p.log.Warn("recording the session's token in the claimed pod's Secret gave up: the API server did not answer; a reattach finishes it", zap.String("pod", sb.state.Pod), zap.Error(err))
				return
			case <-time.After(delay):
			}
		}
	}()
}

// rotate runs a whole rotation (steps 1 to 3) for a sandbox connected
// with cur.token, cur being its Secret as last read.
func (p *Provider) rotate(ctx context.Context, sb *sandbox, cur tokenSecret) error {
	token, err := randomHex(32)
	if err != nil {
		return err
	}
	if err := p.stageToken(ctx, sb.state.Key, cur.rv, token); err != nil {
		return err
	}
	runRotateHook(ctx, stepStaged, sb.state)
	return p.rotateTo(ctx, sb, token)
}

// takeClaimed finishes the claim of a Pod this process has just claimed
// (pod, as the claim's update returned it): it stages a fresh session
// token in the Pod's Secret, as last read by pre, while pre's connection
// to the daemon with the pool token (begun while the claim was written)
// completes, and rotates the daemon to the staged token.
//
// From the claim's update on, the Pod is a listed sandbox of the session,
// and a Reattach of its state (another harness process resuming the
// session, a console attaching to a listed sandbox) finishes its rotation
// as if the claimer had crashed: it stages its own token at the same
// resourceVersion (the claimer's staging then conflicts), or rotates the
// daemon to the claimer's staged token (the claimer's RotateToken, with
// the pool token, is then refused). Either way the token moved under the
// claim, not away from it: the claimer finishes the same way (attach)
// and keeps the Pod, rather than deleting one that the other process has
// just handed out.
func (p *Provider) takeClaimed(ctx context.Context, st State, pod *corev1.Pod, pre *preconnect) (*sandbox, error) {
	runRotateHook(ctx, stepClaimed, st)
	sec, err := pre.secret()
	if err != nil {
		pre.abandon()
		return nil, err
	}
	token, err := randomHex(32)
	if err != nil {
		pre.abandon()
		return nil, err
	}
	serr := p.stageToken(ctx, st.Key, sec.rv, token)
	sb, err := pre.sandbox()
	if err == nil {
		sb.state = st
		err = serr
	}
	if err == nil {
		runRotateHook(ctx, stepStaged, st)
		if err = p.rotateDaemon(ctx, sb, token); err == nil {
			p.promoteLater(ctx, sb, token)
			return sb, nil
		}
	}
	if sb != nil {
		_ = sb.Close()
	}
	if !errors.Is(err, compute.ErrConflict) && !errors.Is(err, compute.ErrUnauthenticated) {
		return nil, err
	}
	p.log.Info("another process moved the claimed pod's token during the claim (a reattach finishing its rotation); attaching with its Secret",
		zap.String("pod", st.Pod), zap.Error(err))
	sb, aerr := p.attach(ctx, st, pod)
	if aerr != nil {
		return nil, fmt.Errorf("%w (after the token moved under the claim: %w)", aerr, err)
	}
	sb.kept = false // a fresh claim: the session's workspace is not there yet
	return sb, nil
}

// preconnect is the work a claim does on a candidate Pod while its
// update is in flight, so that little of it is left on the claim's path
// once the claim wins: it reads the Pod's Secret (the pool token, and the
// resourceVersion that staging names) and connects to the daemon with the
// pool token (connect: dial, readiness). Nothing is changed: a lost claim
// abandons it (the connection is closed).
type preconnect struct {
	cancel context.CancelFunc
	secc   chan tokenRead    // the Secret's read, put back after each look
	sbc    chan sandboxOrErr // the connection, taken once
}

type tokenRead struct {
	sec tokenSecret
	err error
}

type sandboxOrErr struct {
	sb  *sandbox
	err error
}

// startPreconnect begins the reads and the connection for cand, as listed.
func (p *Provider) startPreconnect(ctx context.Context, cand *corev1.Pod) *preconnect {
	ctx, cancel := context.WithCancel(ctx)
	pre := &preconnect{cancel: cancel, secc: make(chan tokenRead, 1), sbc: make(chan sandboxOrErr, 1)}
	go func() {
		key := cand.Labels[LabelKey]
		got, err := p.client.CoreV1().Secrets(p.cfg.Namespace).Get(ctx, secretName(key), metav1.GetOptions{})
		if err != nil {
			err = p.apiErr("get", "secrets", secretName(key), err)
			pre.secc <- tokenRead{err: err}
			pre.sbc <- sandboxOrErr{err: err}
			return
		}
		sec := readTokenSecret(got)
		pre.secc <- tokenRead{sec: sec}
		sb, err := p.connect(ctx, stateOf(cand), cand, sec.token, false)
		pre.sbc <- sandboxOrErr{sb, err}
	}()
	return pre
}

// secret waits for the Secret's read.
func (pre *preconnect) secret() (tokenSecret, error) {
	r := <-pre.secc
	pre.secc <- r // for a second look
	return r.sec, r.err
}

// sandbox waits for the connection; it is the caller's from then on.
func (pre *preconnect) sandbox() (*sandbox, error) {
	r := <-pre.sbc
	pre.cancel()
	return r.sb, r.err
}

// abandon stops the work and closes the connection if one is made.
func (pre *preconnect) abandon() {
	pre.cancel()
	go func() {
		if r := <-pre.sbc; r.sb != nil {
			_ = r.sb.Close()
		}
	}()
}

// claim takes a ready Pod of the pool for the session: an optimistic
// update of its labels at the resourceVersion it was listed at. A
// conflict means another harness claimed (or changed) it first; the next
// candidate is tried. It returns errNoWarmPod when no Pod could be
// claimed or the pool cannot serve this session; the error says why:
// none was ready, claims lost to other claimers, or (wrapped) what each
// Pod claimed and then given up failed with.
func (p *Provider) claim(ctx context.Context, name string, spec compute.LaunchSpec, root, runAs string) (*sandbox, error) {
	pool, _ := p.cfg.pool(name)
	if root != pool.Template.WorkspaceRoot {
		return nil, fmt.Errorf("%w: the session's workspace root %s is not the pool's %s", errNoWarmPod, root, pool.Template.WorkspaceRoot)
	}
	if runAs != pool.Template.RunAs && !(runAs == "root" && pool.Template.RunAs == "") {
		return nil, fmt.Errorf("%w: the session runs as %q, the pool's daemons as %q", errNoWarmPod, runAs, pool.Template.RunAs)
	}
	cd, cooling := p.cooldown(name)
	if set, err := p.cfg.settings(&pool.Template.Options); cooling && err == nil && set.image == cd.image {
		return nil, fmt.Errorf("%w %s (held back until %s: the daemon of its image %s cannot rotate tokens)", errNoWarmPod, name, cd.until.UTC().Format(time.RFC3339), cd.image)
	}
	pods, err := p.claimablePods(ctx, name)
	if err != nil {
		return nil, err
	}
	lifetime := spec.Lifetime
	if lifetime.CreatedAt.IsZero() {
		lifetime.CreatedAt = time.Now()
	}
	conflicts := 0
	var failed claimFailures
	for i := range pods {
		cand := &pods[i]
		if !podReady(cand) || (cooling && stateOf(cand).Image == cd.image) {
			continue
		}
		// The pool token is read, and the daemon connected to with it,
		// while the claim is written (preconnect): they are used only if
		// the claim wins, and then only to rotate the pool token away
		// (takeClaimed).
		pre := p.startPreconnect(ctx, cand)
		upd := cand.DeepCopy()
		for k, v := range p.ownerLabels(spec.Labels) {
			if _, set := upd.Labels[k]; !set {
				upd.Labels[k] = v
			}
		}
		upd.Labels[LabelClaimed] = "true"
		upd.Labels[LabelSession] = sessionLabel(spec.SessionID)
		if upd.Annotations == nil {
			upd.Annotations = map[string]string{}
		}
		upd.Annotations[AnnotationSession] = spec.SessionID
		activeAt := time.Now()
		upd.Annotations[AnnotationLastActive] = activeAt.UTC().Format(time.RFC3339Nano)
		lifetimeAnnotations(lifetime, upd.Annotations)
		got, err := p.client.CoreV1().Pods(p.cfg.Namespace).Update(ctx, upd, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			pre.abandon()
			conflicts++
			continue // someone else claimed it first
		}
		if err != nil {
			pre.abandon()
			return nil, p.apiErr("update", "pods", cand.Name, err)
		}
		st := stateOf(got)
		_, tokenErr := pre.secret()
		sb, err := p.takeClaimed(ctx, st, got, pre)
		tooOld := errors.Is(err, compute.ErrUnimplemented)
		if tooOld {
			// The pool's image has a daemon from before RotateToken: none
			// of its Pods can be handed out without their pool token.
			// Hold the pool back (before the refill below, which then
			// makes no more of them), and say so once per cooldown.
			until, started := p.startCooldown(name, st.Image)
			if started {
				p.log.Error("the warm pool's daemon cannot rotate its token (its image predates SystemService.RotateToken): deleting the claimed pod; sessions are created cold and the pool is neither claimed from nor refilled until the cooldown ends: rebuild the pool's image",
					zap.String("pool", name), zap.String("pod", got.Name), zap.String("image", st.Image), zap.Time("until", until), zap.Error(err))
			} else {
				p.log.Info("deleting another claimed pod of a held-back warm pool", zap.String("pool", name), zap.String("pod", got.Name))
			}
		}
		p.kickPool(name) // the pool lost a Pod
		if tooOld {
			_ = p.deleteSandbox(ctx, st, true)
			return nil, fmt.Errorf("%w %s (its daemon cannot rotate tokens: %w)", errNoWarmPod, name, err)
		}
		if err != nil {
			p.log.Warn("a claimed warm pod does not answer; deleting it", zap.String("pod", got.Name), zap.Error(err))
			_ = p.deleteSandbox(ctx, st, true)
			what := "did not answer"
			if tokenErr != nil {
				what = "had no readable token"
			}
			failed = append(failed, fmt.Errorf("claimed pod %s %s: %w", got.Name, what, err))
			continue
		}
		sb.recordedActive(activeAt)
		p.log.Info("claimed a warm pod", zap.String("pool", name), zap.String("pod", got.Name), zap.String("session", spec.SessionID))
		return sb, nil
	}
	lost := fmt.Sprintf("%d lost to other claimers", conflicts)
	switch {
	case len(failed) > 0 && conflicts > 0:
		return nil, fmt.Errorf("%w %s (%w; %s)", errNoWarmPod, name, failed, lost)
	case len(failed) > 0:
		return nil, fmt.Errorf("%w %s (%w)", errNoWarmPod, name, failed)
	case conflicts > 0:
		return nil, fmt.Errorf("%w %s (%s)", errNoWarmPod, name, lost)
	}
	return nil, fmt.Errorf("%w %s (none ready)", errNoWarmPod, name)
}

// claimFailures are the claimed Pods a claim had to give up, each with
// why; it wraps them all and names the first few.
type claimFailures []error

// claimFailuresShown is how many claimFailures.Error names.
const claimFailuresShown = 3

func (f claimFailures) Error() string {
	msgs := make([]string, 0, claimFailuresShown+1)
	for i, err := range f {
		if i == claimFailuresShown {
			msgs = append(msgs, fmt.Sprintf("and %d more", len(f)-i))
			break
		}
		msgs = append(msgs, err.Error())
	}
	return strings.Join(msgs, "; ")
}

func (f claimFailures) Unwrap() []error { return f }
