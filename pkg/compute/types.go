package compute

import "github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"

// The Go types of a sandbox's operations (Session's methods), defined by
// package agentclient (see its types.go) and named here so that a caller
// of a Session needs no other import. The daemon's wire types
// (proto/bulkhead/agentd/v1) stay inside agentclient.

// Processes.
type (
	ProcessSpec       = agentclient.ProcessSpec
	TerminalSize      = agentclient.TerminalSize
	OutputStream      = agentclient.OutputStream
	OutputChunk       = agentclient.OutputChunk
	Output            = agentclient.Output
	ProcessState      = agentclient.ProcessState
	ExitStatus        = agentclient.ExitStatus
	ProcessInfo       = agentclient.ProcessInfo
	StartOptions      = agentclient.StartOptions
	StartResult       = agentclient.StartResult
	ExecOptions       = agentclient.ExecOptions
	ExecEvent         = agentclient.ExecEvent
	ExecResult        = agentclient.ExecResult
	ReadOutputOptions = agentclient.ReadOutputOptions
	FollowOptions     = agentclient.FollowOptions
)

// Output streams and process states.
const (
	StreamStdout   = agentclient.StreamStdout
	StreamStderr   = agentclient.StreamStderr
	StreamPTY      = agentclient.StreamPTY
	ProcessRunning = agentclient.ProcessRunning
	ProcessExited  = agentclient.ProcessExited
)

// Files.
type (
	FileType         = agentclient.FileType
	FileInfo         = agentclient.FileInfo
	ReadFileOptions  = agentclient.ReadFileOptions
	OverwritePolicy  = agentclient.OverwritePolicy
	WriteFileOptions = agentclient.WriteFileOptions
	WriteFileResult  = agentclient.WriteFileResult
	StatOptions      = agentclient.StatOptions
	ListDirOptions   = agentclient.ListDirOptions
	DirPage          = agentclient.DirPage
	MakeDirOptions   = agentclient.MakeDirOptions
	RemoveOptions    = agentclient.RemoveOptions
	RenameOptions    = agentclient.RenameOptions
)

// File types and overwrite policies.
const (
	FileRegular           = agentclient.FileRegular
	FileDirectory         = agentclient.FileDirectory
	FileSymlink           = agentclient.FileSymlink
	FileOther             = agentclient.FileOther
	OverwriteAlways       = agentclient.OverwriteAlways
	OverwriteNever        = agentclient.OverwriteNever
	OverwriteOnlyIfExists = agentclient.OverwriteOnlyIfExists
)

// Patches.
type (
	PatchOperationType   = agentclient.PatchOperationType
	PatchOperation       = agentclient.PatchOperation
	ApplyPatchOptions    = agentclient.ApplyPatchOptions
	PatchChangeKind      = agentclient.PatchChangeKind
	PatchChange          = agentclient.PatchChange
	PatchResult          = agentclient.PatchResult
	PatchRejectionDetail = agentclient.PatchRejectionDetail
)

// Patch operations and changes.
const (
	PatchCreateFile = agentclient.PatchCreateFile
	PatchUpdateFile = agentclient.PatchUpdateFile
	PatchDeleteFile = agentclient.PatchDeleteFile
	PatchCreated    = agentclient.PatchCreated
	PatchUpdated    = agentclient.PatchUpdated
	PatchMoved      = agentclient.PatchMoved
	PatchDeleted    = agentclient.PatchDeleted
)

// PatchRejection returns the structured reason an ApplyPatch failed, if
// err carries one, else nil.
func PatchRejection(err error) *PatchRejectionDetail { return agentclient.PatchRejection(err) }

// The workspace and the daemon, reached through Session.Agent.
// ArchiveLimits (client.go) is agentclient's too.
type (
	ArchiveCompression = agentclient.ArchiveCompression
	ArchiveOptions     = agentclient.ArchiveOptions
	RestoreOptions     = agentclient.RestoreOptions
	RestoreResult      = agentclient.RestoreResult
	FingerprintOptions = agentclient.FingerprintOptions
	ArchiveStats       = agentclient.ArchiveStats
	MaterializedFile   = agentclient.MaterializedFile
	MaterializeResult  = agentclient.MaterializeResult
	DaemonInfo         = agentclient.DaemonInfo
	DaemonLimits       = agentclient.DaemonLimits
	PathGrant          = agentclient.PathGrant
	PortListener       = agentclient.PortListener
)

// Archive encodings.
const (
	CompressionZstd = agentclient.CompressionZstd
	CompressionNone = agentclient.CompressionNone
)
