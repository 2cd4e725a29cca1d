package agentclient

import "time"

// The Go types of the daemon's operations. They follow the wire contract
// (proto/bulkhead/agentd/v1) field by field, with Go's shapes: durations
// are time.Duration, times are time.Time (zero when the daemon sent none),
// enums are string constants ("" when unset or unknown to this client), a
// message that may be absent is a pointer. convert.go is the one place
// they meet the wire's messages.

// Processes.

// ProcessSpec says what to run and how.
type ProcessSpec struct {
	// Argv is the program and its arguments. Exactly one of Argv and
	// Command is set.
	Argv []string
	// Command is a shell command line, run as `<shell> -c <command>` (or
	// -lc when Login).
	Command string
	// Shell runs Command; empty means the daemon's default (/bin/sh).
	Shell string
	// Login runs the shell as a login shell.
	Login bool
	// Cwd is the working directory: workspace-relative, absolute inside
	// the workspace or a grant. Empty means the workspace root.
	Cwd string
	// Env is set on top of the daemon's clean defaults. The daemon's own
	// environment is never inherited.
	Env map[string]string
	// User is the sandbox user to run as; empty means the daemon's default
	// run_as user.
	User string
	// Tty runs the process under a pseudo-terminal.
	Tty bool
	// Size is the initial terminal size when Tty is set; zero means the
	// daemon's default.
	Size TerminalSize
	// Stdin keeps a stdin pipe open (pipe mode). Without it stdin is
	// /dev/null. A TTY process always accepts input.
	Stdin bool
	// Timeout kills the process group after this long; zero means no
	// timeout.
	Timeout time.Duration
}

// TerminalSize is a terminal's size in character cells.
type TerminalSize struct {
	Rows uint32
	Cols uint32
}

// OutputStream names where a chunk of output came from.
type OutputStream string

// The output streams.
const (
	StreamStdout OutputStream = "stdout"
	StreamStderr OutputStream = "stderr"
	// StreamPTY is the output of a TTY process (stdout and stderr are one
	// terminal).
	StreamPTY OutputStream = "pty"
)

// OutputChunk is a piece of a process's output at an absolute byte offset.
type OutputChunk struct {
	Stream OutputStream
	Offset int64
	Data   []byte
}

// ProcessState is whether a process still runs.
type ProcessState string

// The states of a process.
const (
	ProcessRunning ProcessState = "running"
	ProcessExited  ProcessState = "exited"
)

// ExitStatus is how a process ended.
type ExitStatus struct {
	// ExitCode is 128+N when the process was killed by signal N (what a
	// shell shows as $?).
	ExitCode int
	// Signal names the signal that killed it ("SIGKILL"), if any.
	Signal string
	// TimedOut is set when the daemon killed it because its timeout passed.
	TimedOut bool
	ExitedAt time.Time
}

// ProcessInfo describes a process the daemon keeps.
type ProcessInfo struct {
	ProcessID string
	PID       int
	Argv      []string
	Cwd       string
	User      string
	Tty       bool
	StartedAt time.Time
	State     ProcessState
	// Exit is set once the process has exited.
	Exit      *ExitStatus
	RequestID string
}

// StartOptions tune Start.
type StartOptions struct {
	// RequestID makes Start idempotent: a Start repeating an earlier one's
	// id starts nothing and returns the earlier process. Empty: Start
	// makes one (NewRequestID), which covers its own retries.
	RequestID string
}

// StartResult is the started (or already started) process.
type StartResult struct {
	Process ProcessInfo
	// Existing is set when the request id matched an earlier Start and
	// nothing new was started.
	Existing bool
}

// ExecOptions tune Exec.
type ExecOptions struct {
	// Stdin is written to the process's stdin, which is then closed
	// (implies a stdin pipe).
	Stdin []byte
	// RequestID: as StartOptions.RequestID.
	RequestID string
}

// ExecEvent is one event of an Exec: first the started process, then
// output, finally the exit status.
type ExecEvent struct {
	// Started is set in the first event only.
	Started      *ProcessInfo
	Chunks       []OutputChunk
	DroppedBytes int64
	// Exit is set in the last event only.
	Exit *ExitStatus
}

