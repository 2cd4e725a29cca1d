package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/browser"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/console"
)

// hang bounds one wait in the browser: it only keeps a broken page from
// hanging the test binary; no passing run comes near it.
const hang = 2 * time.Minute

// page is a browser tab on a console served at base.
type page struct {
	t    *testing.T
	tab  *browser.Tab
	base string // http://127.0.0.1:PORT/console/
}

func (p *page) do(actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab.Ctx, hang)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("browser: %v\npage: %s", err, p.shown())
	}
}

// open loads the console at a hash route, as a fresh document.
func (p *page) open(route string) {
	p.t.Helper()
	p.do(chromedp.Navigate(p.base + route))
}

// route changes the hash route inside the loaded document.
func (p *page) route(route string) {
	p.t.Helper()
	p.eval(fmt.Sprintf("location.hash = %q", route))
}

// waitFor waits until the JavaScript expression is truthy.
func (p *page) waitFor(what, expr string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.tab.Ctx, hang)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(hang), chromedp.WithPollingMutation())); err != nil {
		if errors.Is(err, chromedp.ErrPollingTimeout) || errors.Is(err, context.DeadlineExceeded) {
			p.t.Fatalf("waiting for %s (%s): gave up after %s\npage: %s", what, expr, hang, p.shown())
		}
		p.t.Fatalf("waiting for %s: %v", what, err)
	}
}

func (p *page) eval(expr string) {
	p.t.Helper()
	p.do(chromedp.Evaluate[chromedp.Void](expr))
}

func (p *page) bool(expr string) bool {
	p.t.Helper()
	v, err := chromedp.Run(p.tab.Ctx, chromedp.Evaluate[bool](expr))
	if err != nil {
		p.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// text is the textContent of the first element matching sel ("" if none).
func (p *page) text(sel string) string {
	v, err := chromedp.Run(p.tab.Ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel)))
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return v
}

