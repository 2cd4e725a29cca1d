package kubernetes

// A Pod deleted (or evicted) under a running command: the kubelet stops
// the daemon, which kills its processes, so the caller would see only a
// command "killed by SIGKILL" (exit 137), or a broken stream. The daemon
// client of every sandbox carries gRPC interceptors that, when a process's
// exit says it was killed by a signal, or a stream that had started breaks,
// look at the sandbox's Pod; when it is gone, being deleted or stopped by
// the kubelet, the caller gets an error saying so (ErrUnavailable: the
// sandbox is gone) with what the Pod says about it: when its deletion was
// asked, the DisruptionTarget condition (eviction through the API, the
// kubelet's eviction for disk or memory pressure, preemption, the taint
// manager, the garbage collector) and the kubelet's reason and message.
// A plain delete records no author in the Pod (managedFields do not track
// deletes; only the API server's audit log knows).
//
// The interceptors read the exit of a response through protobuf
// reflection (a message field named "exit" whose "signal" is set): the
// wire types stay in agentclient, and only the methods that report exits
// are looked at.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// The daemon's methods whose responses carry a process's exit.
const (
	processService = "/bulkhead.agentd.v1.ProcessService/"
	methodExec     = processService + "Exec"
	methodAttach   = processService + "Attach"
	methodWait     = processService + "Wait"
)

const (
	// podGoneChecks and podGoneGap: how often and how far apart the Pod
	// is looked at after a killed exit while its daemon may still answer.
	podGoneChecks = 3
	podGoneGap    = 300 * time.Millisecond
	podGoneLookup = 5 * time.Second
	// daemonProbe bounds asking the daemon whether it is still there
	// after a killed exit the Pod does not explain yet.
	daemonProbe = 2 * time.Second
	// podGoneWait is how long the Pod is watched for its deletion or
	// eviction to show once its daemon is gone with the command: the
	// kubelet kills the containers first and records the eviction in the
	// Pod's status after, seconds later on a busy node.
	podGoneWait = 20 * time.Second
	// stoppedChecks: how many more looks a Pod that has stopped without
	// saying why gets (the kubelet may record its reason later, or not
	// at all: an eviction for an emptyDir's size on Kubernetes 1.34 left
	// only phase Succeeded for 20 s).
	stoppedChecks = 10
)

// podGoneOptions are the dial options that explain a killed command or a
// broken stream by the Pod's deletion.
func (p *Provider) podGoneOptions(st State) []grpc.DialOption {
	g := podGone{p: p, st: st}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(g.unary), grpc.WithChainStreamInterceptor(g.stream)}
}

// podGone explains the end of one sandbox's commands.
type podGone struct {
	p  *Provider
	st State
}

func (g podGone) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if method != methodWait {
		return err
	}
	if err != nil {
		return g.explain(ctx, cc, "", err)
	}
	if sig := killedBy(reply); sig != "" {
		return g.explain(ctx, cc, sig, nil)
	}
	return nil
}

func (g podGone) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || (method != methodExec && method != methodAttach) {
		return cs, err
	}
	return &podGoneStream{ClientStream: cs, g: g, ctx: ctx, cc: cc}, nil
}

// podGoneStream is an Exec or Attach stream whose end is explained.
type podGoneStream struct {
	grpc.ClientStream
	g        podGone
	ctx      context.Context
	cc       *grpc.ClientConn
	received bool
}

func (s *podGoneStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	switch {
	case err == nil:
		s.received = true
		if sig := killedBy(m); sig != "" {
			return s.g.explain(s.ctx, s.cc, sig, nil)
		}
		return nil
	case errors.Is(err, io.EOF) || !s.received:
		return err
	}
	return s.g.explain(s.ctx, s.cc, "", err)
}

// explain returns an error saying the sandbox's Pod is gone when it is
// (the command was killed by signal sig, or its call failed with err),
// else err unchanged (nil for a killed exit: the caller gets the exit).
//
// A killed exit the Pod does not explain at once is looked at further
// only when the daemon is gone too (it does not answer a health check):
// then the command died with its sandbox, and the Pod is watched for up
// to podGoneWait for the kubelet to record why. A daemon that answers
// means the kill came from inside the sandbox (the command's own kill,
// the OOM killer, a timeout), and the exit is returned at once.
func (g podGone) explain(ctx context.Context, cc *grpc.ClientConn, sig string, err error) error {
	ctx = context.WithoutCancel(ctx)
	why, complete := g.whyGone(ctx, podGoneChecks)
	// Stopped without saying why yet, or not stopped but its daemon gone
	// with the command: wait for the kubelet's word.
	switch {
	case complete:
	case why != "":
		// Stopped: a little longer for the reason, the answer is good
		// already.
		if later, _ := g.whyGone(ctx, stoppedChecks); later != "" {
			why = later
		}
	case sig != "" && !g.daemonAnswers(ctx, cc):
		if later, _ := g.whyGone(ctx, int(podGoneWait/podGoneGap)); later != "" {
			why = later
		}
	}
	if why == "" {
		return err
	}
	if err != nil {
		return fmt.Errorf("kubernetes: sandbox %s: %w: %s; the command's stream broke (%v)", g.st.Pod, compute.ErrUnavailable, why, err)
	}
	return fmt.Errorf("kubernetes: sandbox %s: %w: %s; the command was killed with it (%s)", g.st.Pod, compute.ErrUnavailable, why, sig)
}

