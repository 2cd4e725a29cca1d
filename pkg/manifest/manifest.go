package manifest

import (
	"fmt"
	"maps"
	"slices"
)

// DefaultRoot is the workspace root used when a manifest names none.
const DefaultRoot = "/workspace"

// CurrentVersion is the only manifest format version this package reads.
const CurrentVersion = 1

// Manifest describes the starting contents of a fresh sandbox workspace and
// the accounts, environment and extra path access it runs with.
//
// A Manifest is plain data: build it in Go or load it with LoadTrusted /
// LoadUntrusted, check it with Validate, copy it with Clone. Methods never
// modify the receiver.
type Manifest struct {
	// Version of the format; 0 means CurrentVersion.
	Version int
	// Root is the absolute path of the workspace inside the sandbox; ""
	// means DefaultRoot. See WorkspaceRoot.
	Root string
	// RunAs names the account model-directed processes run as: a declared
	// user, or "root". Empty leaves the choice to the harness.
	RunAs string
	// Entries maps workspace-relative paths to what is created there.
	Entries map[string]*Entry
	// Environment of the sandbox's processes.
	Environment map[string]EnvValue
	// Users and Groups are accounts provisioned in the sandbox. Every user
	// also gets a private group of the same name.
	Users  []User
	Groups []Group
	// ExtraPathGrants give access to absolute sandbox paths outside the
	// workspace. They are runtime access only: never part of a snapshot.
	ExtraPathGrants []PathGrant
	// Redaction is set on a copy made by Redacted: it records what was
	// removed so that Rebind can restore it from the trusted manifest.
	Redaction *Redaction
}

// WorkspaceRoot returns Root, or DefaultRoot when Root is empty.
func (m *Manifest) WorkspaceRoot() string {
	if m.Root == "" {
		return DefaultRoot
	}
	return m.Root
}

// EntryType says what an entry is. The strings are the `type` values of the
// file format.
type EntryType string

// Entry types.
const (
	// TypeFile is a file with inline content.
	TypeFile EntryType = "file"
	// TypeDir is a directory, with optional children.
	TypeDir EntryType = "dir"
	// TypeLocalFile copies one file from the harness host.
	TypeLocalFile EntryType = "local_file"
	// TypeLocalDir copies a directory tree from the harness host.
	TypeLocalDir EntryType = "local_dir"
	// TypeGitRepo checks out a git repository.
	TypeGitRepo EntryType = "git_repo"
	// TypeS3Mount mounts an S3 (or S3-compatible) bucket.
	TypeS3Mount EntryType = "s3_mount"
	// TypeGCSMount mounts a Google Cloud Storage bucket.
	TypeGCSMount EntryType = "gcs_mount"
	// TypeR2Mount mounts a Cloudflare R2 bucket.
	TypeR2Mount EntryType = "r2_mount"
	// TypeAzureBlobMount mounts an Azure Blob Storage container.
	TypeAzureBlobMount EntryType = "azure_blob_mount"
	// TypeS3FilesMount mounts an Amazon S3 Files file system: an NFS file
	// system (fs-...) reached through a mount target in a VPC, whose data
	// lives in an S3 bucket. The harness-side strategy (package
	// compute/mount) reads that bucket; the NFS-only fields serve an NFS
	// mount.
	TypeS3FilesMount EntryType = "s3_files_mount"
)

// EntryTypes returns every entry type, in a fixed order.
func EntryTypes() []EntryType {
	return []EntryType{TypeFile, TypeDir, TypeLocalFile, TypeLocalDir, TypeGitRepo,
		TypeS3Mount, TypeGCSMount, TypeR2Mount, TypeAzureBlobMount, TypeS3FilesMount}
}

// Known reports whether t is one of the entry types above.
func (t EntryType) Known() bool { return slices.Contains(EntryTypes(), t) }

// IsDir reports whether entries of this type are directories.
func (t EntryType) IsDir() bool {
	switch t {
	case TypeFile, TypeLocalFile:
		return false
	}
	return t.Known()
}

// IsMount reports whether t is a remote storage mount.
func (t EntryType) IsMount() bool {
	switch t {
	case TypeS3Mount, TypeGCSMount, TypeR2Mount, TypeAzureBlobMount, TypeS3FilesMount:
		return true
	}
	return false
}

// IsHostSource reports whether t copies from the harness host's filesystem.
func (t EntryType) IsHostSource() bool { return t == TypeLocalFile || t == TypeLocalDir }

