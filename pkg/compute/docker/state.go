package docker

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// Labels the provider puts on its containers (and, for the session and
// workspace-volume ones, on its volumes). A label cannot change after
// creation, so activity is recorded in the private directory instead.
const (
	labelPrefix = "dev.bulkhead."
	// LabelSandbox ("1") marks a Bulkhead sandbox container.
	LabelSandbox = labelPrefix + "sandbox"
	// LabelSession is the session id.
	LabelSession = labelPrefix + "session"
	// LabelCreatedAt is Lifetime.CreatedAt (RFC 3339).
	LabelCreatedAt = labelPrefix + "created-at"
	// LabelTTL is Lifetime.TTL (a Go duration), when set.
	LabelTTL = labelPrefix + "ttl"
	// LabelIdleTimeout is Lifetime.IdleTimeout (a Go duration), when set.
	LabelIdleTimeout = labelPrefix + "idle-timeout"
	// LabelStateVersion is the version of the provider's State.
	LabelStateVersion = labelPrefix + "state-version"
	// LabelKey names the sandbox's private directory under StateDir.
	LabelKey = labelPrefix + "key"
	// LabelVolume is the workspace volume, when there is one.
	LabelVolume = labelPrefix + "volume"
	// LabelWorkspace is the workspace root inside the container.
	LabelWorkspace = labelPrefix + "workspace"
	// LabelWorkspaceVolume ("1") marks a workspace volume.
	LabelWorkspaceVolume = labelPrefix + "workspace-volume"
)

// StateVersion is the version of State this package writes and reads.
const StateVersion = 1

// State is what finds a Docker sandbox again (Sandbox.State,
// SandboxInfo.State). It holds no token: the token stays in the private
// directory on the host.
type State struct {
	Version     int    `json:"version"`
	ContainerID string `json:"container_id"`
	Name        string `json:"name"`
	// Key names the private directory under Config.StateDir.
	Key       string `json:"key"`
	SessionID string `json:"session_id"`
	Image     string `json:"image"`
	// Volume is the workspace volume ("" when the workspace is in the
	// container's layer).
	Volume    string `json:"volume,omitempty"`
	Workspace string `json:"workspace"`
}

var (
	keyRE  = regexp.MustCompile(`^[0-9a-f]{16}$`)
	nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
)

// DecodeState parses and checks a provider state.
func DecodeState(raw json.RawMessage) (State, error) {
	var st State
	if len(raw) == 0 {
		return st, fmt.Errorf("docker: %w: empty sandbox state", compute.ErrInvalidArgument)
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("docker: %w: sandbox state: %v", compute.ErrInvalidArgument, err)
	}
	switch {
	case st.Version != StateVersion:
		return st, fmt.Errorf("docker: %w: sandbox state version %d (this provider reads %d)", compute.ErrInvalidArgument, st.Version, StateVersion)
	case st.ContainerID == "" && st.Name == "":
		return st, fmt.Errorf("docker: %w: sandbox state names no container", compute.ErrInvalidArgument)
	case !keyRE.MatchString(st.Key):
		return st, fmt.Errorf("docker: %w: sandbox state has a malformed key %q", compute.ErrInvalidArgument, st.Key)
	case st.Volume != "" && !nameRE.MatchString(st.Volume):
		return st, fmt.Errorf("docker: %w: sandbox state has a malformed volume name %q", compute.ErrInvalidArgument, st.Volume)
	}
	return st, nil
}

func (st State) encode() (json.RawMessage, error) {
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("docker: encode sandbox state: %w", err)
	}
	return raw, nil
}

// stateFromLabels rebuilds a State from a container's labels (List).
func stateFromLabels(id, name, image string, labels map[string]string) State {
	return State{
		Version: StateVersion, ContainerID: id, Name: strings.TrimPrefix(name, "/"), Key: labels[LabelKey],
		SessionID: labels[LabelSession], Image: image, Volume: labels[LabelVolume], Workspace: labels[LabelWorkspace],
	}
}

// lifetimeLabels records a Lifetime as labels.
func lifetimeLabels(l compute.Lifetime, into map[string]string) {
	into[LabelCreatedAt] = l.CreatedAt.UTC().Format(time.RFC3339Nano)
	if l.TTL > 0 {
		into[LabelTTL] = l.TTL.String()
	}
	if l.IdleTimeout > 0 {
		into[LabelIdleTimeout] = l.IdleTimeout.String()
	}
}

