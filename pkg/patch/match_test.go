package patch

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

func newTestMatcher(texts ...string) *matcher {
	budget := DefaultMaxScanLines
	return &matcher{texts: texts, budget: &budget}
}

func TestSeekPasses(t *testing.T) {
	tests := []struct {
		name  string
		file  []string
		pat   []string
		start int
		eof   bool
		want  int
	}{
		{"exact", []string{"a", "b", "c"}, []string{"b", "c"}, 0, false, 1},
		{"from start", []string{"x", "a", "x", "a"}, []string{"a"}, 2, false, 3},
		{"trailing whitespace", []string{"a", "b  \t", "c"}, []string{"b", "c"}, 0, false, 1},
		{"surrounding whitespace", []string{"a", "    b", "c"}, []string{"b", "c "}, 0, false, 1},
		{"unicode punctuation", []string{"s := “hi” – ok", "x\u00a0=\u00a01"}, []string{`s := "hi" - ok`, "x = 1"}, 0, false, 0},
		{"folding works both ways", []string{`it's`}, []string{"it’s"}, 0, false, 0},
		{"exact later beats fuzzy earlier", []string{" a", "a"}, []string{"a"}, 0, false, 1},
		{"no match", []string{"a", "b"}, []string{"c"}, 0, false, -1},
		{"pattern longer than file", []string{"a"}, []string{"a", "a"}, 0, false, -1},
		{"empty pattern", []string{"a"}, nil, 1, false, 1},
		{"end of file", []string{"a", "b", "a", "b"}, []string{"a", "b"}, 0, true, 2},
		{"end of file only at end", []string{"a", "b", "c"}, []string{"a", "b"}, 0, true, -1},
		{"end of file not before start", []string{"a", "b"}, []string{"b"}, 2, true, -1},
		{"no NFC or tab folding", []string{"\tx = 1"}, []string{"  x =  1"}, 0, false, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := newTestMatcher(tt.file...).seek(tt.pat, tt.start, tt.eof); got != tt.want {
				t.Errorf("seek = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestSeekAgainstNaive compares the KMP search with a direct scan on random
// repetitive files.
func TestSeekAgainstNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", " a", "a ", "c"}
	pick := func(n int) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return s
	}
	naive := func(file, pat []string, start int) int {
		for p := passExact; p < numPasses; p++ {
			for i := start; i+len(pat) <= len(file); i++ {
				ok := true
				for k := range pat {
					if passKey(p, file[i+k]) != passKey(p, pat[k]) {
						ok = false
						break
					}
				}
				if ok {
					return i
				}
			}
		}
		return -1
	}
	for range 2000 {
		file, pat := pick(rng.IntN(30)), pick(1+rng.IntN(4))
		start := rng.IntN(len(file) + 1)
		if got, want := newTestMatcher(file...).seek(pat, start, false), naive(file, pat, start); got != want {
			t.Fatalf("seek(%q, %q, %d) = %d, want %d", file, pat, start, got, want)
		}
	}
}

func TestSeekBudget(t *testing.T) {
	budget := 10
	m := &matcher{texts: make([]string, 100), budget: &budget}
	if got := m.seek([]string{"x"}, 0, false); got != -1 || !m.exhausted {
		t.Errorf("seek = %d, exhausted = %v; want -1, true", got, m.exhausted)
	}
}

func TestSplitText(t *testing.T) {
	tests := []struct {
		in   string
		want []textLine
		eol  string
	}{
		{"", []textLine{}, "\n"},
		{"a", []textLine{{"a", ""}}, "\n"},
		{"a\nb\n", []textLine{{"a", "\n"}, {"b", "\n"}}, "\n"},
		{"a\r\nb", []textLine{{"a", "\r\n"}, {"b", ""}}, "\r\n"},
		{"a\rb\r\n\n", []textLine{{"a", "\r"}, {"b", "\r\n"}, {"", "\n"}}, "\r"},
		{"\r\r\n", []textLine{{"", "\r"}, {"", "\r\n"}}, "\r"},
	}
	for _, tt := range tests {
		got := splitText(tt.in)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("splitText(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if eol := preferredEOL(got); eol != tt.eol {
			t.Errorf("preferredEOL(%q) = %q, want %q", tt.in, eol, tt.eol)
		}
	}
}
