package patch

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Values of Error.Op.
const (
	OpNameParse  = "parse"  // the patch text or an operation is malformed
	OpNameAdd    = "add"    // an Add File operation
	OpNameDelete = "delete" // a Delete File operation
	OpNameUpdate = "update" // an Update File operation
	OpNameMove   = "move"   // the destination of an Update File with Move to
)

// Error is the error Parse, FromOperations, ParseOperationsJSON and Plan
// return. Its Error text is written for the model that wrote the patch: it
// names the file, quotes what did not match and shows the closest part of the
// current file, so that a corrected patch can be written. It only ever names
// paths written in the patch.
//
// Err is the class of failure, one of:
//   - errkind.ErrInvalidArgument: the patch is malformed (syntax, bad
//     operation, empty patch); nothing was read;
//   - errkind.ErrPatchRejected: the patch is well formed but does not apply
//     to the current files (context not found, file missing, directory in
//     the way, file not UTF-8, a Source read failed);
//   - errkind.ErrResourceExhausted: a limit in Options was exceeded.
//
// Cause, when set, is the more specific reason: errkind.ErrNotFound,
// errkind.ErrIsDirectory or errkind.ErrNotDirectory, or the error a Source
// returned, kept whole (so errors.Is finds e.g. errkind.ErrPathEscape in it).
// errors.Is matches both Err and Cause; callers that map errors to status
// codes should test the specific causes they care about before the class.
type Error struct {
	Op   string // one of the OpName constants
	Path string // the file concerned, as written in the patch; empty for envelope errors
	// Line is the 1-based line of the patch text (or of the operation's
	// diff) the error refers to; 0 when it refers to no line.
	Line int
	// Hunk is the 1-based index of the failing hunk within its update; 0
	// when the error is not about one hunk.
	Hunk   int
	Reason string // one-line description, without the path
	// Context holds the lines that were searched for and not found: the
	// hunk's context and removed lines, or the one anchor text. At most
	// maxErrorLines are kept.
	Context []string
	// Closest is the region of the current file that agrees best with
	// Context, or nil when nothing comes close.
	Closest *Region
	Err     error // class sentinel, see above
	Cause   error // specific cause, may be nil
}

// Region is a run of lines of a current file.
type Region struct {
	StartLine int      // 1-based number of Lines[0] in the file
	Lines     []string // the file's text of those lines, without line endings
	// Agree is how many of the searched-for lines equal the line at the same
	// offset here once surrounding whitespace is ignored.
	Agree int
	// Compared is how many searched-for lines Agree was counted over.
	Compared int
}

// Bounds on what an error quotes, so one bad hunk cannot produce a huge
// message.
const (
	maxErrorLines     = 20   // lines kept in Context and Region.Lines and quoted per block
	maxQuoteBytes     = 2000 // bytes quoted per block
	maxQuoteLineBytes = 200  // bytes quoted per line
)

// Error renders the failure for a person or a model.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.classText())
	b.WriteString(": ")
	what := e.Op + " " + e.Path
	if e.Op == OpNameParse {
		what = "file " + e.Path
	}
	switch {
	case e.Line > 0 && e.Path != "":
		fmt.Fprintf(&b, "line %d (%s): ", e.Line, what)
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	case e.Path != "":
		fmt.Fprintf(&b, "%s: ", what)
	}
	b.WriteString(e.Reason)
	if e.Cause != nil && !isOwnCause(e.Cause) {
		b.WriteString(": ")
		b.WriteString(describeCause(e.Cause))
	}
	if len(e.Context) > 0 {
		b.WriteString("\nthe patch's lines that were searched for (without their ' ', '-' or '@@ ' prefix):")
		quoteLines(&b, e.Context, 0)
	}
	if r := e.Closest; r != nil && len(r.Lines) > 0 {
		fmt.Fprintf(&b, "\nclosest match in %s starts at line %d", e.Path, r.StartLine)
		if r.Compared > 0 {
			fmt.Fprintf(&b, " (%d of %d non-blank lines agree when surrounding whitespace is ignored)", r.Agree, r.Compared)
		}
		b.WriteString("; the file there reads:")
		quoteLines(&b, r.Lines, r.StartLine)
	}
	return b.String()
}

