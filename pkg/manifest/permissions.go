package manifest

import (
	"fmt"
	"io/fs"
	"strings"
)

// Access is a set of rwx bits for one class of user (owner, group or other).
type Access uint8

// Access bits, combinable with |.
const (
	AccessNone  Access = 0
	AccessExec  Access = 1
	AccessWrite Access = 2
	AccessRead  Access = 4
	AccessAll   Access = AccessRead | AccessWrite | AccessExec
)

// Permissions are the mode bits a materialized entry receives: rwx for owner,
// group and other, plus whether the entry is a directory. Special bits
// (setuid, setgid, sticky) are deliberately not representable.
//
// In a manifest they are written either symbolically ("drwxr-x---",
// "-rw-r--r--", or the nine rwx characters alone) or in octal ("0750", "750",
// "0o750"); they are always written back in four-digit octal.
type Permissions struct {
	Owner     Access
	Group     Access
	Other     Access
	Directory bool
}

// DefaultPermissions are the permissions an entry gets when it names none.
// Following the reference SDK, every entry kind defaults to rwxr-xr-x (0755);
// dir marks directory-like entries.
func DefaultPermissions(dir bool) Permissions {
	return Permissions{Owner: AccessAll, Group: AccessRead | AccessExec, Other: AccessRead | AccessExec, Directory: dir}
}

// PermissionsFromMode takes the rwx bits and the directory flag of an OS file
// mode; every other bit is ignored.
func PermissionsFromMode(m fs.FileMode) Permissions {
	return Permissions{
		Owner:     Access(m>>6) & AccessAll,
		Group:     Access(m>>3) & AccessAll,
		Other:     Access(m) & AccessAll,
		Directory: m.IsDir(),
	}
}

// Perm returns the nine permission bits (0 to 0o777).
func (p Permissions) Perm() fs.FileMode {
	return fs.FileMode(p.Owner&AccessAll)<<6 | fs.FileMode(p.Group&AccessAll)<<3 | fs.FileMode(p.Other&AccessAll)
}

// Mode returns Perm with fs.ModeDir added for a directory.
func (p Permissions) Mode() fs.FileMode {
	m := p.Perm()
	if p.Directory {
		m |= fs.ModeDir
	}
	return m
}

// String renders the ten-character ls form, such as "drwxr-x---".
func (p Permissions) String() string {
	var b [10]byte
	b[0] = '-'
	if p.Directory {
		b[0] = 'd'
	}
	for i, a := range [3]Access{p.Owner, p.Group, p.Other} {
		b[1+3*i] = pick(a&AccessRead != 0, 'r')
		b[2+3*i] = pick(a&AccessWrite != 0, 'w')
		b[3+3*i] = pick(a&AccessExec != 0, 'x')
	}
	return string(b[:])
}

func pick(set bool, c byte) byte {
	if set {
		return c
	}
	return '-'
}

// Octal renders the four-digit octal form, such as "0750". The directory
// flag is not part of it.
func (p Permissions) Octal() string {
	return fmt.Sprintf("%04o", uint32(p.Perm()))
}

// check reports what is wrong with p, or "".
func (p Permissions) check() string {
	if p.Owner > AccessAll || p.Group > AccessAll || p.Other > AccessAll {
		return fmt.Sprintf("access values must be between 0 and 7 (owner %d, group %d, other %d)", p.Owner, p.Group, p.Other)
	}
	return ""
}

// ParsePermissions reads a symbolic ("drwxr-x---", "-rw-r--r--",
// "rw-r--r--") or octal ("0750", "750", "0o750") permission string. A
// symbolic string may carry one trailing ls annotation character ('+', '@'
// or '.'), which is ignored. Setuid, setgid and sticky bits are rejected in
// both forms. The octal form never sets Directory.
func ParsePermissions(s string) (Permissions, error) {
	if s == "" {
		return Permissions{}, fmt.Errorf("empty permission string")
	}
	if isOctalForm(s) {
		return parseOctal(s)
	}
	return parseSymbolic(s)
}

func isOctalForm(s string) bool {
	return s[0] >= '0' && s[0] <= '9'
}

func parseOctal(s string) (Permissions, error) {
	digits := s
	if len(s) > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'O') {
		digits = s[2:]
	}
	if len(digits) == 4 && digits[0] == '0' {
		digits = digits[1:]
	}
	if len(digits) != 3 {
		if len(digits) == 4 && digits[0] >= '1' && digits[0] <= '7' {
			return Permissions{}, fmt.Errorf("permission %q sets setuid, setgid or sticky bits, which are not supported", s)
		}
		return Permissions{}, fmt.Errorf("permission %q is not three octal digits (like 0755)", s)
	}
	var v [3]Access
	for i := range 3 {
		c := digits[i]
		if c < '0' || c > '7' {
			return Permissions{}, fmt.Errorf("permission %q has a non-octal digit %q", s, c)
		}
		v[i] = Access(c - '0')
	}
	return Permissions{Owner: v[0], Group: v[1], Other: v[2]}, nil
}

func parseSymbolic(s string) (Permissions, error) {
	body := s
	// The last character of a bare rwx string is an 'x' or '-' slot, so a
	// trailing '+', '@' or '.' can only be an ls annotation.
	if n := len(body); (n == 10 || n == 11) && strings.IndexByte("+@.", body[n-1]) >= 0 {
		body = body[:n-1]
	}
	var p Permissions
	switch len(body) {
	case 10:
		switch body[0] {
		case 'd':
			p.Directory = true
		case '-':
		default:
			return Permissions{}, fmt.Errorf("permission %q: the type character must be 'd' or '-'", s)
		}
		body = body[1:]
	case 9:
	default:
		return Permissions{}, fmt.Errorf("permission %q is neither an rwx string (like drwxr-x---) nor octal (like 0750)", s)
	}
	const want = "rwx"
	var v [3]Access
	for i := range 9 {
		c := body[i]
		slot := want[i%3]
		switch {
		case c == slot:
			v[i/3] |= Access(4 >> (i % 3))
		case c == '-':
		case strings.IndexByte("sStT", c) >= 0:
			return Permissions{}, fmt.Errorf("permission %q sets setuid, setgid or sticky bits, which are not supported", s)
		default:
			return Permissions{}, fmt.Errorf("permission %q: character %d must be %q or '-'", s, i+1, slot)
		}
	}
	p.Owner, p.Group, p.Other = v[0], v[1], v[2]
	return p, nil
}