// ExecResult is what a completed Exec produced.
type ExecResult struct {
	// Process is the process that ran (zero when it did not start).
	Process ProcessInfo
	// Exit is how it ended (zero unless Exec returned no error).
	Exit ExitStatus
	// Stdout and Stderr collect the output when Exec was given no callback
	// (PTY output lands in Stdout); with a callback they stay empty, so a
	// streaming caller's memory does not grow with the output.
	Stdout  []byte
	Stderr  []byte
	Dropped int64
}

// ReadOutputOptions tune ReadOutput.
type ReadOutputOptions struct {
	// Cursor is the absolute byte offset to read from.
	Cursor int64
	// YieldTime is how long to wait for output when none is available
	// yet; zero returns at once.
	YieldTime time.Duration
	// MaxBytes bounds the bytes returned; zero means the daemon's maximum.
	MaxBytes int
}

// FollowOptions tune Follow.
type FollowOptions struct {
	// Cursor is the absolute byte offset to stream from.
	Cursor int64
}

// Output is a batch of a process's output (ReadOutput, Follow).
type Output struct {
	Chunks []OutputChunk
	// NextCursor is where the next read starts.
	NextCursor int64
	// DroppedBytes lie between the cursor and the oldest byte the daemon
	// still buffers: they are lost.
	DroppedBytes int64
	// Exit is set when the process has exited and all its output up to
	// NextCursor was returned.
	Exit *ExitStatus
}

// Files.

// FileType is the kind of a filesystem object.
type FileType string

// The kinds of filesystem objects.
const (
	FileRegular   FileType = "regular"
	FileDirectory FileType = "directory"
	FileSymlink   FileType = "symlink"
	// FileOther is a device, fifo or socket: listed, never read or written.
	FileOther FileType = "other"
)

// FileInfo describes a filesystem object.
type FileInfo struct {
	// Path is the path as the caller gave it (ListDir: the entry's path
	// under the listed directory).
	Path string
	// Name is the base name.
	Name string
	Type FileType
	Size int64
	// Mode is the permission bits (0o7777, as chmod takes them).
	Mode uint32
	UID  uint32
	GID  uint32
	// Owner and Group are names, when the sandbox knows them.
	Owner      string
	Group      string
	ModifiedAt time.Time
	// SymlinkTarget is the target of a symlink.
	SymlinkTarget string
	// RawName is the entry's name as raw bytes, set only when it is not
	// valid UTF-8 (Name and Path then carry a lossy UTF-8 form).
	RawName []byte
}

// IsDir reports whether fi is a directory.
func (fi *FileInfo) IsDir() bool { return fi != nil && fi.Type == FileDirectory }

// IsRegular reports whether fi is a regular file.
func (fi *FileInfo) IsRegular() bool { return fi != nil && fi.Type == FileRegular }

// ReadFileOptions tune ReadFile.
type ReadFileOptions struct {
	// Offset is the byte offset to start at.
	Offset int64
	// Limit bounds the bytes read; zero means to the end (within the
	// daemon's limit).
	Limit int64
	User  string
}

// OverwritePolicy says what WriteFile does when the target exists.
type OverwritePolicy string

// The overwrite policies; "" is OverwriteAlways.
const (
	// OverwriteAlways replaces an existing file.
	OverwriteAlways OverwritePolicy = "always"
	// OverwriteNever fails with errkind.ErrAlreadyExists when the file exists.
	OverwriteNever OverwritePolicy = "never"
	// OverwriteOnlyIfExists fails with errkind.ErrNotFound when the file
	// does not exist.
	OverwriteOnlyIfExists OverwritePolicy = "only_if_exists"
)

// WriteFileOptions tune WriteFile.
type WriteFileOptions struct {
	// Mode is the permission bits of a new file; zero means 0644. An
	// existing file keeps its own.
	Mode uint32
	User string
	// CreateParents creates missing parent directories.
	CreateParents bool
	Overwrite     OverwritePolicy
	// ExpectedSize, when set, fails the write (changing nothing) unless
	// exactly this many bytes arrive.
	ExpectedSize *int64
	// ExpectedSHA256, when set, fails the write (changing nothing) unless
	// the content has this SHA-256.
	ExpectedSHA256 []byte
	// ComputeSHA256 asks for the content's SHA-256 (WriteFileResult.SHA256),
	// computed as the bytes arrive. Implied by ExpectedSHA256. Off by
	// default: hashing costs the sandbox CPU on every byte.
	ComputeSHA256 bool
}