// daemonAnswers reports whether the sandbox's daemon answers a health
// check on cc within daemonProbe.
func (g podGone) daemonAnswers(ctx context.Context, cc *grpc.ClientConn) bool {
	if cc == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, daemonProbe)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// whyGone looks at the sandbox's Pod up to checks times, podGoneGap
// apart, and says why it is gone, "" when it is not (or cannot be looked
// at). A Pod that has stopped without saying why yet (its phase is set
// before the kubelet records an eviction) is looked at again, and what
// it said last is the answer; complete reports that it said why (or is
// deleted).
func (g podGone) whyGone(ctx context.Context, checks int) (why string, complete bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(checks)*podGoneGap+podGoneLookup)
	defer cancel()
	last := ""
	for i := range checks {
		if i > 0 {
			select {
			case <-ctx.Done():
				return last, false
			case <-time.After(podGoneGap):
			}
		}
		pod, err := g.p.client.CoreV1().Pods(g.st.Namespace).Get(ctx, g.st.Pod, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Sprintf("its Pod %s/%s was deleted", g.st.Namespace, g.st.Pod), true
		case err != nil:
			g.p.log.Debug("cannot look at the sandbox's Pod after its command was killed", zap.String("pod", g.st.Pod), zap.Error(err))
			return last, false
		}
		if why := podGoneReason(pod); why != "" {
			last = why
			if pod.DeletionTimestamp != nil || podSaysWhy(pod) {
				return why, true
			}
		}
	}
	return last, false
}

// podSaysWhy reports whether a stopped pod says why it stopped: the
// kubelet's reason or a DisruptionTarget condition.
func podSaysWhy(pod *corev1.Pod) bool {
	if pod.Status.Reason != "" {
		return true
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// podGoneReason says how pod went away: deleted, evicted or stopped; ""
// when it is still running and not being deleted.
func podGoneReason(pod *corev1.Pod) string {
	var parts []string
	name := pod.Namespace + "/" + pod.Name
	switch {
	case pod.DeletionTimestamp != nil:
		s := fmt.Sprintf("its Pod %s was deleted (at %s", name, pod.DeletionTimestamp.UTC().Format(time.RFC3339))
		if g := pod.DeletionGracePeriodSeconds; g != nil {
			s += fmt.Sprintf(", grace period %ds", *g)
		}
		parts = append(parts, s+")")
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		parts = append(parts, fmt.Sprintf("its Pod %s was stopped (phase %s)", name, pod.Status.Phase))
	default:
		return ""
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			parts = append(parts, "by "+disruptionBy(c.Reason)+" ("+c.Reason+")"+colon(c.Message))
		}
	}
	if pod.Status.Reason != "" {
		parts = append(parts, "the kubelet says "+pod.Status.Reason+colon(pod.Status.Message))
	}
	return strings.Join(parts, "; ")
}

// disruptionBy names who a DisruptionTarget reason says disrupted a Pod.
func disruptionBy(reason string) string {
	switch reason {
	case "EvictionByEvictionAPI":
		return "an eviction through the API"
	case "PreemptionByScheduler":
		return "the scheduler, to make room for another Pod"
	case "DeletionByTaintManager":
		return "the taint manager (a NoExecute taint on its node)"
	case "DeletionByPodGC":
		return "the Pod garbage collector"
	case "TerminationByKubelet":
		return "the kubelet (node pressure or shutdown)"
	}
	return "the cluster"
}

func colon(msg string) string {
	if msg = strings.TrimSpace(msg); msg == "" {
		return ""
	}
	return ": " + msg
}

// killedBy returns the signal that killed the process whose exit a
// response m reports, "" when m reports none (or no kill).
func killedBy(m any) string {
	pm, ok := m.(proto.Message)
	if !ok {
		return ""
	}
	r := pm.ProtoReflect()
	exit := r.Descriptor().Fields().ByName("exit")
	if exit == nil || exit.Kind() != protoreflect.MessageKind || !r.Has(exit) {
		return ""
	}
	er := r.Get(exit).Message()
	sig := er.Descriptor().Fields().ByName("signal")
	if sig == nil || sig.Kind() != protoreflect.StringKind {
		return ""
	}
	switch s := er.Get(sig).String(); s {
	case "SIGKILL", "SIGTERM", "KILL", "TERM":
		return s
	}
	return ""
}
