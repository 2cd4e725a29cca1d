package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Provider runs sandboxes as Pods. It is safe for concurrent use; it keeps
// no per-sandbox state in memory: the API server's objects are the state.
type Provider struct {
	cfg    Config
	log    *zap.Logger
	client Clientset
	rest   *rest.Config
	// params encodes the options of exec requests (the core/v1 scheme).
	params runtime.ParameterCodec

	poolMu  sync.Mutex
	poolRun *poolRunner

	coolMu  sync.Mutex
	cooling map[string]poolCooldown // by pool name (Config.PoolCooldown)
	// now is the clock of pool cooldowns (time.Now; tests move it).
	now func() time.Time
}

var (
	_ compute.Provider        = (*Provider)(nil)
	_ compute.AccountProvider = (*Provider)(nil)
)

// New makes a provider talking to the API server restCfg describes (the
// client-side rate limits Config.QPS and Burst apply). It does no I/O.
func New(cfg Config, restCfg *rest.Config, log *zap.Logger) (*Provider, error) {
	if restCfg == nil {
		return nil, fmt.Errorf("kubernetes: %w: no REST config", compute.ErrInvalidArgument)
	}
	rc := rest.CopyConfig(restCfg)
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = c.QPS, c.Burst
	if rc.UserAgent == "" {
		rc.UserAgent = "bulkhead-harness"
	}
	cs, err := newClientset(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client: %w", err)
	}
	return NewWithClient(cfg, cs, rc, log)
}

// NewFromKubeconfig makes a provider from a kubeconfig file (empty: the
// usual loading rules, $KUBECONFIG then ~/.kube/config, or the in-cluster
// configuration when there is none). Config.Namespace defaults to the
// kubeconfig context's namespace.
func NewFromKubeconfig(cfg Config, kubeconfig string, log *zap.Logger) (*Provider, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w: kubeconfig: %v", compute.ErrInvalidArgument, err)
	}
	if cfg.Namespace == "" {
		if ns, _, err := cc.Namespace(); err == nil {
			cfg.Namespace = ns
		}
	}
	return New(cfg, rc, log)
}