// WriteFileResult describes the written file.
type WriteFileResult struct {
	Info FileInfo
	// SHA256 is the content's SHA-256, when ComputeSHA256 or
	// ExpectedSHA256 was set; empty otherwise.
	SHA256 []byte
}

// StatOptions tune Stat.
type StatOptions struct {
	User string
}

// ListDirOptions tune ListDir.
type ListDirOptions struct {
	User string
	// PageSize is the number of entries per page; zero means the daemon's
	// default.
	PageSize int
	// PageToken is a previous page's NextPageToken.
	PageToken string
}

// DirPage is one page of a directory listing.
type DirPage struct {
	Entries []FileInfo
	// NextPageToken is empty on the last page.
	NextPageToken string
}

// MakeDirOptions tune MakeDir.
type MakeDirOptions struct {
	// Mode is the permission bits; zero means 0755.
	Mode uint32
	// Parents creates missing parents; an existing directory is then not
	// an error.
	Parents bool
	User    string
}

// RemoveOptions tune Remove.
type RemoveOptions struct {
	// Recursive removes a non-empty directory and everything under it.
	Recursive bool
	User      string
}

// RenameOptions tune Rename.
type RenameOptions struct {
	// Overwrite replaces an existing target.
	Overwrite bool
	User      string
}

// Patches.

// PatchOperationType is the kind of one file operation. The values are
// those of the per-file operation form (package patch's Operation.Type).
type PatchOperationType string

// The kinds of file operations.
const (
	PatchCreateFile PatchOperationType = "create_file"
	PatchUpdateFile PatchOperationType = "update_file"
	PatchDeleteFile PatchOperationType = "delete_file"
)

// PatchOperation is one file operation of the per-file form of a patch.
type PatchOperation struct {
	Type PatchOperationType
	Path string
	// Diff is a V4A body without envelope or file header (create: "+"
	// lines; update: hunks; delete: empty).
	Diff string
	// MoveTo, for an update, moves the file here.
	MoveTo string
}

// ApplyPatchOptions tune ApplyPatch and ApplyOperations.
type ApplyPatchOptions struct {
	// Cwd is the directory relative paths of the patch are resolved
	// against; empty means the workspace root.
	Cwd  string
	User string
	// DryRun checks that the patch applies without changing anything.
	DryRun bool
}

// PatchChangeKind is what happened to one file.
type PatchChangeKind string

// The kinds of changes.
const (
	PatchCreated PatchChangeKind = "created"
	PatchUpdated PatchChangeKind = "updated"
	PatchMoved   PatchChangeKind = "moved"
	PatchDeleted PatchChangeKind = "deleted"
)

// PatchChange reports one applied operation.
type PatchChange struct {
	Kind PatchChangeKind
	// Path is the path as written in the patch.
	Path string
	// NewPath is the destination of a move.
	NewPath string
}

// PatchResult lists what a patch changed, in patch order.
type PatchResult struct {
	Changes []PatchChange
}

// PatchRejectionDetail is the structured reason an ApplyPatch failed (see the
// function PatchRejection).
type PatchRejectionDetail struct {
	// Path is the file whose operation failed.
	Path string
	// ExpectedLines are the lines the patch expected to find.
	ExpectedLines []string
	// ClosestLine is the 1-based line of the region of the current file
	// closest to them (0 if none).
	ClosestLine int
	// ClosestLines are that region.
	ClosestLines []string
	// Kind is the class of the failure: errkind.ErrInvalidArgument (the
	// patch is malformed), errkind.ErrPatchRejected (it does not apply to
	// the current files) or errkind.ErrResourceExhausted (a size limit);
	// nil when the daemon named none this client knows.
	Kind error
	// Cause is the specific cause when an operation of the patch met a
	// failing file (errkind.ErrNotFound, ErrIsDirectory, ErrPathEscape,
	// ...); nil when there is none.
	Cause error
	// Message is the patch engine's one-line description of the failure,
	// written for the model that wrote the patch: it names only paths from
	// the patch and quotes nothing of the daemon's host.
	Message string
}

