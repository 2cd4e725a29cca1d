package manifest

import (
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
