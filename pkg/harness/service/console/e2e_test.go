package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/browser"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/console"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store/bolt"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
	"github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1/harnessv1connect"
)

func TestMain(m *testing.M) { os.Exit(agentdtest.Run(m)) }

// e2eCommand is what the scripted agent runs: its output carries markup,
// which the timeline must show as text.
const e2eCommand = `echo '<script>window.__xss = 9</script>' && echo console-e2e > out.txt`

// realService starts `harness serve`'s service over real sockets with the
// console mounted, local sandboxes (the daemon built from this checkout)
// and a scripted Responses server, and returns its base URL.
func realService(t *testing.T, token string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bh-console-") // short: unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	script := replay.NewServer()
	t.Cleanup(script.Close)
	script.SetFallback(func(req *replay.Request) replay.Turn {
		if len(req.InputOfType("function_call_output")) == 0 {
			args, _ := json.Marshal(map[string]string{"cmd": e2eCommand})
			return replay.Turn{Items: []replay.Item{replay.Message("Running the command."), replay.FunctionCall("c1", "exec_command", string(args))}}
		}
		return replay.Turn{Items: []replay.Item{replay.Message("All done.")}}
	})
	prov, err := local.New(local.Config{StateDir: filepath.Join(dir, "sandboxes"), AgentdPath: agentdtest.Binaries(t).Agentd, Isolation: local.IsolationNone}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // no sandbox outlives the test
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		infos, _ := prov.List(ctx)
		for _, i := range infos {
			_ = prov.Destroy(ctx, i.State)
		}
		_ = prov.Close()
	})
	snaps, err := snapshot.NewLocal(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(dir, "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	mdl, err := model.NewOpenAI(model.Config{Model: "scripted", APIKey: "sk-unused", BaseURL: script.URL(), Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := auth.ParseTokens([]byte(token+" acme\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(context.Background(), service.Config{Store: st, Compute: compute.NewClient(prov, compute.ClientOptions{Log: log, Snapshots: snaps}),
		Model: mdl, DefaultModel: "scripted", Auth: tokens, Log: log, SandboxRetention: 10 * time.Minute, Console: console.Handler(),
		PreviewKey: []byte(strings.Repeat("preview-key-", 4))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Serve(ctx, ln, svc.Handler(), time.Second) }()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer scancel()
		if err := svc.Shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// bearerTransport adds the token to every request.
type bearerTransport string

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// TestConsoleApprovesARealRun: a run is started through the service's API
// with exec_command needing approval; in the browser the console shows it
// waiting, the approval is clicked, and the timeline shows the command's
// output (markup as text) and the run completed. Then the sandbox's page,
// its files (download) and a live terminal into it work against the real
// service.
func TestConsoleApprovesARealRun(t *testing.T) {
	const token = "tok-console-e2e-0123456789"
	base := realService(t, token)
	runs := harnessv1connect.NewRunServiceClient(&http.Client{Transport: bearerTransport(token)}, base, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	started, err := runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{
		Agent:     &harnessv1.AgentSpec{Name: "worker", Instructions: "Do the task."},
		Manifest:  "entries:\n  notes.md:\n    type: file\n    content: hello\n",
		Approvals: &harnessv1.ApprovalPolicy{RequireApproval: []string{"exec_command"}},
		Input:     "Run the command, then stop.",
	}))
	if err != nil {
		t.Fatalf("start run: %v", err)
	}
	runID := started.Msg.GetRun().GetRunId()

	b := browser.Start(t)
	p := &page{t: t, tab: b.NewTab(t), base: base + console.MountPath}
	p.open("#/runs/" + runID)
	p.present("#token-form")
	p.do(chromedp.SendKeys("#token", token), chromedp.Click(`#token-form button[type=submit]`))
	p.present(`.approval button.approve`, `#timeline li[data-kind=approval_requested]`)
	if got := p.text(".approval"); !strings.Contains(got, "exec_command") || !strings.Contains(got, "console-e2e") {
		t.Errorf("the approval shows %q, want the tool and its command", got)
	}
	p.tab.Screenshot(t, "real-run-waiting")
	p.do(chromedp.Click(`.approval button.approve`))
	p.present(`#timeline li[data-kind=approval_decided]`, `#timeline li[data-kind=run_finished]`)
	p.waitFor("the run shown succeeded", `document.querySelector("#run-status").textContent === "succeeded"`)
	timeline := p.text("#timeline")
	for _, want := range []string{"<script>window.__xss = 9</script>", "All done."} {
		if !strings.Contains(timeline, want) {
			t.Errorf("timeline lacks %q:\n%s", want, timeline)
		}
	}
	if p.bool(`window.__xss !== undefined || document.querySelector("#view script") !== null`) {
		t.Error("the command's output ran as script")
	}
	p.tab.Screenshot(t, "real-run-done")
	got, err := runs.GetRun(ctx, connect.NewRequest(&harnessv1.GetRunRequest{RunId: runID}))
	if err != nil || got.Msg.GetRun().GetStatus() != harnessv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("the service says the run is %v (%v), want succeeded", got.Msg.GetRun().GetStatus(), err)
	}
	sandboxID := got.Msg.GetRun().GetSandboxId()

	p.route("#/sandboxes")
	p.present(`#sandboxes-table tr[data-sandbox-id="` + sandboxID + `"]`)
	p.tab.Screenshot(t, "real-sandboxes")
	if row := p.text(`#sandboxes-table tr[data-sandbox-id="` + sandboxID + `"]`); !strings.Contains(row, "local") {
		t.Errorf("sandbox row = %q, want its provider", row)
	}

	p.route("#/sandboxes/" + sandboxID + "/files/")
	p.present(`#files-table tr[data-path="out.txt"] button.download`, `#files-table tr[data-path="notes.md"]`)
	p.tab.Screenshot(t, "real-files")
	p.do(chromedp.Click(`#files-table tr[data-path="out.txt"] button.download`))
	p.waitFor("the download", `document.querySelector("#status").textContent === "Downloaded out.txt (12 B)"`)

	p.route("#/sandboxes/" + sandboxID + "/terminal")
	p.waitFor("the terminal connected", `document.querySelector("#terminal-state").textContent === "connected"`)
	p.do(chromedp.SendKeys("#terminal .xterm-helper-textarea", "echo term-$((6*7))\r"))
	p.waitFor("the shell's answer", `document.querySelector("#terminal .xterm-rows").textContent.includes("term-42")`)
	p.tab.Screenshot(t, "real-terminal")
	p.do(chromedp.SendKeys("#terminal .xterm-helper-textarea", "exit\r"))
	p.waitFor("the shell's exit", `document.querySelector("#terminal-state").textContent.startsWith("exited")`)

	// A run started from the console's form: it needs approval for its
	// shell command (the form's default), is approved there and completes.
	p.route("#/runs/new")
	p.present("#new-run-form", "#new-approve-shell:checked")
	p.do(
		chromedp.SendKeys("#new-agent", "form-agent"),
		chromedp.SendKeys("#new-input", "Run the command from the form."),
		chromedp.SendKeys("#new-manifest", "entries:\n  form.md: {type: file, content: from the form}\n"),
		chromedp.Click("#new-submit"),
	)
	p.waitFor("the started run shown", `location.hash.startsWith("#/runs/run-") && document.querySelector(".approval button.approve") !== null`)
	formRun := p.text("#run-summary")
	p.tab.Screenshot(t, "real-form-run-waiting")
	p.do(chromedp.Click(`.approval button.approve`))
	p.waitFor("the form's run succeeded", `document.querySelector("#run-status").textContent === "succeeded"`)
	list, err := runs.ListRuns(ctx, connect.NewRequest(&harnessv1.ListRunsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var fromForm *harnessv1.Run
	for _, r := range list.Msg.GetRuns() {
		if r.GetRunId() != runID {
			fromForm = r
		}
	}
	if fromForm == nil || fromForm.GetAgent() != "form-agent" || fromForm.GetInput() != "Run the command from the form." ||
		fromForm.GetStatus() != harnessv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Errorf("the run started from the form: %v (summary shows %q)", fromForm, formRun)
	}

	if ex := p.tab.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions in the console's pages:\n%s", strings.Join(ex, "\n"))
	}
}

// TestConsoleManagesARealSandbox drives the sandbox buttons against the
// real service with local sandboxes: New sandbox, a command in its
// terminal (which also starts a web server in it), Pause and Resume, the
// server's port exposed and its preview link answering, Delete.
func TestConsoleManagesARealSandbox(t *testing.T) {
	const token = "tok-console-sandbox-0123456789"
	base := realService(t, token)
	p := signedIn(t, base, token, "#/sandboxes")
	p.present("#new-sandbox")
	p.do(chromedp.Click("#new-sandbox"))
	p.waitFor("the sandbox created", `document.querySelector("#status").textContent.startsWith("Created sandbox ")`)
	id := strings.TrimPrefix(p.text("#status"), "Created sandbox ")
	row := `#sandboxes-table tr[data-sandbox-id="` + id + `"]`
	p.present(row + " [data-action=pause]")
	p.tab.Screenshot(t, "real-sandbox-created")

	p.route("#/sandboxes/" + id + "/terminal")
	p.waitFor("the terminal connected", `document.querySelector("#terminal-state").textContent === "connected"`)
	p.do(chromedp.SendKeys("#terminal .xterm-helper-textarea", "echo made-$((6*7)) > index.html && cat index.html\r"))
	p.waitFor("the shell's answer", `document.querySelector("#terminal .xterm-rows").textContent.includes("made-42")`)

	p.route("#/sandboxes")
	p.present(row + " [data-action=pause]")
	p.do(chromedp.Click(row + " [data-action=pause]"))
	p.present(row + " [data-action=resume]")
	if got := p.text(row + " .status"); got != "paused" {
		t.Errorf("status after Pause = %q", got)
	}
	p.do(chromedp.Click(row + " [data-action=resume]"))
	p.present(row + " [data-action=pause]")
	if got := p.text(row + " .status"); got != "running" {
		t.Errorf("status after Resume = %q", got)
	}

	// A web server in the sandbox (a local one runs this host's python3),
	// in a session of its own so that it outlives the terminal.
	_, noPython := exec.LookPath("python3")
	if noPython == nil {
		p.route("#/sandboxes/" + id + "/terminal")
		p.waitFor("the terminal connected", `document.querySelector("#terminal-state").textContent === "connected"`)
		p.do(chromedp.SendKeys("#terminal .xterm-helper-textarea",
			"setsid nohup python3 -m http.server 18431 --bind 127.0.0.1 >/dev/null 2>&1 < /dev/null & sleep 1; echo serving\r"))
		p.waitFor("the server started", `document.querySelector("#terminal .xterm-rows").textContent.includes("serving")`)
	}
	p.route("#/sandboxes/" + id)
	p.present("#expose-form")
	p.do(chromedp.SendKeys("#expose-port", "18431"), chromedp.Click("#expose-submit"))
	link := `#ports-table tr[data-port="18431"] a.preview`
	p.present(link)
	href := p.text(link)
	if !strings.HasPrefix(href, base+"/v1/preview/") || !p.bool(`document.querySelector('`+link+`').relList.contains("noopener")`) {
		t.Errorf("preview link %q, want one below %s/v1/preview/ opening without an opener", href, base)
	}
	p.tab.Screenshot(t, "real-sandbox-port")
	if noPython == nil {
		body := ""
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !strings.Contains(body, "made-42"); time.Sleep(200 * time.Millisecond) {
			if res, err := http.Get(href + "index.html"); err == nil {
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				body = string(b)
			}
		}
		if !strings.Contains(body, "made-42") {
			t.Errorf("the preview answered %q, want the sandbox's index.html", body)
		}
	} else {
		t.Log("no python3 here: the preview link is not followed")
	}

	p.route("#/sandboxes")
	p.present(row + " [data-action=delete]")
	p.do(chromedp.Click(row+" [data-action=delete]"), chromedp.Click(row+" [data-action=confirm]"))
	p.waitFor("the sandbox gone", `document.querySelector('`+row+`') === null && document.querySelector("#status").textContent === "Deleted `+id+`"`)
	if ex := p.tab.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions in the console's pages:\n%s", strings.Join(ex, "\n"))
	}
}
