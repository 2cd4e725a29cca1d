package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentd/archive"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/responsestest"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// DefaultModel is the model `harness run` uses when --model and
// $BULKHEAD_MODEL are unset.
const DefaultModel = "gpt-5.1"

// defaultInstructions are the agent's instructions for `harness run`.
const defaultInstructions = `Work on the task in the sandbox's workspace. Read any task description the user points you to
before changing files, make the smallest correct change, run the most relevant checks, and finish
with a summary of the files you changed and the exact verification command you ran.`

type runFlags struct {
	manifest         string
	baseDir          string
	model            string
	json             bool
	replay           string
	replayWithoutKey string
	maxTurns         int
	workdir          string
	export           string
	instructions     string
	keep             bool
}

func newRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [flags] TASK",
		Short: "Run an agent on a task in a fresh sandbox",
		Long: `Run an agent on TASK in a fresh sandbox made from --manifest, with the OpenAI Responses API
($OPENAI_API_KEY, $OPENAI_BASE_URL). Progress is shown as it happens (--json for JSON lines); the
final output is printed last. The exit status is non-zero when the run fails.

--replay FILE replays a recorded model session instead of calling a model (offline, labelled as a
replay); --replay-without-key FILE does so only when $OPENAI_API_KEY is not set.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runTask(cmd, g, f, args[0]) },
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.manifest, "manifest", "m", "", "workspace manifest (YAML or JSON); host sources are read relative to its directory")
	fl.StringVar(&f.baseDir, "base-dir", "", "trusted directory host sources are read from (default: the manifest's directory)")
	fl.StringVar(&f.model, "model", "", "model name (default $BULKHEAD_MODEL, then "+DefaultModel+")")
	fl.BoolVar(&f.json, "json", false, "print events as JSON lines")
	fl.StringVar(&f.replay, "replay", "", "replay this recorded model session instead of calling a model")
	fl.StringVar(&f.replayWithoutKey, "replay-without-key", "", "replay this recording when $OPENAI_API_KEY is not set")
	fl.IntVar(&f.maxTurns, "max-turns", 30, "most model calls in the run")
	fl.StringVar(&f.workdir, "workdir", "", "working directory of the run, relative to the workspace root")
	fl.StringVar(&f.export, "export", "", "copy the final workspace into this local directory (created; must be empty)")
	fl.StringVar(&f.instructions, "instructions", "", "the agent's instructions (default: a coding-task prompt)")
	fl.BoolVar(&f.keep, "keep", false, "keep the sandbox after the run and print its session state file")
	return cmd
}

func runTask(cmd *cobra.Command, g *globals, f *runFlags, task string) error {
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	m := &manifest.Manifest{}
	baseDir := f.baseDir
	if f.manifest != "" {
		var err error
		if m, err = manifest.LoadTrustedFile(f.manifest); err != nil {
			return err
		}
		if baseDir == "" {
			baseDir = filepath.Dir(f.manifest)
		}
	}
	if baseDir != "" {
		abs, err := filepath.Abs(baseDir)
		if err != nil {
			return err
		}
		baseDir = abs
	}
	mdl, label, closeModel, err := chooseModel(f, g)
	if err != nil {
		return err
	}
	defer closeModel()
	if label != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), label)
	}
	client, release, err := g.client(materializer.Options{BaseDir: baseDir})
	if err != nil {
		return err
	}
	defer release()

	modelName := f.model
	if modelName == "" {
		modelName = os.Getenv("BULKHEAD_MODEL")
	}
	if modelName == "" {
		modelName = DefaultModel
	}
	instructions := f.instructions
	if instructions == "" {
		instructions = defaultInstructions
	}
	agent := &harness.Agent{Name: "sandbox-engineer", Instructions: instructions, DefaultManifest: m, RunAs: m.RunAs}
	sc := &harness.SandboxConfig{Client: client, Workdir: f.workdir, KeepSession: f.keep}
	if f.export != "" {
		if err := emptyDir(f.export); err != nil {
			return err
		}
		sc.OnSession = func(_ context.Context, s *compute.Session) error {
			s.OnPreStop(func(ctx context.Context, s *compute.Session) error { return export(ctx, s, f.export) })
			return nil
		}
	}
	r := &harness.Runner{Model: mdl, ModelName: modelName, Log: g.logger()}
	stream := r.RunStreamed(ctx, agent, task, harness.RunConfig{MaxTurns: f.maxTurns, Sandbox: sc})
	p := &printer{w: out, json: f.json}
	for ev := range stream.Events() {
		p.event(ev)
	}
	res, runErr := stream.Wait()
	if f.keep && res != nil && res.SessionState != nil {
		if path, err := saveState(g, res.SessionState); err == nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "sandbox kept: %s (state in %s)\n", res.SessionState.SessionID, path)
		} else {
			runErr = errors.Join(runErr, err)
		}
	}
	if runErr != nil {
		return runErr
	}
	p.final(res)
	return nil
}

// chooseModel returns the OpenAI model, or a replay of a recording with a
// label saying so.
func chooseModel(f *runFlags, g *globals) (model.Model, string, func(), error) {
	rec := f.replay
	label := ""
	if rec == "" && f.replayWithoutKey != "" && os.Getenv("OPENAI_API_KEY") == "" {
		rec = f.replayWithoutKey
		label = "OPENAI_API_KEY is not set: "
	}
	if rec != "" {
		r, err := responsestest.LoadRecording(rec)
		if err != nil {
			return nil, "", nil, err
		}
		srv := responsestest.NewServer(r.ScriptTurns()...)
		m, err := model.NewOpenAI(model.Config{APIKey: "replay", BaseURL: srv.URL(), Logger: g.logger(), Retry: model.RetryPolicy{MaxAttempts: 1}})
		if err != nil {
			srv.Close()
			return nil, "", nil, err
		}
		label += fmt.Sprintf("[REPLAY] replaying the recorded model session %s (no model is called); the sandbox, tools and commands are real.", rec)
		return m, label, srv.Close, nil
	}
	m, err := model.NewOpenAI(model.Config{Logger: g.logger()})
	if err != nil {
		return nil, "", nil, fmt.Errorf("%w (set OPENAI_API_KEY, or pass --replay FILE to replay a recorded session)", err)
	}
	return m, "", func() {}, nil
}

// printer shows run events.
type printer struct {
	w       io.Writer
	json    bool
	inText  bool
	lastRes string
}

func (p *printer) event(ev harness.Event) {
	if p.json {
		b, _ := json.Marshal(ev)
		fmt.Fprintln(p.w, string(b))
		return
	}
	switch ev.Kind {
	case harness.EventTextDelta:
		if !p.inText {
			fmt.Fprint(p.w, "\n")
			p.inText = true
		}
		fmt.Fprint(p.w, ev.Text)
	case harness.EventModelReset:
		fmt.Fprint(p.w, "\n[the model call was retried; the text above is discarded]\n")
	case harness.EventToolCall:
		p.endText()
		fmt.Fprintf(p.w, "\n> %s\n", describeCall(ev.Call))
	case harness.EventToolResult:
		fmt.Fprint(p.w, indent(limitLines(ev.Result.Output, 40), "  "))
		if ev.Result.IsError {
			fmt.Fprintln(p.w, "  (the tool reported an error to the model)")
		}
	case harness.EventTurnStarted, harness.EventFinalOutput:
		p.endText()
	}
}

func (p *printer) endText() {
	if p.inText {
		fmt.Fprint(p.w, "\n")
		p.inText = false
	}
}

func (p *printer) final(res *harness.Result) {
	if p.json {
		b, _ := json.Marshal(map[string]any{"kind": "result", "final_output": res.FinalOutput, "turns": res.Turns,
			"input_tokens": res.Usage.InputTokens, "output_tokens": res.Usage.OutputTokens})
		fmt.Fprintln(p.w, string(b))
		return
	}
	// The final output was streamed as it came; end with the totals.
	p.endText()
	fmt.Fprintf(p.w, "\n== done: %d turns, %d input / %d output tokens\n", res.Turns, res.Usage.InputTokens, res.Usage.OutputTokens)
}

// describeCall renders a tool call readably.
func describeCall(c *harness.ToolCall) string {
	switch c.Name {
	case "exec_command":
		var a struct {
			Cmd     string `json:"cmd"`
			Workdir string `json:"workdir"`
		}
		if json.Unmarshal([]byte(c.Input), &a) == nil && a.Cmd != "" {
			if a.Workdir != "" {
				return fmt.Sprintf("$ %s   (in %s)", a.Cmd, a.Workdir)
			}
			return "$ " + a.Cmd
		}
	case "apply_patch":
		var files []string
		for _, line := range strings.Split(c.Input, "\n") {
			for _, h := range []string{"*** Add File: ", "*** Update File: ", "*** Delete File: "} {
				if strings.HasPrefix(line, h) {
					files = append(files, strings.ToLower(strings.Fields(h)[1])+" "+strings.TrimPrefix(line, h))
				}
			}
		}
		return "apply_patch: " + strings.Join(files, ", ")
	}
	in := c.Input
	if len(in) > 200 {
		in = in[:200] + "..."
	}
	return c.Name + " " + in
}

func limitLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append(lines[:n], fmt.Sprintf("... (%d more lines)", len(lines)-n))
	}
	return strings.Join(lines, "\n") + "\n"
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// emptyDir creates dir or checks that it is empty.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("--export %s: the directory is not empty", dir)
	}
	return nil
}

// export copies the session's workspace into dir, extracting the daemon's
// archive with the same safety rules the daemon applies to restores.
func export(ctx context.Context, s *compute.Session, dir string) error {
	pr, pw := io.Pipe()
	go func() {
		_, err := s.Agent().Archive(ctx, &agentdv1.ArchiveRequest{Compression: agentdv1.ArchiveCompression_ARCHIVE_COMPRESSION_NONE}, pw)
		pw.CloseWithError(err)
	}()
	_, err := archive.Restore(ctx, dir, pr, archive.RestoreOptions{})
	pr.CloseWithError(err)
	if err != nil {
		return fmt.Errorf("export workspace: %w", err)
	}
	return nil
}

// saveState writes a session state under the state directory.
func saveState(g *globals, st *compute.State) (string, error) {
	dir, err := g.dir("sessions")
	if err != nil {
		return "", err
	}
	data, err := st.Encode()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, st.SessionID+".json")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return "", fmt.Errorf("save session state: %w", err)
	}
	return p, nil
}