// NewWithClient makes a provider over an existing clientset (client-go's,
// or its fake one in tests, through an adapter: see Clientset). restCfg
// may be nil; port-forward and exec relays then fail.
func NewWithClient(cfg Config, client Clientset, restCfg *rest.Config, log *zap.Logger) (*Provider, error) {
	if log == nil {
		log = zap.NewNop()
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Provider{cfg: cfg, log: log.With(zap.String("provider", ProviderName), zap.String("namespace", cfg.Namespace)), client: client, rest: restCfg,
		params: newAPICodecs().params, now: time.Now}, nil
}

// Name is "kubernetes".
func (p *Provider) Name() string { return ProviderName }

// Config returns the configuration with its defaults filled in.
func (p *Provider) Config() Config { return p.cfg }

// API returns the clientset the provider uses (tests and diagnostics).
func (p *Provider) API() Clientset { return p.client }

// DefaultRunAs gives a session whose manifest names no run_as user an
// unprivileged account of its own, when the daemon runs as root in its
// container (it cannot create accounts otherwise).
func (p *Provider) DefaultRunAs() *manifest.User {
	if p.cfg.RunAsUser != nil {
		return nil
	}
	return &manifest.User{Name: compute.DefaultRunAsName}
}

// Close stops the warm pools' background work. Sandboxes and pool Pods are
// left as they are.
func (p *Provider) Close() error {
	p.StopPools()
	return nil
}

// Launch creates a sandbox Pod (or claims one from a warm pool) and
// returns it connected. With spec.Prior set, the earlier Pod (if any) is
// deleted and its workspace PVC, if kept, is mounted again (WorkspaceKept).
// A Prior that is not spec.SessionID's sandbox is refused with
// ErrInvalidArgument before anything is deleted, created or mounted: one
// naming a warm pool Pod not claimed for spec.SessionID and the state's
// session (unclaimed, or another session's), or a cold Pod created for
// another session (claimedFor, after one Pod read), or, when the new
// sandbox would mount it, a workspace PVC not made for the session
// (volumeFor, after one PVC read).
func (p *Provider) Launch(ctx context.Context, spec compute.LaunchSpec) (compute.Sandbox, error) {
	if spec.SessionID == "" {
		return nil, fmt.Errorf("kubernetes: launch: %w: empty session id", compute.ErrInvalidArgument)
	}
	set, err := p.cfg.settings(spec.Options)
	if err != nil {
		return nil, err
	}
	root, runAs := manifest.DefaultRoot, ""
	if m := spec.Manifest; m != nil {
		root, runAs = m.WorkspaceRoot(), m.RunAs
		if p.cfg.RunAsUser != nil && (m.RunAs != "" || len(m.Users) > 0 || len(m.Groups) > 0) {
			return nil, fmt.Errorf("kubernetes: launch: %w: the daemon runs as non-root uid %d (Config.RunAsUser), so it cannot create the manifest's accounts or run as %q",
				compute.ErrFailedPrecondition, *p.cfg.RunAsUser, m.RunAs)
		}
	}
	if err := checkRoot(root); err != nil {
		return nil, err
	}
	log := p.log.With(zap.String("session", spec.SessionID))

	var prior *State
	if len(spec.Prior) > 0 {
		st, err := DecodeState(spec.Prior)
		if err != nil {
			return nil, err
		}
		prior = &st
		if set.volume {
			// The PVC this launch mounts again (Launch reads it below).
			if err := p.vetVolume(ctx, p.cfg.Namespace, st, spec.SessionID, "mount it"); err != nil {
				return nil, err
			}
		}
		if err := p.deleteClaimed(ctx, st, st.Volume != "", spec.SessionID, "replace it"); err != nil {
			return nil, err
		}
	}

	if set.pool != "" && !set.volume && prior == nil {
		sb, err := p.claim(ctx, set.pool, spec, root, runAs)
		switch {
		case err == nil:
			return sb, nil
		case errors.Is(err, errNoWarmPod):
			log.Info("no warm pod to claim; creating one cold", zap.String("pool", set.pool), zap.String("why", err.Error()))
		default:
			return nil, err
		}
	}

	key, err := randomHex(8)
	if err != nil {
		return nil, err
	}
	lifetime := spec.Lifetime
	if lifetime.CreatedAt.IsZero() {
		lifetime.CreatedAt = time.Now()
	}
	objLabels := p.ownerLabels(spec.Labels)
	objLabels[LabelSandbox] = "1"
	objLabels[LabelKey] = key
	objLabels[LabelSession] = sessionLabel(spec.SessionID)
	activeAt := time.Now()
	annots := map[string]string{AnnotationSession: spec.SessionID, AnnotationWorkspace: root,
		AnnotationLastActive: activeAt.UTC().Format(time.RFC3339Nano)}
	lifetimeAnnotations(lifetime, annots)

	var cleanup []func(context.Context)
	fail := func(err error) (compute.Sandbox, error) {
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StopTimeout+30*time.Second)
		defer cancel()
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i](bg)
		}
		return nil, err
	}

	// Workspace PVC.
	volName, kept := "", false
	if set.volume {
		volName = VolumeName(spec.SessionID)
		if prior != nil && prior.Volume != "" {
			volName = prior.Volume
		}
		_, err := p.client.CoreV1().PersistentVolumeClaims(p.cfg.Namespace).Get(ctx, volName, metav1.GetOptions{})
		switch {
		case err == nil && prior == nil:
			return nil, fmt.Errorf("kubernetes: %w: workspace claim %s already exists (left by an earlier sandbox of session %s): launch with that sandbox's state as Prior to reuse it, or destroy it",
				compute.ErrAlreadyExists, volName, spec.SessionID)
		case err == nil:
			kept = true
			log.Info("reusing the preserved workspace claim", zap.String("pvc", volName))
		case apierrors.IsNotFound(err):
			vl := p.ownerLabels(spec.Labels)
			vl[LabelWorkspaceVolume] = "1"
			vl[LabelSession] = sessionLabel(spec.SessionID)
			va := map[string]string{AnnotationSession: spec.SessionID}
			// Each cleanup is registered before its create: a create whose
			// answer was lost (the API server restarting) may have happened.
			cleanup = append(cleanup, func(bg context.Context) { p.deleteRetrying(bg, "persistentvolumeclaims", volName) })
			if _, err := p.client.CoreV1().PersistentVolumeClaims(p.cfg.Namespace).Create(ctx, p.claimFor(volName, vl, va, set.disk), metav1.CreateOptions{}); err != nil {
				return fail(p.apiErr("create", "persistentvolumeclaims", volName, err))
			}
		default:
			return nil, p.apiErr("get", "persistentvolumeclaims", volName, err)
		}
		annots[AnnotationVolume] = volName
	}

	// The NetworkPolicy comes first, so the Pod is never unprotected, then
	// the token Secret, so the kubelet finds it when it mounts the Pod's
	// volumes; the Pod becomes the owner of both once it exists (adopt).
	if boolOr(p.cfg.NetworkPolicy, true) {
		np := p.policyFor(key, objLabels)
		cleanup = append(cleanup, func(bg context.Context) { p.deleteRetrying(bg, "networkpolicies", policyName(key)) })
		if _, err := p.client.NetworkingV1().NetworkPolicies(p.cfg.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return fail(p.apiErr("create", "networkpolicies", np.Name, err))
		}
	}
	cleanup = append(cleanup, func(bg context.Context) { p.deleteRetrying(bg, "secrets", secretName(key)) })
	token, err := p.createToken(ctx, key, objLabels, false)
	if err != nil {
		return fail(err)
	}

	pod := p.podFor(podParams{key: key, set: set, root: root, runAs: runAs, volume: volName, labels: objLabels, annots: annots})
	cleanup = append(cleanup, func(bg context.Context) { p.deleteRetrying(bg, "pods", pod.Name) })
	created, err := p.client.CoreV1().Pods(p.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fail(p.apiErr("create", "pods", pod.Name, err))
	}
	// The owner patches run while the Pod starts.
	adopted := make(chan error, 1)
	go func() { adopted <- p.adopt(ctx, created, key) }()
	st := stateOf(created)
	sb, err := p.connect(ctx, st, created, token, kept)
	if aerr := <-adopted; err == nil && aerr != nil {
		_ = sb.Close()
		err = aerr
	}
	if err != nil {
		return fail(err)
	}
	sb.recordedActive(activeAt)
	log.Info("sandbox started", zap.String("pod", created.Name), zap.String("image", set.image), zap.Bool("workspace_kept", kept))
	return sb, nil
}

