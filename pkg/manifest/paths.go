package manifest

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Size bounds that hold for every manifest, trusted or not.
const (
	maxPathBytes      = 4096 // PATH_MAX
	maxComponentBytes = 255  // NAME_MAX
	maxNameBytes      = 32   // user and group names (useradd's limit)
	maxTextBytes      = 4096 // descriptions
	maxSecretBytes    = 256
	maxEnvNameBytes   = 256
	maxEnvValueBytes  = 128 << 10
)

// ValidateEntryPath checks one entry key (or child key) of a manifest. An
// accepted path is relative, POSIX, already clean and inside the workspace:
// not empty, no leading '/', no '\', no empty, '.' or '..' components, no
// control characters, valid UTF-8, components of at most 255 bytes and at
// most 4096 bytes in all. Keys are compared exactly, so rejecting every
// non-canonical spelling means two keys that name the same file are always
// equal strings.
func ValidateEntryPath(p string) error {
	if err := checkPathText(p); err != nil {
		return err
	}
	if p[0] == '/' {
		return errors.New("must be relative to the workspace root, not absolute")
	}
	if hasDriveLetter(p) {
		return errors.New("looks like a Windows absolute path; entry paths are relative POSIX paths")
	}
	return checkComponents(p)
}

// checkPathText applies the rules shared by every path: non-empty, bounded,
// UTF-8, no control characters, no backslashes.
func checkPathText(p string) error {
	switch {
	case p == "":
		return errors.New("empty path")
	case len(p) > maxPathBytes:
		return fmt.Errorf("path is longer than %d bytes", maxPathBytes)
	case !utf8.ValidString(p):
		return errors.New("path is not valid UTF-8")
	case hasControl(p):
		return errors.New("path contains a control character")
	case strings.IndexByte(p, '\\') >= 0:
		return errors.New(`path contains a backslash; separate components with "/"`)
	}
	return nil
}

func checkComponents(p string) error {
	for c := range strings.SplitSeq(p, "/") {
		switch {
		case c == "":
			return errors.New(`path has an empty component ("//", or a leading or trailing "/")`)
		case c == ".":
			return errors.New(`path has a "." component`)
		case c == "..":
			return errors.New(`path has a ".." component; entries cannot leave the workspace`)
		case len(c) > maxComponentBytes:
			return fmt.Errorf("path component is longer than %d bytes", maxComponentBytes)
		}
	}
	return nil
}

func hasDriveLetter(p string) bool {
	return len(p) >= 2 && p[1] == ':' && (p[0]|0x20 >= 'a' && p[0]|0x20 <= 'z') && (len(p) == 2 || p[2] == '/')
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029' {
			return true
		}
	}
	return false
}

// checkAbsPath checks an absolute sandbox path (root, grant, home, shell):
// it must be absolute and already clean.
func checkAbsPath(p string) error {
	if err := checkPathText(p); err != nil {
		return err
	}
	if p[0] != '/' {
		return errors.New("must be an absolute path")
	}
	if c := path.Clean(p); c != p {
		return fmt.Errorf("must be a clean path (%q)", c)
	}
	return nil
}

// checkHostSrc checks the src of a local_file/local_dir entry: a relative
// path below the trusted base directory ("." is the base directory itself,
// for a local_dir), or an absolute clean path, which the harness reads only
// when it lies in one of the application's host grants (checked when the
// manifest is materialized: a manifest cannot grant itself host access).
func checkHostSrc(src string, dir bool) error {
	if dir && src == "." {
		return nil
	}
	if err := checkPathText(src); err != nil {
		return err
	}
	if hasDriveLetter(src) {
		return errors.New("must be a POSIX path relative to the trusted base directory, or absolute")
	}
	if src[0] == '/' {
		if src == "/" {
			return errors.New("must not be the file system root")
		}
		return checkComponents(src[1:])
	}
	return checkComponents(src)
}

// checkSubPath checks a relative path inside something else (a git subpath,
// a bucket prefix). Empty is allowed; one trailing '/' is tolerated.
func checkSubPath(p string) error {
	if p == "" {
		return nil
	}
	p = strings.TrimSuffix(p, "/")
	if err := checkPathText(p); err != nil {
		return err
	}
	if p[0] == '/' || hasDriveLetter(p) {
		return errors.New("must be relative, not absolute")
	}
	return checkComponents(p)
}

// isUnder reports whether p equals dir or lies below it (both clean absolute
// or both clean relative).
func isUnder(p, dir string) bool {
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// checkAccountName checks a user or group name: POSIX portable characters
// (letters, digits, '.', '_', '-'), not starting with '-', at most 32 bytes,
// and not all digits (that would read as a numeric id).
func checkAccountName(s string) error {
	if s == "" {
		return errors.New("empty name")
	}
	if len(s) > maxNameBytes {
		return fmt.Errorf("name is longer than %d bytes", maxNameBytes)
	}
	if s[0] == '-' {
		return errors.New(`name must not start with "-"`)
	}
	if s == "." || s == ".." {
		return fmt.Errorf("%q is not a valid name", s)
	}
	digits := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isPortable(c) {
			return fmt.Errorf("name contains %q; use letters, digits, '.', '_' and '-'", c)
		}
		if c < '0' || c > '9' {
			digits = false
		}
	}
	if digits {
		return errors.New("name must not be all digits")
	}
	return nil
}

