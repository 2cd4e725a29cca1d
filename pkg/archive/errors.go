package archive

import (
	"errors"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Operation names used in *errkind.PathError values.
const (
	opArchive     = "archive"
	opRestore     = "restore"
	opFingerprint = "fingerprint"
)

// streamName is the Path of a restore error that concerns the stream as a
// whole rather than one member (garbage before the first header, a missing
// end-of-archive marker, ...).
const streamName = "(archive)"

// maxShownName bounds how much of a member name an error repeats.
const maxShownName = 200

// classify maps err to one wrapping a compute sentinel (see
// errkind.ClassifyFS: host paths are dropped, the errno survives).
func classify(err error) error { return errkind.ClassifyFS(err) }

// pathErr returns a *errkind.PathError for name with err classified. A nil
// err stays nil; an error that already is a *errkind.PathError is kept.
func pathErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	var pe *errkind.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &errkind.PathError{Op: op, Path: name, Err: classify(err)}
}

// refuse returns a *errkind.PathError for name wrapping sentinel with a
// reason.
func refuse(op, name string, sentinel error, format string, args ...any) error {
	return &errkind.PathError{Op: op, Path: name, Err: errkind.Errorf(sentinel, format, args...)}
}

// shown renders an untrusted name for an error message: names that are
// valid UTF-8 without control characters are kept as they are, others are
// quoted; very long names are cut.
func shown(name string) string {
	plain := utf8.ValidString(name)
	for _, r := range name {
		if !plain || unicode.IsControl(r) {
			plain = false
			break
		}
	}
	cut := len(name) > maxShownName
	if cut {
		name = name[:maxShownName]
	}
	if plain {
		for !utf8.ValidString(name) { // a cut inside a rune
			name = name[:len(name)-1]
		}
	} else {
		name = strconv.Quote(name)
		name = name[1 : len(name)-1]
	}
	if cut {
		name += "..."
	}
	return name
}