// shown is the text the page shows (for failure messages), clipped.
func (p *page) shown() string {
	v, err := chromedp.Run(p.tab.Ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(v) > 4000 {
		v = v[:4000] + "..."
	}
	return v
}

// present waits until every selector matches an element.
func (p *page) present(sels ...string) {
	p.t.Helper()
	for _, s := range sels {
		p.waitFor(s, fmt.Sprintf("document.querySelector(%q)", s))
	}
}

// TestConsolePagesAgainstFakeService drives every page of the console in
// headless Chromium against an in-test fake of the service's JSON API:
// sign-in, the runs list, a run's timeline (with markup in the agent's
// output shown as text), approving a call from the browser, the sandboxes,
// the file browser with a download, and the terminal (typing into xterm.js
// over the WebSocket). Each page is screenshotted.
func TestConsolePagesAgainstFakeService(t *testing.T) {
	const token = "t0ken-for-the-console"
	fake := newFakeService(token)
	srv := fake.start(t)
	b := browser.Start(t)
	p := &page{t: t, tab: b.NewTab(t), base: srv.URL + console.MountPath}
	// Each step goes on from the page the one before left; the first
	// failure ends the test.
	ok := true
	step := func(name string, f func(t *testing.T)) {
		ok = ok && t.Run(name, func(t *testing.T) {
			p.t = t
			f(t)
		})
	}

	step("SignIn", func(t *testing.T) {
		p.open("#/runs")
		p.present("#token-form", "label[for=token]", "#token")
		p.tab.Screenshot(t, "signin")
		p.do(chromedp.SendKeys("#token", token), chromedp.Click(`#token-form button[type=submit]`))
		p.present("#runs-table")
		if got := p.text("#alert"); got != "" {
			t.Fatalf("alert after sign-in: %q", got)
		}
	})

	step("Runs", func(t *testing.T) {
		p.route("#/runs")
		p.present(`#runs-table tr[data-run-id="run-1"]`, `#runs-table tr[data-run-id="run-2"]`, "#status-filter", `#nav-runs[aria-current=page]`)
		if got := p.text(`#runs-table tr[data-run-id="run-1"]`); !strings.Contains(got, "waiting approval") || !strings.Contains(got, "1 waiting") {
			t.Errorf("run-1 row = %q, want its status and its waiting approval", got)
		}
		if got := p.text(`#runs-table tr[data-run-id="run-2"]`); !strings.Contains(got, "<b>hello</b>") {
			t.Errorf("run-2 row = %q, want its input as text", got)
		}
		p.tab.Screenshot(t, "runs")
	})

	step("TimelineEscapesAgentOutput", func(t *testing.T) {
		p.route("#/runs/run-2")
		p.present(`#timeline li[data-kind=run_finished]`, "#run-summary", "#final-output")
		timeline := p.text("#timeline")
		for _, want := range []string{xssOutput, "<script>window.__xss = 3</script>", "done: <i>not italic</i>"} {
			if !strings.Contains(timeline, want) {
				t.Errorf("timeline text lacks %q:\n%s", want, timeline)
			}
		}
		if p.bool(`document.querySelectorAll("#view script, #view img, #view b, #view i").length !== 0`) {
			t.Error("agent output became elements in the page")
		}
		if p.bool(`window.__xss !== undefined`) {
			t.Error("agent output ran as script")
		}
		// The fake broke the first stream after three events: the page
		// resumed after them and shows every event once.
		fake.mu.Lock()
		resumed := slices.Clone(fake.resumed)
		fake.mu.Unlock()
		if !slices.Equal(resumed, []int{3}) {
			t.Errorf("event streams resumed after %v, want [3]", resumed)
		}
		if p.bool(`document.querySelectorAll("#timeline li[data-kind=tool_call]").length !== 1 || document.querySelectorAll("#timeline li[data-seq]").length !== 4`) {
			t.Errorf("timeline after a resumed stream:\n%s", timeline)
		}
		p.tab.Screenshot(t, "run-xss")
	})

	step("ApproveFromBrowser", func(t *testing.T) {
		p.route("#/runs/run-1")
		p.present(`#timeline li[data-kind=approval_requested]`, `.approval[data-call-id="call-1"] button.approve`,
			`#timeline li[data-call-id="call-0"] pre.output`)
		if got := p.text(`#timeline li[data-kind=model_text]`); !strings.Contains(got, "Let me clean the build.") {
			t.Errorf("model text = %q, want the deltas joined", got)
		}
		p.tab.Screenshot(t, "run-waiting")
		p.do(chromedp.Click(`.approval[data-call-id="call-1"] button.approve`))
		p.present(`#timeline li[data-kind=approval_decided]`, `#timeline li[data-kind=run_finished]`)
		p.waitFor("the run shown succeeded", `document.querySelector("#run-status").textContent === "succeeded"`)
		if got := p.text("#approvals"); !strings.Contains(got, "Nothing waits") {
			t.Errorf("approvals after the decision = %q", got)
		}
		fake.mu.Lock()
		approvals := slices.Clone(fake.approvals)
		fake.mu.Unlock()
		if !slices.Equal(approvals, []string{"call-1=true"}) {
			t.Errorf("ApproveToolCall calls = %q, want one approval of call-1", approvals)
		}
		p.tab.Screenshot(t, "run-approved")
	})

	step("Sandboxes", func(t *testing.T) {
		p.route("#/sandboxes")
		p.present(`#sandboxes-table tr[data-sandbox-id="sb-1"]`, `#sandboxes-table tr[data-sandbox-id="sb-2"]`, `#nav-sandboxes[aria-current=page]`)
		row := p.text(`#sandboxes-table tr[data-sandbox-id="sb-2"]`)
		for _, want := range []string{"docker", "stopped", "2h 0m ago", "left"} {
			if !strings.Contains(row, want) {
				t.Errorf("sb-2 row = %q, want %q in it", row, want)
			}
		}
		p.tab.Screenshot(t, "sandboxes")
	})

	step("Files", func(t *testing.T) {
		p.route("#/sandboxes/sb-1/files/")
		p.present(`#files-table tr[data-path="src"] a`, `#files-table tr[data-path="<b>odd name</b>.txt"]`)
		p.do(chromedp.Click(`#files-table tr[data-path="src"] a`))
		p.present(`#files-table tr[data-path="src/notes.txt"] button.download`, `nav.crumbs a`)
		p.tab.Screenshot(t, "files")
		p.do(chromedp.Click(`#files-table tr[data-path="src/notes.txt"] button.download`))
		p.waitFor("the download announced", `document.querySelector("#status").textContent.startsWith("Downloaded src/notes.txt")`)
		fake.mu.Lock()
		downloads := slices.Clone(fake.downloads)
		fake.mu.Unlock()
		if !slices.Equal(downloads, []string{"src/notes.txt"}) {
			t.Errorf("downloads = %q", downloads)
		}
	})

	step("Terminal", func(t *testing.T) {
		p.route("#/sandboxes/sb-1/terminal")
		p.present("#terminal .xterm", "#terminal-state")
		p.waitFor("the terminal connected", `document.querySelector("#terminal-state").textContent === "connected"`)
		p.waitFor("the shell's prompt", `document.querySelector("#terminal .xterm-rows").textContent.includes("fake shell ready")`)
		p.do(chromedp.SendKeys("#terminal .xterm-helper-textarea", "ls -l\r"))
		p.waitFor("the echo of what was typed", `document.querySelector("#terminal .xterm-rows").textContent.includes("echo:")`)
		p.tab.Screenshot(t, "terminal")
		p.do(chromedp.SendKeys("#terminal .xterm-helper-textarea", "exit\r"))
		p.waitFor("the exit shown", `document.querySelector("#terminal-state").textContent === "exited with code 3"`)
		p.present("#terminal-reconnect:not([hidden])")
	})

	step("StartRunForm", func(t *testing.T) {
		p.route("#/runs")
		p.present("#new-run-link")
		p.do(chromedp.Click("#new-run-link"))
		p.present("#new-run-form", "label[for=new-agent]", "label[for=new-instructions]", "label[for=new-model]",
			"label[for=new-input]", "label[for=new-manifest]", "label[for=new-approve-shell]", "#new-approve-shell:checked")
		p.do(
			chromedp.SendKeys("#new-agent", "fixer"),
			chromedp.SendKeys("#new-model", "gpt-form"),
			chromedp.SendKeys("#new-instructions", "Be brief."),
			chromedp.SendKeys("#new-input", "Fix <the> tests"),
			chromedp.SendKeys("#new-manifest", "entries:\n  host: {type: local_dir, src: /etc}\n"),
		)
		p.tab.Screenshot(t, "new-run")
		// The service refuses the manifest: the error shows, the form stays.
		p.do(chromedp.Click("#new-submit"))
		p.waitFor("the refusal shown", `document.querySelector("#alert").textContent.includes("host sources are not allowed")`)
		if !p.bool(`location.hash === "#/runs/new" && !document.querySelector("#new-submit").disabled`) {
			t.Errorf("after a refused start the page is %q", p.shown())
		}
		// A manifest the service takes, and shell commands without approval.
		p.eval(`document.querySelector("#new-manifest").value = ""`)
		p.do(
			chromedp.SendKeys("#new-manifest", "entries:\n  notes.txt: {type: file, content: hi}\n"),
			chromedp.Click("#new-approve-shell"),
			chromedp.Click("#new-submit"),
		)
		p.waitFor("the new run shown", `location.hash === "#/runs/run-new-1" && document.querySelector("#run-summary") !== null`)
		p.present(`#timeline li[data-kind=turn_started]`)
		fake.mu.Lock()
		starts := slices.Clone(fake.starts)
		fake.mu.Unlock()
		if len(starts) != 1 {
			t.Fatalf("StartRun calls that started a run: %v", starts)
		}
		got, _ := json.Marshal(starts[0])
		want := `{"agent":{"instructions":"Be brief.","model":"gpt-form","name":"fixer"},"input":"Fix \u003cthe\u003e tests","manifest":"entries:\n  notes.txt: {type: file, content: hi}\n"}`
		if string(got) != want {
			t.Errorf("StartRun request =\n%s\nwant\n%s", got, want)
		}
		p.tab.Screenshot(t, "new-run-started")
	})

	step("StartRunRequiresApprovalByDefault", func(t *testing.T) {
		p.route("#/runs/new")
		p.present("#new-run-form", "#new-approve-shell:checked")
		p.do(chromedp.SendKeys("#new-input", "List files"), chromedp.Click("#new-submit"))
		p.waitFor("the new run shown", `location.hash === "#/runs/run-new-2"`)
		fake.mu.Lock()
		starts := slices.Clone(fake.starts)
		fake.mu.Unlock()
		got, _ := json.Marshal(starts[len(starts)-1])
		if want := `{"agent":{},"approvals":{"requireApproval":["exec_command"]},"input":"List files"}`; string(got) != want {
			t.Errorf("StartRun request = %s, want %s", got, want)
		}
	})

	step("BadTokenShowsSignIn", func(t *testing.T) {
		p.eval(`sessionStorage.setItem("bulkhead.token", "wrong")`)
		p.open("#/runs")
		p.present("#token-form")
		p.waitFor("the refusal said", `document.querySelector("#view").innerText.includes("refused the token")`)
		// Going elsewhere before signing in again keeps the reason (it
		// was lost when a refused call and a navigation crossed).
		p.route("#/runs/new")
		p.present("#token-form")
		if got := p.text("#view"); !strings.Contains(got, "refused the token") {
			t.Errorf("sign-in page after a bad token and a navigation = %q", got)
		}
	})

	if ex := p.tab.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions in the console's pages:\n%s", strings.Join(ex, "\n"))
	}
}
