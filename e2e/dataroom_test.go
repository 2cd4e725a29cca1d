package e2e

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	hs "github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// dataRoomManifest: accounts, a read-only data room shared with the
// analysts group, a writable output directory.
func dataRoomManifest() *manifest.Manifest {
	ro := manifest.PermissionsFromMode(0o750)
	roFile := manifest.PermissionsFromMode(0o640)
	return &manifest.Manifest{
		Groups: []manifest.Group{{Name: "analysts"}},
		Users:  []manifest.User{{Name: "analyst", Groups: []string{"analysts"}}},
		RunAs:  "analyst",
		Entries: map[string]*manifest.Entry{
			"dataroom": {Type: manifest.TypeDir, Group: "analysts", Permissions: &ro, Description: "quarterly figures (read-only)",
				Children: map[string]*manifest.Entry{
					"q3.csv": {Type: manifest.TypeFile, Group: "analysts", Permissions: &roFile, Content: []byte("quarter,revenue\nQ3,1200\n")},
				}},
			"output": {Type: manifest.TypeDir, Description: "write the report here"},
		},
	}
}

// TestDataRoomAnalyst is scenario 2: the agent runs as analyst; reading
// the data room works, writing into it fails with a permission error the
// model sees, and the report lands in output/.
func TestDataRoomAnalyst(t *testing.T) {
	report := "*** Begin Patch\n*** Add File: output/report.md\n+# Q3\n+Revenue was 1200.\n*** End Patch"
	for _, p := range providers() {
		t.Run(p.name, func(t *testing.T) {
			p.skip(t)
			testenv.Require(t, testenv.Condition(p.users, "this provider's sandboxes cannot create accounts (the local provider needs root)"))
			srv := replay.NewServer(
				replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "exec_command", `{"cmd":"cat dataroom/q3.csv"}`)}},
				replay.Turn{Items: []replay.Item{replay.FunctionCall("c2", "exec_command", `{"cmd":"echo 9999 >> dataroom/q3.csv"}`)}},
				replay.Turn{Items: []replay.Item{replay.FunctionCall("c3", "exec_command", `{"cmd":"chmod u+w dataroom/q3.csv"}`)}},
				replay.Turn{Items: []replay.Item{replay.CustomToolCall("c4", "apply_patch", report)}},
				replay.Turn{Items: []replay.Item{replay.Message("The report is in output/report.md.")}},
			)
			t.Cleanup(srv.Close)
			m, err := model.NewOpenAI(model.Config{Model: "test-model", APIKey: "x", BaseURL: srv.URL(), Retry: model.RetryPolicy{MaxAttempts: 1}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t)
			client := p.client(t, stateDir(t), nil, materializer.Options{})
			mf := dataRoomManifest()
			sess, err := client.Create(ctx, createOptions(mf))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = client.Delete(ctx, sess) })
			if err := sess.Start(ctx); err != nil {
				t.Fatal(err)
			}
			agent := &hs.Agent{Name: "analyst", Instructions: "Write the Q3 report.", RunAs: "analyst"}
			r := &hs.Runner{Model: m, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}
			res, err := r.Run(ctx, agent, "report on Q3", hs.RunConfig{Sandbox: &hs.SandboxConfig{Session: sess}})
			if err != nil {
				t.Fatal(err)
			}
			if res.FinalOutput != "The report is in output/report.md." {
				t.Fatalf("final %q", res.FinalOutput)
			}
			outs := map[string]string{}
			for _, req := range srv.Requests() {
				for _, o := range req.InputOfType("function_call_output") {
					outs[o["call_id"].(string)], _ = o["output"].(string)
				}
				for _, o := range req.InputOfType("custom_tool_call_output") {
					outs[o["call_id"].(string)], _ = o["output"].(string)
				}
			}
			if !strings.Contains(outs["c1"], "Q3,1200") || !strings.Contains(outs["c1"], "exited with code 0") {
				t.Errorf("reading the data room: %q", outs["c1"])
			}
			for _, c := range []string{"c2", "c3"} {
				if !strings.Contains(strings.ToLower(outs[c]), "permission denied") && !strings.Contains(strings.ToLower(outs[c]), "operation not permitted") {
					t.Errorf("%s: the model was not shown a permission error: %q", c, outs[c])
				}
				if strings.Contains(outs[c], "exited with code 0") {
					t.Errorf("%s succeeded: %q", c, outs[c])
				}
			}
			// The data room is intact, the report is there and belongs to
			// the analyst.
			var b bytes.Buffer
			if _, err := sess.ReadFile(ctx, "dataroom/q3.csv", compute.ReadFileOptions{}, &b); err != nil || b.String() != "quarter,revenue\nQ3,1200\n" {
				t.Errorf("data room changed: %q %v", b.String(), err)
			}
			fi, err := sess.Stat(ctx, "output/report.md", compute.StatOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if fi.Owner != "analyst" {
				t.Errorf("report owned by %q, want analyst", fi.Owner)
			}
			b.Reset()
			if _, err := sess.ReadFile(ctx, "output/report.md", compute.ReadFileOptions{}, &b); err != nil || !strings.Contains(b.String(), "Revenue was 1200.") {
				t.Errorf("report: %q %v", b.String(), err)
			}
		})
	}
}

// createOptions makes the options of a session for a manifest.
func createOptions(m *manifest.Manifest) compute.CreateOptions {
	return compute.CreateOptions{Manifest: m}
}
