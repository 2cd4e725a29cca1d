package archive

import (
	"strings"

	"go.uber.org/zap"
)

// ReservedPrefix starts the names of the staging and backup directories
// Restore creates at the top of the workspace. Write and Fingerprint skip
// top-level entries with this prefix, and Restore refuses archive members
// that use it.
const ReservedPrefix = ".bulkhead-restore-"

// TempPrefix starts the names of the temporary files a workspace's atomic
// writes leave beside their targets (the daemon's workspace.TempPrefix, which
// a test of package agentd keeps equal to this one). Write and Fingerprint
// skip such names anywhere in the tree, and Restore refuses members that use
// them.
const TempPrefix = ".bulkhead-tmp-"

// isTempName reports whether a file name is a workspace's temporary name.
func isTempName(name string) bool { return strings.HasPrefix(name, TempPrefix) }

// DefaultLevel is the zstd level Write uses when WriteOptions.Level is 0.
// It matches the zstd command line default.
const DefaultLevel = 3

// Compression selects how Write encodes the tar stream. Restore detects the
// encoding from the stream itself.
type Compression int

const (
	// CompressionZstd compresses the tar stream with zstd (the default).
	CompressionZstd Compression = iota
	// CompressionNone writes a plain tar stream.
	CompressionNone
)

// String returns "zstd" or "none".
func (c Compression) String() string {
	switch c {
	case CompressionZstd:
		return "zstd"
	case CompressionNone:
		return "none"
	default:
		return "unknown"
	}
}

// WriteOptions configures Write.
type WriteOptions struct {
	// Compression of the stream; the zero value is zstd.
	Compression Compression
	// Level is the zstd level, 1 to 22 as on the zstd command line
	// (0: DefaultLevel). It is mapped to the nearest level the encoder
	// implements.
	Level int
	// Concurrency is how many sections of the stream zstd compresses in
	// parallel. 0 or 1 (the default): one goroutine compresses a block
	// while the walk reads the next, with about 10 MB of buffers. Above 1,
	// sections of 8 MiB (32 MiB above level 5) are compressed in parallel,
	// faster on a machine with idle cores but holding about 20 MB (80 MB)
	// per section. The stream is deterministic for a given Level and
	// Concurrency, and the same for every Concurrency above 1.
	Concurrency int
	// Exclude lists workspace-relative, slash-separated paths (ephemeral
	// entries, mount points, registered skip paths) that are skipped with
	// everything below them.
	Exclude []string
	// UserName and GroupName, when set, name the owner and group of each
	// member in addition to the numeric ids ("" for unknown ids).
	UserName  func(uid uint32) string
	GroupName func(gid uint32) string
	// Logger receives warnings (a file that shrank while it was read).
	// Nil means no logging.
	Logger *zap.Logger
}

// RestoreOptions configures Restore.
type RestoreOptions struct {
	// Exclude lists workspace-relative paths preserved from the current
	// workspace: archive members at or below them are ignored and the
	// workspace's own entries there are left in place.
	Exclude []string
	// Limits bound what an archive may make Restore do; zero fields take
	// the defaults.
	Limits Limits
	// AllowExternalSymlinks permits symbolic links whose target is absolute
	// or leaves the workspace. It is off by default: Restore never follows
	// links itself, but a link out of the workspace is a standing invitation
	// for whatever later resolves workspace paths without confinement (host
	// tools on a local workspace, a harness reading results) to read or
	// write outside it. Turn it on for workspaces that legitimately carry
	// such links (a Python virtualenv's bin/python -> /usr/bin/python3)
	// when the sandbox itself is the boundary.
	AllowExternalSymlinks bool
	// PreserveOwnership gives restored entries the archive's numeric uid and
	// gid. It takes effect only when the daemon runs as root (otherwise
	// entries belong to the daemon's user). Setuid and setgid bits are kept
	// only when ownership is preserved, so that a restore never creates a
	// set-id file owned by someone the archive did not name.
	PreserveOwnership bool
	// Logger receives diagnostics (paths and errors, never contents). Nil
	// means no logging.
	Logger *zap.Logger
	// Fault, when set, is called at each Step of the restore (and of the
	// recovery Restore begins with), for tests that choose where a restore
	// dies: a hook that never returns there (it kills the process, or ends
	// its goroutine with runtime.Goexit) leaves the workspace exactly as a
	// crash at that point would, for Recover to finish; an error it
	// returns fails that step as a disk error would (ignored at
	// StepCleanup, like a failed removal). Nil in production.
	Fault func(Step) error

	hooks testHooks
}

// testHooks lets tests of this package reach paths the options cannot.
type testHooks struct {
	// ignoreDeclaredSize disables the early refusal of members whose
	// declared size cannot fit, so that tests reach the written-bytes
	// accounting.
	ignoreDeclaredSize bool
	// sync, when set, is called before each fsync of a staged file or
	// directory with its stage-relative path ("" for the staging
	// directory), from the syncer's goroutines; an error it returns fails
	// that fsync.
	sync func(rel string) error
}

// FingerprintOptions configures Fingerprint.
type FingerprintOptions struct {
	// Exclude lists workspace-relative paths left out, as for Write.
	Exclude []string
	// Extra is hashed after the tree, e.g. the canonical bytes of the
	// manifest the workspace was built from.
	Extra []byte
}

// Limits bound the resources one Restore may use. A zero field takes the
// default shown; a negative one is an invalid argument.
type Limits struct {
	// MaxMembers bounds the archive's members, of every type (default
	// 500,000).
	MaxMembers int64
	// MaxBytes bounds the content bytes actually written (default 8 GiB).
	MaxBytes int64
	// MaxInputBytes bounds the bytes read from the input stream, compressed
	// (default 4 GiB).
	MaxInputBytes int64
	// MaxExpansionRatio bounds decompressed archive bytes (which include
	// every byte written) divided by input bytes, checked continuously once
	// RatioMinBytes have been decompressed (default 250).
	MaxExpansionRatio float64
	// RatioMinBytes is the decompressed size below which the ratio is not
	// checked, so that small archives of very compressible files pass
	// (default 64 MiB).
	RatioMinBytes int64
	// MaxPathBytes bounds a member name or link target, in bytes (default
	// 4096, PATH_MAX).
	MaxPathBytes int
	// MaxDepth bounds the number of components of a member name (default
	// 256).
	MaxDepth int
}

// Default limits.
const (
	DefaultMaxMembers        int64   = 500_000
	DefaultMaxBytes          int64   = 8 << 30
	DefaultMaxInputBytes     int64   = 4 << 30
	DefaultMaxExpansionRatio float64 = 250
	DefaultRatioMinBytes     int64   = 64 << 20
	DefaultMaxPathBytes      int     = 4096
	DefaultMaxDepth          int     = 256
)

// Stats counts what Write or Restore did.
type Stats struct {
	// Members counts archive members written, or read (of every type,
	// including ignored ones) by Restore.
	Members int64
	// Files, Dirs, Symlinks and HardLinks count the entries archived or
	// created by type (an implicit parent directory Restore had to create
	// is not counted).
	Files     int64
	Dirs      int64
	Symlinks  int64
	HardLinks int64
	// Bytes counts file content bytes archived or written.
	Bytes int64
	// Skipped counts entries left out: for Write, devices, FIFOs, sockets
	// and names that are not UTF-8 (excluded paths are not counted); for
	// Restore, members at or below an excluded path.
	Skipped int64
}