// createToken makes a fresh token and its Secret, without an owner yet
// (mutable for a warm pool Pod, see secretFor).
func (p *Provider) createToken(ctx context.Context, key string, objLabels map[string]string, mutable bool) (string, error) {
	token, err := randomHex(32)
	if err != nil {
		return "", err
	}
	sec := p.secretFor(key, token, objLabels, mutable)
	if _, err := p.client.CoreV1().Secrets(p.cfg.Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return "", p.apiErr("create", "secrets", sec.Name, err)
	}
	return token, nil
}

// adopt makes pod the owner of its token Secret and, unless disabled, its
// NetworkPolicy (both patches at once), so garbage collection removes
// them with it.
func (p *Provider) adopt(ctx context.Context, pod *corev1.Pod, key string) error {
	if !boolOr(p.cfg.NetworkPolicy, true) {
		return p.adoptSecret(ctx, pod, key)
	}
	policy := make(chan error, 1)
	go func() { policy <- p.adoptPolicy(ctx, pod, key) }()
	return errors.Join(p.adoptSecret(ctx, pod, key), <-policy)
}

// ownerPatch is a merge patch making pod the owner of an object.
func ownerPatch(pod *corev1.Pod) ([]byte, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": ownedBy(pod)}})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: owner patch: %w", err)
	}
	return patch, nil
}

// adoptSecret makes pod the owner of its token Secret.
func (p *Provider) adoptSecret(ctx context.Context, pod *corev1.Pod, key string) error {
	patch, err := ownerPatch(pod)
	if err != nil {
		return err
	}
	if _, err := p.client.CoreV1().Secrets(p.cfg.Namespace).Patch(ctx, secretName(key), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return p.apiErr("patch", "secrets", secretName(key), err)
	}
	return nil
}

// adoptPolicy makes pod the owner of its NetworkPolicy.
func (p *Provider) adoptPolicy(ctx context.Context, pod *corev1.Pod, key string) error {
	patch, err := ownerPatch(pod)
	if err != nil {
		return err
	}
	if _, err := p.client.NetworkingV1().NetworkPolicies(p.cfg.Namespace).Patch(ctx, policyName(key), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return p.apiErr("patch", "networkpolicies", policyName(key), err)
	}
	return nil
}

// connect waits for the Pod to run, dials its daemon and waits until it
// serves and accepts the token.
func (p *Provider) connect(ctx context.Context, st State, pod *corev1.Pod, token string, kept bool) (*sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout)
	defer cancel()
	running, err := p.waitRunning(ctx, pod)
	if err != nil {
		return nil, err
	}
	addr, dopts, err := p.dialOptions(running)
	if err != nil {
		return nil, err
	}
	dopts = append(dopts, p.podGoneOptions(st)...)
	dopts = append(dopts, p.cfg.AgentDialOptions...)
	ac, err := agentclient.Dial(agentclient.Options{Address: addr, Token: token, DialOptions: dopts, TracerProvider: compute.RPCTracing(ctx)})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: pod %s: %w", pod.Name, err)
	}
	var lastCheck time.Time
	_, err = agentclient.WaitReady(ctx, ac, agentclient.ReadyOptions{Alive: func(ctx context.Context) error {
		if time.Since(lastCheck) < time.Second {
			return nil
		}
		lastCheck = time.Now()
		cur, err := p.client.CoreV1().Pods(p.cfg.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return compute.MarkRetryable(fmt.Errorf("%w: pod %s was deleted during start-up", compute.ErrUnavailable, pod.Name))
		}
		if err == nil {
			if why := podDead(cur); why != "" {
				return compute.MarkRetryable(fmt.Errorf("%w: pod %s %s", compute.ErrUnavailable, pod.Name, why))
			}
		}
		return nil
	}})
	if err != nil {
		_ = ac.Close()
		if p.cfg.Connect == ConnectPortForward && p.cfg.RuntimeClassName != "" && errors.Is(err, compute.ErrDeadlineExceeded) {
			// Under a sandboxed runtime (gVisor, Kata) the kubelet's
			// port-forward dials the host's network namespace, where the
			// daemon does not listen: say so and name the way that works.
			return nil, fmt.Errorf("kubernetes: pod %s (runtime class %s) over port-forward: %w; port-forward does not reach a daemon under a sandboxed runtime such as gVisor or Kata: use the exec connection (Connect: %q, --kube-connect %s)",
				pod.Name, p.cfg.RuntimeClassName, err, ConnectExec, ConnectExec)
		}
		return nil, fmt.Errorf("kubernetes: pod %s: %w", pod.Name, err)
	}
	return &sandbox{p: p, client: ac, state: st, kept: kept}, nil
}

// podDead says why a Pod can no longer serve ("" while it can).
func podDead(pod *corev1.Pod) string {
	if pod.DeletionTimestamp != nil {
		return "is being deleted"
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		why := "stopped (phase " + string(pod.Status.Phase)
		if pod.Status.Reason != "" {
			why += ", reason " + pod.Status.Reason
		}
		if pod.Status.Message != "" {
			why += ": " + pod.Status.Message
		}
		for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
			if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
				why += fmt.Sprintf("; container %s exited %d (%s)", cs.Name, t.ExitCode, t.Reason)
				if m := strings.TrimSpace(t.Message); m != "" {
					why += ": " + lastLines(m, 5)
				}
			}
		}
		return why + ")"
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return fmt.Sprintf("cannot start container %s: %s: %s", cs.Name, w.Reason, w.Message)
			}
		}
	}
	return ""
}

