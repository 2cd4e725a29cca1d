// Package browser starts headless Chromium for tests and drives it with
// chromedp: a private profile directory per browser, --no-sandbox only when
// the tests run as root (Chromium's sandbox refuses uid 0), and the process
// stopped and its files removed when the test ends.
//
// Chromium comes from Debian's packages (apt-get install chromium; .ci/run
// installs it). A test that needs it and finds no chromium on PATH skips
// through internal/testing/testenv with one line on a developer's machine, and
// fails under CI=true.
package browser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// Tool is the executable the package looks for on PATH.
const Tool = "chromium"

// ArtifactsEnv names a directory where Screenshot also keeps its images
// (under the test's name), for CI to collect. Unset: only t.TempDir.
const ArtifactsEnv = "BULKHEAD_TEST_ARTIFACTS"

// Browser is one running headless Chromium.
type Browser struct {
	// first is the context of the first tab, which started the process;
	// tabs derived from it share the process.
	first context.Context
	// StartTime is how long Chromium took from exec to its first tab.
	StartTime time.Duration
	// Version is what `chromium --version` printed.
	Version string
}

// Start starts headless Chromium for t; it is stopped and its profile
// directory removed when t ends. It skips t (fails it under CI=true) when
// chromium is not on PATH.
func Start(t testing.TB) *Browser {
	t.Helper()
	testenv.Require(t, testenv.Tool(Tool))
	bin, err := exec.LookPath(Tool)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	profile := t.TempDir()
	lw := &logWriter{t: t}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-gpu", true),
		chromedp.CombinedOutput(lw),
	)
	if os.Geteuid() == 0 {
		// Chromium's own sandbox cannot run as root; the page it loads is
		// the test's own loopback server.
		opts = append(opts, chromedp.NoSandbox)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &Browser{Version: version(bin)}
	// The first tab starts the process; keep it open for the browser's
	// life so later tabs reuse the same process.
	first, cancelFirst := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelFirst()
		cancelAlloc() // kills the process and waits for it
		lw.mu.Lock()
		lw.done = true
		lw.mu.Unlock()
	})
	start := time.Now()
	if err := chromedp.Do(first); err != nil {
		t.Fatalf("browser: start %s: %v", bin, err)
	}
	b.StartTime = time.Since(start)
	b.first = first
	t.Logf("browser: %s started in %s (profile %s)", b.Version, b.StartTime.Round(time.Millisecond), profile)
	return b
}

// version returns `bin --version`'s first line, or "chromium".
func version(bin string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "chromium"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

// Tab is one browser tab. Its console messages and uncaught exceptions are
// logged to the test; Exceptions returns the exceptions.
type Tab struct {
	// Ctx is the tab's chromedp context: pass it to chromedp.Do/Run.
	Ctx context.Context

	mu         sync.Mutex
	exceptions []string
}

// NewTab opens a tab, closed when t ends.
func (b *Browser) NewTab(t testing.TB) *Tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.first)
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		t.Fatalf("browser: new tab: %v", err)
	}
	tab := &Tab{Ctx: ctx}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			t.Logf("browser console %s: %s (%s:%d)", m.Type, m, m.URL, m.Line+1)
			if m.IsException() {
				tab.mu.Lock()
				tab.exceptions = append(tab.exceptions, m.String())
				tab.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done // no t.Logf after the test ends
	})
	return tab
}

// Exceptions returns the uncaught exceptions the tab's pages threw so far.
func (tab *Tab) Exceptions() []string {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	return append([]string(nil), tab.exceptions...)
}

// Screenshot captures the whole page of the tab as a PNG, checks that it is
// a non-empty PNG, writes it to name+".png" under t.TempDir() (and under
// $BULKHEAD_TEST_ARTIFACTS/<test name>/ when that is set) and returns its
// path.
func (tab *Tab) Screenshot(t testing.TB, name string) string {
	t.Helper()
	png, err := chromedp.Run(tab.Ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser: screenshot %s: %v", name, err)
	}
	if err := checkPNG(png); err != nil {
		t.Fatalf("browser: screenshot %s: %v", name, err)
	}
	dirs := []string{t.TempDir()}
	if a := os.Getenv(ArtifactsEnv); a != "" {
		dirs = append(dirs, filepath.Join(a, sanitize(t.Name())))
	}
	var path string
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("browser: screenshot %s: %v", name, err)
		}
		path = filepath.Join(dir, sanitize(name)+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatalf("browser: screenshot %s: %v", name, err)
		}
	}
	t.Logf("browser: screenshot %s: %d bytes, %s", name, len(png), path)
	return path
}

// checkPNG reports whether b is a PNG with a non-empty image.
func checkPNG(b []byte) error {
	const sig = "\x89PNG\r\n\x1a\n"
	if len(b) < 24 || string(b[:8]) != sig || string(b[12:16]) != "IHDR" {
		return errors.New("not a PNG image")
	}
	w := uint32(b[16])<<24 | uint32(b[17])<<16 | uint32(b[18])<<8 | uint32(b[19])
	h := uint32(b[20])<<24 | uint32(b[21])<<16 | uint32(b[22])<<8 | uint32(b[23])
	if w == 0 || h == 0 {
		return fmt.Errorf("empty image (%dx%d)", w, h)
	}
	return nil
}

// sanitize makes s a file name.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r == ':' || r == ' ' {
			return '_'
		}
		return r
	}, s)
}

// logWriter sends Chromium's own output to the test log, line by line,
// until the test ends.
type logWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
			if line != "" {
				w.t.Logf("chromium: %s", line)
			}
		}
	}
	return len(p), nil
}
