package materializer_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// fakeFetcher records pinned fetches and writes a file into the checkout.
type fakeFetcher struct {
	mu    sync.Mutex
	calls []fakeFetch
	err   error
}

type fakeFetch struct {
	repo  manifest.GitRepo
	token string
	addrs []netip.Addr
}

func (f *fakeFetcher) Fetch(context.Context, *manifest.GitRepo, string) error {
	return errors.New("fakeFetcher: unpinned fetch")
}

func (f *fakeFetcher) FetchPinned(_ context.Context, repo *manifest.GitRepo, dir string, addrs []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := fakeFetch{repo: *repo, addrs: slices.Clone(addrs)}
	if repo.Token != nil {
		c.token, _ = repo.Token.Value()
	}
	f.calls = append(f.calls, c)
	if f.err != nil {
		return f.err
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte("fetched\n"), 0o644)
}

// unpinnedFetcher is a GitFetcher that cannot pin addresses.
type unpinnedFetcher struct{}

func (unpinnedFetcher) Fetch(context.Context, *manifest.GitRepo, string) error { return nil }

// resolver answers lookups from a table and counts them.
type resolver struct {
	mu    sync.Mutex
	addrs map[string][]string
	hosts []string
}

func (r *resolver) lookup(_ context.Context, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hosts = append(r.hosts, host)
	list, ok := r.addrs[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, s := range list {
		out = append(out, netip.MustParseAddr(s))
	}
	return out, nil
}

func gitManifest(repo *manifest.GitRepo) *manifest.Manifest {
	return &manifest.Manifest{Entries: map[string]*manifest.Entry{"repo": {Type: manifest.TypeGitRepo, Git: repo}}}
}

func debugLog() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(core), logs
}