func lastLines(s string, n int) string {
	ls := strings.Split(s, "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// waitRunning watches the Pod until its daemon can be dialled (dialable:
// the Pod is returned as then read), it fails, or it disappears.
func (p *Provider) waitRunning(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	check := func(cur *corev1.Pod) (*corev1.Pod, bool, error) {
		if why := podDead(cur); why != "" {
			return nil, true, compute.MarkRetryable(fmt.Errorf("kubernetes: pod %s: %w: %s", cur.Name, compute.ErrUnavailable, why))
		}
		if p.dialable(cur) {
			return cur, true, nil
		}
		return nil, false, nil
	}
	if got, done, err := check(pod); done {
		return got, err
	}
	rv := pod.ResourceVersion
	var hiccup apiHiccup
	for {
		w, err := p.client.CoreV1().Pods(p.cfg.Namespace).Watch(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String(), ResourceVersion: rv,
			AllowWatchBookmarks: true,
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, p.waitErr(ctx, pod.Name)
			}
			if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
				rv = ""
				continue
			}
			if hiccup.wait(ctx, err) {
				continue
			}
			if ctx.Err() != nil {
				return nil, p.waitErr(ctx, pod.Name)
			}
			return nil, p.apiErr("watch", "pods", pod.Name, err)
		}
		hiccup.reset()
		got, done, err := func() (*corev1.Pod, bool, error) {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil, true, p.waitErr(ctx, pod.Name)
				case ev, ok := <-w.ResultChan():
					if !ok {
						return nil, false, nil // the watch ended: start another
					}
					switch ev.Type {
					case watch.Deleted:
						return nil, true, compute.MarkRetryable(fmt.Errorf("kubernetes: pod %s: %w: deleted before it ran", pod.Name, compute.ErrUnavailable))
					case watch.Error:
						if st, ok := ev.Object.(*metav1.Status); ok && (st.Code == 410 || st.Reason == metav1.StatusReasonExpired || st.Reason == metav1.StatusReasonGone) {
							rv = ""
						}
						return nil, false, nil
					case watch.Bookmark:
						if cur, ok := ev.Object.(*corev1.Pod); ok {
							rv = cur.ResourceVersion
						}
					case watch.Added, watch.Modified:
						cur, ok := ev.Object.(*corev1.Pod)
						if !ok {
							continue
						}
						rv = cur.ResourceVersion
						if got, done, err := check(cur); done {
							return got, true, err
						}
					}
				}
			}
		}()
		if done {
			return got, err
		}
		if rv == "" {
			// Resync from a fresh read.
			cur, err := p.client.CoreV1().Pods(p.cfg.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) {
					return nil, compute.MarkRetryable(fmt.Errorf("kubernetes: pod %s: %w: deleted before it ran", pod.Name, compute.ErrUnavailable))
				}
				if ctx.Err() == nil && hiccup.wait(ctx, err) {
					continue // rv is still "": read again
				}
				if ctx.Err() != nil {
					return nil, p.waitErr(ctx, pod.Name)
				}
				return nil, p.apiErr("get", "pods", pod.Name, err)
			}
			if got, done, err := check(cur); done {
				return got, err
			}
			rv = cur.ResourceVersion
		}
	}
}

// dialable reports whether the daemon of pod can be dialled: the Pod runs
// with an IP or, reaching it by its IP or by port-forward, it has an IP
// and its init container completed. The kubelet starts the daemon's
// container as soon as it sees the init container's exit, but reports
// the Pod Running only once it sees that container run, at its next look
// at the node's containers (generic PLEG: every second); the daemon
// listens before then, and connect's readiness wait retries the dial
// until it does. Through exec the relay runs in the daemon's container,
// which must run first.
func (p *Provider) dialable(pod *corev1.Pod) bool {
	if pod.Status.PodIP == "" {
		return false
	}
	if pod.Status.Phase == corev1.PodRunning {
		return true
	}
	if p.cfg.Connect == ConnectExec || pod.Status.Phase != corev1.PodPending || len(pod.Status.InitContainerStatuses) != len(pod.Spec.InitContainers) {
		return false
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		if t := cs.State.Terminated; t == nil || t.ExitCode != 0 {
			return false
		}
	}
	return true
}

// waitErr explains a start-up that ran out of time, with the Pod's
// conditions and events' gist when they can be read.
func (p *Provider) waitErr(ctx context.Context, name string) error {
	why := ""
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	if cur, err := p.client.CoreV1().Pods(p.cfg.Namespace).Get(bg, name, metav1.GetOptions{}); err == nil {
		why = " (phase " + string(cur.Status.Phase)
		for _, c := range cur.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				why += "; " + string(c.Type) + ": " + c.Message
			}
		}
		for _, cs := range append(append([]corev1.ContainerStatus{}, cur.Status.InitContainerStatuses...), cur.Status.ContainerStatuses...) {
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				why += "; " + cs.Name + ": " + w.Reason
			}
		}
		why += ")"
	}
	sentinel := compute.ErrDeadlineExceeded
	if errors.Is(ctx.Err(), context.Canceled) {
		sentinel = compute.ErrCanceled
	}
	return fmt.Errorf("kubernetes: pod %s: %w: it did not start running in time%s", name, sentinel, why)
}

