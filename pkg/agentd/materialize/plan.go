// Package materialize applies a materialization plan to a workspace: the
// entries a manifest declares (directories, files, symbolic links) with
// their modes and owners, fed by a tar stream of the files' bytes.
//
// Apply is all-or-nothing for the workspace's files: every entry is built in
// a staging directory inside the workspace (so the final moves are renames
// on one file system), checked against the plan (each file's exact size, no
// member missing or extra), flushed, and only then moved into place. Paths
// are handled through os.Root, so a symbolic link in the workspace can never
// redirect a write outside it. Accounts are created before the entries (the
// owners must exist), through the Accounts the daemon provides.
package materialize

import (
	"context"
	"io/fs"
	"os"
)

// Kind is what an entry creates.
type Kind int

// Entry kinds.
const (
	KindFile Kind = iota + 1
	KindDir
	KindSymlink
)

func (k Kind) String() string {
	switch k {
	case KindFile:
		return "file"
	case KindDir:
		return "directory"
	case KindSymlink:
		return "symlink"
	}
	return "unknown"
}

// Entry is one path of the plan.
type Entry struct {
	// Path is workspace-relative and slash-separated.
	Path string
	Kind Kind
	// Mode holds the permission bits; 0 means 0644 (files) or 0755 (dirs).
	Mode fs.FileMode
	// User and Group own the entry; "" means the daemon's identity (user)
	// and the user's primary group (group).
	User, Group string
	// Size is the exact byte count of a file's tar member.
	Size int64
	// LinkTarget is a symlink's relative target.
	LinkTarget string
	// Volatile entries are re-created at every start (remote mounts,
	// ephemeral entries): a plan of only volatile entries is not flushed
	// to disk before it becomes visible.
	Volatile bool
}

// Group is an account group to create when missing.
type Group struct {
	Name string
	GID  *uint32
}

// User is an account to create when missing.
type User struct {
	Name   string
	UID    *uint32
	Groups []string
	Home   string
	Shell  string
}

// Plan is everything one Materialize call applies.
type Plan struct {
	Groups  []Group
	Users   []User
	Entries []Entry
	// RootUser, when set, owns the workspace root directory itself (with
	// its primary group; the mode is kept) once the plan is applied.
	RootUser string
}

// Accounts creates and resolves the sandbox's accounts.
type Accounts interface {
	// EnsureGroup creates the group when it does not exist and reports
	// whether it did.
	EnsureGroup(ctx context.Context, g Group) (created bool, err error)
	// EnsureUser creates the user (with a private group of its name) when
	// it does not exist and reports whether it did.
	EnsureUser(ctx context.Context, u User) (created bool, err error)
	// IDs resolves an owner: "" user means the daemon's own uid, "" group
	// means the user's primary group.
	IDs(user, group string) (uid, gid uint32, err error)
}

// Options bounds one Apply.
type Options struct {
	// MaxEntries bounds the plan (default 1,000,000).
	MaxEntries int
	// MaxFileBytes bounds one file (0: no limit).
	MaxFileBytes int64
	// MaxTotalBytes bounds the sum of the files' sizes (0: no limit).
	MaxTotalBytes int64
	// Workers write small files in parallel (default 4).
	Workers int
	// Flush makes the staged entries durable before they become visible
	// (default: one syncfs of the workspace's file system). It is not
	// called for a plan whose entries are all volatile.
	Flush func(dir *os.File) error
}

// File reports one file written.
type File struct {
	Path   string
	Size   int64
	SHA256 string
	Mode   fs.FileMode
}

// Result reports what Apply did.
type Result struct {
	Files         []File
	Dirs          int64
	Symlinks      int64
	UsersCreated  []string
	GroupsCreated []string
}

// StagePrefix starts the name of the staging directory at the workspace's
// top level. It begins with the archive's reserved prefix so archives and
// fingerprints never include it, and the daemon removes leftovers at start.
const StagePrefix = ".bulkhead-restore-materialize-"
