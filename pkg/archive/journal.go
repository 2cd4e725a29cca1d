package archive

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// PrivateDir is the name, at the top of the workspace, of Restore's
// private area: a directory owned by the restoring process's user with
// mode 0700 that holds the journal of the restore in progress, its staging
// directory and its backup directory. Restore creates it and removes it
// when it ends; a crash leaves it for Recover. Like every ReservedPrefix
// name it is never archived, fingerprinted, moved by a restore or accepted
// as an archive member.
//
// Other users (a sandbox's run_as users) can neither read nor write inside
// it, so they cannot forge or alter the journal; Recover trusts the
// directory and the journal only when they belong to its own effective
// uid, are not accessible to group or others and are not symbolic links,
// and removes whatever else holds the name.
const PrivateDir = ReservedPrefix + "private"

// Names inside PrivateDir.
const (
	journalName  = "journal"
	journalTemp  = "journal.tmp"
	stagePrefix  = "stage-"
	backupPrefix = "backup-"
)

// maxJournalBytes bounds the journal a recovery reads.
const maxJournalBytes = 16 << 20

// journalVersion is the version of the journal's encoding.
const journalVersion = 1

// phase is the step of a restore the journal records. A restore goes
// staging -> swap-out -> swap-in -> done, or, undone, from swap-out or
// swap-in through undo-in (from swap-in only) and undo-out. The journal
// records swap-out only once the staging directory is complete (the
// archive fully extracted and checked): from then on a crash rolls the
// restore forward, before it back.
type phase string

const (
	// phaseStaging: the archive is being extracted into the staging
	// directory; the workspace is untouched. Recovery removes the stage.
	phaseStaging phase = "staging"
	// phaseSwapOut: the stage is complete; the workspace's entries are
	// being moved into the backup. Recovery moves the rest out, then in.
	phaseSwapOut phase = "swap-out"
	// phaseSwapIn: every old entry is in the backup; the staged entries
	// are being moved in. Recovery moves the rest in.
	phaseSwapIn phase = "swap-in"
	// phaseDone: the workspace holds the archive; the backup and the stage
	// are being removed.
	phaseDone phase = "done"
	// phaseUndoIn: a failed swap is being undone; the entries moved in are
	// being moved back into the stage.
	phaseUndoIn phase = "undo-in"
	// phaseUndoOut: the backup's entries are being moved back.
	phaseUndoOut phase = "undo-out"
)

// valid reports whether p is a phase this version writes.
func (p phase) valid() bool {
	switch p {
	case phaseStaging, phaseSwapOut, phaseSwapIn, phaseDone, phaseUndoIn, phaseUndoOut:
		return true
	}
	return false
}

// journal is what a restore records in its private area, rewritten (to a
// temporary file, fsynced, renamed, the directory fsynced) at each phase.
// It holds everything a recovery needs to finish or undo the restore
// without the archive: which directories to use, which paths to leave in
// place, and the metadata of the directories that stay.
type journal struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	Phase   phase  `json:"phase"`
	// Stage and Backup are the names of the staging and backup
	// directories inside PrivateDir.
	Stage  string `json:"stage"`
	Backup string `json:"backup"`
	// Exclude is the restore's normalised exclude set, sorted.
	Exclude []string `json:"exclude,omitempty"`
	// Spine is the set of directories kept in place because they lead to
	// a preserved excluded path, sorted (parents first).
	Spine []string `json:"spine,omitempty"`
	// Chown says whether the archive's owners are applied (the restore
	// preserves ownership and runs as root).
	Chown bool `json:"chown,omitempty"`
	// Before is the metadata of the root ("") and of the spine
	// directories before the restore, put back when it is undone.
	Before []dirRecord `json:"before"`
	// After is the archive's metadata for the spine directories it names,
	// applied when the swap has moved their contents in.
	After []dirRecord `json:"after,omitempty"`
}

