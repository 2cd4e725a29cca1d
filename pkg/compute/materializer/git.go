package materializer

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// GitCLI fetches repositories with the git command line on the harness
// host: a shallow fetch of the ref, checked out into the directory. A token
// is passed as an HTTP header through git's environment configuration
// (never argv, never a URL, never the checkout's .git/config, never the
// sandbox).
//
// Git runs apart from the harness's own configuration and environment:
// with an empty temporary HOME, no global or system configuration
// (GIT_CONFIG_GLOBAL=/dev/null, GIT_CONFIG_NOSYSTEM=1), so an operator's
// ~/.gitconfig (url.*.insteadOf rewrites, credential helpers, proxies) never
// applies to a fetch; no credential helper and no prompt; no HTTP
// redirects; no hooks; https as its only transport; and an environment of
// PATH alone besides what git needs here, so that no variable of the
// harness (API keys, cloud credentials, proxy settings) reaches git or the
// remote helpers it runs.
type GitCLI struct {
	// URL is for tests only: it replaces the https URL of every repository
	// (with a local path, or an https URL on another port), and lets git use
	// the file transport, which every fetch refuses otherwise. Applications
	// leave it nil.
	URL func(*manifest.GitRepo) string
	// Git is the git binary; "" means "git" on PATH.
	Git string
}

// PinnedGitFetcher is a GitFetcher that can also fetch from addresses its
// caller resolved and checked, without resolving the host's name itself.
// The materializer fetches the repositories of untrusted manifests
// (Options.Untrusted) only through one; GitCLI is one.
type PinnedGitFetcher interface {
	GitFetcher
	// FetchPinned is Fetch connecting to the repository's host at one of
	// addrs only (over https, on port 443), so that the name cannot
	// resolve to another address between the check and the connection.
	FetchPinned(ctx context.Context, repo *manifest.GitRepo, dir string, addrs []netip.Addr) error
}

// Fetch checks repo out at its ref into dir.
func (g GitCLI) Fetch(ctx context.Context, repo *manifest.GitRepo, dir string) error {
	return g.fetch(ctx, repo, dir, nil)
}

// FetchPinned checks repo out at its ref into dir, connecting to its host
// at addrs only (git's http.curloptResolve: curl is given the addresses and
// never looks the name up).
func (g GitCLI) FetchPinned(ctx context.Context, repo *manifest.GitRepo, dir string, addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return errkind.Errorf(errkind.ErrInvalidArgument, "no address to fetch %s from", repo.Repo)
	}
	return g.fetch(ctx, repo, dir, addrs)
}

func (g GitCLI) fetch(ctx context.Context, repo *manifest.GitRepo, dir string, addrs []netip.Addr) error {
	fetchURL := repo.CloneURL()
	if g.URL != nil {
		fetchURL = g.URL(repo)
	}
	bin := g.Git
	if bin == "" {
		bin = "git"
	}
	var cfg gitConfig
	// Transports: https only (the test URL adds local repositories).
	cfg.add("protocol.allow", "never")
	cfg.add("protocol.https.allow", "always")
	if g.URL != nil {
		cfg.add("protocol.file.allow", "always")
	}
	// An empty value resets the list of helpers: none is asked.
	cfg.add("credential.helper", "")
	// A redirect would take the fetch (and its Authorization header) to
	// another host or address than the one checked.
	cfg.add("http.followRedirects", "false")
	cfg.add("core.hooksPath", os.DevNull)
	if len(addrs) > 0 {
		pin, err := curlResolve(repo.EffectiveHost(), fetchURL, addrs)
		if err != nil {
			return err
		}
		cfg.add("http.curloptResolve", pin)
	}
	if repo.Token != nil {
		token, ok := repo.Token.Value()
		if !ok {
			return errkind.Errorf(errkind.ErrFailedPrecondition, "the token %s of %s is not resolved", repo.Token.String(), repo.Repo)
		}
		auth := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + token))
		cfg.add("http.extraHeader", "Authorization: Basic "+auth)
	}
	home, err := os.MkdirTemp("", "bulkhead-git-home-")
	if err != nil {
		return fmt.Errorf("git: empty home directory: %w", errkind.ClassifyFS(err))
	}
	defer os.RemoveAll(home)
	env := gitEnv(home, cfg)
	ref := repo.Ref
	if ref == "" {
		ref = "HEAD"
	}
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				return errkind.ClassifyFS(ctx.Err())
			}
			msg := strings.TrimSpace(stderr.String())
			if len(msg) > 500 {
				msg = msg[:500]
			}
			return errkind.MarkRetryable(fmt.Errorf("git %s: %w: %s", args[0], errkind.ErrUnavailable, msg))
		}
		return nil
	}
	// No template: nothing (hooks included) is copied into the checkout.
	if err := run("init", "--quiet", "--template="); err != nil {
		return err
	}
	if err := run("fetch", "--quiet", "--depth=1", "--no-tags", fetchURL, ref); err != nil {
		return err
	}
	return run("-c", "advice.detachedHead=false", "checkout", "--quiet", "FETCH_HEAD")
}

// gitConfig is configuration given to git through its environment
// (GIT_CONFIG_COUNT, GIT_CONFIG_KEY_n, GIT_CONFIG_VALUE_n): it applies to
// git and the helpers it runs, is not written anywhere, and does not show
// in argv.
type gitConfig struct{ keys, values []string }

func (c *gitConfig) add(key, value string) {
	c.keys = append(c.keys, key)
	c.values = append(c.values, value)
}

// gitEnv is the whole environment git runs with: the harness's PATH (to
// find git's helpers), an empty HOME, no global or system configuration,
// no prompt, the C locale, and cfg.
func gitEnv(home string, cfg gitConfig) []string {
	env := []string{
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + home,
		"GIT_CONFIG_GLOBAL=" + os.DevNull,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"LC_ALL=C",
	}
	if p, ok := os.LookupEnv("PATH"); ok {
		env = append(env, "PATH="+p)
	}
	env = append(env, "GIT_CONFIG_COUNT="+strconv.Itoa(len(cfg.keys)))
	for i := range cfg.keys {
		n := strconv.Itoa(i)
		env = append(env, "GIT_CONFIG_KEY_"+n+"="+cfg.keys[i], "GIT_CONFIG_VALUE_"+n+"="+cfg.values[i])
	}
	return env
}

// curlResolve is the http.curloptResolve entry that makes curl connect to
// addrs for the fetch URL's host and port ("host:443:addr,[v6addr]"). The
// URL is the repository's https URL (port 443), or the test URL of GitCLI.
func curlResolve(host, fetchURL string, addrs []netip.Addr) (string, error) {
	port := "443"
	if u, err := url.Parse(fetchURL); err == nil && u.Scheme == "https" && u.Hostname() != "" {
		host = u.Hostname()
		if p := u.Port(); p != "" {
			port = p
		}
	}
	if strings.ContainsAny(host, ":,[] ") {
		return "", errkind.Errorf(errkind.ErrInvalidArgument, "git host %q cannot be pinned to an address", host)
	}
	list := make([]string, 0, len(addrs))
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if !a.IsValid() {
			return "", errkind.Errorf(errkind.ErrInvalidArgument, "invalid address for git host %q", host)
		}
		if a.Is6() {
			list = append(list, "["+a.String()+"]")
		} else {
			list = append(list, a.String())
		}
	}
	return host + ":" + port + ":" + strings.Join(list, ","), nil
}
