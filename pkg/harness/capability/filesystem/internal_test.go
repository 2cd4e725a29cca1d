package filesystem

import (
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain\ttab", "plain\ttab"},
		{"esc\x1b[31mred\x7f", `esc\x1b[31mred\x7f`},
		{"cr\r", `cr\x0d`},
		{strings.Repeat("a", 250), strings.Repeat("a", 200) + " ..."},
		// Cut on a rune boundary: 199 bytes of 'a', then a 2-byte rune.
		{strings.Repeat("a", 199) + "é" + "tail", strings.Repeat("a", 199) + " ..."},
	} {
		if got := printable(tc.in); got != tc.want {
			t.Errorf("printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestQuoteLinesBounds(t *testing.T) {
	lines := make([]string, 25)
	for i := range lines {
		lines[i] = "l"
	}
	var b strings.Builder
	quoteLines(&b, lines, 7)
	got := b.String()
	if !strings.HasPrefix(got, "\n     7 | l\n     8 | l") || !strings.HasSuffix(got, "\n    26 | l\n    ... (5 more lines)") {
		t.Errorf("quoted:\n%s", got)
	}
}

func TestImageType(t *testing.T) {
	for in, want := range map[string]string{
		"\x89PNG\r\n\x1a\n":          "image/png",
		"\x89PNG\r\n\x1a":            "",
		"\xff\xd8\xff":               "image/jpeg",
		"\xff\xd8":                   "",
		"GIF87a":                     "image/gif",
		"GIF89a...":                  "image/gif",
		"GIF88a":                     "",
		"RIFF\x00\x00\x00\x00WEBP":   "image/webp",
		"RIFF\x00\x00\x00\x00WAVE":   "",
		"RIFF\x00\x00\x00\x00WEB":    "",
		"BM\x00\x00":                 "",
		"<svg xmlns='...'></svg>":    "",
		"II*\x00 tiff little-endian": "",
		"":                           "",
	} {
		if got := imageType([]byte(in)); got != want {
			t.Errorf("imageType(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSizeText(t *testing.T) {
	for n, want := range map[int64]string{10 << 20: "10MB", 1 << 20: "1MB", 64: "64 bytes", 3<<20 + 1: "3145729 bytes"} {
		if got := sizeText(n); got != want {
			t.Errorf("sizeText(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSuccessSummaryEmpty(t *testing.T) {
	if got := successSummary(nil); got != "No files were modified." {
		t.Errorf("got %q", got)
	}
	got := successSummary([]agentclient.PatchChange{{Kind: agentclient.PatchMoved, Path: "a", NewPath: "b"}})
	if got != "Updated a\nMoved a to b" {
		t.Errorf("got %q", got)
	}
}