// logText is every logged message with its fields, for searching.
func logText(logs *observer.ObservedLogs) string {
	var b strings.Builder
	for _, e := range logs.All() {
		b.WriteString(e.Message)
		for k, v := range e.ContextMap() {
			fmt.Fprintf(&b, " %s=%v", k, v)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// A git host that is not on the operator's allow list is refused before
// anything is resolved or fetched; the zero policy allows no host, and a
// repository without a host means github.com, which must be listed too.
func TestGitUntrustedHostNotAllowed(t *testing.T) {
	cases := map[string]struct {
		repo    manifest.GitRepo
		allowed []string
	}{
		"zero policy":            {manifest.GitRepo{Host: "github.com", Repo: "acme/repo", Ref: "main"}, nil},
		"default host unlisted":  {manifest.GitRepo{Repo: "acme/repo", Ref: "main"}, []string{"gitlab.com"}},
		"other host":             {manifest.GitRepo{Host: "evil.example.com", Repo: "acme/repo", Ref: "main"}, []string{"github.com"}},
		"allowed name's sibling": {manifest.GitRepo{Host: "api.github.com", Repo: "acme/repo", Ref: "main"}, []string{"github.com"}},
		// Manifests built in Go skip LoadUntrusted's rules: the
		// materializer refuses addresses and ports by itself.
		"IP literal":             {manifest.GitRepo{Host: "127.0.0.1", Repo: "acme/repo", Ref: "main"}, []string{"github.com"}},
		"IP literal and port":    {manifest.GitRepo{Host: "127.0.0.1:8080", Repo: "acme/repo", Ref: "main"}, []string{"github.com"}},
		"allowed name with port": {manifest.GitRepo{Host: "github.com:8443", Repo: "acme/repo", Ref: "main"}, []string{"github.com"}},
		"numeric name":           {manifest.GitRepo{Host: "127.1", Repo: "acme/repo", Ref: "main"}, []string{"github.com"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := &fakeFetcher{}
			r := &resolver{addrs: map[string][]string{}}
			repo := tc.repo
			_, err := materializer.Prepare(ctxT(t), gitManifest(&repo), materializer.Options{Git: f, Untrusted: true,
				GitPolicy: materializer.GitPolicy{AllowedHosts: tc.allowed, LookupNetIP: r.lookup}})
			if !errors.Is(err, errkind.ErrPermissionDenied) {
				t.Fatalf("Prepare = %v, want ErrPermissionDenied", err)
			}
			if len(f.calls) != 0 || len(r.hosts) != 0 {
				t.Errorf("refused host was fetched (%d) or resolved (%v)", len(f.calls), r.hosts)
			}
		})
	}
}

// An allowed host whose name resolves to an address that is not public
// (any one of them) is refused; the error names the repository only, the
// reason and address go to the debug log.
func TestGitUntrustedRefusesPrivateAddresses(t *testing.T) {
	cases := map[string][]string{
		"loopback":             {"127.0.0.1"},
		"IPv6 loopback":        {"::1"},
		"mapped loopback":      {"::ffff:127.0.0.1"},
		"private":              {"10.1.2.3"},
		"link-local":           {"fe80::1"},
		"metadata":             {"169.254.169.254"},
		"IPv6 metadata":        {"fd00:ec2::254"},
		"unspecified":          {"0.0.0.0"},
		"one private of two":   {"140.82.112.3", "192.168.0.10"},
		"one private of three": {"2606:50c0:8000::153", "140.82.112.3", "172.17.0.1"},
	}
	for name, addrs := range cases {
		t.Run(name, func(t *testing.T) {
			f := &fakeFetcher{}
			r := &resolver{addrs: map[string][]string{"git.example.com": addrs}}
			log, logs := debugLog()
			_, err := materializer.Prepare(ctxT(t), gitManifest(&manifest.GitRepo{Host: "Git.Example.com", Repo: "acme/repo", Ref: "main"}),
				materializer.Options{Git: f, Untrusted: true, Log: log,
					GitPolicy: materializer.GitPolicy{AllowedHosts: []string{"git.example.com"}, LookupNetIP: r.lookup}})
			if !errors.Is(err, errkind.ErrPermissionDenied) {
				t.Fatalf("Prepare = %v, want ErrPermissionDenied", err)
			}
			if want := "entry repo: permission denied: git fetch of git.example.com/acme/repo failed"; err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
			if len(f.calls) != 0 {
				t.Errorf("fetched %d times", len(f.calls))
			}
			if !slices.Equal(r.hosts, []string{"git.example.com"}) {
				t.Errorf("lookups %v, want one of git.example.com", r.hosts)
			}
			if text := logText(logs); !strings.Contains(text, "not a public address") {
				t.Errorf("the debug log does not say why:\n%s", text)
			}
		})
	}
}

// A fetch that fails on the network says the same whatever happened, so
// a tenant learns nothing of what answers where; the details are logged
// at debug level. A name that does not resolve reads the same.
func TestGitUntrustedErrorsAreNoOracle(t *testing.T) {
	detail := errors.New("git fetch: sandbox unavailable: fatal: unable to access 'https://git.example.com/acme/repo.git/': Failed to connect to git.example.com port 443 after 1 ms: Connection refused")
	for name, tc := range map[string]struct {
		addrs map[string][]string
		err   error
	}{
		"connection refused": {map[string][]string{"git.example.com": {"140.82.112.3"}}, detail},
		"no such host":       {map[string][]string{}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeFetcher{err: tc.err}
			r := &resolver{addrs: tc.addrs}
			log, logs := debugLog()
			_, err := materializer.Prepare(ctxT(t), gitManifest(&manifest.GitRepo{Host: "git.example.com", Repo: "acme/repo", Ref: "main"}),
				materializer.Options{Git: f, Untrusted: true, Log: log,
					GitPolicy: materializer.GitPolicy{AllowedHosts: []string{"git.example.com"}, LookupNetIP: r.lookup}})
			if want := "entry repo: sandbox unavailable: git fetch of git.example.com/acme/repo failed"; err == nil || err.Error() != want {
				t.Fatalf("error %v, want %q", err, want)
			}
			if !errkind.Retryable(err) || !errors.Is(err, errkind.ErrUnavailable) {
				t.Errorf("error %v: want a retryable ErrUnavailable", err)
			}
			text := logText(logs)
			if tc.err != nil && !strings.Contains(text, "Connection refused") {
				t.Errorf("the debug log lacks git's error:\n%s", text)
			}
			if tc.err == nil && !strings.Contains(text, "no such host") {
				t.Errorf("the debug log lacks the lookup's error:\n%s", text)
			}
		})
	}
}

// An allowed host with public addresses is fetched at exactly those
// addresses, with the operator's credential for the host (never the
// manifest's: a token in an untrusted manifest is refused).
func TestGitUntrustedFetchIsPinnedWithOperatorCredential(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "github-token")
	must(t, os.WriteFile(tokenFile, []byte("  ghs_operator\nsecond line\n"), 0o600))
	pol, err := materializer.ParseGitPolicy([]string{"GitHub.com", "gitlab.com"}, []string{"github.com=" + tokenFile})
	must(t, err)
	r := &resolver{addrs: map[string][]string{"github.com": {"140.82.112.3", "2606:50c0:8000::153"}, "gitlab.com": {"172.65.251.78"}}}
	pol.LookupNetIP = r.lookup
	f := &fakeFetcher{}
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"a": {Type: manifest.TypeGitRepo, Git: &manifest.GitRepo{Repo: "acme/a", Ref: "main"}},
		"b": {Type: manifest.TypeGitRepo, Git: &manifest.GitRepo{Host: "gitlab.com", Repo: "acme/b", Ref: "v1"}},
	}}
	p, err := materializer.Prepare(ctxT(t), m, materializer.Options{Git: f, Untrusted: true, GitPolicy: pol, Concurrency: 1})
	must(t, err)
	p.Close()
	if len(f.calls) != 2 {
		t.Fatalf("%d fetches, want 2", len(f.calls))
	}
	slices.SortFunc(f.calls, func(a, b fakeFetch) int { return strings.Compare(a.repo.Repo, b.repo.Repo) })
	a, b := f.calls[0], f.calls[1]
	if a.repo.EffectiveHost() != "github.com" || a.token != "ghs_operator" ||
		!slices.Equal(a.addrs, []netip.Addr{netip.MustParseAddr("140.82.112.3"), netip.MustParseAddr("2606:50c0:8000::153")}) {
		t.Errorf("github fetch: host %q token %q addrs %v", a.repo.EffectiveHost(), a.token, a.addrs)
	}
	if b.repo.Host != "gitlab.com" || b.repo.Token != nil || !slices.Equal(b.addrs, []netip.Addr{netip.MustParseAddr("172.65.251.78")}) {
		t.Errorf("gitlab fetch: host %q token %v addrs %v", b.repo.Host, b.repo.Token, b.addrs)
	}
	if slices.Sort(r.hosts); !slices.Equal(r.hosts, []string{"github.com", "gitlab.com"}) {
		t.Errorf("lookups %v, want one per host", r.hosts)
	}

	// A token named by the manifest is refused, even resolved.
	tok := manifest.Secret("gh").WithValue("tenant-token")
	_, err = materializer.Prepare(ctxT(t), gitManifest(&manifest.GitRepo{Repo: "acme/a", Ref: "main", Token: &tok}),
		materializer.Options{Git: f, Untrusted: true, GitPolicy: pol})
	if !errors.Is(err, errkind.ErrPermissionDenied) || len(f.calls) != 2 {
		t.Errorf("manifest token: %v (%d fetches)", err, len(f.calls))
	}

	// A fetcher that cannot pin addresses cannot fetch for tenants.
	_, err = materializer.Prepare(ctxT(t), gitManifest(&manifest.GitRepo{Repo: "acme/a", Ref: "main"}),
		materializer.Options{Git: unpinnedFetcher{}, Untrusted: true, GitPolicy: pol})
	if !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Errorf("unpinned fetcher: %v, want ErrFailedPrecondition", err)
	}

	// An unreadable credential fails the fetch; the operator is told.
	must(t, os.Remove(tokenFile))
	log, logs := debugLog()
	_, err = materializer.Prepare(ctxT(t), gitManifest(&manifest.GitRepo{Repo: "acme/a", Ref: "main"}),
		materializer.Options{Git: f, Untrusted: true, GitPolicy: pol, Log: log})
	if !errors.Is(err, errkind.ErrFailedPrecondition) || strings.Contains(err.Error(), tokenFile) {
		t.Errorf("missing token file: %v", err)
	}
	if logs.FilterLevelExact(zapcore.WarnLevel).Len() != 1 {
		t.Errorf("no warning for the operator:\n%s", logText(logs))
	}
}

