package patch

import (
	"fmt"
	"strings"
	"testing"
)

// tenKFile returns a 10,000-line Go-like file with many repeated lines.
func tenKFile() []string {
	lines := make([]string, 0, 10000)
	for i := 0; len(lines) < 10000; i++ {
		lines = append(lines,
			fmt.Sprintf("func step%d(x int) int {", i),
			fmt.Sprintf("\ty := x * %d", i%13),
			"\tif y > 100 {",
			"\t\treturn y",
			"\t}",
			fmt.Sprintf("\treturn y + %d", i),
			"}",
			"",
		)
	}
	return lines[:10000]
}

// tenKPatch edits hunks hunks spread over the file; trailing adds trailing
// whitespace to the context so the exact pass fails and the second pass
// matches.
func tenKPatch(lines []string, hunks int, trailing string) string {
	body := []string{"*** Update File: big.go"}
	stride := len(lines) / hunks
	for h := range hunks {
		at := h*stride + stride/2
		at -= at % 8 // start of a function
		body = append(body, "@@ "+lines[at],
			" "+lines[at+1]+trailing,
			" "+lines[at+2]+trailing,
			" "+lines[at+3]+trailing,
			"-"+lines[at+4],
			"+\t} // edited",
			" "+lines[at+5]+trailing,
			" "+lines[at+6]+trailing,
		)
	}
	return envelope(body...)
}

func benchmarkApply(b *testing.B, lines []string, text string) {
	src := newMemTree(map[string]string{"big.go": strings.Join(lines, "\n") + "\n"})
	b.SetBytes(int64(len(src.files["big.go"])))
	b.ReportAllocs()
	for b.Loop() {
		p, err := Parse(text, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Plan(src, p, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApply10kLines applies 50 anchored update hunks to a 10,000-line
// file.
func BenchmarkApply10kLines(b *testing.B) {
	lines := tenKFile()
	benchmarkApply(b, lines, tenKPatch(lines, 50, ""))
}

// BenchmarkApply10kLinesFuzzy is the same with every context line matched
// only by the trailing-whitespace pass.
func BenchmarkApply10kLinesFuzzy(b *testing.B) {
	lines := tenKFile()
	benchmarkApply(b, lines, tenKPatch(lines, 50, "  "))
}

// BenchmarkApply10kLinesRepetitive is a worst case for naive matching: a
// file of identical lines and a long hunk that matches only at the end.
func BenchmarkApply10kLinesRepetitive(b *testing.B) {
	lines := make([]string, 10000)
	for i := range lines {
		lines[i] = "x"
	}
	lines[len(lines)-1] = "end"
	body := []string{"*** Update File: big.go", "@@"}
	for range 500 {
		body = append(body, " x")
	}
	body = append(body, "-end", "+END")
	benchmarkApply(b, lines, envelope(body...))
}

func TestTenKPatchApplies(t *testing.T) {
	lines := tenKFile()
	for _, trailing := range []string{"", "  "} {
		src := newMemTree(map[string]string{"big.go": strings.Join(lines, "\n") + "\n"})
		changes, err := parseAndPlan(src, tenKPatch(lines, 50, trailing))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(changes[0].Content), "} // edited"); n != 50 {
			t.Errorf("trailing %q: %d hunks applied, want 50", trailing, n)
		}
	}
}
