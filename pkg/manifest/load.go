package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Limits bound the size of an untrusted manifest. A zero field takes its
// default from DefaultLimits.
type Limits struct {
	// MaxDocumentBytes bounds the YAML or JSON text.
	MaxDocumentBytes int
	// MaxEntries bounds the number of entries, dir children included.
	MaxEntries int
	// MaxContentBytes bounds the sum of inline file contents.
	MaxContentBytes int64
}

// DefaultLimits returns the limits used for untrusted manifests unless the
// application sets others: 4 MiB of text, 10,000 entries, 4 MiB of inline
// content.
func DefaultLimits() Limits {
	return Limits{MaxDocumentBytes: 4 << 20, MaxEntries: 10_000, MaxContentBytes: 4 << 20}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxDocumentBytes <= 0 {
		l.MaxDocumentBytes = d.MaxDocumentBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	if l.MaxContentBytes <= 0 {
		l.MaxContentBytes = d.MaxContentBytes
	}
	return l
}

// CheckLimits reports (as a *ValidationError of kind ErrTooLarge) whether m
// has more entries or inline content than l allows. Zero fields of l take
// their defaults.
func (m *Manifest) CheckLimits(l Limits) error {
	var p problems
	m.checkLimits(&p, l.withDefaults())
	return p.err()
}

func (m *Manifest) checkLimits(p *problems, l Limits) {
	count := 0
	var content int64
	walkAll(m.Entries, "entries", "", func(_, _ string, e *Entry) {
		count++
		if e != nil {
			content += int64(len(e.Content))
		}
	})
	if count > l.MaxEntries {
		p.add(ErrTooLarge, "entries", 0, fmt.Sprintf("%d entries; the limit is %d", count, l.MaxEntries))
	}
	if content > l.MaxContentBytes {
		p.add(ErrTooLarge, "entries", 0, fmt.Sprintf("%d bytes of inline file content; the limit is %d", content, l.MaxContentBytes))
	}
}

// UntrustedOptions says what an untrusted manifest may ask for. The zero
// value allows none of it.
type UntrustedOptions struct {
	// AllowHostSources permits local_file and local_dir entries, which make
	// the harness read files below its trusted base directory.
	AllowHostSources bool
	// AllowGrants permits extra_path_grants.
	AllowGrants bool
	// AllowMounts permits mount entries (which a provider may serve with
	// ambient cloud credentials).
	AllowMounts bool
	// AllowedSecrets lists the secret names the manifest may reference (in
	// environment, git tokens, mount credentials). Any other reference is
	// refused, so that a manifest cannot pull an arbitrary harness secret
	// into the sandbox.
	AllowedSecrets []string
	// Root is the only workspace root the manifest may name; "" means
	// DefaultRoot.
	Root string
	// Limits bound the manifest's size; zero fields take DefaultLimits.
	Limits Limits
}

// LoadTrusted reads a manifest written by the application (its own
// configuration): strict decoding, then Validate. Everything the format can
// express is allowed. Problems come back together in a *ValidationError.
func LoadTrusted(data []byte, f Format) (*Manifest, error) {
	n, ferr := parseDocument(data, f)
	if ferr != nil {
		return nil, &ValidationError{Problems: []*FieldError{ferr}}
	}
	return finishTrusted(n)
}

func finishTrusted(n *node) (*Manifest, error) {
	var p problems
	m := decodeManifest(n, &p)
	if err := p.err(); err != nil {
		return nil, err
	}
	m.validate(&p)
	if len(p.list) > 0 {
		indexLines(n).attach(&p)
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return m, nil
}

// LoadTrustedFile reads a trusted manifest from a file; the format follows
// the extension (.json, .yaml, .yml), otherwise it is detected.
func LoadTrustedFile(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	f := FormatAuto
	switch strings.ToLower(filepath.Ext(path)) {
	case ".json":
		f = FormatJSON
	case ".yaml", ".yml":
		f = FormatYAML
	}
	m, err := LoadTrusted(data, f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// LoadUntrusted reads a manifest from a source the application does not
// control (written by a model, uploaded by a user): the size limits are
// checked first, then strict decoding, Validate, the limits on entries, and
// the trust rules. Unless opts allows them, it refuses host sources
// (local_file, local_dir), extra path grants, mounts, secret references
// (environment secrets, git tokens, mount credentials), a workspace root other
// than the expected one, run_as root, and a git host given as an IP address
// or with a port (an untrusted manifest names git hosts by DNS name only;
// which names the harness fetches from is its operator's choice, checked
// when it fetches). All problems come back together in a *ValidationError;
// trust problems are of kind ErrUntrusted.
func LoadUntrusted(data []byte, f Format, opts UntrustedOptions) (*Manifest, error) {
	lim := opts.Limits.withDefaults()
	if len(data) > lim.MaxDocumentBytes {
		var p problems
		p.add(ErrTooLarge, "", 0, fmt.Sprintf("the document is %d bytes; the limit is %d", len(data), lim.MaxDocumentBytes))
		return nil, p.err()
	}
	n, ferr := parseDocument(data, f)
	if ferr != nil {
		return nil, &ValidationError{Problems: []*FieldError{ferr}}
	}
	var p problems
	m := decodeManifest(n, &p)
	if err := p.err(); err != nil {
		return nil, err
	}
	m.validate(&p)
	m.checkLimits(&p, lim)
	m.checkTrust(&p, opts)
	if len(p.list) > 0 {
		indexLines(n).attach(&p)
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return m, nil
}

// CheckUntrusted applies LoadUntrusted's trust rules and limits to a
// manifest obtained some other way (built from model output in Go, say),
// together with Validate.
func (m *Manifest) CheckUntrusted(opts UntrustedOptions) error {
	var p problems
	m.validate(&p)
	m.checkLimits(&p, opts.Limits.withDefaults())
	m.checkTrust(&p, opts)
	return p.err()
}

func (m *Manifest) checkTrust(p *problems, opts UntrustedOptions) {
	deny := func(path, msg string) { p.add(ErrUntrusted, path, 0, msg) }
	want := opts.Root
	if want == "" {
		want = DefaultRoot
	}
	if m.WorkspaceRoot() != want {
		deny("root", fmt.Sprintf("an untrusted manifest cannot move the workspace root (expected %q)", want))
	}
	if m.RunAs == "root" {
		deny("run_as", "an untrusted manifest cannot run as root")
	}
	if len(m.ExtraPathGrants) > 0 && !opts.AllowGrants {
		deny("extra_path_grants", "path grants are not allowed in an untrusted manifest")
	}
	walkAll(m.Entries, "entries", "", func(fp, _ string, e *Entry) {
		switch {
		case e == nil:
		case e.Type.IsHostSource() && !opts.AllowHostSources:
			deny(fp, fmt.Sprintf("%s entries read files of the harness host and are not allowed in an untrusted manifest", e.Type))
		case e.Type.IsMount() && !opts.AllowMounts:
			deny(fp, fmt.Sprintf("%s entries are not allowed in an untrusted manifest", e.Type))
		case e.Type == TypeGitRepo && e.Git != nil && e.Git.Host != "":
			// Validate checked the host's shape; an untrusted manifest must
			// also name it, not give an address or a port to connect to.
			if err := ValidateGitHostName(e.Git.Host); err != nil && checkGitHost(e.Git.Host) == nil {
				deny(fieldPath(fp, "host"), err.Error()+" (in an untrusted manifest)")
			}
		}
	})
	for _, s := range m.secretSites() {
		if slices.Contains(opts.AllowedSecrets, s.ref.Name) {
			continue
		}
		switch s.kind {
		case "git":
			deny(s.path, fmt.Sprintf("git credentials (secret %q) are not allowed in an untrusted manifest", s.ref.Name))
		default:
			deny(s.path, fmt.Sprintf("secret %q is not allowed in an untrusted manifest", s.ref.Name))
		}
	}
}