// Reattach connects to the sandbox prior describes, reading its token from
// its Secret (attach, which finishes a token rotation left half done). A
// Pod that is gone, being deleted, evicted or exited gives an error
// wrapping ErrNotFound (and saying why), so the session launches a
// replacement and restores the snapshot. A warm pool Pod not claimed for
// the state's session, or a cold Pod created for another session, is
// refused (claimedFor) before anything is changed.
func (p *Provider) Reattach(ctx context.Context, spec compute.LaunchSpec, prior json.RawMessage) (compute.Sandbox, error) {
	st, err := DecodeState(prior)
	if err != nil {
		return nil, err
	}
	pods := p.client.CoreV1().Pods(st.Namespace)
	pod, err := pods.Get(ctx, st.Pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("kubernetes: sandbox %s: %w: the pod is gone", st.Pod, compute.ErrNotFound)
	}
	if err != nil {
		return nil, p.apiErr("get", "pods", st.Pod, err)
	}
	if pod.Labels[LabelKey] != st.Key || (st.UID != "" && string(pod.UID) != st.UID) {
		return nil, fmt.Errorf("kubernetes: sandbox %s: %w: pod %s is not this sandbox", st.Pod, compute.ErrNotFound, pod.Name)
	}
	if err := claimedFor(pod, st, spec.SessionID, "reattach"); err != nil {
		return nil, err
	}
	if why := podDead(pod); why != "" {
		return nil, fmt.Errorf("kubernetes: sandbox %s: %w: the pod %s", st.Pod, compute.ErrNotFound, why)
	}
	sb, err := p.attach(ctx, st, pod)
	if err != nil {
		return nil, err
	}
	_ = sb.Touch(ctx)
	p.log.Info("reattached to the running sandbox", zap.String("session", st.SessionID), zap.String("pod", st.Pod))
	return sb, nil
}

// claimedFor checks that the Pod a state a caller hands in names (to
// Reattach, Destroy, or Launch as Prior) is the sandbox of the state's
// session (and of sessionID, the caller's, when not ""). A warm pool Pod
// must have been claimed for it: the claim's update marks it LabelClaimed
// "true" and writes the session id in AnnotationSession, both at once,
// and neither changes afterwards. An unclaimed pool Pod (still on its
// pool token, which a reattach of an unclaimed Pod would not rotate) or
// one claimed by another session is not this sandbox: reattaching to it
// would take a Pod no claim gave this session, and deleting it would take
// one from the pool or from another session. A cold Pod (of no pool)
// records its session in AnnotationSession at creation (every version of
// the provider has written it); one recording another session is
// another session's sandbox. A cold Pod recording none (not one this
// provider made) passes, as every cold Pod did before the check. The
// error names the Pod and why, says what was refused (op: "reattach",
// "destroy it", "replace it"), and wraps ErrInvalidArgument, as a bad
// state does, and not ErrNotFound, which would have Client.Resume launch
// a replacement with this state as Prior.
func claimedFor(pod *corev1.Pod, st State, sessionID, op string) error {
	owner := pod.Annotations[AnnotationSession]
	want, other := unrecordedSession(st, sessionID, func(s string) bool { return s == owner })
	pool := pod.Labels[LabelPool]
	if pool == "" {
		if owner == "" || !other {
			return nil
		}
		return fmt.Errorf("kubernetes: sandbox %s: %w: pod %s was not created for session %q (it was created for another session; refusing to %s)",
			st.Pod, compute.ErrInvalidArgument, pod.Name, want, op)
	}
	if pod.Labels[LabelClaimed] != "true" {
		return fmt.Errorf("kubernetes: sandbox %s: %w: pod %s is an unclaimed pod of warm pool %s (a state of a claimed sandbox is needed to %s)",
			st.Pod, compute.ErrInvalidArgument, pod.Name, pool, op)
	}
	if owner == "" || other {
		why := "it was claimed by another session"
		if owner == "" {
			why = "its claim records no session"
		}
		return fmt.Errorf("kubernetes: sandbox %s: %w: pod %s of warm pool %s was not claimed for session %q (%s; refusing to %s)",
			st.Pod, compute.ErrInvalidArgument, pod.Name, pool, want, why, op)
	}
	return nil
}

// volumeFor checks that the workspace PVC a state a caller hands in names
// (pvc, as read) was made for the state's session (and sessionID's, the
// caller's, when not ""), before Destroy deletes it or Launch mounts it
// again. Launch creates each workspace PVC with LabelWorkspaceVolume "1"
// and LabelSession (sessionLabel of its session), as every version of the
// provider has, and now also the exact id in AnnotationSession, which is
// compared when present (a PVC made by an earlier version has none, and
// is judged by its label). A PVC without those marks (not a workspace
// claim of this provider's) or made for another session is refused: the
// error names the PVC and why, says what was refused (op), and wraps
// ErrInvalidArgument.
func volumeFor(pvc *corev1.PersistentVolumeClaim, st State, sessionID, op string) error {
	if pvc.Labels[LabelWorkspaceVolume] != "1" {
		return fmt.Errorf("kubernetes: sandbox %s: %w: claim %s is not a workspace claim of the provider (it has no %s=1 label; refusing to %s)",
			st.Pod, compute.ErrInvalidArgument, pvc.Name, LabelWorkspaceVolume, op)
	}
	label, exact := pvc.Labels[LabelSession], pvc.Annotations[AnnotationSession]
	want, other := unrecordedSession(st, sessionID, func(s string) bool {
		return label == sessionLabel(s) && (exact == "" || exact == s)
	})
	if other {
		why := "it was made for another session"
		if label == "" {
			why = "it records no session"
		}
		return fmt.Errorf("kubernetes: sandbox %s: %w: workspace claim %s was not made for session %q (%s; refusing to %s)",
			st.Pod, compute.ErrInvalidArgument, pvc.Name, want, why, op)
	}
	return nil
}