// Entry is one thing created in the workspace. Type decides which of the
// type-specific fields apply; Validate rejects the others when set.
type Entry struct {
	Type EntryType
	// Description is shown to the model next to the entry in the
	// filesystem tree.
	Description string
	// Ephemeral entries are materialized again on every start and are left
	// out of snapshots. Mounts are always ephemeral.
	Ephemeral bool
	// Group owning the entry: a declared group or a declared user (whose
	// private group is meant).
	Group string
	// Permissions of the entry; nil means DefaultPermissions. Not allowed on
	// mounts, whose storage decides.
	Permissions *Permissions

	// Content of a TypeFile entry. In the file format it is written as
	// `content` (UTF-8 text, taken verbatim) or `content_base64` (standard
	// base64, for anything else); it is written back the same way.
	Content []byte
	// Children of a TypeDir entry, keyed by paths relative to the entry.
	Children map[string]*Entry
	// Src of a TypeLocalFile or TypeLocalDir entry: a path relative to the
	// trusted base directory the harness reads host sources from, or an
	// absolute host path, which the harness reads only inside one of the
	// application's host grants (materializer.Options.HostGrants). Empty
	// only in a redacted copy.
	Src string
	// Git describes a TypeGitRepo entry.
	Git *GitRepo
	// Mount describes a mount entry.
	Mount *Mount
}

// EffectivePermissions returns the entry's permissions with defaults applied
// and the directory flag set from the type.
func (e *Entry) EffectivePermissions() Permissions {
	p := DefaultPermissions(false)
	if e.Permissions != nil {
		p = *e.Permissions
	}
	p.Directory = e.Type.IsDir()
	return p
}

// IsEphemeral reports whether the entry is ephemeral (mounts always are).
func (e *Entry) IsEphemeral() bool { return e.Ephemeral || e.Type.IsMount() }

// String describes the entry without its content, so that printing an entry
// or a manifest never puts file contents in a log.
func (e *Entry) String() string {
	if e == nil {
		return "<nil entry>"
	}
	switch e.Type {
	case TypeFile:
		return fmt.Sprintf("file(%d bytes)", len(e.Content))
	case TypeDir:
		return fmt.Sprintf("dir(%d children)", len(e.Children))
	}
	return string(e.Type)
}

// GitRepo is a repository checked out into a TypeGitRepo entry.
type GitRepo struct {
	// Host serving the repository, such as "github.com" (the default when
	// empty). No scheme, no user information.
	Host string
	// Repo is the repository path on the host, such as "owner/name".
	Repo string
	// Ref is a branch, a tag or a commit id.
	Ref string
	// Subpath, when set, copies only this directory of the repository.
	Subpath string
	// Token, when set, authenticates the fetch. The harness fetches such
	// repositories itself; the token never enters the sandbox.
	Token *SecretRef
}

// DefaultGitHost is the host used when GitRepo.Host is empty.
const DefaultGitHost = "github.com"

// EffectiveHost returns Host, or DefaultGitHost when it is empty.
func (g *GitRepo) EffectiveHost() string {
	if g.Host == "" {
		return DefaultGitHost
	}
	return g.Host
}

// CloneURL returns the HTTPS URL of the repository.
func (g *GitRepo) CloneURL() string {
	return "https://" + g.EffectiveHost() + "/" + g.Repo + ".git"
}

// Mount describes remote storage mounted at a mount entry's path. Which
// fields apply depends on the entry type:
//
//	s3_mount          bucket (required), prefix, region, endpoint
//	gcs_mount         bucket (required), prefix, region, endpoint
//	r2_mount          bucket and account (required), prefix, endpoint
//	azure_blob_mount  account and container (required), prefix, endpoint
//	s3_files_mount    file_system_id and region (required), subpath,
//	                  mount_target_ip, access_point, extra_options
//
// All of them take read_only; all but s3_files_mount take credentials (an
// S3 Files file system is reached with the mounting host's own IAM
// identity, or, read through its backing bucket, with credentials the
// harness's configuration names; so the manifest names none).
//
// Credentials are secret references only, keyed by a provider-specific name
// (see CredentialKeys). Mounting is done by providers; this package only
// describes and checks the declaration.
type Mount struct {
	Bucket    string
	Account   string
	Container string
	Prefix    string
	Region    string
	Endpoint  string
	// FileSystemID names an S3 Files file system: "fs-" and lowercase hex.
	FileSystemID string
	// Subpath of an S3 Files mount is the directory of the file system
	// that is mounted: absolute inside the file system ("/a/b"), clean;
	// empty means its root.
	Subpath string
	// MountTargetIP, when set, is the IP address of the S3 Files mount
	// target to use instead of resolving one for the region.
	MountTargetIP string
	// AccessPoint, when set, is an S3 Files access point ("fsap-" and
	// lowercase hex) the mount goes through.
	AccessPoint string
	// ExtraOptions are further NFS mount options of an S3 Files mount,
	// each "name" or "name=value" (no commas or spaces).
	ExtraOptions []string
	// ReadOnly mounts reject writes. nil means true: a mount is read-only
	// unless it says otherwise.
	ReadOnly    *bool
	Credentials map[string]SecretRef
}

