package browser

import (
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserLoadsAPageAndScreenshotsIt starts Chromium, loads a page from
// a loopback server, reads an element and takes a screenshot. It logs how
// long Chromium took to start.
func TestBrowserLoadsAPageAndScreenshotsIt(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>t</title><h1 id="h">hello</h1>` +
			`<script>throw new Error("boom")</script>`))
	}))
	defer srv.Close()
	b := Start(t)
	tab := b.NewTab(t)
	if err := chromedp.Do(tab.Ctx, chromedp.Navigate(srv.URL), chromedp.WaitVisible("#h")); err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(tab.Ctx, chromedp.Text("#h"))
	if err != nil || text != "hello" {
		t.Fatalf("text = %q, %v; want hello", text, err)
	}
	path := tab.Screenshot(t, "page")
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("screenshot %s: %v", path, err)
	}
	// The page's uncaught exception is reported (the console event comes
	// asynchronously: wait for it, bounded only by the test's deadline).
	for !slices.ContainsFunc(tab.Exceptions(), func(e string) bool { return strings.Contains(e, "boom") }) {
		if err := chromedp.Do(tab.Ctx, chromedp.Sleep(20*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCheckPNG(t *testing.T) {
	if err := checkPNG(nil); err == nil {
		t.Error("checkPNG(nil) = nil")
	}
	hdr := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x00\x00\x00\x00\x01")
	if err := checkPNG(hdr); err == nil {
		t.Error("checkPNG(0x1) = nil")
	}
	hdr[19] = 1
	if err := checkPNG(hdr); err != nil {
		t.Errorf("checkPNG(1x1) = %v", err)
	}
}