// unrecordedSession is the first session that an object a state names
// must record and does not (records says whether it does): the state's,
// then sessionID, the caller's, when not "". It returns "", false when
// the object records both.
func unrecordedSession(st State, sessionID string, records func(session string) bool) (string, bool) {
	if !records(st.SessionID) {
		return st.SessionID, true
	}
	if sessionID != "" && !records(sessionID) {
		return sessionID, true
	}
	return "", false
}

// vetVolume reads the workspace PVC st names, in namespace ns (where it
// would be deleted or mounted), and refuses it unless volumeFor accepts
// it. A state naming none, or a PVC that is gone, passes.
func (p *Provider) vetVolume(ctx context.Context, ns string, st State, sessionID, op string) error {
	if st.Volume == "" {
		return nil
	}
	pvc, err := p.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, st.Volume, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return p.apiErr("get", "persistentvolumeclaims", st.Volume, err)
	}
	return volumeFor(pvc, st, sessionID, op)
}

// Destroy deletes the sandbox's Pod (foreground: garbage collection
// removes what it owns first), Secret and NetworkPolicy, and under
// DeleteAll its workspace PVC, and waits until the Pod is gone. What is
// already gone is not an error. A state that is not its session's
// sandbox is refused with ErrInvalidArgument, with nothing deleted: one
// naming a warm pool Pod not claimed for the state's session (unclaimed,
// or another session's) or a cold Pod created for another session
// (claimedFor, after one Pod read), or, under DeleteAll, a workspace PVC
// not made for the session (volumeFor, after one PVC read).
func (p *Provider) Destroy(ctx context.Context, prior json.RawMessage) error {
	st, err := DecodeState(prior)
	if err != nil {
		return err
	}
	if err := p.deleteClaimed(ctx, st, p.cfg.DeletePolicy == DeleteSandbox, "", "destroy it"); err != nil {
		return err
	}
	p.log.Info("sandbox destroyed", zap.String("session", st.SessionID), zap.String("pod", st.Pod))
	return nil
}

// deleteSandbox deletes a state's Pod, Secret and NetworkPolicy, its PVC
// unless keepVolume, and waits for the Pod to be gone. It trusts st, so it
// is for states the provider made itself (a pool's Pods, a Pod a claim
// gives up); a state a caller hands in goes through deleteClaimed.
func (p *Provider) deleteSandbox(ctx context.Context, st State, keepVolume bool) error {
	return p.deleteVetted(ctx, st, keepVolume, nil)
}

// deleteClaimed is deleteSandbox for a state a caller hands in (Destroy,
// Launch's Prior): a Pod there that is not the sandbox of the state's
// session (and sessionID's, when not "") is refused (claimedFor, op
// saying what was refused) before anything is deleted, and so is, unless
// keepVolume, a workspace PVC not made for the session (vetVolume). A Pod
// or PVC that is gone is not checked: what is left is deleted as before.
func (p *Provider) deleteClaimed(ctx context.Context, st State, keepVolume bool, sessionID, op string) error {
	if !keepVolume {
		if err := p.vetVolume(ctx, st.Namespace, st, sessionID, op); err != nil {
			return err
		}
	}
	return p.deleteVetted(ctx, st, keepVolume, func(pod *corev1.Pod) error {
		return claimedFor(pod, st, sessionID, op)
	})
}

// deleteVetted does deleteSandbox's work; vet, when not nil, sees the Pod
// st names as read (whatever its labels) and can refuse it before
// anything is deleted.
func (p *Provider) deleteVetted(ctx context.Context, st State, keepVolume bool, vet func(*corev1.Pod) error) error {
	fg := metav1.DeletePropagationForeground
	var errs []error
	pods := p.client.CoreV1().Pods(st.Namespace)
	pod, err := pods.Get(ctx, st.Pod, metav1.GetOptions{})
	if err == nil && vet != nil {
		if err := vet(pod); err != nil {
			return err
		}
	}
	switch {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return p.apiErr("get", "pods", st.Pod, err)
	case pod.Labels[LabelKey] != st.Key:
		pod = nil // not ours (should not happen: the name holds the key)
	}
	if pod != nil {
		err := pods.Delete(ctx, st.Pod, metav1.DeleteOptions{PropagationPolicy: &fg, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return p.apiErr("delete", "pods", st.Pod, err)
		}
	}
	if err := p.client.CoreV1().Secrets(st.Namespace).Delete(ctx, secretName(st.Key), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, p.apiErr("delete", "secrets", secretName(st.Key), err))
	}
	if boolOr(p.cfg.NetworkPolicy, true) {
		if err := p.client.NetworkingV1().NetworkPolicies(st.Namespace).Delete(ctx, policyName(st.Key), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, p.apiErr("delete", "networkpolicies", policyName(st.Key), err))
		}
	}
	if !keepVolume && st.Volume != "" {
		if err := p.client.CoreV1().PersistentVolumeClaims(st.Namespace).Delete(ctx, st.Volume, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, p.apiErr("delete", "persistentvolumeclaims", st.Volume, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if pod != nil {
		if err := p.waitGone(ctx, st.Namespace, pod); err != nil {
			return err
		}
	}
	if !keepVolume && st.Volume != "" {
		// The claim goes once no Pod uses it (pvc-protection).
		return p.waitClaimGone(ctx, st.Namespace, st.Volume)
	}
	return nil
}

// waitClaimGone watches until the PVC name is deleted (bounded).
func (p *Provider) waitClaimGone(ctx context.Context, ns, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pvcs := p.client.CoreV1().PersistentVolumeClaims(ns)
	for {
		cur, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("kubernetes: claim %s: %w: still terminating", name, compute.ErrDeadlineExceeded)
			}
			return p.apiErr("get", "persistentvolumeclaims", name, err)
		}
		w, err := pvcs.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: cur.ResourceVersion})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("kubernetes: claim %s: %w: still terminating", name, compute.ErrDeadlineExceeded)
			}
			return p.apiErr("watch", "persistentvolumeclaims", name, err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return fmt.Errorf("kubernetes: claim %s: %w: still terminating", name, compute.ErrDeadlineExceeded)
		}
	}
}

