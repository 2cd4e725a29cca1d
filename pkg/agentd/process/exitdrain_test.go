package process

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestExitReportCarriesLastOutput: output printed just before a quick exit,
// on both streams and more than the exit watcher reads itself
// (drainAtExitReads), is all in the log before the exit is reported, in
// order, whether a follower holds the output back (HoldOutput, then Attach)
// or nobody follows (Wait, then Read).
func TestExitReportCarriesLastOutput(t *testing.T) {
	m := newTestManager(t, Config{DrainGrace: time.Minute}) // a report by grace would hang the test, not pass it
	for _, size := range []int{1, 700, 5000, 300 << 10} {
		script := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo end; echo err >&2; exit 7", size)
		want := strings.Repeat("x", size) + "end\n"
		t.Run(fmt.Sprintf("attached/%d", size), func(t *testing.T) {
			info, err := m.Start(testCtx(t), StartOptions{Argv: []string{"sh", "-c", script}, HoldOutput: true})
			if err != nil {
				t.Fatal(err)
			}
			o := collect(t, m, info.ID)
			if o.stdout.String() != want || o.stderr.String() != "err\n" || o.dropped != 0 || o.exit.Code != 7 {
				t.Fatalf("stdout %d bytes (want %d), stderr %q, dropped %d, exit %+v", o.stdout.Len(), len(want), o.stderr.String(), o.dropped, o.exit)
			}
		})
		t.Run(fmt.Sprintf("polled/%d", size), func(t *testing.T) {
			info := mustStart(t, m, StartOptions{Argv: []string{"sh", "-c", script}})
			e, err := m.Wait(testCtx(t), info.ID)
			if err != nil || e.Code != 7 {
				t.Fatalf("Wait = %+v, %v", e, err)
			}
			var stdout, stderr bytes.Buffer
			var cursor int64
			for {
				r, err := m.Read(testCtx(t), info.ID, cursor, 0, 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range r.Chunks {
					map[Stream]*bytes.Buffer{Stdout: &stdout, Stderr: &stderr}[c.Stream].Write(c.Data)
				}
				cursor = r.NextCursor
				if r.Exit != nil {
					break
				}
			}
			if stdout.String() != want || stderr.String() != "err\n" {
				t.Fatalf("stdout %d bytes (want %d), stderr %q", stdout.Len(), len(want), stderr.String())
			}
		})
	}
}
