package main

import (
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// readTrace reads a real trace: the stderr of `GODEBUG=inittrace=1
// sandbox-agentd --help` (its usage text follows the init lines) and of
// grpcfloor, both built as `make bench` builds them (Go 1.26).
func readTrace(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/inittrace/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The figures below were computed from the files with awk, not with the
// code under test.
func TestParseInitTraceReal(t *testing.T) {
	d := parseInitTrace(readTrace(t, "sandbox-agentd.txt"))
	if len(d.entries) != 160 || d.malformed != 0 {
		t.Fatalf("sandbox-agentd: %d entries, %d malformed; want 160, 0", len(d.entries), d.malformed)
	}
	if got, want := d.entries[0], (initEntry{pkg: "internal/bytealg"}); got != want {
		t.Errorf("first entry %+v, want %+v", got, want)
	}
	last := d.entries[len(d.entries)-1]
	if want := (initEntry{pkg: "google.golang.org/grpc/reflection/grpc_reflection_v1alpha", atMS: 3.6, clockMS: 0.007, bytes: 5928, allocs: 10}); last != want {
		t.Errorf("last entry %+v, want %+v", last, want)
	}
	tot := sumInits(d.entries)
	if tot.pkgs != 160 || math.Abs(tot.clockMS-1.995) > 1e-9 || tot.bytes != 558656 || tot.allocs != 3218 {
		t.Errorf("total %+v, want 160 packages, 1.995 ms, 558656 bytes, 3218 allocs", tot)
	}
	if got := pkgs(topInits(d.entries, 3, byBytes)); got != "google.golang.org/protobuf/reflect/protodesc github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1 google.golang.org/protobuf/types/descriptorpb" {
		t.Errorf("top 3 by bytes: %s", got)
	}
	// grpc and protodesc both took 0.24 ms: ties go by path.
	if got := pkgs(topInits(d.entries, 2, byClock)); got != "google.golang.org/grpc google.golang.org/protobuf/reflect/protodesc" {
		t.Errorf("top 2 by clock: %s", got)
	}

	f := parseInitTrace(readTrace(t, "grpcfloor.txt"))
	if len(f.entries) != 145 || f.malformed != 0 {
		t.Fatalf("grpcfloor: %d entries, %d malformed; want 145, 0", len(f.entries), f.malformed)
	}
	extra := sumInits(notIn(d.entries, f.entries))
	if extra.pkgs != 15 || math.Abs(extra.clockMS-0.528) > 1e-9 || extra.bytes != 137824 || extra.allocs != 662 {
		t.Errorf("packages grpcfloor does not init: %+v, want 15, 0.528 ms, 137824 bytes, 662 allocs", extra)
	}

	rows := initRows(d, f)
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	for _, want := range []string{"160 packages", "1.99 ms clock", "546 KiB in 3218 allocs"} {
		if !strings.Contains(rows[0].value, want) {
			t.Errorf("total row %q lacks %q", rows[0].value, want)
		}
	}
	if !strings.Contains(rows[0].baseline, "145 packages") || rows[0].ratio != "1.13x clock, 1.40x bytes" {
		t.Errorf("total row baseline %q, ratio %q", rows[0].baseline, rows[0].ratio)
	}
	if !strings.HasPrefix(rows[2].value, "google.golang.org/protobuf/reflect/protodesc 164.5 KiB, bulkhead/proto/bulkhead/agentd/v1 81.3 KiB") {
		t.Errorf("top by bytes row %q", rows[2].value)
	}
	if !strings.HasPrefix(rows[3].value, "15 packages") || !strings.Contains(rows[3].value, "by bytes: bulkhead/proto/bulkhead/agentd/v1 81.3 KiB, bulkhead/pkg/userdb 26.3 KiB") {
		t.Errorf("not-in-floor row %q", rows[3].value)
	}
	// Without the floor: the same rows, no baseline, no comparison row.
	rows = initRows(d, initTrace{})
	if len(rows) != 3 || rows[0].baseline != "" || rows[1].baseline != "" || rows[0].ratio != "" {
		t.Errorf("rows without the floor: %+v", rows)
	}
}

func pkgs(es []initEntry) string {
	var s []string
	for _, e := range es {
		s = append(s, e.pkg)
	}
	return strings.Join(s, " ")
}

func TestParseInitLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want initEntry
		ok   bool
	}{
		{"init runtime @0.052 ms, 0.027 ms clock, 0 bytes, 0 allocs", initEntry{"runtime", 0.052, 0.027, 0, 0}, true},
		{"init example.com/a @12 ms, 10 ms clock, 1048576 bytes, 7 allocs", initEntry{"example.com/a", 12, 10, 1 << 20, 7}, true},
		{"  init p @1 ms,  2 ms clock, 3 bytes, 4 allocs\r", initEntry{"p", 1, 2, 3, 4}, true},
		{"init p 1 ms, 2 ms clock, 3 bytes, 4 allocs", initEntry{}, false},                     // no @
		{"init p @1 ms, 2 ms clock, 3 bytes", initEntry{}, false},                              // cut short
		{"init p @1 ms, 2 ms clock, 3 bytes, 4 allocs, 5", initEntry{}, false},                 // one too many
		{"init p @1 ms, -2 ms clock, 3 bytes, 4 allocs", initEntry{}, false},                   // negative
		{"init p @1 ms, 2 ms clock, -3 bytes, 4 allocs", initEntry{}, false},                   // negative
		{"init p @NaN ms, 2 ms clock, 3 bytes, 4 allocs", initEntry{}, false},                  // not a number
		{"init p @1e3 ms, 2 ms clock, 3 bytes, 4 allocs", initEntry{}, false},                  // not as printed
		{"init p @1.2.3 ms, 2 ms clock, 3 bytes, 4 allocs", initEntry{}, false},                // two points
		{"init p @1 ms, 2 ms clock, 0x3 bytes, 4 allocs", initEntry{}, false},                  // hex
		{"init p @1 ms, 2 ms clock, 3 bytes, 99999999999999999999 allocs", initEntry{}, false}, // overflow
		{"init p @1 ms, 2 s clock, 3 bytes, 4 allocs", initEntry{}, false},                     // unit
		{"init p @" + strings.Repeat("9", 400) + " ms, 2 ms clock, 3 bytes, 4 allocs", initEntry{}, false},
	} {
		got, ok := parseInitLine(strings.TrimSpace(tc.line))
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseInitLine(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
	// Only lines that start with "init " count, as parsed or malformed.
	tr := parseInitTrace("{\"level\":\"info\",\"msg\":\"init done\"}\ninitializing\ninit: x\ninit p @1 ms, 2 ms clock, 3 bytes, 4 allocs\ninit garbage\n")
	if len(tr.entries) != 1 || tr.malformed != 1 {
		t.Errorf("mixed output: %+v, want 1 entry, 1 malformed", tr)
	}
}

// formatInitLine writes an entry as the runtime would (with all digits).
func formatInitLine(e initEntry) string {
	return "init " + e.pkg + " @" + strconv.FormatFloat(e.atMS, 'f', -1, 64) + " ms, " +
		strconv.FormatFloat(e.clockMS, 'f', -1, 64) + " ms clock, " +
		strconv.FormatInt(e.bytes, 10) + " bytes, " + strconv.FormatInt(e.allocs, 10) + " allocs"
}

// FuzzParseInitTrace checks that any output parses without panicking into
// entries that are well formed, that every "init " line is either an entry
// or malformed, and that entries written back the runtime's way parse to
// themselves.
func FuzzParseInitTrace(f *testing.F) {
	f.Add("init runtime @0.052 ms, 0.027 ms clock, 0 bytes, 0 allocs\n")
	f.Add("init p @1 ms, 2 ms clock, 3 bytes, 4 allocs\nlog line\ninit q @x ms\n")
	f.Fuzz(func(t *testing.T, out string) {
		tr := parseInitTrace(out)
		lines := 0
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "init ") {
				lines++
			}
		}
		if len(tr.entries)+tr.malformed != lines {
			t.Fatalf("%d entries + %d malformed != %d init lines", len(tr.entries), tr.malformed, lines)
		}
		var back []string
		for _, e := range tr.entries {
			if e.pkg == "" || strings.ContainsFunc(e.pkg, unicode.IsSpace) {
				t.Fatalf("package %q", e.pkg)
			}
			for _, v := range []float64{e.atMS, e.clockMS} {
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > maxTraceMS {
					t.Fatalf("time %v in %+v", v, e)
				}
			}
			if e.bytes < 0 || e.allocs < 0 {
				t.Fatalf("negative count in %+v", e)
			}
			back = append(back, formatInitLine(e))
		}
		again := parseInitTrace(strings.Join(back, "\n"))
		if again.malformed != 0 || len(again.entries) != len(tr.entries) {
			t.Fatalf("written back: %d entries, %d malformed; want %d, 0", len(again.entries), again.malformed, len(tr.entries))
		}
		for i := range again.entries {
			if again.entries[i] != tr.entries[i] {
				t.Fatalf("written back: %+v, want %+v", again.entries[i], tr.entries[i])
			}
		}
		// Summing and ranking hold for any entries.
		tot := sumInits(tr.entries)
		top := topInits(tr.entries, initTop, byClock)
		if tot.pkgs != len(tr.entries) || len(top) > initTop {
			t.Fatalf("total %+v, top %d", tot, len(top))
		}
		for i := 1; i < len(top); i++ {
			if top[i].clockMS > top[i-1].clockMS {
				t.Fatalf("top by clock out of order: %+v", top)
			}
		}
	})
}
