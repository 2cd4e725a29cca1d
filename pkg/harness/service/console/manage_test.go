package console_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/browser"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/console"
)

// signedIn opens the console at route in a new tab of a new browser and
// signs in with token.
func signedIn(t *testing.T, base, token, route string) *page {
	t.Helper()
	b := browser.Start(t)
	p := &page{t: t, tab: b.NewTab(t), base: base + console.MountPath}
	p.open(route)
	p.present("#token-form")
	p.do(chromedp.SendKeys("#token", token), chromedp.Click(`#token-form button[type=submit]`))
	return p
}

// sandboxCalls is what the fake was asked to do with sandboxes so far.
func (f *fakeService) sandboxCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// TestConsoleManagesSandboxes drives the sandbox buttons in headless
// Chromium against the fake service: New sandbox, its terminal, Pause and
// Resume (the status and the buttons follow), Fork (and a fork the quota
// refuses, its message shown in the row), Snapshot and the snapshots list
// with Delete, exposing a port (a refused one, then one with its preview
// link) and revoking it, and Delete with its confirmation (from the list
// and from a sandbox's page).
func TestConsoleManagesSandboxes(t *testing.T) {
	const token = "t0ken-for-sandboxes"
	fake := newFakeService(token)
	srv := fake.start(t)
	p := signedIn(t, srv.URL, token, "#/sandboxes")
	row := func(id string) string { return `#sandboxes-table tr[data-sandbox-id="` + id + `"]` }
	const sb = "sb-new-1"
	ok := true
	step := func(name string, f func(t *testing.T)) {
		ok = ok && t.Run(name, func(t *testing.T) { p.t = t; f(t) })
	}

	step("Create", func(t *testing.T) {
		p.present("#new-sandbox", row("sb-1"), "#snapshots-table")
		if p.bool(`document.querySelector('` + row("sb-1") + ` :is([data-action=pause], [data-action=fork], [data-action=snapshot])') !== null`) {
			t.Error("a run's sandbox offers Pause, Fork or Snapshot")
		}
		p.do(chromedp.Click("#new-sandbox"))
		p.present(row(sb) + " [data-action=pause]")
		p.waitFor("the creation announced", `document.querySelector("#status").textContent === "Created sandbox `+sb+`"`)
		if got := p.text(row(sb)); !strings.Contains(got, "running") || !strings.Contains(got, "local") {
			t.Errorf("new sandbox row = %q", got)
		}
		p.tab.Screenshot(t, "sandbox-created")
	})

	step("Terminal", func(t *testing.T) {
		p.do(chromedp.Click(row(sb) + ` a[href$="/terminal"]`))
		p.waitFor("the terminal connected", `document.querySelector("#terminal-state").textContent === "connected"`)
		p.do(chromedp.SendKeys("#terminal .xterm-helper-textarea", "uname\r"))
		p.waitFor("the echo of the command", `document.querySelector("#terminal .xterm-rows").textContent.includes("echo:")`)
		p.route("#/sandboxes")
		p.present(row(sb) + " [data-action=pause]")
	})

	step("PauseResume", func(t *testing.T) {
		p.do(chromedp.Click(row(sb) + " [data-action=pause]"))
		p.present(row(sb) + " [data-action=resume]")
		if got := p.text(row(sb) + " .status"); got != "paused" {
			t.Errorf("status after Pause = %q", got)
		}
		if p.bool(`document.querySelector('` + row(sb) + ` [data-action=fork], ` + row(sb) + ` a[href$="/terminal"]') !== null`) {
			t.Error("a paused sandbox offers Fork or its terminal")
		}
		p.tab.Screenshot(t, "sandbox-paused")
		p.do(chromedp.Click(row(sb) + " [data-action=resume]"))
		p.present(row(sb) + " [data-action=pause]")
		p.waitFor("running again", `document.querySelector('`+row(sb)+` .status').textContent === "running"`)
	})

	step("ForkAndQuota", func(t *testing.T) {
		p.do(chromedp.Click(row(sb) + " [data-action=fork]"))
		p.present(row("sb-new-4"))
		// A second fork exceeds the fake's quota: the service's message
		// shows in the row, and stays across the timed refresh.
		p.do(chromedp.Click(row(sb) + " [data-action=fork]"))
		p.waitFor("the refusal in the row", `document.querySelector('`+row(sb)+` .inline-error').textContent === "sandbox quota: 4 of 4 sandboxes in use"`)
		if got := p.text("#alert"); got != "" {
			t.Errorf("page alert = %q, want the refusal in the row only", got)
		}
	})

	step("Snapshots", func(t *testing.T) {
		p.do(chromedp.Click(row(sb) + " [data-action=snapshot]"))
		p.present(`#snapshots-table tr[data-snapshot-id="snap-6"]`)
		if got := p.text(`#snapshots-table tr[data-snapshot-id="snap-6"]`); !strings.Contains(got, sb) || !strings.Contains(got, "2.0 KiB") {
			t.Errorf("snapshot row = %q", got)
		}
		p.do(chromedp.Click(`#snapshots-table tr[data-snapshot-id="snap-6"] [data-action=delete]`))
		p.do(chromedp.Click(`#snapshots-table tr[data-snapshot-id="snap-6"] [data-action=confirm]`))
		p.waitFor("the snapshot gone", `document.querySelector('#snapshots-table').textContent.includes("No snapshots.")`)
	})

	step("Ports", func(t *testing.T) {
		p.do(chromedp.Click(row(sb) + ` a[href="#/sandboxes/` + sb + `"]`))
		p.present("#expose-form", "label[for=expose-port]", "#sandbox-status", "#ports-table")
		p.do(chromedp.SendKeys("#expose-port", "22"), chromedp.Click("#expose-submit"))
		p.waitFor("the refusal", `document.querySelector("#ports-error").textContent === "port 22: the operator does not allow exposing it"`)
		p.eval(`document.querySelector("#expose-port").value = ""`)
		p.do(chromedp.SendKeys("#expose-port", "8080"), chromedp.Click("#expose-submit"))
		link := `#ports-table tr[data-port="8080"] a.preview`
		p.present(link)
		if got := p.text("#ports-error"); got != "" {
			t.Errorf("ports error after a good expose = %q", got)
		}
		want := srv.URL + "/v1/preview/tok-" + sb + "-8080/"
		if !p.bool(`(() => { const a = document.querySelector('` + link + `'); return a.href === "` + want +
			`" && a.target === "_blank" && a.relList.contains("noopener") && a.textContent === a.href; })()`) {
			t.Errorf("preview link: %q, want %s in a new tab without an opener", p.text(link), want)
		}
		p.tab.Screenshot(t, "sandbox-ports")
		p.do(chromedp.Click(`#ports-table tr[data-port="8080"] [data-action=revoke]`))
		p.waitFor("the port gone", `document.querySelector("#ports-table").textContent.includes("No exposed ports.")`)
	})

	step("Delete", func(t *testing.T) {
		p.route("#/sandboxes")
		p.present(row(sb) + " [data-action=delete]")
		p.do(chromedp.Click(row(sb) + " [data-action=delete]"))
		p.present(row(sb) + " [data-action=cancel]")
		p.do(chromedp.Click(row(sb) + " [data-action=cancel]"))
		p.present(row(sb) + " [data-action=delete]")
		p.do(chromedp.Click(row(sb) + " [data-action=delete]"))
		p.do(chromedp.Click(row(sb) + " [data-action=confirm]"))
		p.waitFor("the sandbox gone", `document.querySelector('`+row(sb)+`') === null && document.querySelector('`+row("sb-new-4")+`') !== null`)
		// Deleting from a sandbox's own page goes back to the list.
		p.route("#/sandboxes/sb-new-4")
		p.present("#sandbox-actions [data-action=delete]")
		p.do(chromedp.Click("#sandbox-actions [data-action=delete]"), chromedp.Click("#sandbox-actions [data-action=confirm]"))
		p.waitFor("the list without the fork", `location.hash === "#/sandboxes" && document.querySelector('`+row("sb-1")+`') !== null && document.querySelector('`+row("sb-new-4")+`') === null`)
		want := []string{"CreateSandbox", "PauseSandbox " + sb, "ResumeSandbox " + sb, "ForkSandbox " + sb, "ForkSandbox " + sb,
			"SnapshotSandbox " + sb, "DeleteSnapshot snap-6", "ExposePort " + sb, "ExposePort " + sb, "RevokePort " + sb, "DeleteSandbox " + sb,
			"DeleteSandbox sb-new-4"}
		if got := fake.sandboxCalls(); !slices.Equal(got, want) {
			t.Errorf("sandbox calls:\n%q\nwant\n%q", got, want)
		}
	})

	if ex := p.tab.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions in the console's pages:\n%s", strings.Join(ex, "\n"))
	}
}

