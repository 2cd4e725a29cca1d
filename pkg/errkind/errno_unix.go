//go:build unix

package errkind

import "syscall"

// ErrnoSentinel returns the sentinel for a system error number, so every
// layer that touches the filesystem classifies errno values the same way.
// Errors without a better match are ErrInternal.
func ErrnoSentinel(errno syscall.Errno) error {
	switch errno {
	case syscall.ENOENT:
		return ErrNotFound
	case syscall.ENOTDIR:
		return ErrNotDirectory
	case syscall.EISDIR:
		return ErrIsDirectory
	case syscall.EACCES, syscall.EPERM:
		return ErrPermissionDenied
	case syscall.EROFS:
		return ErrReadOnly
	case syscall.ENOSPC, syscall.EDQUOT:
		return ErrNoSpace
	case syscall.EEXIST:
		return ErrAlreadyExists
	case syscall.ENOTEMPTY:
		return ErrNotEmpty
	case syscall.ELOOP:
		// Confined resolution refuses symlinks it may not follow with ELOOP.
		return ErrPathEscape
	case syscall.ENAMETOOLONG, syscall.EINVAL, syscall.EXDEV, syscall.ENXIO, syscall.ENODEV:
		return ErrInvalidArgument
	case syscall.EFBIG, syscall.EMLINK, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM:
		return ErrResourceExhausted
	case syscall.EBUSY, syscall.ETXTBSY:
		return ErrFailedPrecondition
	case syscall.EINTR, syscall.EAGAIN:
		return ErrUnavailable
	default:
		return ErrInternal
	}
}
