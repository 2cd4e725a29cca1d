package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	hs "github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// script is the model's side of part 2: write a file, look at it (allowed
// without approval), then pack it with a command that needs approval, and
// finish.
func script() []replay.Turn {
	return []replay.Turn{
		{Items: []replay.Item{
			replay.Message("I'll write the summary, then pack it."),
			replay.CustomToolCall("call_1", "apply_patch", "*** Begin Patch\n*** Add File: report/summary.md\n+# Weekly summary\n+\n+All three readings are within range.\n*** End Patch"),
			replay.FunctionCall("call_2", "exec_command", `{"cmd": "ls -l report"}`),
		}},
		{Items: []replay.Item{
			replay.FunctionCall("call_3", "exec_command", `{"cmd": "tar -czf report.tar.gz report && tar -tzf report.tar.gz"}`),
		}},
		{Items: []replay.Item{replay.Message("Packed report/ into report.tar.gz.")}},
	}
}

// newAgent returns the agent of part 2: exec_command needs a human's
// approval unless the command is a plain ls or cat.
func newAgent(out io.Writer) *hs.Agent {
	return &hs.Agent{
		Name:         "packer",
		Instructions: "Write a weekly summary in report/summary.md and pack report/ into report.tar.gz.",
		Approvals: map[string]hs.ApprovalPolicy{
			"exec_command": hs.CommandsOutside(regexp.MustCompile(`(ls|cat)( [-\w./]+)*`)),
		},
		Hooks: hs.Hooks{
			OnToolCall: func(_ context.Context, _ *hs.RunContext, c hs.ToolCall) {
				fmt.Fprintf(out, "> %s\n", describe(c))
			},
			OnToolResult: func(_ context.Context, _ *hs.RunContext, _ hs.ToolCall, r tool.Result) {
				fmt.Fprint(out, indent(r.Output))
			},
		},
	}
}

// runStatePart runs an agent until it stops for approval, saves the
// RunState, deletes the sandbox, then approves and resumes the run: the
// workspace comes back from the snapshot in a fresh sandbox and the
// approved command runs there.
func runStatePart(ctx context.Context, client *compute.Client, dir string, out io.Writer, log *zap.Logger) error {
	step(out, "Part 2: a run stopped for approval, its sandbox deleted, the run resumed")
	srv := replay.NewServer(script()...)
	defer srv.Close()
	mdl, err := model.NewOpenAI(model.Config{Model: "scripted", APIKey: "scripted", BaseURL: srv.URL(), Logger: log})
	if err != nil {
		return err
	}
	runner := &hs.Runner{Model: mdl, Log: log}
	agent := newAgent(out)
	cfg := hs.RunConfig{Sandbox: &hs.SandboxConfig{
		Client:   client,
		Manifest: &manifest.Manifest{Entries: map[string]*manifest.Entry{"report": {Type: manifest.TypeDir}}},
	}}

	// The run stops before the command that needs approval. The runner
	// persisted its session to the snapshot store and left the sandbox
	// running; the RunState records where both are.
	res, err := runner.Run(ctx, agent, "Write and pack this week's summary.", cfg)
	if err != nil {
		return err
	}
	if len(res.Interruptions) == 0 {
		return fmt.Errorf("the run did not stop for approval (final output %q)", res.FinalOutput)
	}
	for _, p := range res.Interruptions {
		fmt.Fprintf(out, "stopped: %s needs approval (call %s)\n", describe(p.Call), p.Call.ID)
	}
	data, err := res.State.Encode()
	if err != nil {
		return err
	}
	statePath := filepath.Join(dir, "run-state.json")
	if err := os.WriteFile(statePath, data, 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, "run state saved to %s (%d bytes of JSON: conversation, pending call, session state)\n", filepath.Base(statePath), len(data))

	// While the run waits for a human, its sandbox disappears (reaped, a
	// node lost, an idle timeout...). Only the snapshot is left.
	for key, st := range res.State.Sessions {
		sess, err := client.Resume(ctx, st)
		if err != nil {
			return err
		}
		if err := client.Delete(ctx, sess); err != nil {
			return err
		}
		fmt.Fprintf(out, "deleted the sandbox of agent %q while the run waited; snapshot %s stays\n", key, st.SnapshotID)
	}

	// Later, possibly in another process: load the state, decide, resume.
	data, err = os.ReadFile(statePath)
	if err != nil {
		return err
	}
	st, err := hs.DecodeRunState(data)
	if err != nil {
		return err
	}
	for _, p := range st.Undecided() {
		if err := st.Approve(p.Call.ID); err != nil {
			return err
		}
		fmt.Fprintf(out, "approved call %s\n", p.Call.ID)
	}
	// The runner resumes the session recorded in the state: the sandbox is
	// gone, so a fresh one is launched and the workspace restored from the
	// snapshot before the approved command runs in it.
	var packed string
	agent.Hooks.OnToolResult = func(_ context.Context, _ *hs.RunContext, c hs.ToolCall, r tool.Result) {
		if c.ID == "call_3" {
			packed = r.Output
		}
		fmt.Fprint(out, indent(r.Output))
	}
	res, err = runner.Resume(ctx, agent, st, cfg)
	if err != nil {
		return err
	}
	if !strings.Contains(packed, "report/summary.md") {
		return fmt.Errorf("the approved command did not find the restored file:\n%s", packed)
	}
	fmt.Fprintf(out, "final output: %s\n", res.FinalOutput)
	// The run is over: the runner closed and deleted its session. Its last
	// snapshot stays in the store until deleted.
	n, err := sandboxCount(ctx, client)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "the runner cleaned up: %d sandboxes left\n", n)
	return nil
}

// describe renders a tool call on one line.
func describe(c hs.ToolCall) string {
	var args struct {
		Cmd string `json:"cmd"`
	}
	if c.Name == "exec_command" && json.Unmarshal([]byte(c.Input), &args) == nil {
		return "exec_command: $ " + args.Cmd
	}
	first, _, _ := strings.Cut(strings.TrimPrefix(c.Input, "*** Begin Patch\n"), "\n")
	return c.Name + ": " + first
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}