// The policy's configuration is checked: names only, credentials for
// allowed hosts, token files present.
func TestParseGitPolicy(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "tok")
	must(t, os.WriteFile(tokenFile, []byte("abc\n"), 0o600))
	p, err := materializer.ParseGitPolicy([]string{" GitHub.com "}, []string{"GITHUB.com=" + tokenFile})
	must(t, err)
	if !slices.Equal(p.AllowedHosts, []string{"github.com"}) || p.Credentials["github.com"] == nil {
		t.Errorf("policy %+v", p)
	}
	if tok, err := p.Credentials["github.com"](ctxT(t)); err != nil || tok != "abc" {
		t.Errorf("token %q, %v", tok, err)
	}
	bad := map[string]struct{ hosts, creds []string }{
		"IP literal":           {[]string{"127.0.0.1"}, nil},
		"IPv6 literal":         {[]string{"[::1]"}, nil},
		"port":                 {[]string{"github.com:443"}, nil},
		"scheme":               {[]string{"https://github.com"}, nil},
		"wildcard":             {[]string{"*.github.com"}, nil},
		"credential unlisted":  {[]string{"github.com"}, []string{"gitlab.com=" + tokenFile}},
		"credential no file":   {[]string{"github.com"}, []string{"github.com=" + filepath.Join(dir, "missing")}},
		"credential malformed": {[]string{"github.com"}, []string{"github.com"}},
		"credential twice":     {[]string{"github.com"}, []string{"github.com=" + tokenFile, "GitHub.com=" + tokenFile}},
	}
	for name, tc := range bad {
		if _, err := materializer.ParseGitPolicy(tc.hosts, tc.creds); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Prepare checks a policy built in Go the same way.
	_, err = materializer.Prepare(ctxT(t), &manifest.Manifest{}, materializer.Options{Untrusted: true,
		GitPolicy: materializer.GitPolicy{AllowedHosts: []string{"169.254.169.254"}}})
	if !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Errorf("Prepare with an IP in the allow list: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	must(t, os.WriteFile(empty, []byte("\n"), 0o600))
	if _, err := materializer.GitTokenFile(empty)(ctxT(t)); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Errorf("empty token file: %v", err)
	}
	// CheckManifest refuses early what the fetch would refuse.
	if err := p.CheckManifest(gitManifest(&manifest.GitRepo{Host: "gitlab.com", Repo: "a/b", Ref: "main"})); !errors.Is(err, errkind.ErrPermissionDenied) {
		t.Errorf("CheckManifest(gitlab.com) = %v", err)
	}
	if err := p.CheckManifest(gitManifest(&manifest.GitRepo{Repo: "a/b", Ref: "main"})); err != nil {
		t.Errorf("CheckManifest(github.com) = %v", err)
	}
	ipPolicy := materializer.GitPolicy{AllowedHosts: []string{"127.0.0.1"}}
	if err := ipPolicy.CheckManifest(gitManifest(&manifest.GitRepo{Host: "127.0.0.1", Repo: "a/b", Ref: "main"})); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Errorf("CheckManifest under a policy allowing an IP address = %v, want ErrInvalidArgument", err)
	}
}