// TestConsoleShowsPatchAsDiff: apply_patch calls in a run's timeline are
// coloured diffs (file and hunk headers, added and removed lines), in both
// the patch text and the JSON operations form, and a patch carrying markup
// (`+<img src=x onerror=alert(1)>`) shows it as text: no element is made
// from it and nothing runs.
func TestConsoleShowsPatchAsDiff(t *testing.T) {
	const token = "t0ken-for-diffs"
	fake := newFakeService(token)
	srv := fake.start(t)
	p := signedIn(t, srv.URL, token, "#/runs/run-3")
	p.present(`#timeline li[data-kind=run_finished]`, `li[data-call-id="p-1"] pre.input.diff`, `li[data-call-id="p-2"] pre.input.diff`)
	lines := func(call, class string) string {
		return strings.Join(evalStrings(p,
			`[...document.querySelectorAll('li[data-call-id="`+call+`"] pre.diff > span.`+class+`')].map((e) => e.textContent)`), "\n")
	}
	cases := []struct{ call, class, want string }{
		{"p-1", "diff-file", "*** Begin Patch\n*** Update File: web/index.html\n*** Add File: notes.md\n*** End Patch"},
		{"p-1", "diff-hunk", "@@ <body>"},
		{"p-1", "diff-del", "-<p>old</p>"},
		{"p-1", "diff-add", "+<img src=x onerror=alert(1)>\n+<img src=y onerror=\"window.__xss = 4\"><script>window.__xss = 5</script>\n+# Notes"},
		{"p-1", "diff-ctx", " <h1>Hi</h1>"},
		{"p-2", "diff-file", "*** Update File: a.go\n*** Move to: b.go\n*** Delete File: <b>gone</b>.txt"},
		{"p-2", "diff-del", "-\treturn 1"},
		{"p-2", "diff-add", "+\treturn 2"},
	}
	for _, c := range cases {
		if got := lines(c.call, c.class); got != c.want {
			t.Errorf("%s lines %s:\n%s\nwant\n%s\nthe diff:\n%s", c.call, c.class, got, c.want, p.text(`li[data-call-id="`+c.call+`"] pre.diff`))
		}
	}
	if p.bool(`document.querySelectorAll("#view img, #view script, #view b, pre.diff *:not(span), pre.diff span *").length !== 0`) {
		t.Error("the patch's markup became elements in the page")
	}
	if p.bool(`window.__xss !== undefined`) {
		t.Error("the patch ran as script")
	}
	if p.bool(`getComputedStyle(document.querySelector('li[data-call-id="p-1"] .diff-add')).backgroundColor ===
		getComputedStyle(document.querySelector('li[data-call-id="p-1"] .diff-del')).backgroundColor`) {
		t.Error("added and removed lines look the same")
	}
	if got := p.text(`li[data-call-id="p-2"] pre.output`); got != "Updated a.go\nMoved a.go to b.go\nDeleted <b>gone</b>.txt" {
		t.Errorf("apply_patch result = %q", got)
	}
	p.tab.Screenshot(t, "run-diff")
	if ex := p.tab.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions in the console's pages:\n%s", strings.Join(ex, "\n"))
	}
}

// evalStrings evaluates a JavaScript expression giving an array of strings.
func evalStrings(p *page, expr string) []string {
	p.t.Helper()
	v, err := chromedp.Run(p.tab.Ctx, chromedp.Evaluate[[]string](expr))
	if err != nil {
		p.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}
