package main

// Package init cost: one start of sandbox-agentd and one of grpcfloor with
// GODEBUG=inittrace=1, whose runtime prints a line per package init to
// stderr, summed and ranked (issue #17: most of the daemon's idle RSS is
// pages of the binary that init functions touch).

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

// initTraceEnv is what makes a Go program trace its package inits.
const initTraceEnv = "GODEBUG=inittrace=1"

// initTop is how many packages the top lists show.
const initTop = 5

// initEntry is one package's init as GODEBUG=inittrace=1 reports it:
//
//	init PKG @T ms, C ms clock, B bytes, A allocs
//
// T is when it started after the runtime's start, C the wall-clock time it
// took, B and A what it allocated on the heap.
type initEntry struct {
	pkg           string
	atMS, clockMS float64
	bytes, allocs int64
}

// initTrace is a parsed trace: the entries in the order the runtime ran
// them, and how many lines looked like an init line but did not parse.
type initTrace struct {
	entries   []initEntry
	malformed int
}

// maxTraceMS bounds a time in an init line (a day): larger ones, and
// anything not finite, are taken as garbage.
const maxTraceMS = 24 * 60 * 60 * 1000

// parseInitTrace picks the init lines out of a program's stderr (its other
// output, its log for one, is ignored). A line that starts with "init " but
// does not have the runtime's form counts as malformed.
func parseInitTrace(out string) initTrace {
	var t initTrace
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "init ") {
			continue
		}
		e, ok := parseInitLine(line)
		if !ok {
			t.malformed++
			continue
		}
		t.entries = append(t.entries, e)
	}
	return t
}

// parseInitLine parses one "init PKG @T ms, C ms clock, B bytes, A allocs"
// line (the runtime's doInit1).
func parseInitLine(line string) (initEntry, bool) {
	f := strings.Fields(line)
	if len(f) != 11 || f[0] != "init" || f[3] != "ms," || f[5] != "ms" || f[6] != "clock," || f[8] != "bytes," || f[10] != "allocs" {
		return initEntry{}, false
	}
	at, ok := cutMS(f[2], "@")
	if !ok {
		return initEntry{}, false
	}
	clock, ok := cutMS(f[4], "")
	if !ok {
		return initEntry{}, false
	}
	bytes, ok := cutCount(f[7])
	if !ok {
		return initEntry{}, false
	}
	allocs, ok := cutCount(f[9])
	if !ok {
		return initEntry{}, false
	}
	return initEntry{pkg: f[1], atMS: at, clockMS: clock, bytes: bytes, allocs: allocs}, true
}

// cutMS parses a millisecond figure as the runtime prints it ("0",
// "0.008", "0.24", "12") after prefix: a plain non-negative decimal.
func cutMS(s, prefix string) (float64, bool) {
	s, ok := strings.CutPrefix(s, prefix)
	if !ok || s == "" || strings.ContainsFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' }) {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v > maxTraceMS {
		return 0, false
	}
	return v, true
}

// cutCount parses a byte or allocation count: plain decimal digits.
func cutCount(s string) (int64, bool) {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r < '0' || r > '9' }) {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// initTotal is the sum over a set of entries.
type initTotal struct {
	pkgs          int
	clockMS       float64
	bytes, allocs int64
}

func sumInits(es []initEntry) initTotal {
	t := initTotal{pkgs: len(es)}
	for _, e := range es {
		t.clockMS += e.clockMS
		t.bytes += e.bytes
		t.allocs += e.allocs
	}
	return t
}

func (t initTotal) String() string {
	return fmt.Sprintf("%d packages, %.2f ms clock, %.0f KiB in %d allocs", t.pkgs, t.clockMS, float64(t.bytes)/1024, t.allocs)
}

// topInits is the n entries first by key (larger first; ties by package
// path, so the list is the same for the same trace).
func topInits(es []initEntry, n int, key func(initEntry) float64) []initEntry {
	s := slices.Clone(es)
	slices.SortStableFunc(s, func(a, b initEntry) int {
		if c := cmp.Compare(key(b), key(a)); c != 0 {
			return c
		}
		return strings.Compare(a.pkg, b.pkg)
	})
	return s[:min(n, len(s))]
}

func byClock(e initEntry) float64 { return e.clockMS }
func byBytes(e initEntry) float64 { return float64(e.bytes) }

// shortPkg trims this module's path off a package path (the table is wide
// enough as it is).
func shortPkg(p string) string {
	if rest, ok := strings.CutPrefix(p, "github.com/bulkhead-dev/bulkhead/"); ok {
		return "bulkhead/" + rest
	}
	return p
}

// clockList and bytesList format a top list.
func clockList(es []initEntry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%s %.2g ms", shortPkg(e.pkg), e.clockMS)
	}
	return strings.Join(parts, ", ")
}

func bytesList(es []initEntry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%s %.1f KiB", shortPkg(e.pkg), float64(e.bytes)/1024)
	}
	return strings.Join(parts, ", ")
}

