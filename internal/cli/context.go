package cli

// `harness context ...` manages the config file's named contexts, and
// applyContext makes the current one the defaults of every command.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// contextPrecedence documents where a setting comes from.
const contextPrecedence = `Each setting is taken from the first of: its flag; its environment variable
($BULKHEAD_STATE_DIR, $KUBECONFIG, $BULKHEAD_SERVER, $BULKHEAD_TOKEN); the context given with
--context; the config file's current context; the built-in default. The config file is --config,
else $BULKHEAD_CONFIG, else $XDG_CONFIG_HOME/bulkhead/config.yaml, else
~/.config/bulkhead/config.yaml. A context's server-token-file is used only with that context's own
server, never sent to a server given by a flag or variable. Paths in a context may start with ~/;
relative ones are relative to the config file's directory.`

// applyContext fills the settings no flag or variable gave from the
// chosen context (--context, else the current one). The values are set
// as defaults, not as given flags, so a session's own saved settings
// still win over them (see adoptProvider).
func (g *globals) applyContext(cmd *cobra.Command) error {
	for c := cmd; c != nil; c = c.Parent() {
		if c.Annotations[skipContextAnnotation] != "" {
			return nil
		}
	}
	p, err := g.configPath()
	if err != nil {
		if g.contextName == "" {
			return nil // no home directory and no config asked for: no contexts
		}
		return err
	}
	cfg, err := loadConfig(p)
	if err != nil {
		return err
	}
	name := g.contextName
	if name == "" {
		name = cfg.CurrentContext
	}
	if name == "" {
		return nil
	}
	ctx := cfg.find(name)
	if ctx == nil {
		return unknownContext(cfg, p, name)
	}
	c := ctx.resolved(filepath.Dir(p))
	g.ctxDefaults = c
	for _, d := range []struct{ flag, env, val string }{
		{"provider", "", c.Provider},
		{"state-dir", stateDirEnv, c.StateDir},
		{"kubeconfig", "KUBECONFIG", c.Kubeconfig},
		{"kube-context", "", c.KubeContext},
		{"namespace", "", c.Namespace},
	} {
		f := cmd.Flag(d.flag)
		if d.val == "" || f == nil || f.Changed || (d.env != "" && os.Getenv(d.env) != "") {
			continue
		}
		if err := f.Value.Set(d.val); err != nil {
			return usageErr(compute.ErrInvalidArgument, "context %s (%s): %s: %v", name, p, d.flag, err)
		}
	}
	return nil
}

// skipContextAnnotation marks commands that do not take a context's
// defaults (those that manage contexts).
const skipContextAnnotation = "bulkhead/no-context"

// unknownContext is the error for a context name the file lacks.
func unknownContext(cfg *cliConfig, p, name string) error {
	msg := fmt.Sprintf("no context %q in %s", name, p)
	if near := nearestName(name, cfg.names()); near != "" {
		msg += fmt.Sprintf("; did you mean %q?", near)
	}
	if len(cfg.Contexts) == 0 {
		return usageErr(compute.ErrNotFound, "%s (it has none: `harness context set NAME ...` makes one)", msg)
	}
	return usageErr(compute.ErrNotFound, "%s (contexts: %s)", msg, strings.Join(cfg.names(), ", "))
}

// resolved returns the context with its paths expanded: ~/ to the home
// directory, relative ones against dir.
func (c namedContext) resolved(dir string) namedContext {
	for _, p := range []*string{&c.StateDir, &c.Kubeconfig, &c.ServerTokenFile} {
		switch {
		case *p == "":
		case strings.HasPrefix(*p, "~/"):
			if home, err := os.UserHomeDir(); err == nil {
				*p = filepath.Join(home, (*p)[2:])
			}
		case !filepath.IsAbs(*p):
			*p = filepath.Join(dir, *p)
		}
	}
	return c
}

// newContextCmd returns `harness context` and its subcommands.
func newContextCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Manage named contexts: the defaults (provider, state dir, cluster, server) of each place sandboxes live",
		Long: `A context names the settings of one place sandboxes live: a provider and its state directory,
a Kubernetes cluster (kubeconfig, kube context, namespace), or a ` + "`harness serve`" + ` (server URL and token
file). ` + "`harness context use NAME`" + ` makes one current, so daily commands need no flags.

` + contextPrecedence,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{skipContextAnnotation: "1"},
	}
	cmd.AddCommand(newContextListCmd(g), newContextUseCmd(g), newContextShowCmd(g), newContextSetCmd(g), newContextDeleteCmd(g))
	return cmd
}

