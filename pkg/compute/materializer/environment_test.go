package materializer_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// secretsFrom resolves secrets from a map and counts the look-ups.
func secretsFrom(values map[string]string, calls *int) manifest.SecretResolver {
	return manifest.SecretResolverFunc(func(_ context.Context, name string) (string, error) {
		*calls++
		v, ok := values[name]
		if !ok {
			return "", errkind.Errorf(errkind.ErrNotFound, "no secret %s", name)
		}
		return v, nil
	})
}

func TestEnvironmentReachesProcesses(t *testing.T) {
	d := agentdtest.Start(t, nil)
	m := &manifest.Manifest{
		Entries: map[string]*manifest.Entry{"task.md": {Type: manifest.TypeFile, Content: []byte("t")}},
		Environment: map[string]manifest.EnvValue{
			"MODE":      manifest.Literal("test"),
			"API_TOKEN": manifest.SecretEnv("TEAM_TOKEN"),
			"ALSO":      manifest.SecretEnv("TEAM_TOKEN"),
		},
	}
	calls := 0
	opts := materializer.Options{Secrets: secretsFrom(map[string]string{"TEAM_TOKEN": "tok-123"}, &calls)}
	if _, err := materializer.Apply(ctxT(t), d.Client, m, opts); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("a secret used twice was resolved %d times, want once", calls)
	}
	res, err := d.Client.Exec(ctxT(t), agentclient.ProcessSpec{Argv: []string{"env"}}, agentclient.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MODE=test\n", "API_TOKEN=tok-123\n", "ALSO=tok-123\n"} {
		if !strings.Contains(string(res.Stdout), want) {
			t.Fatalf("env lacks %q:\n%s", want, res.Stdout)
		}
	}
	// The manifest itself is untouched: the resolved value is not kept in it.
	if _, ok := m.Environment["API_TOKEN"].Secret.Value(); ok {
		t.Fatal("the caller's manifest now holds the secret's value")
	}

	// The ephemeral-only plan applied after a restore sets it as well, so a
	// replacement sandbox gets its environment back.
	p, err := materializer.Prepare(ctxT(t), m, materializer.Options{
		Secrets: opts.Secrets,
		Include: func(_ string, e *manifest.Entry) bool { return e.IsEphemeral() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.Plan.SetEnvironment || p.Plan.Environment["API_TOKEN"] != "tok-123" || len(p.Plan.Entries) != 0 {
		t.Fatalf("ephemeral-only plan: set_environment %v, environment names %d, entries %d",
			p.Plan.SetEnvironment, len(p.Plan.Environment), len(p.Plan.Entries))
	}

	// A manifest copy resolved beforehand needs no resolver.
	resolved, err := m.ResolveSecrets(ctxT(t), opts.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := materializer.Prepare(ctxT(t), resolved, materializer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p2.Close()
	if p2.Plan.Environment["ALSO"] != "tok-123" {
		t.Fatal("an already resolved secret was not used")
	}

	// A manifest without an environment still sets (clears) it.
	p3, err := materializer.Prepare(ctxT(t), &manifest.Manifest{}, materializer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p3.Close()
	if !p3.Plan.SetEnvironment || len(p3.Plan.Environment) != 0 {
		t.Fatal("a manifest without an environment must clear the daemon's")
	}
}

func TestEnvironmentSecretMissing(t *testing.T) {
	d := agentdtest.Start(t, nil)
	m := &manifest.Manifest{
		Entries:     map[string]*manifest.Entry{"task.md": {Type: manifest.TypeFile, Content: []byte("t")}},
		Environment: map[string]manifest.EnvValue{"API_TOKEN": manifest.SecretEnv("MISSING_TOKEN"), "MODE": manifest.Literal("x")},
	}
	calls := 0
	for name, opts := range map[string]materializer.Options{
		"resolver fails": {Secrets: secretsFrom(map[string]string{"OTHER": "other-value"}, &calls)},
		"no resolver":    {},
	} {
		_, err := materializer.Apply(ctxT(t), d.Client, m, opts)
		if err == nil {
			t.Fatalf("%s: a missing secret was accepted", name)
		}
		if !strings.Contains(err.Error(), "API_TOKEN") || !strings.Contains(err.Error(), "MISSING_TOKEN") || strings.Contains(err.Error(), "other-value") {
			t.Fatalf("%s: the error must name the variable and the secret: %v", name, err)
		}
		if name == "no resolver" && !errors.Is(err, errkind.ErrFailedPrecondition) {
			t.Fatalf("no resolver: want ErrFailedPrecondition, got %v", err)
		}
		if _, err := os.Stat(filepath.Join(d.Workspace, "task.md")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: a refused manifest wrote task.md: %v", name, err)
		}
	}
	res, err := d.Client.Exec(ctxT(t), agentclient.ProcessSpec{Argv: []string{"env"}}, agentclient.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(res.Stdout), "MODE=") {
		t.Fatalf("a refused manifest set the environment:\n%s", res.Stdout)
	}
}
