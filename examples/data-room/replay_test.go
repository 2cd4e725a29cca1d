// Package dataroom holds the test of the data-room example: it runs the
// README's command (harness run with the recorded model session) against a
// real local sandbox and checks the permission model held.
package dataroom

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/cli"
	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

func TestMain(m *testing.M) { os.Exit(agentdtest.Run(m)) }

const task = "Using the data room, report FY2024 revenue by region and the operating margin per quarter in output/report.md."

func TestReplay(t *testing.T) {
	// The data room creates sandbox accounts, which the local provider can
	// do only as root (elsewhere, use --provider docker).
	testenv.Require(t, testenv.Root)
	// A short private state directory (unix socket paths are short) that
	// the sandbox's accounts can pass through.
	state, err := os.MkdirTemp("", "bh-dataroom-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	if err := os.Chmod(state, 0o711); err != nil {
		t.Fatal(err)
	}
	agentd := agentdtest.Binaries(t).Agentd
	export := filepath.Join(state, "export")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := cli.Execute(ctx, []string{"run", "--state-dir", state, "--agentd", agentd, "--isolation", "none",
		"--manifest", "manifest.yaml", "--replay", "replay.json", "--export", export, task},
		cli.Streams{In: strings.NewReader(""), Out: &stdout, Err: &stderr})
	out := stdout.String()
	if code != 0 {
		t.Fatalf("harness run: exit %d\n%s\n%s", code, out, stderr.String())
	}
	// The real commands' output agrees with the recorded report, the write
	// into the data room was refused, and the run ended.
	for _, want := range []string{
		"Americas    8020   49.5%",
		"Q4 revenue=4490 costs=3580 income=910 margin=20.3%",
		"dataroom/NOTES.txt: Permission denied",
		"Created output/report.md",
		"== done: 8 turns",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the run's output lacks %q:\n%s", want, out)
		}
	}
	// The exported workspace: the data room as it was, the report beside it.
	for _, f := range []string{"README.md", "revenue.csv", "costs.csv"} {
		want, err := os.ReadFile(filepath.Join("dataroom", f))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(export, "dataroom", f)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("dataroom/%s changed: %v", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(export, "dataroom", "NOTES.txt")); !os.IsNotExist(err) {
		t.Errorf("dataroom/NOTES.txt exists (%v): the data room was writable", err)
	}
	report, err := os.ReadFile(filepath.Join(export, "output", "report.md"))
	if err != nil || !bytes.Contains(report, []byte("| Q4      |   4,490 | 3,580 |              910 |  20.3% |")) {
		t.Errorf("output/report.md: %v\n%s", err, report)
	}
}
