package skills

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// readGit fetches opts.Git into a temporary directory, reads the bundles
// under its subpath, and removes the checkout.
func readGit(ctx context.Context, opts Options, lim *limits) ([]*bundle, error) {
	repo := opts.Git
	source := gitSource(repo)
	if err := checkGit(repo); err != nil {
		return nil, fmt.Errorf("skills: %s: %w", source, err)
	}
	if repo.Token != nil {
		if _, ok := repo.Token.Value(); !ok {
			return nil, fmt.Errorf("skills: %s: the token %s is not resolved (resolve it with manifest.SecretRef.WithValue)",
				source, repo.Token.String())
		}
	}
	dir, err := os.MkdirTemp(opts.TempDir, "bulkhead-skills-")
	if err != nil {
		return nil, fmt.Errorf("skills: %s: %w", source, err)
	}
	defer os.RemoveAll(dir)
	if err := opts.Fetcher.Fetch(ctx, repo, dir); err != nil {
		return nil, fmt.Errorf("skills: fetching %s: %w", source, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("skills: %s: %w", source, err)
	}
	defer root.Close()
	if repo.Subpath != "" {
		sub, err := root.OpenRoot(repo.Subpath)
		if err != nil {
			return nil, fmt.Errorf("skills: %s: subpath: %w", source, err)
		}
		defer sub.Close()
		root = sub
	}
	return readBundles(root, source, lim)
}

// gitSource describes a repository for messages: host/repo@ref:subpath,
// never the token.
func gitSource(g *manifest.GitRepo) string {
	s := "git " + g.EffectiveHost() + "/" + g.Repo
	if g.Ref != "" {
		s += "@" + g.Ref
	}
	if g.Subpath != "" {
		s += ":" + g.Subpath
	}
	return s
}

// checkGit applies the manifest's rules for git_repo entries (host, repo,
// ref, subpath, token name) to g; an empty ref is allowed and means the
// default branch.
func checkGit(g *manifest.GitRepo) error {
	c := *g
	if c.Ref == "" {
		c.Ref = "HEAD"
	}
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{"skills": {Type: manifest.TypeGitRepo, Git: &c}}}
	err := m.Validate()
	var ve *manifest.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	msgs := make([]string, len(ve.Problems))
	for i, p := range ve.Problems {
		msgs[i] = strings.TrimPrefix(p.Path, `entries["skills"].`) + ": " + p.Msg
	}
	return errors.New(strings.Join(msgs, "; "))
}