// waitGone watches until the Pod is deleted (bounded by its grace period
// and a margin).
func (p *Provider) waitGone(ctx context.Context, ns string, pod *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StopTimeout+30*time.Second)
	defer cancel()
	sel := fields.OneTermEqualSelector("metadata.name", pod.Name).String()
	for {
		list, err := p.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("kubernetes: pod %s: %w: still terminating", pod.Name, compute.ErrDeadlineExceeded)
			}
			return p.apiErr("list", "pods", pod.Name, err)
		}
		found := false
		for _, it := range list.Items {
			if it.Name == pod.Name && it.UID == pod.UID {
				found = true
			}
		}
		if !found {
			return nil
		}
		w, err := p.client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("kubernetes: pod %s: %w: still terminating", pod.Name, compute.ErrDeadlineExceeded)
			}
			return p.apiErr("watch", "pods", pod.Name, err)
		}
		gone := func() bool {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return false
				case ev, ok := <-w.ResultChan():
					if !ok {
						return false
					}
					if cur, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Deleted && cur.Name == pod.Name && cur.UID == pod.UID {
						return true
					}
				}
			}
		}()
		if gone {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("kubernetes: pod %s: %w: still terminating", pod.Name, compute.ErrDeadlineExceeded)
		}
	}
}

// apiHiccup rides out a restarting API server while a launch waits on a
// Pod it has already created: the server is unreachable for a moment,
// then refuses for a moment what the Role allows (its RBAC cache has not
// synced). Either is retried with a growing pause for forbiddenGrace from
// the first; a success resets it. Starting the launch over would cost a
// new Pod.
type apiHiccup struct {
	since time.Time
	delay time.Duration
}

// wait pauses and reports true if err is worth another try; false when
// err is permanent, the grace has run out or ctx ended.
func (h *apiHiccup) wait(ctx context.Context, err error) bool {
	if !apierrors.IsForbidden(err) && !transient(err) {
		return false
	}
	if h.since.IsZero() {
		h.since, h.delay = time.Now(), 100*time.Millisecond
	}
	if time.Since(h.since) >= forbiddenGrace {
		return false
	}
	t := time.NewTimer(h.delay)
	defer t.Stop()
	h.delay = min(h.delay*2, 2*time.Second)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (h *apiHiccup) reset() { h.since = time.Time{} }

// forbiddenGrace is how long a cleanup retries a Forbidden answer: an API
// server that has just restarted answers before its RBAC cache has
// synced, and refuses for a moment what the Role allows.
const forbiddenGrace = 15 * time.Second

// deleteRetrying deletes an object of a failed launch, retrying while the
// API server is unreachable (it may be restarting) until ctx ends, and
// retrying Forbidden for forbiddenGrace.
func (p *Provider) deleteRetrying(ctx context.Context, resource, name string) {
	bg := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{PropagationPolicy: &bg}
	var forbiddenSince time.Time
	for delay := 100 * time.Millisecond; ; delay = min(delay*2, 2*time.Second) {
		var err error
		switch resource {
		case "pods":
			err = p.client.CoreV1().Pods(p.cfg.Namespace).Delete(ctx, name, opts)
		case "secrets":
			err = p.client.CoreV1().Secrets(p.cfg.Namespace).Delete(ctx, name, opts)
		case "networkpolicies":
			err = p.client.NetworkingV1().NetworkPolicies(p.cfg.Namespace).Delete(ctx, name, opts)
		case "persistentvolumeclaims":
			err = p.client.CoreV1().PersistentVolumeClaims(p.cfg.Namespace).Delete(ctx, name, opts)
		}
		if err == nil || apierrors.IsNotFound(err) {
			return
		}
		retry := transient(err)
		if apierrors.IsForbidden(err) {
			if forbiddenSince.IsZero() {
				forbiddenSince = time.Now()
			}
			retry = time.Since(forbiddenSince) < forbiddenGrace
		}
		if !retry {
			p.log.Warn("cleanup after a failed launch", zap.String("resource", resource), zap.String("name", name), zap.Error(err))
			return
		}
		select {
		case <-ctx.Done():
			p.log.Warn("cleanup after a failed launch gave up: the API server did not come back", zap.String("resource", resource), zap.String("name", name), zap.Error(err))
			return
		case <-time.After(delay):
		}
	}
}

// selector selects the provider's sandbox Pods (configured labels
// included).
func (p *Provider) selector(extra map[string]string) string {
	set := labels.Set{LabelSandbox: "1"}
	for k, v := range p.cfg.Labels {
		set[k] = v
	}
	for k, v := range extra {
		set[k] = v
	}
	return labels.SelectorFromSet(set).String()
}

// List returns the provider's sandbox Pods carrying all of Config.Labels
// (warm pool Pods not yet claimed are not sandboxes yet, and not listed).
func (p *Provider) List(ctx context.Context) ([]compute.SandboxInfo, error) {
	list, err := p.client.CoreV1().Pods(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: p.selector(nil)})
	if err != nil {
		return nil, p.apiErr("list", "pods", "", err)
	}
	out := make([]compute.SandboxInfo, 0, len(list.Items))
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.Labels[LabelClaimed] == "false" || !keyRE.MatchString(pod.Labels[LabelKey]) {
			continue
		}
		st := stateOf(pod)
		raw, err := st.encode()
		if err != nil {
			return nil, err
		}
		life, last := lifetimeOf(pod.Annotations)
		out = append(out, compute.SandboxInfo{
			Provider: ProviderName, SessionID: st.SessionID, ID: pod.Name,
			Running:  pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil,
			Lifetime: life, LastActive: last, State: raw,
		})
	}
	return out, nil
}