// dirRecord is the metadata of one kept directory.
type dirRecord struct {
	Path string `json:"path"`
	// Mode holds the permission bits with setuid, setgid and sticky, as
	// chmod(2) takes them.
	Mode uint32 `json:"mode"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	// Atime and Mtime are seconds and nanoseconds; a zero Atime is left
	// alone when applied.
	Atime [2]int64 `json:"atime"`
	Mtime [2]int64 `json:"mtime"`
}

// recordOf converts the archive's metadata for a spine directory.
func recordOf(d dirMeta) dirRecord {
	return dirRecord{Path: d.path, Mode: d.mode & 0o7777, UID: d.uid, GID: d.gid,
		Mtime: [2]int64{d.mtime.Unix(), int64(d.mtime.Nanosecond())}}
}

// timespec converts a recorded time; a zero record is UTIME_OMIT.
func timespec(t [2]int64) unix.Timespec {
	if t == [2]int64{} {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.Timespec{Sec: t[0], Nsec: t[1]}
}

// stagePath and backupPath are the root-relative paths of the journal's
// staging and backup directories.
func (j *journal) stagePath() string  { return PrivateDir + "/" + j.Stage }
func (j *journal) backupPath() string { return PrivateDir + "/" + j.Backup }

// validate checks a journal read back from disk: a journal that passed
// the ownership checks was written by this code, but a recovery acts on
// nothing it has not checked (names, paths, phase).
func (j *journal) validate() error {
	switch {
	case j.Version != journalVersion:
		return fmt.Errorf("journal version %d, want %d", j.Version, journalVersion)
	case len(j.ID) != 16 || strings.Trim(j.ID, "0123456789abcdef") != "":
		return fmt.Errorf("bad restore id %q", j.ID)
	case j.Stage != stagePrefix+j.ID || j.Backup != backupPrefix+j.ID:
		return fmt.Errorf("staging and backup names do not match the restore id")
	case !j.Phase.valid():
		return fmt.Errorf("unknown phase %q", j.Phase)
	}
	exclude, err := newExcludeSet(opRestore, j.Exclude)
	if err != nil {
		return err
	}
	lim, _ := Limits{}.resolve()
	spine := make(map[string]bool, len(j.Spine))
	for _, p := range j.Spine {
		c, err := cleanMember(p, &lim)
		if err != nil || c != p || p == "" {
			return fmt.Errorf("bad kept directory %q", p)
		}
		// A kept directory leads to an excluded path, and so do its
		// parents.
		leads := false
		for e := range exclude {
			leads = leads || strings.HasPrefix(e, p+"/")
		}
		if parent, _ := split(p); !leads || (parent != "" && !slices.Contains(j.Spine, parent)) {
			return fmt.Errorf("kept directory %q leads to no excluded path", p)
		}
		spine[p] = true
	}
	for _, d := range j.Before {
		if d.Path != "" && !spine[d.Path] {
			return fmt.Errorf("metadata for %q, which is not kept", d.Path)
		}
	}
	for _, d := range j.After {
		if !spine[d.Path] {
			return fmt.Errorf("metadata for %q, which is not kept", d.Path)
		}
	}
	return nil
}

// privateState says what holds PrivateDir in a workspace.
type privateState int

const (
	privateAbsent    privateState = iota
	privateTrusted                // our directory, 0700
	privateUntrusted              // anything else: a link, a file, someone else's directory
)

// openPrivate looks PrivateDir up without following links and says whether
// it can be trusted: a directory owned by our effective uid that group and
// others cannot access.
func (t *tree) openPrivate() (int, privateState, error) {
	fd, err := t.dir(PrivateDir)
	switch {
	case errors.Is(err, unix.ENOENT):
		return -1, privateAbsent, nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		return -1, privateUntrusted, nil
	case err != nil:
		return -1, privateAbsent, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return -1, privateAbsent, err
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		t.forget(PrivateDir)
		return -1, privateUntrusted, nil
	}
	return fd, privateTrusted, nil
}

// makePrivate creates PrivateDir (mode 0700) unless our own is there, and
// returns its descriptor.
func (t *tree) makePrivate() (int, error) {
	fd, state, err := t.openPrivate()
	switch {
	case err != nil:
		return -1, err
	case state == privateTrusted:
		return fd, nil
	case state == privateUntrusted:
		return -1, errkind.Errorf(errkind.ErrFailedPrecondition, "an entry the restore does not own holds its private directory")
	}
	if err := ignoreEINTR(func() error { return unix.Mkdirat(int(t.top.Fd()), PrivateDir, 0o700) }); err != nil {
		return -1, err
	}
	t.touched[""] = true
	fd, state, err = t.openPrivate()
	if err == nil && state != privateTrusted {
		err = errkind.Errorf(errkind.ErrFailedPrecondition, "the private directory was replaced while it was created")
	}
	if err != nil {
		return -1, err
	}
	// The umask may have taken bits we need; none beyond 0700 are given.
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return -1, err
	}
	return fd, t.sync()
}

// errUntrustedJournal marks a journal file that is not ours.
var errUntrustedJournal = errors.New("the journal file is not the restore's own")

// readJournal reads and checks the journal in our private directory pfd:
// nil when there is none, errUntrustedJournal when the file is not ours.
func readJournal(pfd int) (*journal, error) {
	fd, err := openat(pfd, journalName, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, nil
	case errors.Is(err, unix.ELOOP):
		return nil, errUntrustedJournal
	case err != nil:
		return nil, err
	}
	f := os.NewFile(uintptr(fd), journalName)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 || st.Nlink != 1 {
		return nil, errUntrustedJournal
	}
	b, err := io.ReadAll(io.LimitReader(f, maxJournalBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxJournalBytes {
		return nil, fmt.Errorf("%w: the journal is larger than %d bytes", errkind.ErrInvalidArgument, maxJournalBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var j journal
	if err := dec.Decode(&j); err != nil {
		return nil, fmt.Errorf("%w: the journal does not decode: %v", errkind.ErrInvalidArgument, err)
	}
	if err := j.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errkind.ErrInvalidArgument, err)
	}
	return &j, nil
}

// writeJournal records j in the private directory: written to a temporary
// file and fsynced, renamed over the previous journal, and the directory
// fsynced. fault is called between the fsync and the rename.
func (t *tree) writeJournal(j *journal, fault func(string) error) error {
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	pfd, err := t.dir(PrivateDir)
	if err != nil {
		return err
	}
	if err := ignoreEINTR(func() error { return unix.Unlinkat(pfd, journalTemp, 0) }); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	fd, err := openat(pfd, journalTemp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	err = writeAll(fd, b)
	if err == nil {
		err = ignoreEINTR(func() error { return unix.Fsync(fd) })
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := fault(StepJournal + string(j.Phase)); err != nil {
		return err
	}
	if err := ignoreEINTR(func() error { return unix.Renameat(pfd, journalTemp, pfd, journalName) }); err != nil {
		return err
	}
	return ignoreEINTR(func() error { return unix.Fsync(pfd) })
}

// removeJournal deletes the journal: the restore it recorded is over.
func (t *tree) removeJournal() error {
	pfd, err := t.dir(PrivateDir)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	err = ignoreEINTR(func() error { return unix.Unlinkat(pfd, journalName, 0) })
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// statDir reads the metadata of the kept directory rel.
func (t *tree) statDir(rel string) (dirRecord, error) {
	fd, err := t.dir(rel)
	if err != nil {
		return dirRecord{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return dirRecord{}, err
	}
	return dirRecord{Path: rel, Mode: st.Mode & 0o7777, UID: int(st.Uid), GID: int(st.Gid),
		Atime: [2]int64{st.Atim.Sec, st.Atim.Nsec}, Mtime: [2]int64{st.Mtim.Sec, st.Mtim.Nsec}}, nil
}

// setDir gives the kept directory rel the owner (when chown), the mode
// (when mode) and the times of d, through a descriptor opened without
// following links. The directory is fsynced with the others the phase
// touched.
func (t *tree) setDir(rel string, d dirRecord, chown, mode bool) error {
	fd, err := t.dir(rel)
	if err != nil {
		return err
	}
	t.touched[rel] = true
	if chown {
		if err := unix.Fchown(fd, d.UID, d.GID); err != nil {
			return err
		}
	}
	if mode {
		if err := unix.Fchmod(fd, d.Mode&0o7777); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{timespec(d.Atime), timespec(d.Mtime)}
	return ignoreEINTR(func() error { return unix.UtimesNanoAt(fd, ".", ts, 0) })
}
