package manifest

import (
	"net/netip"
	"path"
	"strings"
	"testing"
)

func TestValidateEntryPath(t *testing.T) {
	good := []string{
		"a", "a/b", "src/app.py", ".hidden", "a/.b/c", "..a", "a..", "a/...", "with space", "ünïcode/файл",
		"C:x", ":/y", "ab:/c", strings.Repeat("a", 255), strings.Repeat("a/", 2047) + "a",
	}
	for _, p := range good {
		if err := ValidateEntryPath(p); err != nil {
			t.Errorf("ValidateEntryPath(%q) = %v, want nil", p, err)
		}
	}
	bad := []struct{ in, msg string }{
		{"", "empty path"},
		{"/etc/passwd", "relative"},
		{"/", "relative"},
		{"..", `".." component`},
		{"../x", `".." component`},
		{"a/../b", `".." component`},
		{"a/..", `".." component`},
		{".", `"." component`},
		{"./a", `"." component`},
		{"a/./b", `"." component`},
		{"a//b", "empty component"},
		{"a/", "empty component"},
		{`a\b`, "backslash"},
		{`..\x`, "backslash"},
		{"C:/data", "Windows"},
		{"c:", "Windows"},
		{"a:/b", "Windows"},
		{"a\nb", "control character"},
		{"a\x00b", "control character"},
		{"a\x7fb", "control character"},
		{"a\u2028b", "control character"},
		{"a\u0085b", "control character"},
		{"a\xffb", "UTF-8"},
		{strings.Repeat("a", 256), "255 bytes"},
		{strings.Repeat("a/", 2048) + "a", "4096 bytes"},
	}
	for _, tc := range bad {
		err := ValidateEntryPath(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ValidateEntryPath(%q) = %v, want an error mentioning %q", tc.in, err, tc.msg)
		}
	}
}

// checkAcceptedPath states what an accepted entry path guarantees.
func checkAcceptedPath(t *testing.T, p string) {
	t.Helper()
	if path.IsAbs(p) || p == "" {
		t.Fatalf("accepted %q: not relative", p)
	}
	if path.Clean(p) != p {
		t.Fatalf("accepted %q: not clean (%q)", p, path.Clean(p))
	}
	for c := range strings.SplitSeq(p, "/") {
		if c == ".." || c == "." || c == "" {
			t.Fatalf("accepted %q: component %q", p, c)
		}
	}
	if strings.ContainsAny(p, "\\\x00\n\r") {
		t.Fatalf("accepted %q: forbidden character", p)
	}
	// Joined below a root, it stays below the root.
	if j := path.Join("/workspace", p); !strings.HasPrefix(j, "/workspace/") {
		t.Fatalf("accepted %q: escapes the root as %q", p, j)
	}
}

func FuzzValidatePath(f *testing.F) {
	for _, s := range []string{"a", "a/b", "../x", "a/../b", "/abs", "a//b", "./a", `a\b`, "C:/x", "a\x00", "ü/ß", "..", "..."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if err := ValidateEntryPath(p); err == nil {
			checkAcceptedPath(t, p)
		}
		// The other path checks never panic either.
		_ = checkAbsPath(p)
		_ = checkHostSrc(p, true)
		_ = checkSubPath(p)
		_ = checkGitRef(p)
		_ = checkGitHost(p)
		if ValidateGitHostName(p) == nil {
			if checkGitHost(p) != nil || strings.Contains(p, ":") {
				t.Fatalf("ValidateGitHostName accepted %q, which is not a bare host name", p)
			}
			if _, err := netip.ParseAddr(p); err == nil {
				t.Fatalf("ValidateGitHostName accepted the address %q", p)
			}
		}
		_ = checkEndpoint(p)
		if _, err := ParsePermissions(p); err == nil && len(p) > 12 {
			t.Fatalf("ParsePermissions accepted %q", p)
		}
	})
}

func TestAccountAndEnvNames(t *testing.T) {
	for _, s := range []string{"analyst", "a", "svc_1", "a.b-c", "_x", "1a", strings.Repeat("a", 32)} {
		if err := checkAccountName(s); err != nil {
			t.Errorf("checkAccountName(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", "-a", "123", "a b", "a:b", "a/b", ".", "..", "é", strings.Repeat("a", 33)} {
		if err := checkAccountName(s); err == nil {
			t.Errorf("checkAccountName(%q) accepted", s)
		}
	}
	for _, s := range []string{"PATH", "_x", "a1", "A_B_9"} {
		if err := checkEnvName(s); err != nil {
			t.Errorf("checkEnvName(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", "1A", "A-B", "A=B", "A B", "Ä"} {
		if err := checkEnvName(s); err == nil {
			t.Errorf("checkEnvName(%q) accepted", s)
		}
	}
	for _, s := range []string{"token", "prod/github-token", "a.b_c", "9x"} {
		if err := checkSecretName(s); err != nil {
			t.Errorf("checkSecretName(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", "/x", "-x", ".x", "a b", "a$b", strings.Repeat("a", 257)} {
		if err := checkSecretName(s); err == nil {
			t.Errorf("checkSecretName(%q) accepted", s)
		}
	}
}

// ValidateGitHostName is the rule for git hosts of untrusted manifests and
// the operator's allow list: DNS names only, no IP address in any spelling,
// no port.
func TestValidateGitHostName(t *testing.T) {
	for _, h := range []string{"github.com", "GitHub.com", "gitlab.example.org", "git-1.example.com", "localhost", "a1.b2"} {
		if err := ValidateGitHostName(h); err != nil {
			t.Errorf("ValidateGitHostName(%q) = %v", h, err)
		}
	}
	ip := []string{"127.0.0.1", "10.0.0.1", "169.254.169.254", "127.1", "2130706433", "0x7f.0.0.1", "0x7f000001",
		"git.example.0x10", "example.123", "127.0.0.1:8080", "::1", "[::1]", "[::ffff:127.0.0.1]:443", "fd00:ec2::254"}
	for _, h := range ip {
		if err := ValidateGitHostName(h); err == nil || !strings.Contains(err.Error(), "not an IP address") {
			t.Errorf("ValidateGitHostName(%q) = %v, want an IP address refusal", h, err)
		}
	}
	port := []string{"github.com:443", "github.com:22", "github.com:8443", "github.com:"}
	for _, h := range port {
		if err := ValidateGitHostName(h); err == nil || !strings.Contains(err.Error(), "port") {
			t.Errorf("ValidateGitHostName(%q) = %v, want a port refusal", h, err)
		}
	}
	for _, h := range []string{"", "https://github.com", "user@github.com", "github.com/evil", "-a.com", "a..b", "a b", "github.com."} {
		if err := ValidateGitHostName(h); err == nil {
			t.Errorf("ValidateGitHostName(%q) accepted", h)
		}
	}
	// Trusted manifests keep addresses and ports, in range.
	for _, h := range []string{"127.0.0.1:8080", "git.example.com:8443", "10.0.0.1"} {
		if err := checkGitHost(h); err != nil {
			t.Errorf("checkGitHost(%q) = %v", h, err)
		}
	}
	for _, h := range []string{"git.example.com:0", "git.example.com:65536", "git.example.com:99999", "git.example.com:+1"} {
		if err := checkGitHost(h); err == nil {
			t.Errorf("checkGitHost(%q) accepted", h)
		}
	}
}
