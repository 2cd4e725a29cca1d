package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/archive"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
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
	keepSnapshot     bool
	approvalFor      []string
	allowCommands    []string
	interactive      bool
	resume           string
	approve          []string
	reject           []string
	approveAll       bool
}

func newRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [flags] TASK",
		Short: "Run an agent on a task in a fresh sandbox",
		Long: `Run an agent on TASK in a fresh sandbox made from --manifest, with the OpenAI Responses API
($OPENAI_API_KEY, $OPENAI_BASE_URL). Progress is shown as it happens (--json for JSON lines); the
final output is printed last. The exit status is non-zero when the run fails.

The sandbox is deleted at the end, and so is the snapshot of its workspace that closing it takes,
unless --keep-snapshot (then the run says where it is and how to remove it) or --keep (the sandbox
stays, with its snapshot). A run stopped for approval keeps both until it is resumed and ends.
` + "`harness sandbox snapshot gc`" + ` removes old snapshots.

--replay FILE replays a recorded model session instead of calling a model (offline, labelled as a
replay); --replay-without-key FILE does so only when $OPENAI_API_KEY is not set.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case f.resume == "" && len(args) != 1:
				return errors.New("give the task as the one argument (or --resume a stopped run)")
			case f.resume != "" && len(args) != 0:
				return errors.New("a resumed run takes no task argument")
			}
			task := ""
			if len(args) == 1 {
				task = args[0]
			}
			return runTask(cmd, g, f, task)
		},
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
	fl.BoolVar(&f.keep, "keep", false, "keep the sandbox after the run and print its session state file (its snapshot stays too)")
	fl.BoolVar(&f.keepSnapshot, "keep-snapshot", false, "keep the final workspace's snapshot in the snapshot store (by default the run deletes it with its sandbox)")
	g.addAllowDomainFlag(cmd)
	fl.StringArrayVar(&f.approvalFor, "approval-for", nil, "tool whose calls need approval (repeatable), e.g. exec_command")
	fl.StringArrayVar(&f.allowCommands, "allow-command", nil, "exec_command needs approval unless the whole command matches this regexp (repeatable)")
	fl.BoolVar(&f.interactive, "interactive", false, "ask on the terminal for approvals instead of stopping the run")
	fl.StringVar(&f.resume, "resume", "", "resume the stopped run saved in this file (use the same --manifest and approval flags)")
	fl.StringArrayVar(&f.approve, "approve", nil, "with --resume: approve this tool call id (repeatable)")
	fl.StringArrayVar(&f.reject, "reject", nil, "with --resume: reject this tool call id, optionally ID=message for the model (repeatable)")
	fl.BoolVar(&f.approveAll, "approve-all", false, "with --resume: approve every pending call")
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
	var resumed *harness.RunState
	if f.resume != "" {
		data, err := os.ReadFile(f.resume)
		if err != nil {
			return fmt.Errorf("--resume: %w", err)
		}
		if resumed, err = harness.DecodeRunState(data); err != nil {
			return err
		}
		if err := applyDecisionFlags(f, resumed); err != nil {
			return err
		}
		if f.interactive && len(resumed.Undecided()) > 0 {
			if err := askDecisions(cmd, resumed); err != nil {
				return err
			}
		}
	}
	skip := 0
	if resumed != nil {
		skip = resumed.Turn
	}
	flush, err := g.setupTracing(ctx)
	if err != nil {
		return err
	}
	defer flush()
	mdl, label, closeModel, err := chooseModel(f, g, skip)
	if err != nil {
		return err
	}
	defer closeModel()
	if label != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), label)
	}
	g.announce = true
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
	agent.Approvals, err = approvalPolicies(f)
	if err != nil {
		return err
	}
	r := &harness.Runner{Model: mdl, ModelName: modelName, Log: g.logger(), TracerProvider: g.tracer}
	cfg := harness.RunConfig{MaxTurns: f.maxTurns, Sandbox: sc}
	p := &printer{w: out, json: f.json}
	var stream *harness.Stream
	if resumed != nil {
		sc.TrustedManifest = m
		stream = r.ResumeStreamed(ctx, agent, resumed, cfg)
	} else {
		stream = r.RunStreamed(ctx, agent, task, cfg)
	}
	var res *harness.Result
	var runErr error
	for {
		for ev := range stream.Events() {
			p.event(ev)
		}
		res, runErr = stream.Wait()
		if runErr != nil || res == nil || len(res.Interruptions) == 0 {
			break
		}
		if !f.interactive {
			path, err := saveRunState(g, res.State)
			if err != nil {
				return err
			}
			p.endText()
			fmt.Fprintf(cmd.ErrOrStderr(), "\nThe run stopped: %d tool call(s) need approval:\n", len(res.Interruptions))
			for _, pc := range res.Interruptions {
				fmt.Fprintf(cmd.ErrOrStderr(), "  %s  %s\n", pc.Call.ID, describeCall(&pc.Call))
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "Resume with: harness run --resume %s [--approve ID | --reject ID=reason | --approve-all] (and the same --manifest)\n", path)
			return exitError{code: 3}
		}
		if err := askDecisions(cmd, res.State); err != nil {
			return err
		}
		stream = r.ResumeStreamed(ctx, agent, res.State, cfg)
	}
	if f.keep && res != nil && res.SessionState != nil {
		st := res.SessionState
		path, err := saveState(g, st)
		if err == nil {
			err = saveSettings(g, st.SessionID, st.Provider)
		}
		if err == nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "sandbox kept: %s (state in %s), with its workspace snapshot %s in %s; `harness%s sandbox rm %s` removes both\n",
				st.SessionID, path, snapshotOf(st), storeName(g), storeArgs(g), st.SessionID)
		} else {
			runErr = errors.Join(runErr, err)
		}
	} else if res != nil && res.SessionState != nil {
		finishSnapshot(cmd, g, res.SessionState, f.keepSnapshot)
	}
	if runErr != nil {
		return runErr
	}
	p.final(res)
	return nil
}

// chooseModel returns the OpenAI model, or a replay of a recording with a
// label saying so.
func chooseModel(f *runFlags, g *globals, skipTurns int) (model.Model, string, func(), error) {
	rec := f.replay
	label := ""
	if rec == "" && f.replayWithoutKey != "" && os.Getenv("OPENAI_API_KEY") == "" {
		rec = f.replayWithoutKey
		label = "OPENAI_API_KEY is not set: "
	}
	if rec != "" {
		m, closeModel, err := replayModel(g, rec, func(turns []replay.Turn) (*replay.Server, error) {
			if skipTurns > len(turns) {
				return nil, fmt.Errorf("the recording %s has %d turns; the resumed run already made %d", rec, len(turns), skipTurns)
			}
			// A resumed run continues the recording where the run stopped.
			return replay.NewServer(turns[skipTurns:]...), nil
		})
		if err != nil {
			return nil, "", nil, err
		}
		label += fmt.Sprintf("[REPLAY] replaying the recorded model session %s (no model is called); the sandbox, tools and commands are real.", rec)
		return m, label, closeModel, nil
	}
	if os.Getenv("OPENAI_API_KEY") == "" {
		return nil, "", nil, errors.New("no OpenAI API key: set OPENAI_API_KEY, or pass --replay FILE to replay a recorded session")
	}
	m, err := model.NewOpenAI(model.Config{Logger: g.logger()})
	if err != nil {
		return nil, "", nil, fmt.Errorf("%w (set OPENAI_API_KEY, or pass --replay FILE to replay a recorded session)", err)
	}
	return m, "", func() {}, nil
}

// replayModel is a model answering from the recording at path (no model is
// called): script serves the recording's turns (`harness run` queues them,
// `harness serve` replays them from the start for every run); the returned
// func closes its server.
func replayModel(g *globals, path string, script func(turns []replay.Turn) (*replay.Server, error)) (model.Model, func(), error) {
	r, err := replay.LoadRecording(path)
	if err != nil {
		return nil, nil, err
	}
	srv, err := script(r.ScriptTurns())
	if err != nil {
		return nil, nil, err
	}
	m, err := model.NewOpenAI(model.Config{APIKey: "replay", BaseURL: srv.URL(), Logger: g.logger(), Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	return m, srv.Close, nil
}

// printer shows run events.
type printer struct {
	w      io.Writer
	json   bool
	inText bool
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
		_, err := s.Agent().Archive(ctx, compute.ArchiveOptions{Compression: compute.CompressionNone}, pw)
		pw.CloseWithError(err)
	}()
	_, err := archive.Restore(ctx, dir, pr, archive.RestoreOptions{})
	pr.CloseWithError(err)
	if err != nil {
		return fmt.Errorf("export workspace: %w", err)
	}
	return nil
}

// finishSnapshot deals with the snapshot of the workspace the run's
// sandbox took when it was closed (and then deleted): it deletes it, or with
// keep says where it is and how to remove it. A failed delete is a warning:
// the run's work is done.
func finishSnapshot(cmd *cobra.Command, g *globals, st *compute.State, keep bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), time.Minute)
	defer cancel()
	id := snapshotOf(st)
	warn := func(err error) {
		fmt.Fprintf(cmd.ErrOrStderr(), "harness: WARNING: the run's workspace snapshot %s stays in %s: %s; `harness%s sandbox snapshot rm %s` removes it\n",
			id, storeName(g), oneLine(err.Error()), storeArgs(g), id)
	}
	store, err := g.snapshots()
	if err != nil {
		warn(err)
		return
	}
	switch ok, err := store.Exists(ctx, id); {
	case err != nil:
		warn(err)
		return
	case !ok:
		return // the sandbox was closed before anything was persisted
	}
	if keep {
		fmt.Fprintf(cmd.ErrOrStderr(), "workspace snapshot kept: %s in %s; `harness%s sandbox create --id %s` starts a sandbox from it, `harness%s sandbox snapshot rm %s` removes it\n",
			id, storeName(g), storeArgs(g), id, storeArgs(g), id)
		return
	}
	if err := store.Delete(ctx, id); err != nil {
		warn(err)
	}
}

// storeName says where the snapshot store is: --snapshot-store, or the
// state directory's snapshots/.
func storeName(g *globals) string {
	if g.storeFlags.store != "" {
		return g.storeFlags.store
	}
	if dir, err := g.dir("snapshots"); err == nil {
		return dir
	}
	return "the state directory's snapshots/"
}

// storeArgs are the global flags a later command needs to find the same
// snapshot store and session states (with a leading space), or "".
func storeArgs(g *globals) string {
	var b strings.Builder
	if g.stateDir != "" && g.stateDir != os.Getenv(stateDirEnv) {
		fmt.Fprintf(&b, " --state-dir %s", shellQuote(g.stateDir))
	}
	if g.storeFlags.store != "" {
		fmt.Fprintf(&b, " --snapshot-store %s", shellQuote(g.storeFlags.store))
		if g.storeFlags.s3Endpoint != "" {
			fmt.Fprintf(&b, " --s3-endpoint %s", shellQuote(g.storeFlags.s3Endpoint))
		}
	}
	return b.String()
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@%+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
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

// approvalPolicies builds the agent's approval policies from the flags.
func approvalPolicies(f *runFlags) (map[string]harness.ApprovalPolicy, error) {
	out := map[string]harness.ApprovalPolicy{}
	for _, name := range f.approvalFor {
		out[name] = harness.AlwaysApprove()
	}
	if len(f.allowCommands) > 0 {
		var res []*regexp.Regexp
		for _, s := range f.allowCommands {
			re, err := regexp.Compile(s)
			if err != nil {
				return nil, fmt.Errorf("--allow-command %q: %w", s, err)
			}
			res = append(res, re)
		}
		if _, always := out["exec_command"]; !always {
			out["exec_command"] = harness.CommandsOutside(res...)
		}
	}
	return out, nil
}

// applyDecisionFlags records --approve, --reject and --approve-all.
func applyDecisionFlags(f *runFlags, st *harness.RunState) error {
	for _, id := range f.approve {
		if err := st.Approve(id); err != nil {
			return err
		}
	}
	for _, r := range f.reject {
		id, msg, _ := strings.Cut(r, "=")
		if err := st.Reject(id, msg); err != nil {
			return err
		}
	}
	if f.approveAll {
		for _, p := range st.Undecided() {
			if err := st.Approve(p.Call.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// askDecisions asks on the command's input for each undecided call:
// y approves, anything else rejects (a longer answer is the message the
// model sees).
func askDecisions(cmd *cobra.Command, st *harness.RunState) error {
	in := bufio.NewReader(cmd.InOrStdin())
	for _, p := range st.Undecided() {
		fmt.Fprintf(cmd.ErrOrStderr(), "\nApprove %s? [y/N or a reason to refuse] ", describeCall(&p.Call))
		line, err := in.ReadString('\n')
		if err != nil && line == "" {
			return fmt.Errorf("approval of %s: no answer (%v)", p.Call.ID, err)
		}
		switch ans := strings.TrimSpace(line); strings.ToLower(ans) {
		case "y", "yes":
			_ = st.Approve(p.Call.ID)
		case "", "n", "no":
			_ = st.Reject(p.Call.ID, "")
		default:
			_ = st.Reject(p.Call.ID, ans)
		}
	}
	return nil
}

// saveRunState writes a stopped run's state under the state directory.
func saveRunState(g *globals, st *harness.RunState) (string, error) {
	dir, err := g.dir("runs")
	if err != nil {
		return "", err
	}
	data, err := st.Encode()
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, "run-*.json")
	if err != nil {
		return "", fmt.Errorf("save run state: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return "", fmt.Errorf("save run state: %w", err)
	}
	return f.Name(), f.Close()
}
