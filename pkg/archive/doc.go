// Package archive snapshots and restores a sandbox workspace: Write streams
// the workspace tree as a deterministic tar archive (zstd-compressed by
// default), Restore replaces the workspace with the contents of such an
// archive safely and atomically, and Fingerprint hashes the tree so that an
// unchanged workspace can skip a restore.
//
// The package is a pure engine over a directory tree, like pkg/patch: it
// knows nothing of the daemon (no workspace confinement, no accounts; owner
// names come in as lookups), so the daemon (pkg/agentd wraps it for
// the Archive, Restore and Fingerprint RPCs) and the harness (which restores
// exported workspaces on the host) share it without either linking the
// other's internals.
//
// # Reading the workspace
//
// Write and Fingerprint open the workspace with os.OpenRoot and walk it
// through directory descriptors obtained from that root, one name at a time
// with O_NOFOLLOW/AT_SYMLINK_NOFOLLOW: symbolic links are recorded as links
// and never followed, so nothing outside the root is read even when a link
// points out of it. Members are emitted depth first, each directory before
// its contents, siblings in byte-wise order of their names. Headers are PAX
// with numeric ids (plus user and group names when a lookup is given), the
// permission bits (including setuid, setgid and sticky) and the modification
// time in nanoseconds; access and change times are never recorded. The
// second and later names of a multiply-linked regular file become tar hard
// links to the first. Devices, FIFOs and sockets, and names or link targets
// that are not valid UTF-8, cannot be restored and are skipped (counted in
// Stats.Skipped). Excluded paths are skipped with everything below them, and
// so are the workspace's temporary files (TempPrefix) and the
// private area of Restore (ReservedPrefix, top level only).
//
// # Restoring
//
// Restore never trusts the archive. Every member name is checked (UTF-8, no
// NUL, relative, no "..", length and depth limits, no reserved names), every
// member must sit below directories of the same archive (never below a
// symbolic link or a file of the archive), hard links must name an earlier
// regular member, symbolic links must stay inside the workspace (resolved
// through the archive's other links) unless AllowExternalSymlinks is set,
// and devices and FIFOs are refused. Sizes are never trusted: bytes are
// counted as they are written, decompressed bytes are counted against the
// compressed input, and the number of members is bounded (Limits).
//
// Extraction goes into a fresh staging directory inside the workspace
// (same filesystem), which starts empty, so the archive's own bookkeeping
// knows everything it contains; every file is created with O_EXCL and
// O_NOFOLLOW below a directory opened through the staging os.Root. Only when
// the whole archive has been read and checked does Restore swap: the current
// top-level entries move into a backup directory, the staged entries move
// into place, and the backup is removed. Any failure before the end of the
// swap moves everything back, so the root is exactly as it was. The root
// itself is never renamed (it may be a mount point).
//
// # Crashes
//
// Restore is also atomic with respect to crashes. The staging and backup
// directories live in the workspace's private area (PrivateDir: a
// directory at the top of the workspace owned by the restoring user, mode
// 0700), beside a journal that says which restore is in progress and which
// phase it is in: staging (extracting), swap-out (the stage is complete;
// old entries are moving into the backup), swap-in (all old entries are
// out; staged ones are moving in), done (removing the backup and the
// stage), and undo-in and undo-out when a failed swap is being undone. The
// journal is rewritten at each phase (temporary file, fsync, rename, fsync
// of the directory), after the directories the last phase changed are
// fsynced. Before the journal says swap-out, every staged file and
// directory is fsynced (several at once, as the extraction goes), so that
// a power loss, not only a crash of the process, cannot leave the restored
// tree with empty or truncated files once the swap has begun. Within a phase every move is idempotent: an entry a phase has
// moved is no longer where that phase looks, so a phase run again carries
// on where it stopped.
//
// Recover, which the daemon runs when it starts (and Restore before it
// begins), reads the journal and finishes what it records: a restore whose
// stage was complete is rolled forward, one interrupted while extracting is
// rolled back (the stage is removed; the workspace was never touched), and
// an interrupted rollback is finished. The workspace is then exactly the
// old tree or exactly the new one. Staging and backup directories without
// a journal are removed. While a journal records an incomplete restore,
// Write and Fingerprint refuse (errkind.ErrFailedPrecondition naming it)
// rather than capture a half-swapped tree; when Recover cannot complete it
// (an entry in the way, a planted symbolic link), it says why and keeps
// everything for the next attempt. Recovery reaches every directory from
// the root one component at a time without following symbolic links, and
// trusts the private area and the journal only when they belong to its own
// effective uid and are closed to group and others: a sandbox process
// running as another user cannot forge a journal, and cannot make a
// recovery follow a link out of (or within) the workspace. Tests choose
// where a restore dies with RestoreOptions.Fault.
//
// Excluded paths are preserved from the current workspace: members of the
// archive at or below an excluded path are ignored, an excluded entry of the
// workspace stays where it is (it is never moved, opened or descended into,
// so a mount point is safe), and the directories that lead to it are kept
// and have their contents swapped entry by entry instead of being moved
// whole.
//
// A directory that Restore would move must not be a mount point (it
// refuses, naming it): mounts belong in the excludes. Its removal of the
// backup never descends into another mount either.
//
// Restore, like Write, must not run concurrently with other changes to the
// workspace; the caller serialises them.
//
// All errors are *compute.PathError values naming the workspace path or
// archive member concerned, wrapping a compute sentinel; host paths never
// appear in them.
package archive
