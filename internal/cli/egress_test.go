package cli

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestAllowDomainFlag: --allow-domain refuses IP addresses and bad
// patterns, and is refused where it cannot be enforced (plain local
// sandboxes share the host's network; remote sandboxes are configured
// where they run). Nothing is created.
func TestAllowDomainFlag(t *testing.T) {
	state := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--isolation", "none", "sandbox", "create", "--allow-domain", "example.com"}, "bubblewrap"},
		{[]string{"sandbox", "create", "--allow-domain", "10.0.0.1"}, "--allow-domain"},
		{[]string{"sandbox", "create", "--allow-domain", "*.com"}, "--allow-domain"},
		{[]string{"sandbox", "create", "--allow-domain", "example.com:0"}, "--allow-domain"},
		{[]string{"--provider", "remote", "sandbox", "create", "--allow-domain", "example.com"}, "remote"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		args := append([]string{"--state-dir", state, "--agentd", filepath.Join(state, "no-agentd")}, c.args...)
		code := Execute(t.Context(), args, Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
		if code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want a failure mentioning %q", c.args, code, errb.String(), c.want)
		}
	}
}