// notIn is the entries of a whose package b does not init.
func notIn(a, b []initEntry) []initEntry {
	seen := make(map[string]bool, len(b))
	for _, e := range b {
		seen[e.pkg] = true
	}
	var out []initEntry
	for _, e := range a {
		if !seen[e.pkg] {
			out = append(out, e)
		}
	}
	return out
}

// traceAgentdInits starts the daemon once with GODEBUG=inittrace=1, as the
// bench starts it otherwise, and returns its trace once it served.
func traceAgentdInits(ctx context.Context, agentd string) (initTrace, error) {
	var out syncbuf.Buffer
	sb, err := local.Start(ctx, local.Options{
		AgentdPath: agentd,
		Stderr:     &out,
		Wrap:       func(argv []string) []string { return append([]string{"env", initTraceEnv}, argv...) },
	}, zap.NewNop())
	if err != nil {
		return initTrace{}, fmt.Errorf("start sandbox-agentd with %s: %w", initTraceEnv, err)
	}
	// Close returns once everything the daemon wrote was forwarded.
	if err := sb.Close(context.Background()); err != nil {
		return initTrace{}, fmt.Errorf("stop sandbox-agentd traced: %w", err)
	}
	return checkTrace("sandbox-agentd", out.String())
}

// traceFloorInits does the same for grpcfloor.
func traceFloorInits(ctx context.Context, binDir string) (initTrace, error) {
	var out syncbuf.Buffer
	fl, err := startFloorWith(ctx, binDir, []string{initTraceEnv}, &out)
	if err != nil {
		return initTrace{}, err
	}
	fl.close() // waits for the copy of its stderr
	return checkTrace("grpcfloor", out.String())
}

// checkTrace parses a program's stderr and fails if no init line parsed.
func checkTrace(name, out string) (initTrace, error) {
	t := parseInitTrace(out)
	if len(t.entries) == 0 {
		const max = 300
		if len(out) > max {
			out = out[:max] + "..."
		}
		return t, fmt.Errorf("%s with %s printed no init line (%d malformed); its stderr: %q", name, initTraceEnv, t.malformed, out)
	}
	return t, nil
}

// benchInitCost traces one start of each binary and returns the rows:
// totals, the top packages by clock and by bytes (grpcfloor beside), and
// what the packages grpcfloor does not init add. Without the floor
// (withFloor false, or its trace failing), the baseline column is empty.
func benchInitCost(ctx context.Context, binDir, agentd string, withFloor bool) ([]row, error) {
	d, err := traceAgentdInits(ctx, agentd)
	if err != nil {
		return nil, err
	}
	var f initTrace
	if withFloor {
		if f, err = traceFloorInits(ctx, binDir); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: no grpcfloor init trace:", err)
		}
	}
	return initRows(d, f), nil
}

// initRows formats two traces (f empty: no baseline).
func initRows(d, f initTrace) []row {
	const what = "sandbox-agentd package init (GODEBUG=inittrace=1, one start): "
	dt, ft := sumInits(d.entries), sumInits(f.entries)
	total := func(t initTrace, s initTotal) string {
		v := s.String()
		if t.malformed > 0 {
			v += fmt.Sprintf(" (%d init lines did not parse)", t.malformed)
		}
		return v
	}
	rows := []row{{what + "all packages", total(d, dt), "", "", ""}}
	if len(f.entries) > 0 {
		rows[0].baseline = total(f, ft) + " (grpcfloor)"
		rows[0].ratio = fmt.Sprintf("%s clock, %s bytes", ratioF(dt.clockMS, ft.clockMS), ratioF(float64(dt.bytes), float64(ft.bytes)))
	}
	top := func(t initTrace, list func([]initEntry) string, key func(initEntry) float64) string {
		if len(t.entries) == 0 {
			return ""
		}
		return list(topInits(t.entries, initTop, key))
	}
	rows = append(rows,
		row{fmt.Sprintf("%stop %d by clock", what, initTop), top(d, clockList, byClock), top(f, clockList, byClock), "", ""},
		row{fmt.Sprintf("%stop %d by bytes allocated", what, initTop), top(d, bytesList, byBytes), top(f, bytesList, byBytes), "", ""},
	)
	if len(f.entries) > 0 {
		extra := notIn(d.entries, f.entries)
		et := sumInits(extra)
		v := et.String()
		if len(extra) > 0 {
			v += fmt.Sprintf("; by clock: %s; by bytes: %s", clockList(topInits(extra, initTop, byClock)), bytesList(topInits(extra, initTop, byBytes)))
		}
		rows = append(rows, row{what + "packages grpcfloor does not init", v, "",
			fmt.Sprintf("%.0f%% of the clock, %.0f%% of the bytes", pct(et.clockMS, dt.clockMS), pct(float64(et.bytes), float64(dt.bytes))), ""})
	}
	return rows
}

func ratioF(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func pct(part, whole float64) float64 {
	if whole == 0 {
		return 0
	}
	return 100 * part / whole
}
