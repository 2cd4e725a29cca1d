package materializer

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// GitCLI fetches repositories with the git command line on the harness
// host: a shallow fetch of the ref, checked out into the directory. A token
// is passed as an HTTP header through git's environment configuration
// (never argv, never a URL, never the sandbox).
type GitCLI struct {
	// URL maps a repository to its fetch URL; nil means GitRepo.CloneURL
	// (https). Tests point it at local repositories.
	URL func(*manifest.GitRepo) string
	// Git is the git binary; "" means "git" on PATH.
	Git string
}

// Fetch checks repo out at its ref into dir.
func (g GitCLI) Fetch(ctx context.Context, repo *manifest.GitRepo, dir string) error {
	url := repo.CloneURL()
	if g.URL != nil {
		url = g.URL(repo)
	}
	bin := g.Git
	if bin == "" {
		bin = "git"
	}
	env := append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1")
	if repo.Token != nil {
		token, ok := repo.Token.Value()
		if !ok {
			return errkind.Errorf(errkind.ErrFailedPrecondition, "the token %s of %s is not resolved", repo.Token.String(), repo.Repo)
		}
		auth := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + token))
		env = append(env, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader",
			"GIT_CONFIG_VALUE_0=Authorization: Basic "+auth)
	}
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
	if err := run("init", "--quiet"); err != nil {
		return err
	}
	if err := run("fetch", "--quiet", "--depth=1", "--no-tags", url, ref); err != nil {
		return err
	}
	return run("-c", "advice.detachedHead=false", "checkout", "--quiet", "FETCH_HEAD")
}