// gitDump is one run of the fake git: its arguments, its environment, and
// what its HOME holds.
type gitDump struct {
	args   []string
	env    map[string]string
	homeLs string
}

// fakeGit writes a git stand-in that records each run into a file and
// makes a checkout of one file; it returns the binary and a reader of the
// runs.
func fakeGit(t *testing.T) (string, func() []gitDump) {
	dir := t.TempDir()
	out := filepath.Join(dir, "runs")
	bin := filepath.Join(dir, "git")
	script := `#!/bin/sh
{
  echo "ARGS"
  for a in "$@"; do echo "ARG $a"; done
  echo "HOMELS [$(ls -A "$HOME")]"
  env | sed 's/^/ENV /'
} >> '` + out + `'
if [ "$1" = "-c" ] && [ "$3" = "checkout" ]; then echo fetched > README.md; fi
exit 0
`
	must(t, os.WriteFile(bin, []byte(script), 0o755))
	return bin, func() []gitDump {
		data, err := os.ReadFile(out)
		must(t, err)
		var runs []gitDump
		for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
			switch {
			case line == "ARGS":
				runs = append(runs, gitDump{env: map[string]string{}})
			case strings.HasPrefix(line, "ARG "):
				runs[len(runs)-1].args = append(runs[len(runs)-1].args, strings.TrimPrefix(line, "ARG "))
			case strings.HasPrefix(line, "HOMELS "):
				runs[len(runs)-1].homeLs = strings.TrimPrefix(line, "HOMELS ")
			case strings.HasPrefix(line, "ENV "):
				k, v, _ := strings.Cut(strings.TrimPrefix(line, "ENV "), "=")
				runs[len(runs)-1].env[k] = v
			}
		}
		return runs
	}
}