// loadConfigOf returns the config file's path and contents.
func (g *globals) loadConfigOf() (string, *cliConfig, error) {
	p, err := g.configPath()
	if err != nil {
		return "", nil, err
	}
	cfg, err := loadConfig(p)
	return p, cfg, err
}

func newContextListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the contexts (* marks the current one)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, cfg, err := g.loadConfigOf()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CURRENT\tNAME\tPROVIDER\tSERVER")
			for _, c := range cfg.Contexts {
				mark := ""
				if c.Name == cfg.CurrentContext {
					mark = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", mark, c.Name, orDash(c.Provider), orDash(c.Server))
			}
			return tw.Flush()
		},
	}
}

// orDash shows an empty value as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newContextUseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "use NAME",
		Short: "Make NAME the current context",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.editContext(cmd, args[0], "switched to context %s\n", func(cfg *cliConfig) { cfg.CurrentContext = args[0] })
		},
	}
}

func newContextShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show [NAME]",
		Short: "Show a context's settings (default: the current one)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, cfg, err := g.loadConfigOf()
			if err != nil {
				return err
			}
			name := cfg.CurrentContext
			if g.contextName != "" {
				name = g.contextName
			}
			if len(args) == 1 {
				name = args[0]
			}
			if name == "" {
				return usageErr(compute.ErrNotFound, "no current context in %s (`harness context use NAME` sets one)", p)
			}
			c := cfg.find(name)
			if c == nil {
				return unknownContext(cfg, p, name)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "context: %s (%s)\n", name, p)
			for _, f := range c.fields()[1:] {
				if *f.val != "" {
					fmt.Fprintf(out, "%s: %s\n", f.key, *f.val)
				}
			}
			return nil
		},
	}
}

func newContextSetCmd(g *globals) *cobra.Command {
	var c namedContext
	cmd := &cobra.Command{
		Use:   "set NAME [--provider P] [--state-dir D] [--kubeconfig F] [--kube-context C] [--namespace N] [--server URL] [--server-token-file F]",
		Short: "Create a context, or change the settings given of an existing one (an empty value removes one)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkContextName(args[0]); err != nil {
				return usageErr(compute.ErrInvalidArgument, "%v", err)
			}
			if c.Provider != "" && !strings.Contains(" local docker remote kubernetes ", " "+c.Provider+" ") {
				return usageErr(compute.ErrInvalidArgument, "--provider %q: local, docker, remote or kubernetes", c.Provider)
			}
			if c.Server != "" {
				if _, err := checkServerURL(c.Server, true); err != nil {
					return err
				}
			}
			p, cfg, err := g.loadConfigOf()
			if err != nil {
				return err
			}
			dst := cfg.find(args[0])
			verb := "changed"
			if dst == nil {
				cfg.Contexts = append(cfg.Contexts, namedContext{Name: args[0]})
				dst, verb = &cfg.Contexts[len(cfg.Contexts)-1], "created"
			}
			src, dstFields := c.fields(), dst.fields()
			for i := 1; i < len(src); i++ {
				if cmd.Flags().Changed(src[i].key) {
					*dstFields[i].val = *src[i].val
				}
			}
			if err := saveConfig(p, cfg); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s context %s in %s\n", verb, args[0], p)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&c.Provider, "provider", "", "sandbox provider: local, docker, remote or kubernetes")
	fl.StringVar(&c.StateDir, "state-dir", "", "state directory")
	fl.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubernetes sandboxes: the kubeconfig")
	fl.StringVar(&c.KubeContext, "kube-context", "", "kubernetes sandboxes: the kubeconfig's context")
	fl.StringVar(&c.Namespace, "namespace", "", "kubernetes sandboxes: the namespace")
	fl.StringVar(&c.Server, "server", "", "the URL of a harness serve (https, or http on loopback)")
	fl.StringVar(&c.ServerTokenFile, "server-token-file", "", "file holding the bearer token for the server (mode 0600)")
	return cmd
}

func newContextDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a context (the current one too: then none is current)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.editContext(cmd, args[0], "deleted context %s\n", func(cfg *cliConfig) {
				cfg.Contexts = slices.DeleteFunc(cfg.Contexts, func(c namedContext) bool { return c.Name == args[0] })
				if cfg.CurrentContext == args[0] {
					cfg.CurrentContext = ""
				}
			})
		},
	}
}

// editContext changes the config file with fn when it has a context
// name, and then says done (a format taking the name).
func (g *globals) editContext(cmd *cobra.Command, name, done string, fn func(*cliConfig)) error {
	p, cfg, err := g.loadConfigOf()
	if err != nil {
		return err
	}
	if cfg.find(name) == nil {
		return unknownContext(cfg, p, name)
	}
	fn(cfg)
	if err := saveConfig(p, cfg); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), done, name)
	return nil
}
