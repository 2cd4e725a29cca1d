package server

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// envOf runs env in the sandbox with the request's own variables.
func envOf(t *testing.T, td *testDaemon, req map[string]string) map[string]string {
	t.Helper()
	res, err := td.client.Exec(ctxT(t), agentclient.ProcessSpec{Argv: []string{"env"}, Env: req}, agentclient.ExecOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(string(res.Stdout), "\n"), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

// setEnvironment materializes an empty plan that only sets the environment.
func setEnvironment(t *testing.T, td *testDaemon, env map[string]string) error {
	t.Helper()
	_, err := td.client.Materialize(ctxT(t), &agentclient.MaterializePlan{Environment: env, SetEnvironment: true}, bytes.NewReader(nil))
	return err
}

func TestMaterializeEnvironmentReachesProcesses(t *testing.T) {
	td := newTestDaemon(t, nil)
	if err := setEnvironment(t, td, map[string]string{"SANDBOX_A": "one", "SHARED": "manifest", "PATH": "/opt/tools/bin:/usr/bin:/bin", "LANG": "en_US.UTF-8"}); err != nil {
		t.Fatal(err)
	}
	env := envOf(t, td, map[string]string{"SHARED": "request"})
	if env["SANDBOX_A"] != "one" {
		t.Fatalf("the manifest's environment is missing: %v", env)
	}
	if env["SHARED"] != "request" {
		t.Fatalf("the request's env must override the manifest's: SHARED=%q", env["SHARED"])
	}
	if env["PATH"] != "/opt/tools/bin:/usr/bin:/bin" || env["LANG"] != "en_US.UTF-8" {
		t.Fatalf("the manifest's environment must override the daemon's defaults: PATH=%q LANG=%q", env["PATH"], env["LANG"])
	}

	// A second plan replaces the environment as a whole.
	if err := setEnvironment(t, td, map[string]string{"SANDBOX_B": "two"}); err != nil {
		t.Fatal(err)
	}
	env = envOf(t, td, nil)
	if _, ok := env["SANDBOX_A"]; ok || env["SANDBOX_B"] != "two" {
		t.Fatalf("a second plan must replace the environment: %v", env)
	}
	if env["PATH"] == "/opt/tools/bin:/usr/bin:/bin" || env["PATH"] == "" {
		t.Fatalf("the default PATH must come back once the manifest no longer sets it: PATH=%q", env["PATH"])
	}

	// A plan that does not set it keeps it.
	if _, err := td.client.Materialize(ctxT(t), &agentclient.MaterializePlan{}, bytes.NewReader(nil)); err != nil {
		t.Fatal(err)
	}
	if env = envOf(t, td, nil); env["SANDBOX_B"] != "two" {
		t.Fatalf("a plan without set_environment must keep the environment: %v", env)
	}

	// An empty environment with set_environment clears it.
	if err := setEnvironment(t, td, nil); err != nil {
		t.Fatal(err)
	}
	if env = envOf(t, td, nil); env["SANDBOX_B"] != "" {
		t.Fatalf("an empty environment must clear it: %v", env)
	}
}

func TestMaterializeEnvironmentRejectsBadVariables(t *testing.T) {
	td := newTestDaemon(t, nil)
	if err := setEnvironment(t, td, map[string]string{"KEEP": "kept"}); err != nil {
		t.Fatal(err)
	}
	for name, env := range map[string]map[string]string{
		"equals in name": {"A=B": "x"},
		"NUL in value":   {"OK": "a\x00b"},
	} {
		err := setEnvironment(t, td, env)
		if !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Fatalf("%s: want InvalidArgument, got %v", name, err)
		}
	}
	if env := envOf(t, td, nil); env["KEEP"] != "kept" {
		t.Fatalf("a rejected plan must leave the environment as it was: %v", env)
	}
}

func TestMaterializeEnvironmentKeptWhenPlanFails(t *testing.T) {
	td := newTestDaemon(t, nil)
	if err := setEnvironment(t, td, map[string]string{"KEEP": "kept"}); err != nil {
		t.Fatal(err)
	}
	// An entry escaping the workspace fails the plan.
	_, err := td.client.Materialize(ctxT(t), &agentclient.MaterializePlan{
		Entries:        []*agentclient.MaterializeEntry{{Path: "../escape", Kind: agentclient.EntryDirectory, Mode: 0o755}},
		Environment:    map[string]string{"NEW": "new"},
		SetEnvironment: true,
	}, bytes.NewReader(nil))
	if err == nil {
		t.Fatal("a plan escaping the workspace succeeded")
	}
	if env := envOf(t, td, nil); env["KEEP"] != "kept" || env["NEW"] != "" {
		t.Fatalf("a failed plan must leave the environment as it was: %v", env)
	}
}
