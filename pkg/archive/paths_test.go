package archive

import (
	"errors"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestCleanMember(t *testing.T) {
	lim, err := Limits{}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	ok := map[string]string{
		"a": "a", "./a/b/": "a/b", "a//b": "a/b", "./": "", ".": "", "a/./b": "a/b", "ü/名": "ü/名",
		"a\\b": "a\\b", // a backslash is an ordinary byte on Linux
	}
	for in, want := range ok {
		got, err := cleanMember(in, &lim)
		if err != nil || got != want {
			t.Errorf("cleanMember(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := map[string]error{
		"/a": errkind.ErrPathEscape, "..": errkind.ErrPathEscape, "a/../b": errkind.ErrPathEscape,
		"a\x00b": errkind.ErrInvalidArgument, "\xff": errkind.ErrInvalidArgument,
		strings.Repeat("x", 256):            errkind.ErrInvalidArgument,
		strings.Repeat("d/", 4000):          errkind.ErrInvalidArgument,
		ReservedPrefix + "stage-1/f":        errkind.ErrInvalidArgument,
		"d/.bulkhead-tmp-1":                 errkind.ErrInvalidArgument,
		strings.Repeat("d/", 257) + "f":     errkind.ErrInvalidArgument,
		"d/" + ReservedPrefix + "is-fine/f": nil,
	}
	for in, want := range bad {
		_, err := cleanMember(in, &lim)
		if want == nil {
			if err != nil {
				t.Errorf("cleanMember(%q): %v", in, err)
			}
			continue
		}
		if !errors.Is(err, want) {
			t.Errorf("cleanMember(%q) = %v, want %v", shown(in), err, want)
		}
	}
}

func TestShown(t *testing.T) {
	for in, want := range map[string]string{
		"plain/name":             "plain/name",
		"bad\xffname":            `bad\xffname`,
		"new\nline":              `new\nline`,
		strings.Repeat("é", 150): strings.Repeat("é", 100) + "...",
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestExcludeSet(t *testing.T) {
	s, err := newExcludeSet(opArchive, []string{"a/b/", "./c", "d/../e"})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"a/b": true, "a/b/c": true, "a": false, "a/bc": false, "c": true, "e": true, "d": false} {
		if got := s.covers(p); got != want {
			t.Errorf("covers(%q) = %v", p, got)
		}
	}
}
