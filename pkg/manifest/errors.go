package manifest

import (
	"errors"
	"strconv"
	"strings"
)

// Sentinel kinds carried by every FieldError. Test with errors.Is on the
// error returned by a Load function or by Validate.
var (
	// ErrSyntax marks a document that could not be read: bad YAML or JSON,
	// an unknown field, a value of the wrong type, a duplicate key.
	ErrSyntax = errors.New("manifest syntax error")
	// ErrInvalid marks a well-formed manifest that breaks a rule (a bad
	// path, a duplicate entry, an unknown group, ...).
	ErrInvalid = errors.New("invalid manifest")
	// ErrUntrusted marks something an untrusted manifest may not ask for
	// (host sources, path grants, secrets, mounts, another root) unless the
	// application allowed it in UntrustedOptions.
	ErrUntrusted = errors.New("not allowed in an untrusted manifest")
	// ErrTooLarge marks a manifest over one of the Limits.
	ErrTooLarge = errors.New("manifest too large")
)

// FieldError is one problem with a manifest, located by the path of the
// offending field, written the way a reader finds it in the document:
// entries["src/app.py"].permissions, users[1].uid, environment["TOKEN"].secret.
// Values of secrets, environment variables and file contents never appear in
// the message.
type FieldError struct {
	// Path of the field; empty for a problem with the document as a whole.
	Path string
	// Line in the source document (1-based), 0 when unknown (for example for
	// a manifest built in Go).
	Line int
	// Msg says what is wrong.
	Msg string
	// Kind is one of ErrSyntax, ErrInvalid, ErrUntrusted, ErrTooLarge.
	Kind error
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Line > 0 {
		b.WriteString(" (line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns the problem's kind, so errors.Is(err, ErrUntrusted) works.
func (e *FieldError) Unwrap() error { return e.Kind }

// ValidationError holds every problem found in one pass over a manifest:
// the loaders and Validate report all of them at once, not only the first.
type ValidationError struct {
	Problems []*FieldError
}

func (e *ValidationError) Error() string {
	if len(e.Problems) == 1 {
		return "manifest: " + e.Problems[0].Error()
	}
	var b strings.Builder
	b.WriteString("manifest: ")
	b.WriteString(strconv.Itoa(len(e.Problems)))
	b.WriteString(" problems:")
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Unwrap exposes each problem to errors.Is and errors.As.
func (e *ValidationError) Unwrap() []error {
	out := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p
	}
	return out
}

// problems accumulates FieldErrors during decoding and validation.
type problems struct {
	list []*FieldError
}

func (p *problems) add(kind error, path string, line int, msg string) {
	p.list = append(p.list, &FieldError{Path: path, Line: line, Msg: msg, Kind: kind})
}

func (p *problems) invalid(path, msg string) { p.add(ErrInvalid, path, 0, msg) }

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	return &ValidationError{Problems: p.list}
}

// Field path helpers. The top level has no prefix.

func fieldPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func keyPath(parent, key string) string {
	return parent + "[" + strconv.Quote(key) + "]"
}

func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}
