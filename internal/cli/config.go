package cli

// The CLI's config file: named contexts, like kubectl's, each holding the
// defaults of a place sandboxes live (a provider and its state directory,
// a cluster, or a service), and the current one. Read strictly (an
// unknown key, a duplicate or a value of the wrong shape is an error
// naming its line); written atomically, readable by its owner only.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// configEnv names the config file when --config is not given.
const configEnv = "BULKHEAD_CONFIG"

// maxConfigBytes bounds the config file read.
const maxConfigBytes = 1 << 20

// namedContext is one context of the config file. Its keys are the flags
// they stand for.
type namedContext struct {
	Name            string `yaml:"name"`
	Provider        string `yaml:"provider,omitempty"`
	StateDir        string `yaml:"state-dir,omitempty"`
	Kubeconfig      string `yaml:"kubeconfig,omitempty"`
	KubeContext     string `yaml:"kube-context,omitempty"`
	Namespace       string `yaml:"namespace,omitempty"`
	Server          string `yaml:"server,omitempty"`
	ServerTokenFile string `yaml:"server-token-file,omitempty"`
}

// contextFields maps each key of a context to its field, in file order.
func (c *namedContext) fields() []struct {
	key string
	val *string
} {
	return []struct {
		key string
		val *string
	}{
		{"name", &c.Name}, {"provider", &c.Provider}, {"state-dir", &c.StateDir}, {"kubeconfig", &c.Kubeconfig},
		{"kube-context", &c.KubeContext}, {"namespace", &c.Namespace}, {"server", &c.Server}, {"server-token-file", &c.ServerTokenFile},
	}
}

// cliConfig is the config file.
type cliConfig struct {
	CurrentContext string         `yaml:"current-context,omitempty"`
	Contexts       []namedContext `yaml:"contexts"`
}

// find returns the context named name, or nil.
func (c *cliConfig) find(name string) *namedContext {
	for i := range c.Contexts {
		if c.Contexts[i].Name == name {
			return &c.Contexts[i]
		}
	}
	return nil
}

// names lists the contexts' names.
func (c *cliConfig) names() []string {
	var out []string
	for _, x := range c.Contexts {
		out = append(out, x.Name)
	}
	return out
}

// configPath is the config file: --config, else $BULKHEAD_CONFIG, else
// $XDG_CONFIG_HOME/bulkhead/config.yaml, else
// ~/.config/bulkhead/config.yaml.
func (g *globals) configPath() (string, error) {
	if g.config != "" {
		return g.config, nil
	}
	if p := os.Getenv(configEnv); p != "" {
		return p, nil
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "bulkhead", "config.yaml"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("config file: no home directory (give --config or $%s): %w", configEnv, err)
	}
	return filepath.Join(home, ".config", "bulkhead", "config.yaml"), nil
}

// loadConfig reads the config file at p; a missing file is an empty
// config.
func loadConfig(p string) (*cliConfig, error) {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return &cliConfig{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", p, err)
	}
	if len(data) > maxConfigBytes {
		return nil, usageErr(compute.ErrInvalidArgument, "config file %s: over %d bytes", p, maxConfigBytes)
	}
	cfg, line, err := parseConfig(data)
	if err != nil {
		where := p
		if line > 0 {
			where = fmt.Sprintf("%s:%d", p, line)
		}
		return nil, usageErr(compute.ErrInvalidArgument, "config file %s: %v", where, err)
	}
	return cfg, nil
}

