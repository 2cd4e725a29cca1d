package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	bh "github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Fixed account ids: a local sandbox's processes see the host's /etc, not
// the sandbox's own accounts, so commands print numeric ids.
const (
	explorerUID    = 2101
	coordinatorUID = 2102
)

// sharedRoomManifest: accounts explorer and coordinator, both in the group
// team; dataroom/ (and its files) owned by root, readable by team, writable
// by nobody else; output/ writable by the coordinator's group only.
func sharedRoomManifest() *manifest.Manifest {
	perms := func(m os.FileMode) *manifest.Permissions {
		p := manifest.PermissionsFromMode(m)
		return &p
	}
	file := func(content string) *manifest.Entry {
		return &manifest.Entry{Type: manifest.TypeFile, Group: "team", Permissions: perms(0o640), Content: []byte(content)}
	}
	id := func(n uint32) *uint32 { return &n }
	return &manifest.Manifest{
		Users: []manifest.User{{Name: "explorer", UID: id(explorerUID), Groups: []string{"team"}},
			{Name: "coordinator", UID: id(coordinatorUID), Groups: []string{"team"}}},
		Groups: []manifest.Group{{Name: "team", GID: id(2100)}},
		Entries: map[string]*manifest.Entry{
			"dataroom": {Type: manifest.TypeDir, Group: "team", Permissions: perms(0o750), Description: "the data room (read-only)",
				Children: map[string]*manifest.Entry{
					"revenue.csv": file("quarter,revenue\nq3,1200\n"),
					"costs.csv":   file("quarter,costs\nq3,800\n"),
				}},
			"output": {Type: manifest.TypeDir, Group: "coordinator", Permissions: perms(0o775), Description: "reports go here"},
		},
	}
}