func isPortable(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// checkEnvName checks an environment variable name: a letter or '_'
// followed by letters, digits or '_'.
func checkEnvName(s string) error {
	if s == "" {
		return errors.New("empty variable name")
	}
	if len(s) > maxEnvNameBytes {
		return fmt.Errorf("variable name is longer than %d bytes", maxEnvNameBytes)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9'
		if !ok {
			return errors.New("variable names are a letter or '_' followed by letters, digits or '_'")
		}
	}
	return nil
}

// checkSecretName checks the name of a secret reference: letters, digits
// and "._/-", starting with a letter, digit or '_'.
func checkSecretName(s string) error {
	if s == "" {
		return errors.New("empty secret name")
	}
	if len(s) > maxSecretBytes {
		return fmt.Errorf("secret name is longer than %d bytes", maxSecretBytes)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		first := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !first && (i == 0 || (c != '.' && c != '-' && c != '/')) {
			return fmt.Errorf("secret name contains %q at byte %d; use letters, digits and '._/-'", c, i)
		}
	}
	return nil
}

// checkText checks free text (descriptions): UTF-8 and bounded. Newlines
// are allowed; the tree renderer flattens them.
func checkText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("text is not valid UTF-8")
	}
	if len(s) > maxTextBytes {
		return fmt.Errorf("text is longer than %d bytes", maxTextBytes)
	}
	return nil
}

// checkGitHost checks a host name with an optional port: no scheme, no user
// information, no path. A trusted manifest may name an IP address written
// as a DNS name would be (digits and dots) and any port; an untrusted one
// goes through ValidateGitHostName as well.
func checkGitHost(h string) error {
	name, port, hasPort := strings.Cut(h, ":")
	if hasPort {
		n, err := strconv.Atoi(port)
		if err != nil || strings.Trim(port, "0123456789") != "" || n < 1 || n > 65535 {
			return errors.New("port must be a number in 1-65535")
		}
	}
	if name == "" || len(name) > 253 {
		return errors.New("host must be a DNS name such as github.com, without scheme or path")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("host must be a DNS name such as github.com, without scheme or path")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return errors.New("host must be a DNS name such as github.com, without scheme, user or path")
			}
		}
	}
	return nil
}

// ValidateGitHostName checks a git host as untrusted manifests and the
// operator's allow list of git hosts (harness serve --git-host) must write
// it: a DNS name such as github.com, with no port and no scheme, user or
// path, that is not an IP address in any spelling (127.0.0.1, or a name
// whose last label is numeric or hexadecimal, such as 127.1 or 0x7f.1,
// which resolvers read as an address). Case is not significant.
//
// Ports are refused rather than checked: the harness fetches the git hosts
// of untrusted manifests over https on port 443 only, so that a name on the
// allow list cannot point the harness at another service of that host.
func ValidateGitHostName(h string) error {
	// An IPv6 literal, bracketed or not, with a port or not.
	literal := h
	if rest, ok := strings.CutPrefix(h, "["); ok {
		literal, _, _ = strings.Cut(rest, "]")
	}
	if _, err := netip.ParseAddr(literal); err == nil {
		return errGitHostIP()
	}
	if err := checkGitHost(h); err != nil {
		return err
	}
	name, _, hasPort := strings.Cut(h, ":")
	if isNumericHost(name) {
		return errGitHostIP()
	}
	if hasPort {
		return errors.New("git host must not carry a port: git repositories of untrusted manifests are fetched over https on port 443")
	}
	return nil
}

// errGitHostIP refuses a git host given as an address.
func errGitHostIP() error {
	return errors.New("git host must be a DNS name such as github.com, not an IP address")
}

// isNumericHost reports whether a name that passed checkGitHost would be
// read as an IPv4 address by some resolver: its last label is all digits,
// or hexadecimal with a 0x prefix (inet_aton accepts 127.1, 2130706433 and
// 0x7f.0.0.1).
func isNumericHost(name string) bool {
	last := strings.ToLower(name[strings.LastIndexByte(name, '.')+1:])
	return strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x")
}

// checkGitRepoPath checks "owner/name" (or deeper, for hosts with nested
// groups).
func checkGitRepoPath(r string) error {
	if r == "" {
		return errors.New("required")
	}
	if len(r) > 512 {
		return errors.New("repository path is too long")
	}
	if strings.HasSuffix(r, ".git") {
		return errors.New(`write the repository without the ".git" suffix`)
	}
	parts := strings.Split(r, "/")
	if len(parts) < 2 {
		return errors.New(`repository must be "owner/name"`)
	}
	for _, p := range parts {
		if p == "" || p == "." || p == ".." || p[0] == '-' {
			return errors.New(`repository must be "owner/name" with non-empty segments`)
		}
		for i := 0; i < len(p); i++ {
			if !isPortable(p[i]) {
				return fmt.Errorf("repository contains %q; use letters, digits, '.', '_' and '-'", p[i])
			}
		}
	}
	return nil
}

