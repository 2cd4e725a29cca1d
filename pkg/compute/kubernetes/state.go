package kubernetes

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// Labels and annotations the provider puts on its objects.
const (
	labelPrefix = "bulkhead.dev/"
	// LabelSandbox ("1") marks a Bulkhead sandbox Pod (and its Secret and
	// NetworkPolicy; a workspace PVC has LabelWorkspaceVolume instead).
	LabelSandbox = labelPrefix + "sandbox"
	// LabelKey is the sandbox's random key; its objects are named after it.
	LabelKey = labelPrefix + "key"
	// LabelSession is a label-safe form of the session id (the exact id is
	// AnnotationSession).
	LabelSession = labelPrefix + "session"
	// LabelPool is the warm pool a Pod was made for.
	LabelPool = labelPrefix + "pool"
	// LabelClaimed is "false" on a warm pool Pod waiting for a claim and
	// "true" once claimed.
	LabelClaimed = labelPrefix + "claimed"
	// LabelWorkspaceVolume ("1") marks a workspace PVC (with LabelSession
	// and AnnotationSession, its session's).
	LabelWorkspaceVolume = labelPrefix + "workspace-volume"

	// AnnotationSession is the session id (on a sandbox Pod, and on a
	// workspace PVC, though PVCs made by earlier versions lack it).
	AnnotationSession = labelPrefix + "session-id"
	// AnnotationCreatedAt is Lifetime.CreatedAt (RFC 3339).
	AnnotationCreatedAt = labelPrefix + "created-at"
	// AnnotationTTL is Lifetime.TTL (a Go duration), when set.
	AnnotationTTL = labelPrefix + "ttl"
	// AnnotationIdleTimeout is Lifetime.IdleTimeout, when set.
	AnnotationIdleTimeout = labelPrefix + "idle-timeout"
	// AnnotationExpiresAt is CreatedAt+TTL (RFC 3339), when a TTL is set.
	AnnotationExpiresAt = labelPrefix + "expires-at"
	// AnnotationLastActive is the last recorded activity (RFC 3339).
	AnnotationLastActive = labelPrefix + "last-active"
	// AnnotationWorkspace is the workspace root in the Pod.
	AnnotationWorkspace = labelPrefix + "workspace"
	// AnnotationVolume is the workspace PVC, when there is one.
	AnnotationVolume = labelPrefix + "volume"
	// AnnotationRunAs is a pool Pod's default run_as user.
	AnnotationRunAs = labelPrefix + "run-as"
)

// StateVersion is the version of State this package writes and reads.
const StateVersion = 1

// State is what finds a Kubernetes sandbox again (Sandbox.State,
// SandboxInfo.State). It holds no token: the token is in the Secret.
type State struct {
	Version   int    `json:"version"`
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	UID       string `json:"uid,omitempty"`
	Key       string `json:"key"`
	SessionID string `json:"session_id"`
	Image     string `json:"image,omitempty"`
	Workspace string `json:"workspace"`
	// Volume is the workspace PVC ("" for an emptyDir workspace).
	Volume string `json:"volume,omitempty"`
	// Pool is the warm pool the Pod was claimed from, if any.
	Pool string `json:"pool,omitempty"`
}

var keyRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

// DecodeState parses and checks a provider state.
func DecodeState(raw json.RawMessage) (State, error) {
	var st State
	if len(raw) == 0 {
		return st, fmt.Errorf("kubernetes: %w: empty sandbox state", compute.ErrInvalidArgument)
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("kubernetes: %w: sandbox state: %v", compute.ErrInvalidArgument, err)
	}
	switch {
	case st.Version != StateVersion:
		return st, fmt.Errorf("kubernetes: %w: sandbox state version %d (this provider reads %d)", compute.ErrInvalidArgument, st.Version, StateVersion)
	case !keyRE.MatchString(st.Key):
		return st, fmt.Errorf("kubernetes: %w: sandbox state has a malformed key %q", compute.ErrInvalidArgument, st.Key)
	case st.Pod != podName(st.Key):
		return st, fmt.Errorf("kubernetes: %w: sandbox state names pod %q, not this key's", compute.ErrInvalidArgument, st.Pod)
	case st.Namespace == "":
		return st, fmt.Errorf("kubernetes: %w: sandbox state names no namespace", compute.ErrInvalidArgument)
	}
	return st, nil
}

func (st State) encode() (json.RawMessage, error) {
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: encode sandbox state: %w", err)
	}
	return raw, nil
}

// stateOf rebuilds a State from a Pod (List, claims).
func stateOf(pod *corev1.Pod) State {
	img := ""
	for _, c := range pod.Spec.Containers {
		if c.Name == containerName {
			img = c.Image
		}
	}
	return State{
		Version: StateVersion, Namespace: pod.Namespace, Pod: pod.Name, UID: string(pod.UID), Key: pod.Labels[LabelKey],
		SessionID: pod.Annotations[AnnotationSession], Image: img, Workspace: pod.Annotations[AnnotationWorkspace],
		Volume: pod.Annotations[AnnotationVolume], Pool: pod.Labels[LabelPool],
	}
}

// lifetimeAnnotations records a Lifetime.
func lifetimeAnnotations(l compute.Lifetime, into map[string]string) {
	into[AnnotationCreatedAt] = l.CreatedAt.UTC().Format(time.RFC3339Nano)
	if l.TTL > 0 {
		into[AnnotationTTL] = l.TTL.String()
		into[AnnotationExpiresAt] = l.CreatedAt.Add(l.TTL).UTC().Format(time.RFC3339Nano)
	}
	if l.IdleTimeout > 0 {
		into[AnnotationIdleTimeout] = l.IdleTimeout.String()
	}
}

// lifetimeOf reads a Lifetime back; malformed values read as unset.
func lifetimeOf(ann map[string]string) (compute.Lifetime, time.Time) {
	var l compute.Lifetime
	l.CreatedAt, _ = time.Parse(time.RFC3339Nano, ann[AnnotationCreatedAt])
	l.TTL, _ = time.ParseDuration(ann[AnnotationTTL])
	l.IdleTimeout, _ = time.ParseDuration(ann[AnnotationIdleTimeout])
	last, _ := time.Parse(time.RFC3339Nano, ann[AnnotationLastActive])
	return l, last
}

// sessionLabel turns a session id into a label value: ids that had to be
// changed get a short hash so that two of them cannot collide.
func sessionLabel(sessionID string) string {
	var b strings.Builder
	for _, r := range sessionID {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	s = strings.Trim(s, "-_.")
	if s != sessionID || s == "" {
		sum := sha256.Sum256([]byte(sessionID))
		if s != "" {
			s += "-"
		}
		s += hex.EncodeToString(sum[:4])
	}
	return s
}

// VolumeName is the workspace PVC of a session (a DNS label).
func VolumeName(sessionID string) string {
	sum := sha256.Sum256([]byte(sessionID))
	frag := strings.ToLower(sessionLabel(sessionID))
	frag = strings.Map(func(r rune) rune {
		if r == '_' || r == '.' {
			return '-'
		}
		return r
	}, frag)
	if len(frag) > 30 {
		frag = frag[:30]
	}
	frag = strings.Trim(frag, "-")
	return "bulkhead-ws-" + frag + "-" + hex.EncodeToString(sum[:4])
}

func podName(key string) string    { return "bulkhead-" + key }
func secretName(key string) string { return "bulkhead-" + key + "-token" }
func policyName(key string) string { return "bulkhead-" + key }

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("kubernetes: random bytes: %w", err)
	}
	return hex.EncodeToString(b), nil
}
