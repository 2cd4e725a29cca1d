package materializer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/egress"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// GitPolicy decides what the git_repo entries of untrusted manifests
// (Options.Untrusted) may fetch, and with which credentials. The zero
// GitPolicy allows no host: every such entry is refused.
//
// An allowed fetch is made over https to port 443 of the host; its name is
// resolved once, refused if any address it resolves to is not public
// (egress.CheckAddr: loopback, private, link-local, metadata, ...), and git
// connects to the checked addresses only (PinnedGitFetcher).
type GitPolicy struct {
	// AllowedHosts are the git hosts untrusted manifests may fetch from:
	// exact DNS names such as "github.com" (manifest.ValidateGitHostName:
	// no IP address, no port, no wildcard; case does not matter). A
	// git_repo entry without a host means manifest.DefaultGitHost, which
	// must be listed as well. `harness serve --git-host HOST`.
	AllowedHosts []string
	// Credentials maps allowed hosts to the operator's credential for
	// each; a host without one is fetched anonymously. The token is sent as
	// an HTTP Authorization header to that host only (no redirects), given
	// to git through its environment: never argv, a URL, the checkout's
	// .git/config or the sandbox. Tokens named by manifests are refused.
	// `harness serve --git-credential HOST=FILE` (GitTokenFile).
	Credentials map[string]GitCredential
	// LookupNetIP resolves a host name to its addresses; nil means
	// net.DefaultResolver.LookupNetIP(ctx, "ip", host). Tests set it.
	LookupNetIP func(ctx context.Context, host string) ([]netip.Addr, error)
}

// GitCredential returns the operator's token for one git host. It is
// called at each fetch from that host, so a rotated token is picked up.
type GitCredential func(ctx context.Context) (string, error)

// gitLookupTimeout bounds the resolution of a git host.
const gitLookupTimeout = 30 * time.Second

// maxTokenFileBytes bounds a token file.
const maxTokenFileBytes = 64 << 10

// GitTokenFile is a GitCredential read from a file at each fetch: its first
// line, surrounding white space trimmed (a personal access token or an
// installation token; it is sent as the password of user x-access-token).
func GitTokenFile(path string) GitCredential {
	return func(context.Context) (string, error) {
		f, err := os.Open(path)
		if err != nil {
			return "", fmt.Errorf("git token file: %w", errkind.ClassifyFS(err))
		}
		defer f.Close()
		line, err := bufio.NewReader(io.LimitReader(f, maxTokenFileBytes)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("git token file %s: %w", path, errkind.ClassifyFS(err))
		}
		token := strings.TrimSpace(line)
		if token == "" {
			return "", errkind.Errorf(errkind.ErrFailedPrecondition, "git token file %s is empty", path)
		}
		return token, nil
	}
}

// ParseGitPolicy builds a GitPolicy from `harness serve` flags: hosts are
// the --git-host values (DNS names), credentials the --git-credential
// values, each "HOST=FILE" with HOST one of hosts and FILE a token file
// (GitTokenFile; it must exist now and is read again at each fetch).
func ParseGitPolicy(hosts, credentials []string) (GitPolicy, error) {
	p := GitPolicy{}
	for _, h := range hosts {
		p.AllowedHosts = append(p.AllowedHosts, strings.ToLower(strings.TrimSpace(h)))
	}
	for _, c := range credentials {
		host, file, ok := strings.Cut(c, "=")
		host = strings.ToLower(strings.TrimSpace(host))
		if !ok || host == "" || file == "" {
			return GitPolicy{}, errkind.Errorf(errkind.ErrInvalidArgument, "git credential %q: want HOST=FILE", c)
		}
		if _, dup := p.Credentials[host]; dup {
			return GitPolicy{}, errkind.Errorf(errkind.ErrInvalidArgument, "git credential for %s given twice", host)
		}
		if _, err := os.Stat(file); err != nil {
			return GitPolicy{}, fmt.Errorf("git credential for %s: %w", host, errkind.ClassifyFS(err))
		}
		if p.Credentials == nil {
			p.Credentials = map[string]GitCredential{}
		}
		p.Credentials[host] = GitTokenFile(file)
	}
	if err := p.Validate(); err != nil {
		return GitPolicy{}, err
	}
	return p, nil
}

// Validate checks the policy: every allowed host a DNS name without port,
// every credential for an allowed host.
func (p GitPolicy) Validate() error {
	for _, h := range p.AllowedHosts {
		if err := manifest.ValidateGitHostName(h); err != nil {
			return errkind.Errorf(errkind.ErrInvalidArgument, "allowed git host %q: %v", h, err)
		}
	}
	for h, c := range p.Credentials {
		if !p.allows(h) {
			return errkind.Errorf(errkind.ErrInvalidArgument, "git credential for %q, which is not an allowed git host", h)
		}
		if c == nil {
			return errkind.Errorf(errkind.ErrInvalidArgument, "git credential for %q is nil", h)
		}
	}
	return nil
}