// orphanAge is how old an object without an owner must be before Reap
// takes it for a crashed launch's (a launch in progress creates the
// NetworkPolicy and the Secret before the Pod, and makes the Pod their
// owner right after creating it).
const orphanAge = 5 * time.Minute

// ReapOrphans deals with the NetworkPolicies and token Secrets of this
// provider's sandboxes (the selector of List) that still have no owner
// orphanAge after their creation, which only a launch that crashed (or
// lost the API server) between creating them and its Pod's owner patches
// leaves (compute.OrphanReaper: Client.Reap calls it). One whose Pod
// exists is given to it (adopt: garbage collection then removes it with
// the Pod); any other is deleted. The two kinds are dealt with apart: a
// Role without `list secrets` (before the Secret came first) still reaps
// the policies, and the error names the missing verb.
func (p *Provider) ReapOrphans(ctx context.Context, now time.Time) error {
	opts := metav1.ListOptions{LabelSelector: p.selector(nil)}
	var errs []error
	if boolOr(p.cfg.NetworkPolicy, true) {
		nps, err := p.client.NetworkingV1().NetworkPolicies(p.cfg.Namespace).List(ctx, opts)
		if err != nil {
			errs = append(errs, p.apiErr("list", "networkpolicies", "", err))
		} else {
			for _, np := range nps.Items {
				if key, ok := orphanKey(np.ObjectMeta, policyName, now); ok {
					errs = append(errs, p.reapOrphan(ctx, "networkpolicies", np.Name, key))
				}
			}
		}
	}
	secs, err := p.client.CoreV1().Secrets(p.cfg.Namespace).List(ctx, opts)
	if err != nil {
		errs = append(errs, p.apiErr("list", "secrets", "", err))
	} else {
		for _, sec := range secs.Items {
			if key, ok := orphanKey(sec.ObjectMeta, secretName, now); ok {
				errs = append(errs, p.reapOrphan(ctx, "secrets", sec.Name, key))
			}
		}
	}
	return errors.Join(errs...)
}

// orphanKey is the sandbox key of an object without an owner, older than
// orphanAge at now, whose name is name(key) (an object of the provider's,
// not one that merely carries its labels).
func orphanKey(m metav1.ObjectMeta, name func(string) string, now time.Time) (string, bool) {
	key := m.Labels[LabelKey]
	if len(m.OwnerReferences) > 0 || now.Sub(m.CreationTimestamp.Time) < orphanAge || !keyRE.MatchString(key) || m.Name != name(key) {
		return "", false
	}
	return key, true
}

// reapOrphan gives an unowned object (resource: secrets or
// networkpolicies) to its sandbox's Pod, or deletes it when there is none.
func (p *Provider) reapOrphan(ctx context.Context, resource, name, key string) error {
	pod, err := p.client.CoreV1().Pods(p.cfg.Namespace).Get(ctx, podName(key), metav1.GetOptions{})
	switch {
	case err == nil && pod.Labels[LabelKey] == key:
		p.log.Info("giving an unowned object of a sandbox to its pod", zap.String("resource", resource), zap.String("name", name), zap.String("pod", pod.Name))
		if resource == "secrets" {
			return p.adoptSecret(ctx, pod, key)
		}
		return p.adoptPolicy(ctx, pod, key)
	case err != nil && !apierrors.IsNotFound(err):
		return p.apiErr("get", "pods", podName(key), err)
	}
	p.log.Info("deleting an object a crashed launch left without its pod", zap.String("resource", resource), zap.String("name", name))
	switch resource {
	case "secrets":
		err = p.client.CoreV1().Secrets(p.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	default:
		err = p.client.NetworkingV1().NetworkPolicies(p.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return p.apiErr("delete", resource, name, err)
	}
	return nil
}