func argsJSON(v map[string]any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

var permDeniedRE = regexp.MustCompile(`(?i)permission denied`)

// TestAgentAsToolSharedSession is scenario 5: a coordinator agent (running
// as coordinator) calls an explorer agent as a tool; the explorer runs in
// the coordinator's live session as the explorer account. The explorer
// reads the data room and fails to write into output/ and dataroom/ (the
// permission errors are in its tool outputs); its answer comes back as the
// coordinator's tool output; the coordinator cannot change the data room
// either but writes output/report.md, which the coordinator's account
// owns.
func TestAgentAsToolSharedSession(t *testing.T) {
	const (
		report    = "# Q3\n\nProfit: 400 (revenue 1200 - costs 800)\n"
		explored  = "Revenue 1200, costs 800. I could not write to output/ or dataroom/."
		finalText = "The report is in output/report.md."
	)
	for _, p := range providers() {
		t.Run(p.name, func(t *testing.T) {
			p.skip(t)
			testenv.Require(t, testenv.Condition(p.users, "this provider cannot create sandbox accounts here (the local provider needs root)"))
			t.Parallel()
			ctx := ctxT(t)
			client := p.client(t, stateDir(t), nil, materializer.Options{})
			// A live session the test owns and inspects after the run.
			sess := ownedSession(t, ctx, client, compute.CreateOptions{Manifest: sharedRoomManifest()})

			srv, m := newScriptedModel(t,
				// coordinator
				replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "explorer", argsJSON(map[string]any{"input": "Read the data room and leave your notes in output/."}))}},
				// explorer
				replay.Turn{Items: []replay.Item{replay.FunctionCall("e1", "exec_command", argsJSON(map[string]any{"cmd": "id -u; cat dataroom/revenue.csv dataroom/costs.csv"}))}},
				replay.Turn{Items: []replay.Item{
					replay.FunctionCall("e2", "exec_command", argsJSON(map[string]any{"cmd": "echo draft > output/explorer-notes.md"})),
					replay.CustomToolCall("e3", "apply_patch", "*** Begin Patch\n*** Add File: output/explorer.md\n+notes\n*** End Patch\n"),
					replay.FunctionCall("e4", "exec_command", argsJSON(map[string]any{"cmd": "echo tampered >> dataroom/revenue.csv"})),
				}},
				replay.Turn{Items: []replay.Item{replay.Message(explored)}},
				// coordinator
				replay.Turn{Items: []replay.Item{
					replay.CustomToolCall("c2", "apply_patch", "*** Begin Patch\n*** Add File: output/report.md\n+"+
						strings.Join(strings.Split(strings.TrimSuffix(report, "\n"), "\n"), "\n+")+"\n*** End Patch\n"),
					replay.FunctionCall("c3", "exec_command", argsJSON(map[string]any{"cmd": "id -u; echo tampered >> dataroom/costs.csv"})),
				}},
				replay.Turn{Items: []replay.Item{replay.Message(finalText)}},
			)
			r := &bh.Runner{Model: m, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}
			explorer := &bh.Agent{Name: "explorer", Instructions: "Explore the data room and report what you find.",
				HandoffDescription: "Reads the data room and answers questions about it."}
			coordinator := &bh.Agent{Name: "coordinator", Instructions: "Coordinate the analysis and write the report.", RunAs: "coordinator",
				Tools: []tool.Tool{explorer.AsTool(bh.AsToolOptions{Runner: r, ShareSession: true, RunAs: "explorer", MaxTurns: 5})}}
			res, err := r.Run(ctx, coordinator, "Write the Q3 report.", bh.RunConfig{Sandbox: &bh.SandboxConfig{Session: sess}})
			if err != nil {
				t.Fatal(err)
			}
			if res.FinalOutput != finalText || res.Agent != "coordinator" {
				t.Fatalf("final %q by %q", res.FinalOutput, res.Agent)
			}
			if err := srv.Err(); err != nil {
				t.Fatal(err)
			}
			reqs := srv.Requests()
			if len(reqs) != 6 {
				t.Fatalf("%d model requests, want 6", len(reqs))
			}
			if reqs[0].Tool("explorer") == nil || reqs[1].Tool("explorer") != nil || reqs[1].Tool("exec_command") == nil {
				t.Errorf("tools: coordinator %v, explorer %v", reqs[0].Tools(), reqs[1].Tools())
			}

			// The explorer, as explorer, read the data room...
			e := callOutputs(reqs[2])["e1"]
			if !strings.Contains(e, "Process exited with code 0") || !strings.Contains(shellOutputBody(e), "2101\nquarter,revenue\nq3,1200\nquarter,costs\nq3,800\n") {
				t.Errorf("the explorer's read:\n%s", e)
			}
			// ...and its writes failed with permission errors it was shown.
			outs := callOutputs(reqs[3])
			for _, id := range []string{"e2", "e4"} {
				if o := outs[id]; exitedCodeRE.FindStringSubmatch(o) == nil || strings.Contains(o, "exited with code 0") || !permDeniedRE.MatchString(shellOutputBody(o)) {
					t.Errorf("the explorer's write %s did not fail with a permission error:\n%s", id, o)
				}
			}
			if o := outs["e3"]; !permDeniedRE.MatchString(o) || !strings.Contains(o, "output/explorer.md") {
				t.Errorf("the explorer's apply_patch into output/ did not fail with a permission error:\n%s", o)
			}
			// The explorer's answer is the coordinator's tool output.
			if got := callOutputs(reqs[4])["c1"]; got != explored {
				t.Errorf("agent tool output %q", got)
			}
			// The coordinator wrote the report and could not touch the data room.
			outs = callOutputs(reqs[5])
			if o := outs["c2"]; o != "Created output/report.md" {
				t.Errorf("the coordinator's apply_patch: %q", o)
			}
			if o := outs["c3"]; !regexp.MustCompile(`(?m)^2102$`).MatchString(shellOutputBody(o)) || strings.Contains(o, "exited with code 0") || !permDeniedRE.MatchString(o) {
				t.Errorf("the coordinator's write into dataroom/ did not fail with a permission error:\n%s", o)
			}

			// The workspace, through the session's daemon, as the operator
			// (root: a request naming no user runs as the session's own
			// account, which is not in the team).
			agent := sess.Agent()
			read := func(path string) string {
				var b bytes.Buffer
				if _, err := agent.ReadFile(ctx, path, compute.ReadFileOptions{User: "root"}, &b); err != nil {
					t.Fatalf("read %s: %v", path, err)
				}
				return b.String()
			}
			if got := read("output/report.md"); got != report {
				t.Errorf("output/report.md = %q", got)
			}
			if got := read("dataroom/revenue.csv") + read("dataroom/costs.csv"); got != "quarter,revenue\nq3,1200\nquarter,costs\nq3,800\n" {
				t.Errorf("the data room changed: %q", got)
			}
			ls, err := agent.ListDir(ctx, "output", compute.ListDirOptions{User: "root"})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range ls.Entries {
				names = append(names, e.Name)
			}
			if strings.Join(names, ",") != "report.md" {
				t.Errorf("output/ holds %v, want only report.md", names)
			}
			info, err := agent.Stat(ctx, "output/report.md", compute.StatOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ex, err := agent.Exec(ctx, compute.ProcessSpec{Command: "stat -c %u output/report.md"}, compute.ExecOptions{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if ex.Exit.ExitCode != 0 {
				t.Fatalf("id/stat: exit %d: %s", ex.Exit.ExitCode, ex.Stderr)
			}
			if info.Owner != "coordinator" || info.UID != coordinatorUID || strings.TrimSpace(string(ex.Stdout)) != strconv.Itoa(coordinatorUID) {
				t.Errorf("output/report.md is owned by %q (uid %d; stat -c %%u in the sandbox: %q), want coordinator (%d)",
					info.Owner, info.UID, ex.Stdout, coordinatorUID)
			}
		})
	}
}