// gitConfigOf reads the GIT_CONFIG_COUNT/KEY/VALUE configuration of env.
func gitConfigOf(t *testing.T, env map[string]string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	n := 0
	for k := range env {
		if strings.HasPrefix(k, "GIT_CONFIG_KEY_") {
			n++
		}
	}
	if env["GIT_CONFIG_COUNT"] != strconv.Itoa(n) {
		t.Errorf("GIT_CONFIG_COUNT=%q for %d keys", env["GIT_CONFIG_COUNT"], n)
	}
	for i := range n {
		k, ok1 := env["GIT_CONFIG_KEY_"+strconv.Itoa(i)]
		v, ok2 := env["GIT_CONFIG_VALUE_"+strconv.Itoa(i)]
		if !ok1 || !ok2 {
			t.Errorf("GIT_CONFIG_KEY/VALUE_%d missing", i)
		}
		out[k] = append(out[k], v)
	}
	return out
}

// Git runs with a minimal environment of its own, whoever asks: an empty
// HOME, no global or system configuration, no credential helper, https
// only, no redirects, and none of the harness's variables (API keys, cloud
// credentials, proxies, git settings); a token goes through git's
// environment configuration, never argv. For untrusted manifests the host
// is pinned to its checked addresses.
func TestGitEnvironment(t *testing.T) {
	for k, v := range map[string]string{
		"OPENAI_API_KEY": "sk-operator", "AWS_ACCESS_KEY_ID": "AKIAOPERATOR", "AWS_SECRET_ACCESS_KEY": "operator-secret",
		"HTTPS_PROXY": "http://user:pw@proxy.internal:3128", "https_proxy": "http://proxy.internal:3128",
		"GIT_SSL_NO_VERIFY": "1", "GIT_ASKPASS": "/bin/echo", "SSH_AUTH_SOCK": "/tmp/agent.sock",
		"GIT_CONFIG_PARAMETERS": "'url.https://leak@github.com/.insteadof'='https://github.com/'",
		"GIT_CONFIG_COUNT":      "1", "GIT_CONFIG_KEY_0": "credential.helper", "GIT_CONFIG_VALUE_0": "store",
	} {
		t.Setenv(k, v)
	}
	operatorHome := os.Getenv("HOME")
	tokenFile := filepath.Join(t.TempDir(), "tok")
	must(t, os.WriteFile(tokenFile, []byte("op-token\n"), 0o600))
	resolved := manifest.Secret("gh").WithValue("trusted-token")
	cases := map[string]struct {
		repo    manifest.GitRepo
		opts    func(git string) materializer.Options
		pin     string
		token   string
		url     string
		fileURL bool
	}{
		"untrusted": {
			repo: manifest.GitRepo{Repo: "acme/repo", Ref: "main"},
			opts: func(git string) materializer.Options {
				pol, err := materializer.ParseGitPolicy([]string{"github.com"}, []string{"github.com=" + tokenFile})
				must(t, err)
				r := &resolver{addrs: map[string][]string{"github.com": {"140.82.112.3", "2606:50c0:8000::153"}}}
				pol.LookupNetIP = r.lookup
				return materializer.Options{Git: materializer.GitCLI{Git: git}, Untrusted: true, GitPolicy: pol}
			},
			pin: "github.com:443:140.82.112.3,[2606:50c0:8000::153]", token: "op-token", url: "https://github.com/acme/repo.git",
		},
		"trusted with token": {
			repo: manifest.GitRepo{Host: "git.example.com:8443", Repo: "acme/repo", Ref: "v1", Token: &resolved},
			opts: func(git string) materializer.Options {
				return materializer.Options{Git: materializer.GitCLI{Git: git}}
			},
			token: "trusted-token", url: "https://git.example.com:8443/acme/repo.git",
		},
		"test URL": {
			repo: manifest.GitRepo{Repo: "acme/repo", Ref: "v1"},
			opts: func(git string) materializer.Options {
				return materializer.Options{Git: materializer.GitCLI{Git: git, URL: func(*manifest.GitRepo) string { return "/srv/test/repo" }}}
			},
			url: "/srv/test/repo", fileURL: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			bin, runs := fakeGit(t)
			repo := tc.repo
			p, err := materializer.Prepare(ctxT(t), gitManifest(&repo), tc.opts(bin))
			must(t, err)
			p.Close()
			got := runs()
			if len(got) != 3 {
				t.Fatalf("%d git runs, want 3 (init, fetch, checkout)", len(got))
			}
			if !slices.Contains(got[1].args, tc.url) || got[1].args[0] != "fetch" {
				t.Errorf("fetch args %q, want the URL %s", got[1].args, tc.url)
			}
			allowedVars := []string{"PATH", "HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM",
				"GIT_TERMINAL_PROMPT", "LC_ALL", "GIT_CONFIG_COUNT", "PWD"} // PWD: the shell's own
			for _, run := range got {
				for k := range run.env {
					if !slices.Contains(allowedVars, k) && !strings.HasPrefix(k, "GIT_CONFIG_KEY_") && !strings.HasPrefix(k, "GIT_CONFIG_VALUE_") {
						t.Errorf("git %s got %s from the harness's environment", run.args[0], k)
					}
				}
				home := run.env["HOME"]
				if home == "" || home == operatorHome || run.homeLs != "[]" || run.env["XDG_CONFIG_HOME"] != home {
					t.Errorf("git %s: HOME=%q (operator's %q) holding %s, XDG_CONFIG_HOME=%q; want an empty directory of its own",
						run.args[0], home, operatorHome, run.homeLs, run.env["XDG_CONFIG_HOME"])
				}
				if _, err := os.Stat(home); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("the temporary HOME %s was left behind: %v", home, err)
				}
				if run.env["GIT_CONFIG_GLOBAL"] != "/dev/null" || run.env["GIT_CONFIG_NOSYSTEM"] != "1" || run.env["GIT_TERMINAL_PROMPT"] != "0" {
					t.Errorf("git %s: GIT_CONFIG_GLOBAL=%q GIT_CONFIG_NOSYSTEM=%q GIT_TERMINAL_PROMPT=%q", run.args[0],
						run.env["GIT_CONFIG_GLOBAL"], run.env["GIT_CONFIG_NOSYSTEM"], run.env["GIT_TERMINAL_PROMPT"])
				}
				cfg := gitConfigOf(t, run.env)
				want := map[string][]string{
					"protocol.allow": {"never"}, "protocol.https.allow": {"always"}, "credential.helper": {""},
					"http.followRedirects": {"false"}, "core.hooksPath": {"/dev/null"},
				}
				if tc.fileURL {
					want["protocol.file.allow"] = []string{"always"}
				}
				if tc.pin != "" {
					want["http.curloptResolve"] = []string{tc.pin}
				}
				if tc.token != "" {
					want["http.extraHeader"] = []string{"Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+tc.token))}
				}
				for k, v := range want {
					if !slices.Equal(cfg[k], v) {
						t.Errorf("git %s: config %s = %q, want %q", run.args[0], k, cfg[k], v)
					}
				}
				for k := range cfg {
					if _, ok := want[k]; !ok {
						t.Errorf("git %s: unexpected config %s=%q", run.args[0], k, cfg[k])
					}
				}
				for _, a := range run.args {
					if tc.token != "" && strings.Contains(a, tc.token) || strings.Contains(a, "sk-operator") {
						t.Errorf("git %s: a secret in argv: %q", run.args[0], a)
					}
				}
			}
		})
	}
}