// Workspace.

// ArchiveCompression is how an archive is encoded; "" is zstd.
type ArchiveCompression string

// The archive encodings.
const (
	CompressionZstd ArchiveCompression = "zstd"
	CompressionNone ArchiveCompression = "none"
)

// ArchiveOptions tune Archive.
type ArchiveOptions struct {
	// Exclude are workspace-relative paths left out with everything below
	// them (ephemeral entries, mounts, skip paths).
	Exclude     []string
	Compression ArchiveCompression
	// Level is the zstd level, 1-22; zero means the default (3).
	Level int
}

// ArchiveStats counts what an Archive or Restore did.
type ArchiveStats struct {
	Members   int64
	Files     int64
	Dirs      int64
	Symlinks  int64
	HardLinks int64
	// Bytes counts file content bytes.
	Bytes int64
	// Skipped counts entries left out (devices, sockets, excluded members
	// on restore).
	Skipped int64
}

// ArchiveLimits bound a Restore. Zero fields take the daemon's defaults.
type ArchiveLimits struct {
	// MaxMembers bounds the members (entries) of the archive.
	MaxMembers int64
	// MaxExtractedBytes bounds the bytes actually written (not the sizes
	// the archive declares).
	MaxExtractedBytes int64
	// MaxInputBytes bounds the bytes of (compressed) archive read.
	MaxInputBytes int64
}

// RestoreOptions tune Restore.
type RestoreOptions struct {
	// Exclude are workspace-relative paths kept from the current
	// workspace: archive members there are ignored.
	Exclude []string
	// PreserveOwnership gives restored entries the archive's uid and gid
	// (when the daemon is root).
	PreserveOwnership bool
	// AllowExternalSymlinks accepts symlinks that point outside the
	// workspace (virtualenvs).
	AllowExternalSymlinks bool
	Limits                ArchiveLimits
}

// RestoreResult reports what a Restore restored.
type RestoreResult struct {
	Stats ArchiveStats
}

// FingerprintOptions tune Fingerprint.
type FingerprintOptions struct {
	// Exclude are paths left out, as for Archive.
	Exclude []string
	// Extra is hashed after the tree (the canonical manifest).
	Extra []byte
}

// MaterializeEntryKind is what a plan's entry creates.
type MaterializeEntryKind string

// The kinds of plan entries.
const (
	EntryFile      MaterializeEntryKind = "file"
	EntryDirectory MaterializeEntryKind = "directory"
	EntrySymlink   MaterializeEntryKind = "symlink"
)

// MaterializeEntry is one path a plan creates.
type MaterializeEntry struct {
	// Path is workspace-relative and slash-separated: no "..", not absolute.
	Path string
	Kind MaterializeEntryKind
	// Mode is the permission bits (at most 07777). Zero means 0644 for
	// files and 0755 for directories.
	Mode uint32
	// User and Group own the entry, by name; empty means the daemon's own
	// identity (root in a sandbox) for the user, and the user's primary
	// group.
	User  string
	Group string
	// Size, for a file, is the exact number of bytes the tar stream carries.
	Size int64
	// LinkTarget, for a symlink, is the target: relative, and resolving
	// inside the workspace.
	LinkTarget string
	// Volatile entries are re-created at every start (the objects of a
	// remote mount) and never restored from disk, so they need not be
	// flushed to disk before they become visible. A plan whose entries are
	// all volatile skips the flush.
	Volatile bool
}

// MaterializeUser is an account to create when missing.
type MaterializeUser struct {
	Name string
	// UID, when set, is the account's fixed numeric id.
	UID *uint32
	// Groups are supplementary groups (created by the same plan or existing).
	Groups []string
	// Home and Shell are the home directory and login shell; empty:
	// /home/<name> and the default.
	Home  string
	Shell string
}

// MaterializeGroup is a group to create when missing.
type MaterializeGroup struct {
	Name string
	// GID, when set, is the group's fixed numeric id.
	GID *uint32
}

// MaterializeGrant gives processes and file operations access to an
// absolute path outside the workspace.
type MaterializeGrant struct {
	Path     string
	ReadOnly bool
}

