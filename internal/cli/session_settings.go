package cli

// A session remembers the provider it was made with and how to reach it
// (kubeconfig path, context, namespace, connect mode; docker's image and
// runtime) in a sidecar file next to its state, sessions/<id>.settings:
// compute's State is decoded strictly and is the provider's, so the CLI's
// own settings stay beside it. Later commands on the session take them
// where their flags are not given. Never a credential: paths and names.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// sessionSettings are the connection settings a session was made with.
type sessionSettings struct {
	Provider string `json:"provider"`
	// Image is the sandbox image (docker, kubernetes).
	Image         string `json:"image,omitempty"`
	DockerRuntime string `json:"docker_runtime,omitempty"`
	// Kubeconfig is the kubeconfig file's absolute path ("": the usual
	// loading rules).
	Kubeconfig     string `json:"kubeconfig,omitempty"`
	KubeContext    string `json:"kube_context,omitempty"`
	Namespace      string `json:"namespace,omitempty"`
	KubeConnect    string `json:"kube_connect,omitempty"`
	KubePullPolicy string `json:"kube_pull_policy,omitempty"`
}

// settingsExt is the sidecar's extension (not .json: readStates reads
// every .json file of the directory as a State).
const settingsExt = ".settings"

// settingsPath returns where the settings of session id are kept.
func settingsPath(g *globals, id string) (string, error) {
	p, err := statePath(g, id)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(p, ".json") + settingsExt, nil
}

// currentSettings are the settings of the provider this command uses
// (after client resolved them: see kubernetesConfig).
func (g *globals) currentSettings(provider string) sessionSettings {
	s := sessionSettings{Provider: provider}
	switch provider {
	case "docker":
		s.Image, s.DockerRuntime = g.image, g.dockerRuntime
	case "kubernetes":
		s.Image, s.Kubeconfig, s.KubeContext, s.Namespace = g.image, g.kube.kubeconfig, g.kube.context, g.kube.namespace
		s.KubeConnect, s.KubePullPolicy = g.kube.connect, g.kube.pullPolicy
	}
	return s
}

// saveSettings records the settings a new session was made with.
func saveSettings(g *globals, id, provider string) error {
	p, err := settingsPath(g, id)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(g.currentSettings(provider), "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(p, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("save session settings: %w", err)
	}
	return nil
}

// loadSettings reads the settings of session id (nil when none were saved:
// a session made by an older harness).
func loadSettings(g *globals, id string) (*sessionSettings, error) {
	p, err := settingsPath(g, id)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the settings of session %s: %w", id, err)
	}
	var s sessionSettings
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("settings of session %s (%s): %w", id, p, err)
	}
	return &s, nil
}

// removeSettings deletes the settings of session id (absent is fine).
func removeSettings(g *globals, id string) error {
	p, err := settingsPath(g, id)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the settings of session %s: %w", id, err)
	}
	return nil
}

// adoptSession makes a command on session id use the session's provider
// and saved settings where their flags were not given. A --provider other
// than the session's is an error.
func adoptSession(cmd *cobra.Command, g *globals, id, provider string) error {
	if f := cmd.Flag("provider"); f != nil && f.Changed && provider != "" && g.provider != provider {
		return usageErr(compute.ErrInvalidArgument, "session %s is a %s sandbox, not --provider %s (leave --provider out: the session remembers its own)", id, provider, g.provider)
	}
	adoptProvider(cmd, g, provider)
	s, err := loadSettings(g, id)
	if err != nil || s == nil {
		return err
	}
	if s.Provider != "" && provider != "" && s.Provider != provider {
		// Settings of another session's provider: ignore them.
		return nil
	}
	set := func(flag string, dst *string, v string) {
		if f := cmd.Flag(flag); v != "" && (f == nil || !f.Changed) {
			*dst = v
		}
	}
	switch provider {
	case "docker":
		set("image", &g.image, s.Image)
		set("docker-runtime", &g.dockerRuntime, s.DockerRuntime)
	case "kubernetes":
		set("image", &g.image, s.Image)
		set("kubeconfig", &g.kube.kubeconfig, s.Kubeconfig)
		set("kube-context", &g.kube.context, s.KubeContext)
		set("namespace", &g.kube.namespace, s.Namespace)
		set("kube-connect", &g.kube.connect, s.KubeConnect)
		set("kube-pull-policy", &g.kube.pullPolicy, s.KubePullPolicy)
	}
	return nil
}