// IsReadOnly reports whether the mount is read-only (the default).
func (mt *Mount) IsReadOnly() bool { return mt.ReadOnly == nil || *mt.ReadOnly }

// CredentialKeys returns the credential names a mount type accepts.
func CredentialKeys(t EntryType) []string {
	switch t {
	case TypeS3Mount:
		return []string{"access_key_id", "secret_access_key", "session_token"}
	case TypeGCSMount:
		return []string{"service_account_key", "access_id", "secret_access_key", "access_token"}
	case TypeR2Mount:
		return []string{"access_key_id", "secret_access_key"}
	case TypeAzureBlobMount:
		return []string{"account_key", "sas_token"}
	}
	return nil
}

// User is a sandbox account.
type User struct {
	Name string
	// UID, when set, fixes the numeric id; otherwise the sandbox picks one.
	UID *uint32
	// Groups the user belongs to (declared groups), besides its private one.
	Groups []string
	// Home and Shell are absolute sandbox paths; empty leaves the provider's
	// default.
	Home  string
	Shell string
}

// Group is a sandbox group.
type Group struct {
	Name string
	// GID, when set, fixes the numeric id.
	GID *uint32
}

// PathGrant gives model-directed tools access to an absolute sandbox path
// outside the workspace.
type PathGrant struct {
	// Path is absolute, clean and not "/".
	Path     string
	ReadOnly bool
	// Description says why the grant exists.
	Description string
}

// Redaction records what Redacted removed from a manifest.
type Redaction struct {
	// Sources lists the workspace paths of local_file/local_dir entries
	// whose host path was removed.
	Sources []string
	// Grants lists the paths of the extra path grants that were removed.
	Grants []string
}

// Clone returns a deep copy of m. Resolved secret values are kept.
func (m *Manifest) Clone() *Manifest {
	if m == nil {
		return nil
	}
	out := *m
	out.Entries = cloneEntries(m.Entries)
	if m.Environment != nil {
		out.Environment = make(map[string]EnvValue, len(m.Environment))
		for k, v := range m.Environment {
			if v.Secret != nil {
				ref := *v.Secret
				v.Secret = &ref
			}
			out.Environment[k] = v
		}
	}
	if m.Users != nil {
		out.Users = make([]User, len(m.Users))
		for i, u := range m.Users {
			u.UID = cloneUint(u.UID)
			u.Groups = slices.Clone(u.Groups)
			out.Users[i] = u
		}
	}
	if m.Groups != nil {
		out.Groups = make([]Group, len(m.Groups))
		for i, g := range m.Groups {
			g.GID = cloneUint(g.GID)
			out.Groups[i] = g
		}
	}
	out.ExtraPathGrants = slices.Clone(m.ExtraPathGrants)
	if m.Redaction != nil {
		out.Redaction = &Redaction{Sources: slices.Clone(m.Redaction.Sources), Grants: slices.Clone(m.Redaction.Grants)}
	}
	return &out
}

func cloneEntries(in map[string]*Entry) map[string]*Entry {
	if in == nil {
		return nil
	}
	out := make(map[string]*Entry, len(in))
	for k, e := range in {
		out[k] = e.Clone()
	}
	return out
}

// Clone returns a deep copy of e.
func (e *Entry) Clone() *Entry {
	if e == nil {
		return nil
	}
	out := *e
	if e.Permissions != nil {
		p := *e.Permissions
		out.Permissions = &p
	}
	if e.Content != nil {
		out.Content = slices.Clone(e.Content)
	}
	out.Children = cloneEntries(e.Children)
	if e.Git != nil {
		g := *e.Git
		if g.Token != nil {
			t := *g.Token
			g.Token = &t
		}
		out.Git = &g
	}
	if e.Mount != nil {
		mt := *e.Mount
		if mt.ReadOnly != nil {
			ro := *mt.ReadOnly
			mt.ReadOnly = &ro
		}
		mt.Credentials = maps.Clone(mt.Credentials)
		mt.ExtraOptions = slices.Clone(mt.ExtraOptions)
		out.Mount = &mt
	}
	return &out
}

func cloneUint(p *uint32) *uint32 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// WithRunAs returns a copy of m whose RunAs is name, adding a user of that
// name when none is declared (and name is not "root").
func (m *Manifest) WithRunAs(name string) *Manifest {
	out := m.Clone()
	out.RunAs = name
	if name != "root" && !slices.ContainsFunc(out.Users, func(u User) bool { return u.Name == name }) {
		out.Users = append(out.Users, User{Name: name})
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

func sortStrings(s []string) { slices.Sort(s) }
