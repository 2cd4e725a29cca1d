package memory

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncateMiddle(t *testing.T) {
	if got := truncateMiddle("short", 10); got != "short" {
		t.Fatalf("short text changed: %q", got)
	}
	s := strings.Repeat("é✓", 100) // 5 bytes a pair
	for max := 1; max < 40; max++ {
		got := truncateMiddle(s, max)
		if !utf8.ValidString(got) {
			t.Fatalf("max %d: invalid UTF-8 %q", max, got)
		}
		head, tail, ok := strings.Cut(got, "\n[... ")
		if !ok {
			t.Fatalf("max %d: no marker in %q", max, got)
		}
		tail = tail[strings.Index(tail, "]\n")+2:]
		if len(head)+len(tail) > max || len(head)+len(tail) < max-2*utf8.UTFMax {
			t.Fatalf("max %d: kept %d bytes", max, len(head)+len(tail))
		}
		if !strings.HasPrefix(s, head) || !strings.HasSuffix(s, tail) {
			t.Fatalf("max %d: %q is not the text's beginning and end", max, got)
		}
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{{Dir: "/abs"}, {Dir: ".."}, {Dir: "a/../../b"}, {Dir: "."}, {Mode: Mode(7)}} {
		m := newMemory(o)
		if _, err := m.ProcessManifest(nil); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if m := newMemory(Options{Dir: "a/./mem/"}); m.cfgErr != nil || m.summaryPath() != "a/mem/memory_summary.md" {
		t.Errorf("cleaned dir: %v %q", m.cfgErr, m.summaryPath())
	}
}