// allows reports whether host (any case) is an allowed git host.
func (p GitPolicy) allows(host string) bool {
	return slices.ContainsFunc(p.AllowedHosts, func(h string) bool { return strings.EqualFold(h, host) })
}

// credential returns the credential configured for host (any case).
func (p GitPolicy) credential(host string) GitCredential {
	for h, c := range p.Credentials {
		if strings.EqualFold(h, host) {
			return c
		}
	}
	return nil
}

// CheckManifest refuses, with ErrPermissionDenied, an untrusted manifest
// whose git_repo entries name a host the policy does not allow, or a token
// (credentials come from the policy). The materializer checks the same
// when it fetches; a service calls this to refuse such a manifest when it
// is submitted, before a sandbox is made.
func (p GitPolicy) CheckManifest(m *manifest.Manifest) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return m.Walk(func(path string, e *manifest.Entry) error {
		if e.Type != manifest.TypeGitRepo || e.Git == nil {
			return nil
		}
		if _, err := p.checkRepo(e.Git); err != nil {
			return fmt.Errorf("entry %s: %w", path, err)
		}
		return nil
	})
}

// checkRepo applies the policy's static rules to a repository and returns
// its host, lower case. The policy is valid: an allowed host is a DNS name
// without port (manifest.ValidateGitHostName), so an IP address or a port
// is refused as not allowed.
func (p GitPolicy) checkRepo(repo *manifest.GitRepo) (string, error) {
	host := strings.ToLower(repo.EffectiveHost())
	if repo.Token != nil {
		return "", errkind.Errorf(errkind.ErrPermissionDenied,
			"git repository %s/%s names a token; credentials for git hosts come from the harness's configuration", host, repo.Repo)
	}
	if !p.allows(host) {
		return "", errkind.Errorf(errkind.ErrPermissionDenied,
			"git host %s is not allowed: this harness fetches git repositories only from the hosts its operator allows", host)
	}
	return host, nil
}

// fetchUntrusted fetches a git_repo entry of an untrusted manifest into dir
// under the policy. Past the static rules (host allowed, no token in the
// manifest), every failure reads "git fetch of HOST/REPO failed", whatever
// happened on the network: the details are logged at debug level, not
// returned, so that the error is no oracle for what answers where.
func fetchUntrusted(ctx context.Context, log *zap.Logger, p GitPolicy, git GitFetcher, entry string, repo *manifest.GitRepo, dir string) error {
	host, err := p.checkRepo(repo)
	if err != nil {
		return err
	}
	pinned, ok := git.(PinnedGitFetcher)
	if !ok {
		return errkind.Errorf(errkind.ErrFailedPrecondition,
			"the harness's git fetcher (%T) cannot fetch at checked addresses (materializer.PinnedGitFetcher); untrusted manifests cannot fetch git repositories", git)
	}
	log = log.With(zap.String("entry", entry), zap.String("git_host", host), zap.String("git_repo", repo.Repo))
	failed := func(kind error, why string, err error) error {
		log.Debug("git fetch of an untrusted manifest failed", zap.String("reason", why), zap.Error(err))
		out := errkind.Errorf(kind, "git fetch of %s/%s failed", host, repo.Repo)
		if errors.Is(kind, errkind.ErrUnavailable) {
			out = errkind.MarkRetryable(out)
		}
		return out
	}
	lookup := p.LookupNetIP
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, gitLookupTimeout)
	addrs, err := lookup(lctx, host)
	cancel()
	if ctx.Err() != nil {
		return errkind.ClassifyFS(ctx.Err())
	}
	if err != nil {
		return failed(errkind.ErrUnavailable, "the host does not resolve", err)
	}
	if len(addrs) == 0 {
		return failed(errkind.ErrUnavailable, "the host resolves to no address", nil)
	}
	// Every address must be public: a name that also resolves to a private
	// one is refused, whichever git would have picked.
	for _, a := range addrs {
		if err := egress.CheckAddr(a); err != nil {
			return failed(errkind.ErrPermissionDenied, "the host resolves to an address that is not public", err)
		}
	}
	r := *repo
	r.Host, r.Token = host, nil
	if cred := p.credential(host); cred != nil {
		token, err := cred(ctx)
		if err != nil {
			// The operator's configuration is wrong: say so where the
			// operator looks.
			log.Warn("git credential of an allowed host cannot be read", zap.Error(err))
			return failed(errkind.ErrFailedPrecondition, "the host's credential cannot be read", err)
		}
		ref := manifest.Secret("git-host/" + host).WithValue(token)
		r.Token = &ref
	}
	if err := pinned.FetchPinned(ctx, &r, dir, addrs); err != nil {
		if ctx.Err() != nil {
			return errkind.ClassifyFS(ctx.Err())
		}
		return failed(errkind.ErrUnavailable, "git failed", err)
	}
	return nil
}