// checkGitRef checks a branch, tag or commit id with git's ref-name rules
// (a subset: what would confuse git or a shell is refused).
func checkGitRef(r string) error {
	switch {
	case r == "":
		return errors.New("required")
	case len(r) > 256:
		return errors.New("ref is longer than 256 bytes")
	case !utf8.ValidString(r):
		return errors.New("ref is not valid UTF-8")
	case r[0] == '-' || r[0] == '/' || strings.HasSuffix(r, "/") || strings.HasSuffix(r, ".") || strings.HasSuffix(r, ".lock"):
		return errors.New("not a valid git ref")
	case strings.Contains(r, "..") || strings.Contains(r, "@{") || strings.Contains(r, "//") || r == "@":
		return errors.New("not a valid git ref")
	}
	for _, c := range r {
		if c <= ' ' || c == 0x7f || strings.ContainsRune("~^:?*[\\", c) {
			return fmt.Errorf("ref contains %q, which git refs cannot", c)
		}
	}
	return nil
}

// checkEndpoint checks a storage endpoint URL: http or https, a host, no
// user information, query or fragment.
func checkEndpoint(s string) error {
	if hasControl(s) || !utf8.ValidString(s) {
		return errors.New("endpoint contains invalid characters")
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("endpoint is not a URL")
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return errors.New("endpoint must be an http or https URL")
	case u.Host == "":
		return errors.New("endpoint has no host")
	case u.User != nil:
		return errors.New("endpoint must not carry user information; use credentials")
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return errors.New("endpoint must not have a query or fragment")
	}
	return nil
}

// checkToken checks a short identifier (bucket, container, account, region):
// non-empty, bounded, no '/', whitespace or control characters.
func checkToken(s string, max int) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > max {
		return fmt.Errorf("longer than %d bytes", max)
	}
	if !utf8.ValidString(s) || hasControl(s) || strings.ContainsAny(s, "/\\ \t") {
		return errors.New("must not contain '/', '\\', spaces or control characters")
	}
	return nil
}

// checkAWSID checks an AWS resource id of the documented shape: prefix
// ("fs-" for a file system, "fsap-" for an access point) and 8 to 40
// lowercase hexadecimal digits.
func checkAWSID(s, prefix string) error {
	hex, ok := strings.CutPrefix(s, prefix)
	if !ok || len(hex) < 8 || len(hex) > 40 || strings.Trim(hex, "0123456789abcdef") != "" {
		return fmt.Errorf("must be %q followed by 8 to 40 lowercase hexadecimal digits, such as %s0123456789abcdef0", prefix, prefix)
	}
	return nil
}

// checkFileSystemPath checks a directory inside a network file system (the
// subpath of an s3_files_mount): absolute inside that file system, as in
// the NFS source "fs-...:/path", and clean ("/" is its root).
func checkFileSystemPath(p string) error {
	if err := checkPathText(p); err != nil {
		return err
	}
	if p[0] != '/' {
		return errors.New(`must be absolute inside the file system, such as "/" or "/data/in"`)
	}
	if c := path.Clean(p); c != p {
		return fmt.Errorf("must be a clean path (%q)", c)
	}
	if p == "/" {
		return nil
	}
	return checkComponents(p[1:])
}

// checkMountTargetIP checks the address of a mount target: a plain IPv4 or
// IPv6 address (no zone, no port) that can be a host's.
func checkMountTargetIP(s string) error {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return errors.New("must be an IPv4 or IPv6 address, without a port")
	case a.Zone() != "":
		return errors.New("must not carry an IPv6 zone")
	case a.IsUnspecified() || a.IsMulticast():
		return errors.New("must be the address of a host (not unspecified or multicast)")
	}
	return nil
}

// checkMountOption checks one extra mount option: "name" or "name=value",
// the name of letters, digits and '_' or '-', the value of letters, digits
// and "_-.:/+" (no ',' that would add another option, no spaces).
func checkMountOption(o string) error {
	name, value, hasValue := strings.Cut(o, "=")
	isName := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-'
	}
	isValue := func(r rune) bool { return isName(r) || strings.ContainsRune(".:/+", r) }
	switch {
	case len(o) > 256:
		return errors.New("longer than 256 bytes")
	case name == "" || name[0] == '-' || strings.IndexFunc(name, func(r rune) bool { return !isName(r) }) >= 0:
		return errors.New(`must be "name" or "name=value", the name made of letters, digits, '_' and '-'`)
	case hasValue && (value == "" || strings.IndexFunc(value, func(r rune) bool { return !isValue(r) }) >= 0):
		return errors.New(`the value must be non-empty and made of letters, digits and "_-.:/+" (no ',' or spaces)`)
	}
	return nil
}