// lifetimeFromLabels reads a Lifetime back; malformed values read as unset.
func lifetimeFromLabels(labels map[string]string) compute.Lifetime {
	var l compute.Lifetime
	l.CreatedAt, _ = time.Parse(time.RFC3339Nano, labels[LabelCreatedAt])
	l.TTL, _ = time.ParseDuration(labels[LabelTTL])
	l.IdleTimeout, _ = time.ParseDuration(labels[LabelIdleTimeout])
	return l
}

// nameFragment turns a session id into a string usable in container and
// volume names; ids that had to be changed get a short hash so that two of
// them cannot collide.
func nameFragment(sessionID string) string {
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
	if s != sessionID {
		sum := sha256.Sum256([]byte(sessionID))
		s += "-" + hex.EncodeToString(sum[:4])
	}
	return s
}

// VolumeName is the workspace volume of a session.
func VolumeName(sessionID string) string { return "bulkhead-ws-" + nameFragment(sessionID) }

func containerName(sessionID, key string) string {
	return "bulkhead-" + nameFragment(sessionID) + "-" + key[:8]
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("docker: random bytes: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// privateDir is one sandbox's directory on the host.
type privateDir string

func (p *Provider) privateDir(key string) privateDir {
	return privateDir(filepath.Join(p.cfg.StateDir, key))
}

func (d privateDir) runDir() string     { return filepath.Join(string(d), runDirName) }
func (d privateDir) socket() string     { return socketPath(string(d)) }
func (d privateDir) tokenCopy() string  { return filepath.Join(string(d), tokenName) }
func (d privateDir) tokenDrop() string  { return filepath.Join(d.runDir(), tokenName) }
func (d privateDir) lastActive() string { return filepath.Join(string(d), lastActiveName) }

// create makes the directory and its run directory, both 0700.
func (d privateDir) create() error {
	for _, dir := range []string{string(d), d.runDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("docker: create sandbox directory: %w", err)
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("docker: restrict sandbox directory: %w", err)
		}
	}
	return nil
}

// newToken makes a fresh token, keeps the harness-side copy and drops the
// file the daemon reads (and removes) at start.
func (d privateDir) newToken() (string, error) {
	token, err := randomHex(32)
	if err != nil {
		return "", err
	}
	if err := d.create(); err != nil {
		return "", err
	}
	if err := writeSecret(d.tokenCopy(), token); err != nil {
		return "", err
	}
	if err := writeSecret(d.tokenDrop(), token); err != nil {
		return "", err
	}
	return token, nil
}

// readToken reads the harness-side copy.
func (d privateDir) readToken() (string, error) {
	raw, err := os.ReadFile(d.tokenCopy())
	if err != nil {
		return "", fmt.Errorf("docker: read the sandbox's token copy: %w", err)
	}
	token := strings.TrimSpace(string(raw))
	if len(token) != 64 {
		return "", fmt.Errorf("docker: the sandbox's token copy is malformed")
	}
	return token, nil
}

// touch records activity now.
func (d privateDir) touch() error {
	now := time.Now()
	if err := os.Chtimes(d.lastActive(), now, now); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("docker: record activity: %w", err)
		}
		if err := os.WriteFile(d.lastActive(), nil, 0o600); err != nil {
			return fmt.Errorf("docker: record activity: %w", err)
		}
	}
	return nil
}

// lastActiveTime is the recorded activity (zero when none).
func (d privateDir) lastActiveTime() time.Time {
	fi, err := os.Stat(d.lastActive())
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

func (d privateDir) remove() error {
	if err := os.RemoveAll(string(d)); err != nil {
		return fmt.Errorf("docker: remove sandbox directory: %w", err)
	}
	return nil
}

// writeSecret writes a 0600 file atomically (temporary file, then rename).
func writeSecret(path, content string) error {
	tmp := path + ".tmp" + strconv.Itoa(os.Getpid())
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("docker: write token file: %w", err)
	}
	_, werr := f.WriteString(content)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("docker: write token file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("docker: write token file: %w", err)
	}
	return nil
}