// parseConfig reads a config document strictly and returns the line of
// the first fault with it.
func parseConfig(data []byte) (*cliConfig, int, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, syntaxFaultLine(data), fmt.Errorf("invalid YAML: %s", yamlMessage(err))
	}
	cfg := &cliConfig{}
	if len(doc.Content) == 0 {
		return cfg, 0, nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, top.Line, errors.New("want a mapping with current-context and contexts")
	}
	var current *yaml.Node
	seen := map[string]bool{}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if seen[k.Value] {
			return nil, k.Line, fmt.Errorf("%s given twice", k.Value)
		}
		seen[k.Value] = true
		switch k.Value {
		case "current-context":
			if v.Kind != yaml.ScalarNode {
				return nil, v.Line, errors.New("current-context: want a context's name")
			}
			cfg.CurrentContext, current = v.Value, v
		case "contexts":
			if line, err := parseContexts(v, cfg); err != nil {
				return nil, line, err
			}
		default:
			return nil, k.Line, fmt.Errorf("unknown key %q (current-context, contexts)", k.Value)
		}
	}
	if current != nil && cfg.CurrentContext != "" && cfg.find(cfg.CurrentContext) == nil {
		return nil, current.Line, fmt.Errorf("current-context %q names no context (%s)", cfg.CurrentContext, strings.Join(cfg.names(), ", "))
	}
	return cfg, 0, nil
}

// parseContexts reads the contexts sequence into cfg.
func parseContexts(n *yaml.Node, cfg *cliConfig) (int, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return 0, nil
	}
	if n.Kind != yaml.SequenceNode {
		return n.Line, errors.New("contexts: want a list of contexts (- name: NAME ...)")
	}
	for _, item := range n.Content {
		if item.Kind != yaml.MappingNode {
			return item.Line, errors.New("a context: want a mapping (name, provider, state-dir, kubeconfig, kube-context, namespace, server, server-token-file)")
		}
		var c namedContext
		fields := c.fields()
		set := map[string]bool{}
		for i := 0; i+1 < len(item.Content); i += 2 {
			k, v := item.Content[i], item.Content[i+1]
			var dst *string
			for _, f := range fields {
				if f.key == k.Value {
					dst = f.val
				}
			}
			switch {
			case dst == nil:
				return k.Line, fmt.Errorf("unknown key %q in a context (name, provider, state-dir, kubeconfig, kube-context, namespace, server, server-token-file)", k.Value)
			case set[k.Value]:
				return k.Line, fmt.Errorf("%s given twice", k.Value)
			case v.Kind != yaml.ScalarNode || (v.Tag != "!!str" && v.Tag != "!!null"):
				return v.Line, fmt.Errorf("%s: want a string", k.Value)
			}
			set[k.Value], *dst = true, v.Value
		}
		if err := checkContextName(c.Name); err != nil {
			return item.Line, err
		}
		if cfg.find(c.Name) != nil {
			return item.Line, fmt.Errorf("context %q given twice", c.Name)
		}
		cfg.Contexts = append(cfg.Contexts, c)
	}
	return 0, nil
}

// checkContextName accepts 1-63 characters from [A-Za-z0-9._-].
func checkContextName(name string) error {
	if name == "" || len(name) > 63 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		return fmt.Errorf("context name %q: want 1-63 characters from [A-Za-z0-9._-]", name)
	}
	return nil
}

// yamlMessage is the parser's message without its own "line N", which
// is where the construct holding the fault starts, not the fault.
func yamlMessage(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if _, after, ok := strings.Cut(rest, ": "); ok {
			return after
		}
	}
	return msg
}

// syntaxFaultLine is the line a syntax error is on: the first line L
// such that the lines before it parse and no longer prefix up to the end
// does (the parser itself names the line of the enclosing construct).
func syntaxFaultLine(data []byte) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	for l := len(lines); l >= 1; l-- {
		var n yaml.Node
		if yaml.Unmarshal(bytes.Join(lines[:l-1], nil), &n) == nil {
			return l
		}
	}
	return 1
}

// saveConfig writes cfg to p atomically (a temporary file renamed over
// it), readable and writable by its owner only; the directory is made
// (0700) when missing.
func saveConfig(p string, cfg *cliConfig) (err error) {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	data = append([]byte("# harness contexts: see `harness context --help`\n"), data...)
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(p)+".tmp-*")
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	return nil
}