// MaterializePlan is what Materialize creates: accounts, then entries
// (whose file bytes follow as a tar stream), grants and environment.
type MaterializePlan struct {
	Groups []MaterializeGroup
	Users  []MaterializeUser
	// Entries come in any order; a parent directory, when listed, is
	// created before what it contains. Existing files at entry paths are
	// replaced and existing directories kept (their mode and owner set
	// from the entry).
	Entries []*MaterializeEntry
	// Grants replace the daemon's extra path grants when SetGrants.
	Grants    []MaterializeGrant
	SetGrants bool
	// RootUser, when set, owns the workspace root directory itself (with
	// the user's primary group) once the plan is applied, so that the
	// run_as user can create files at the top of its workspace.
	RootUser string
	// Environment replaces the environment the daemon gives every process
	// it starts when SetEnvironment (the manifest's environment, its secret
	// references already resolved by the harness). The daemon keeps it in
	// memory only. It overrides the daemon's defaults; a process's own Env
	// overrides it.
	Environment    map[string]string
	SetEnvironment bool
}

// MaterializedFile reports one file written.
type MaterializedFile struct {
	Path string
	Size int64
	// SHA256 is the hex sha256 of the bytes written.
	SHA256 string
	Mode   uint32
}

// MaterializeResult reports what was materialized.
type MaterializeResult struct {
	Files       []MaterializedFile
	Directories int64
	Symlinks    int64
	// UsersCreated and GroupsCreated are the accounts that did not exist
	// and were created.
	UsersCreated  []string
	GroupsCreated []string
}

// The daemon.

// PrepareCheckpointOptions adjust PrepareCheckpoint.
type PrepareCheckpointOptions struct {
	// ResumeAfter is how long the daemon stays closed when no checkpoint
	// comes (a harness that died meanwhile) before it listens again by
	// itself; zero means the daemon's default (60 s), at most 10 minutes.
	ResumeAfter time.Duration
}

// DaemonInfo describes the daemon.
type DaemonInfo struct {
	// Version is sandbox-agentd's semantic version.
	Version string
	// Commit is the source revision it was built from.
	Commit string
	// WorkspaceRoot is the absolute path of the workspace root inside the
	// sandbox.
	WorkspaceRoot string
	// Features the daemon implements, e.g. "process.pty", "file.run_as",
	// "workspace.apply_patch".
	Features []string
	// RunningAsRoot says whether the daemon runs as root (and can
	// therefore switch to run_as users).
	RunningAsRoot bool
	// UID and GID are the daemon's own.
	UID uint32
	GID uint32
	// DefaultUser is the user processes and file operations run as when a
	// call names none.
	DefaultUser string
	Limits      DaemonLimits
	// Grants are the extra path grants outside the workspace root.
	Grants    []PathGrant
	StartedAt time.Time
	// PID is the daemon's pid inside the sandbox (1 when it is a
	// container's init).
	PID int
	// Platform is the daemon's GOOS/GOARCH.
	Platform string
	// LastActivity is the daemon's last sign of use of its sandbox: the
	// latest call other than Info (health checks never count), process
	// start, exit or output, byte carried by a port forward, or rise of
	// its processes' CPU time, which the daemon samples at each Info (so
	// CPU use is seen with the resolution of the Info calls). Never
	// before StartedAt; Info itself does not move it. Zero from a daemon
	// that does not report it (Features lacks "system.last_activity").
	LastActivity time.Time
	// RunningProcesses is how many processes the daemon started that have
	// not exited yet.
	RunningProcesses int
}

// DaemonLimits are the limits the daemon enforces.
type DaemonLimits struct {
	// MaxProcesses bounds the processes kept at once (running or retained
	// after exit).
	MaxProcesses int
	// OutputBufferBytes is the output kept per process; older output is
	// dropped and reported.
	OutputBufferBytes int64
	// MaxReadBytes bounds what one ReadOutput returns.
	MaxReadBytes int
	// MaxFileBytes bounds a file written or read in one call.
	MaxFileBytes int64
	// MaxPatchBytes bounds an apply_patch input.
	MaxPatchBytes int64
}

// PathGrant allows access to an absolute path outside the workspace root.
type PathGrant struct {
	Path     string
	ReadOnly bool
}
