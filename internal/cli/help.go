package cli

// Help with the shared flags grouped: a command's help lists its own
// flags first, then the flags every command shares under one heading per
// concern (provider, docker, kubernetes, ...), instead of one list of
// thirty.

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagGroupAnnotation holds the heading of a shared flag.
const flagGroupAnnotation = "bulkhead/group"

// flagGroups are the headings of the shared flags, in help order, with
// the flags under each. Every persistent flag of the root has one (a test
// checks it).
var flagGroups = []struct {
	title string
	flags []string
}{
	{"Provider flags", []string{"provider", "state-dir", "label", "host-grant", "mount-max-bytes", "s3-file-system"}},
	{"Local sandbox flags", []string{"agentd", "isolation", "sandbox-rootfs"}},
	{"Docker flags", []string{"image", "docker-runtime"}},
	{"Kubernetes flags", []string{"kubeconfig", "kube-context", "namespace", "kube-connect", "kube-harness-cidr", "runtime-class", "kube-pull-policy"}},
	{"Remote sandbox flags", []string{"address", "token-file", "tls-ca", "tls-cert", "tls-key"}},
	{"Snapshot store flags", []string{"snapshot-store", "s3-endpoint"}},
	{"Service flags", []string{"server", "server-token-file", "insecure-server"}},
	{"Global flags", []string{"config", "context", "verbose", "trace"}},
}

// groupFlags annotates the root's persistent flags with their headings.
func groupFlags(pf *pflag.FlagSet) {
	for _, grp := range flagGroups {
		for _, name := range grp.flags {
			_ = pf.SetAnnotation(name, flagGroupAnnotation, []string{grp.title})
		}
	}
}

// flagGroupOf is the heading of a flag ("" for a command's own).
func flagGroupOf(f *pflag.Flag) string {
	if g := f.Annotations[flagGroupAnnotation]; len(g) == 1 {
		return g[0]
	}
	return ""
}

// groupedUsage writes a command's usage: cobra's, with the flags a
// command has of its own under "Flags:" and the shared ones by group.
func groupedUsage(c *cobra.Command) error {
	w := c.OutOrStderr()
	fmt.Fprint(w, "Usage:")
	if c.Runnable() {
		fmt.Fprintf(w, "\n  %s", c.UseLine())
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\n  %s [command]", c.CommandPath())
	}
	if len(c.Aliases) > 0 {
		fmt.Fprintf(w, "\n\nAliases:\n  %s", c.NameAndAliases())
	}
	if c.HasExample() {
		fmt.Fprintf(w, "\n\nExamples:\n%s", c.Example)
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprint(w, "\n\nAvailable Commands:")
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() || sub.Name() == "help" {
				fmt.Fprintf(w, "\n  %-*s %s", sub.NamePadding(), sub.Name(), sub.Short)
			}
		}
	}
	own := pflag.NewFlagSet(c.Name(), pflag.ContinueOnError)
	grouped := map[string]*pflag.FlagSet{}
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		g := flagGroupOf(f)
		if g == "" {
			own.AddFlag(f)
			return
		}
		if grouped[g] == nil {
			grouped[g] = pflag.NewFlagSet(g, pflag.ContinueOnError)
		}
		grouped[g].AddFlag(f)
	})
	writeFlagSet(w, "Flags", own)
	for _, grp := range flagGroups {
		writeFlagSet(w, grp.title, grouped[grp.title])
	}
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\n\nUse \"%s [command] --help\" for more information about a command.", c.CommandPath())
	}
	fmt.Fprintln(w)
	return nil
}

// writeFlagSet writes a heading and its flags (nothing for none).
func writeFlagSet(w io.Writer, title string, fs *pflag.FlagSet) {
	if fs == nil || !fs.HasAvailableFlags() {
		return
	}
	fmt.Fprintf(w, "\n\n%s:\n%s", title, strings.TrimRight(fs.FlagUsages(), " \n"))
}
