package console

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, target string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec.Result()
}

// TestHandlerServesTheConsole: index and assets under MountPath with a
// strict CSP, "/" redirected, other paths and methods refused.
func TestHandlerServesTheConsole(t *testing.T) {
	h := Handler()
	res := get(t, h, http.MethodGet, MountPath)
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET %s: %d %s", MountPath, res.StatusCode, res.Header.Get("Content-Type"))
	}
	if !strings.Contains(string(body), `<script src="app.js" defer></script>`) {
		t.Errorf("index lacks app.js:\n%s", body)
	}
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"script-src 'self'", "default-src 'none'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-eval") || strings.Contains(strings.SplitN(strings.SplitN(csp, "script-src", 2)[1], ";", 2)[0], "unsafe-inline") {
		t.Errorf("CSP %q lets injected script run", csp)
	}
	if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q", got)
	}
	for target, want := range map[string]int{
		"/":                      http.StatusFound,
		"/console":               http.StatusFound,
		"/console/app.js":        http.StatusOK,
		"/console/nope.js":       http.StatusNotFound,
		"/elsewhere":             http.StatusNotFound,
		"/console/../go.mod":     http.StatusNotFound,
		"/console/vendor/xterm/": http.StatusOK,
	} {
		if res := get(t, h, http.MethodGet, target); res.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", target, res.StatusCode, want)
		} else if want == http.StatusFound && res.Header.Get("Location") != MountPath {
			t.Errorf("GET %s: Location %q, want %q", target, res.Header.Get("Location"), MountPath)
		}
	}
	if res := get(t, h, http.MethodPost, MountPath); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST %s: %d, want 405", MountPath, res.StatusCode)
	}
	if res := get(t, h, http.MethodGet, MountPath+"app.js"); !strings.Contains(res.Header.Get("Content-Type"), "javascript") {
		t.Errorf("app.js Content-Type = %q", res.Header.Get("Content-Type"))
	}
}

// TestIndexReferencesExist: every local script and stylesheet index.html
// loads is served, and nothing comes from another origin.
func TestIndexReferencesExist(t *testing.T) {
	index, err := fs.ReadFile(FS(), "index.html")
	if err != nil {
		t.Fatal(err)
	}
	refs := regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(string(index), -1)
	if len(refs) < 5 {
		t.Fatalf("only %d references in index.html", len(refs))
	}
	for _, m := range refs {
		ref := m[1]
		if strings.HasPrefix(ref, "data:") {
			continue
		}
		if strings.Contains(ref, "//") {
			t.Errorf("index.html loads %s from another origin", ref)
			continue
		}
		if res := get(t, Handler(), http.MethodGet, path.Join(MountPath, ref)); res.StatusCode != http.StatusOK {
			t.Errorf("index.html references %s: %d", ref, res.StatusCode)
		}
	}
}

// TestScriptsNeverParseMarkup: the console's own scripts build the page
// with text nodes only; none of the APIs that parse strings as HTML or
// code appears in them (the vendored xterm.js is not checked).
func TestScriptsNeverParseMarkup(t *testing.T) {
	banned := regexp.MustCompile(`\.innerHTML|\.outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|createContextualFragment|DOMParser`)
	n := 0
	err := fs.WalkDir(FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".js") || strings.HasPrefix(p, "vendor/") {
			return err
		}
		n++
		b, err := fs.ReadFile(FS(), p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if banned.MatchString(line) {
				t.Errorf("%s:%d parses markup or code: %s", p, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil || n < 2 {
		t.Fatalf("walk: %v (%d scripts)", err, n)
	}
}

// TestVendoredAssetsCarryLicenses: each vendored library has its LICENSE.
func TestVendoredAssetsCarryLicenses(t *testing.T) {
	dirs, err := fs.ReadDir(FS(), "vendor")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("vendor: %v", err)
	}
	for _, d := range dirs {
		b, err := fs.ReadFile(FS(), path.Join("vendor", d.Name(), "LICENSE"))
		if err != nil || !strings.Contains(string(b), "Permission is hereby granted") {
			t.Errorf("vendor/%s: no LICENSE with its terms (%v)", d.Name(), err)
		}
	}
}
