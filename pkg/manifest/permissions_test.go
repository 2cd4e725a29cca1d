package manifest

import (
	"io/fs"
	"strings"
	"testing"
)

// Every one of the 512 permission sets, as a file and as a directory,
// survives String/Parse, Octal/Parse and Mode/FromMode.
func TestPermissionsRoundTripAllModes(t *testing.T) {
	for mode := fs.FileMode(0); mode <= 0o777; mode++ {
		for _, dir := range []bool{false, true} {
			full := mode
			if dir {
				full |= fs.ModeDir
			}
			p := PermissionsFromMode(full)
			if p.Perm() != mode || p.Directory != dir || p.Mode() != full {
				t.Fatalf("FromMode(%v) = %+v: Perm %o Mode %v", full, p, p.Perm(), p.Mode())
			}
			s := p.String()
			if len(s) != 10 {
				t.Fatalf("String() = %q, want 10 characters", s)
			}
			if got, err := ParsePermissions(s); err != nil || got != p {
				t.Fatalf("ParsePermissions(%q) = %+v, %v; want %+v", s, got, err, p)
			}
			if got, err := ParsePermissions(s[1:]); err != nil || got != (Permissions{p.Owner, p.Group, p.Other, false}) {
				t.Fatalf("ParsePermissions(%q) = %+v, %v", s[1:], got, err)
			}
			octal := p.Octal()
			if len(octal) != 4 || octal[0] != '0' {
				t.Fatalf("Octal() = %q", octal)
			}
			noDir := p
			noDir.Directory = false
			for _, form := range []string{octal, octal[1:], "0o" + octal[1:]} {
				if got, err := ParsePermissions(form); err != nil || got != noDir {
					t.Fatalf("ParsePermissions(%q) = %+v, %v; want %+v", form, got, err, noDir)
				}
			}
			if got := PermissionsFromMode(p.Mode()); got != p {
				t.Fatalf("FromMode(Mode()) = %+v, want %+v", got, p)
			}
			if p.check() != "" {
				t.Fatalf("check(%+v) = %q", p, p.check())
			}
		}
	}
}

func TestParsePermissions(t *testing.T) {
	good := []struct {
		in   string
		want Permissions
	}{
		{"drwxr-x---", Permissions{AccessAll, AccessRead | AccessExec, AccessNone, true}},
		{"-rw-r--r--", Permissions{AccessRead | AccessWrite, AccessRead, AccessRead, false}},
		{"rw-------", Permissions{AccessRead | AccessWrite, 0, 0, false}},
		{"drwxr-xr-x+", Permissions{AccessAll, 5, 5, true}},
		{"-rw-r--r--@", Permissions{6, 4, 4, false}},
		{"-rw-r--r--.", Permissions{6, 4, 4, false}},
		{"rw-r--r--+", Permissions{6, 4, 4, false}},
		{"0755", Permissions{7, 5, 5, false}},
		{"755", Permissions{7, 5, 5, false}},
		{"0o640", Permissions{6, 4, 0, false}},
		{"0O640", Permissions{6, 4, 0, false}},
		{"000", Permissions{}},
		{"0000", Permissions{}},
	}
	for _, tc := range good {
		got, err := ParsePermissions(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParsePermissions(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	bad := []struct{ in, msg string }{
		{"", "empty"},
		{"4755", "setuid"},
		{"1777", "sticky"},
		{"0800", "non-octal"},
		{"75", "three octal digits"},
		{"07555", "three octal digits"},
		{"0o7555", "setuid"},
		{"drwsr-xr-x", "setuid"},
		{"-rwxr-sr-x", "setuid"},
		{"drwxrwxrwt", "sticky"},
		{"drwxrwxrwT", "sticky"},
		{"lrwxrwxrwx", "type character"},
		{"rwx", "neither"},
		{"drwxr-x--", "character 1"},
		{"drwxr-x---x", "neither"},
		{"-wrxr-xr-x", "character 1 must be 'r'"},
		{"-rw-r--r-+x", "neither"},
		{"+rw-r--r--", "type character"},
	}
	for _, tc := range bad {
		if _, err := ParsePermissions(tc.in); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ParsePermissions(%q) error = %v; want one mentioning %q", tc.in, err, tc.msg)
		}
	}
}

func TestDefaultAndEffectivePermissions(t *testing.T) {
	if got := DefaultPermissions(false).Perm(); got != 0o755 {
		t.Errorf("DefaultPermissions(false) = %o, want 755 (the reference's default for every entry)", got)
	}
	if got := DefaultPermissions(true).Mode(); got != fs.ModeDir|0o755 {
		t.Errorf("DefaultPermissions(true) = %v", got)
	}
	file := &Entry{Type: TypeFile}
	if got := file.EffectivePermissions().String(); got != "-rwxr-xr-x" {
		t.Errorf("file default = %s", got)
	}
	p := Permissions{Owner: AccessRead | AccessExec, Group: AccessRead | AccessExec}
	dir := &Entry{Type: TypeLocalDir, Permissions: &p}
	if got := dir.EffectivePermissions().String(); got != "dr-xr-x---" {
		t.Errorf("local_dir = %s, want the directory flag set from the type", got)
	}
	if p.Directory {
		t.Error("EffectivePermissions modified the entry's permissions")
	}
	if got := (Permissions{Owner: 8}).check(); got == "" {
		t.Error("access 8 accepted")
	}
}
