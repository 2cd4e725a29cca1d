// Package workspace is the sandbox daemon's confined view of the filesystem:
// the workspace root plus the grants the harness configured, and the file
// operations FileService and apply_patch are built on.
//
// Every path the daemon accepts goes through one resolver (Workspace.Resolve):
// a path is workspace-relative, absolute inside the workspace root, or
// absolute inside a grant. ".." that stays inside is normalised lexically;
// anything that leaves is refused with compute.ErrPathEscape before anything
// is touched. Symbolic links are followed the way the kernel would follow them
// (relative targets from the link's directory, absolute targets in the
// sandbox's namespace) but only through the workspace and the grants; a link
// that leads anywhere else is an escape.
//
// Resolution decides which name an operation uses; confinement does not
// depend on it. Every filesystem access goes through an os.Root opened on the
// workspace or grant directory, or through a directory descriptor obtained
// from one and a single final name (openat/renameat/unlinkat with
// AT_SYMLINK_NOFOLLOW semantics). A directory swapped for a symlink between
// resolution and use therefore cannot lead outside: the os.Root refuses it.
//
// Operations may run as a run_as user (*userdb.User). They then execute on a
// dedicated, locked OS thread whose filesystem credentials (supplementary
// groups, fsgid, fsuid) are switched with raw per-thread system calls; the
// thread is never unlocked, so the Go runtime discards it when the operation
// ends. See runAs.
//
// Writes are atomic: content goes to a temporary file (TempPrefix) in the
// target's directory, is fsynced and checked, and is then renamed over the
// target. Commit applies an ordered list of changes all-or-nothing with
// respect to errors, keeping backups until it succeeds.
//
// The package is Linux-only: it relies on O_PATH, renameat2 and per-thread
// filesystem credentials.
//
// All errors are *compute.PathError values whose Path is the path as the
// caller gave it, wrapping a compute sentinel (and the errno, when there is
// one). No host path beyond that ever appears in an error.
package workspace
