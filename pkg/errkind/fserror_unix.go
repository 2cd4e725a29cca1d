//go:build unix

package errkind

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// rootEscapeText is the text os.Root uses when a path leaves the root; the
// standard library exports no sentinel for it.
const rootEscapeText = "path escapes from parent"

// ClassifyFS maps an error from the filesystem (or from a context) to one
// wrapping a sentinel; errors already classified are returned unchanged.
// The errno survives for errors.Is; host paths carried by *fs.PathError and
// *os.LinkError never reach the message.
func ClassifyFS(err error) error {
	if err == nil || Classified(err) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %w", ErrCanceled, context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", ErrDeadlineExceeded, context.DeadlineExceeded)
	case isRootEscape(err):
		return fmt.Errorf("%w: the path leads outside its root", ErrPathEscape)
	case errors.Is(err, os.ErrClosed), errors.Is(err, fs.ErrClosed):
		return fmt.Errorf("%w: the root was closed", ErrFailedPrecondition)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return fmt.Errorf("%w (%w)", ErrnoSentinel(errno), errno)
	}
	var pe *fs.PathError
	var le *os.LinkError
	if errors.As(err, &pe) || errors.As(err, &le) {
		return fmt.Errorf("%w: unexpected filesystem failure", ErrInternal)
	}
	return fmt.Errorf("%w: %w", ErrInternal, err)
}

func isRootEscape(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == rootEscapeText {
			return true
		}
	}
	return false
}