// gitIn runs git for a test's own setup, apart from any configuration.
func gitIn(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// bareRepo makes a bare repository whose main branch holds one file.
func bareRepo(t *testing.T, content string) string {
	work := t.TempDir()
	gitIn(t, work, "init", "--quiet", "--initial-branch=main")
	must(t, os.WriteFile(filepath.Join(work, "WHO"), []byte(content), 0o644))
	gitIn(t, work, "add", ".")
	gitIn(t, work, "commit", "--quiet", "-m", content)
	bare := filepath.Join(t.TempDir(), "repo.git")
	gitIn(t, work, "clone", "--quiet", "--bare", work, bare)
	return bare
}

// The operator's own git configuration never applies: a ~/.gitconfig (or
// $XDG_CONFIG_HOME/git/config) whose url.*.insteadOf rewrites the fetch
// URL (as one carrying the operator's token would) is not read, and the
// token of a fetch is in no file of the checkout.
func TestGitIgnoresOperatorConfig(t *testing.T) {
	testenv.Require(t, testenv.Git)
	genuine := bareRepo(t, "genuine")
	rewritten := bareRepo(t, "rewritten by the operator's gitconfig")
	home := t.TempDir()
	rewrite := "[url \"" + rewritten + "\"]\n\tinsteadOf = " + genuine + "\n" +
		"[credential]\n\thelper = store\n" +
		"[http]\n\textraHeader = X-Operator: leaked\n"
	must(t, os.WriteFile(filepath.Join(home, ".gitconfig"), []byte(rewrite), 0o644))
	must(t, os.MkdirAll(filepath.Join(home, "xdg", "git"), 0o755))
	must(t, os.WriteFile(filepath.Join(home, "xdg", "git", "config"), []byte(rewrite), 0o644))
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, "xdg"))

	// The rewrite is live for the operator's own git: without the fix the
	// fetch below would check out the other repository.
	probe := t.TempDir()
	cmd := exec.Command("git", "ls-remote", "--get-url", genuine)
	cmd.Dir = probe
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != rewritten {
		t.Fatalf("the operator's gitconfig is not in effect for plain git (%q, %v): the test proves nothing", out, err)
	}

	token := manifest.Secret("gh").WithValue("ghp_operator_token")
	dir := t.TempDir()
	g := materializer.GitCLI{URL: func(*manifest.GitRepo) string { return genuine }}
	must(t, g.Fetch(ctxT(t), &manifest.GitRepo{Repo: "acme/repo", Ref: "main", Token: &token}, dir))
	who, err := os.ReadFile(filepath.Join(dir, "WHO"))
	if err != nil || string(who) != "genuine" {
		t.Errorf("checked out %q (%v): the operator's url.insteadOf was applied", who, err)
	}
	secret := []string{"ghp_operator_token", base64.StdEncoding.EncodeToString([]byte("x-access-token:ghp_operator_token")),
		"extraheader", "extraHeader", "insteadof", "insteadOf", "X-Operator"}
	err = filepath.WalkDir(filepath.Join(dir, ".git"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, s := range secret {
			if bytes.Contains(data, []byte(s)) {
				t.Errorf("%s holds %q", p, s)
			}
		}
		return nil
	})
	must(t, err)
	if _, err := os.Stat(filepath.Join(home, ".git-credentials")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the operator's credential helper stored something: %v", err)
	}
}