// Unwrap returns the class sentinel and, when set, the specific cause.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cause}
}

func (e *Error) classText() string {
	switch {
	case errors.Is(e.Err, errkind.ErrInvalidArgument):
		return "invalid patch"
	case errors.Is(e.Err, errkind.ErrResourceExhausted):
		return "patch exceeds a limit"
	default:
		return "patch rejected"
	}
}

// isOwnCause reports whether cause is one of the sentinels this package sets
// itself; their meaning is already in Reason.
func isOwnCause(cause error) bool {
	return cause == errkind.ErrNotFound || cause == errkind.ErrIsDirectory || cause == errkind.ErrNotDirectory
}

// describeCause names a Source error by the sentinel it carries, never by
// its own text, which may contain host paths the model must not see.
func describeCause(err error) string {
	known := [...]error{
		errkind.ErrNotFound, errkind.ErrIsDirectory, errkind.ErrNotDirectory,
		errkind.ErrPathEscape, errkind.ErrPermissionDenied, errkind.ErrReadOnly,
		errkind.ErrNoSpace, errkind.ErrResourceExhausted, errkind.ErrUnavailable,
		errkind.ErrCanceled, errkind.ErrDeadlineExceeded,
	}
	for _, s := range known {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errkind.ErrNotFound.Error()
	case errors.Is(err, fs.ErrPermission):
		return errkind.ErrPermissionDenied.Error()
	}
	return "the file could not be read"
}

// quoteLines writes lines, each on a new line and indented, numbered from
// first when first > 0, and bounded by maxErrorLines, maxQuoteBytes and
// maxQuoteLineBytes.
func quoteLines(b *strings.Builder, lines []string, first int) {
	written := 0
	for i, l := range lines {
		if i == maxErrorLines || written >= maxQuoteBytes {
			fmt.Fprintf(b, "\n    ... (%d more lines)", len(lines)-i)
			return
		}
		text := printable(l)
		if first > 0 {
			fmt.Fprintf(b, "\n%6d | %s", first+i, text)
		} else {
			fmt.Fprintf(b, "\n    %s", text)
		}
		written += len(text)
	}
}

// printable shortens a line to maxQuoteLineBytes (on a rune boundary) and
// escapes control characters other than tab.
func printable(s string) string {
	cut := false
	if len(s) > maxQuoteLineBytes {
		n := maxQuoteLineBytes
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s, cut = s[:n], true
	}
	if strings.IndexFunc(s, isEscaped) >= 0 {
		var b strings.Builder
		for _, r := range s {
			if isEscaped(r) {
				b.WriteString(strings.Trim(strconv.QuoteRune(r), "'"))
			} else {
				b.WriteRune(r)
			}
		}
		s = b.String()
	}
	if cut {
		s += " ..."
	}
	return s
}

func isEscaped(r rune) bool {
	return r != '\t' && (r < 0x20 || r == 0x7f)
}

// keepLines copies at most maxErrorLines of lines.
func keepLines(lines []string) []string {
	if len(lines) > maxErrorLines {
		lines = lines[:maxErrorLines]
	}
	return append([]string(nil), lines...)
}

// syntaxError reports malformed patch text at a line, optionally within op.
func syntaxError(line int, op *FileOp, format string, args ...any) *Error {
	e := &Error{Op: OpNameParse, Line: line, Reason: fmt.Sprintf(format, args...), Err: errkind.ErrInvalidArgument}
	if op != nil {
		e.Path = op.Path
	}
	return e
}

// limitError reports an exceeded Options limit.
func limitError(op, path, format string, args ...any) *Error {
	return &Error{Op: op, Path: path, Reason: fmt.Sprintf(format, args...), Err: errkind.ErrResourceExhausted}
}

// rejection reports a well-formed operation that does not apply.
func rejection(op, path string, cause error, format string, args ...any) *Error {
	return &Error{Op: op, Path: path, Reason: fmt.Sprintf(format, args...), Err: errkind.ErrPatchRejected, Cause: cause}
}

// asError returns err as an *Error, wrapping it as a syntax error if it is
// not one already.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Op: OpNameParse, Reason: err.Error(), Err: errkind.ErrInvalidArgument}
}