// Git speaks https alone (the test URL adds local repositories, and only
// them): a URL for any other transport is refused by git itself, before it
// connects or runs anything.
func TestGitTransports(t *testing.T) {
	testenv.Require(t, testenv.Git)
	genuine := bareRepo(t, "genuine")
	for _, u := range []string{"file://" + genuine, genuine, "ext::false", "ssh://git@127.0.0.1/acme/repo.git", "git://127.0.0.1/acme/repo.git"} {
		dir := t.TempDir()
		g := materializer.GitCLI{URL: func(*manifest.GitRepo) string { return u }}
		err := g.Fetch(ctxT(t), &manifest.GitRepo{Repo: "acme/repo", Ref: "main"}, dir)
		if strings.Contains(u, genuine) {
			if err != nil {
				t.Errorf("%s: %v", u, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "not allowed") {
			t.Errorf("%s: %v, want git's \"transport not allowed\"", u, err)
		}
	}
}

// FetchPinned makes git connect to the checked address without looking
// the name up: the name here does not resolve at all (.test is reserved),
// yet git's TLS handshake, naming it, reaches the listener at the pinned
// address.
func TestGitFetchPinnedConnectsToCheckedAddress(t *testing.T) {
	testenv.Require(t, testenv.Git)
	for _, network := range []string{"127.0.0.1", "::1"} {
		t.Run(network, func(t *testing.T) {
			ln, err := net.Listen("tcp", net.JoinHostPort(network, "0"))
			testenv.Require(t, testenv.Condition(err == nil, "cannot listen on "+network))
			defer ln.Close()
			hello := make(chan []byte, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				buf := make([]byte, 4096)
				n, _ := io.ReadAtLeast(c, buf, 64)
				hello <- buf[:n]
			}()
			port := ln.Addr().(*net.TCPAddr).Port
			u := "https://git.pinned.test:" + strconv.Itoa(port) + "/acme/repo.git"
			g := materializer.GitCLI{URL: func(*manifest.GitRepo) string { return u }}
			err = g.FetchPinned(ctxT(t), &manifest.GitRepo{Host: "git.pinned.test", Repo: "acme/repo", Ref: "main"}, t.TempDir(),
				[]netip.Addr{netip.MustParseAddr(network)})
			if err == nil {
				t.Fatal("the fetch from a listener that speaks no TLS succeeded")
			}
			select {
			case b := <-hello:
				if len(b) == 0 || b[0] != 0x16 || !bytes.Contains(b, []byte("git.pinned.test")) {
					t.Errorf("the listener got %d bytes that are not a ClientHello for git.pinned.test", len(b))
				}
			default:
				t.Fatalf("git never connected to the pinned address: %v", err)
			}
		})
	}
}
