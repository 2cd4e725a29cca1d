package local

// User namespaces: a root harness's bubblewrap sandboxes run in a user
// namespace of their own, which the harness creates (Start with
// Options.UserNS) before bwrap runs, so that root inside a sandbox is never
// host root. The namespace maps the sandbox's ids 0..65535 to a block of
// 65536 host ids of its own (its id base, recorded in the private
// directory), drawn from [minSandboxUID, maxSandboxUID) and used by no
// host account and no other sandbox of the state directory. Root inside
// (the daemon, and processes run as root) is then host uid base: its
// capabilities hold in the sandbox's namespaces only, and a host file
// whose owner is outside the block (every file of the host, the harness's
// token, store and configuration included) is open to it only as far as
// its permissions let anyone read it. A manifest's uids and gids must lie
// in 0..65535 (checkIDs): nothing else can be mapped.

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// idBlockSize is how many ids a sandbox's user namespace maps: the
// sandbox's uids and gids are 0 to idBlockSize-1.
const idBlockSize = 1 << 16

// idBaseFile is the private directory's record of its sandbox's id base:
// a replacement sandbox (resume after its daemon died) maps the same block,
// so that its kept workspace's owners stay the same users.
const idBaseFile = "idbase"

// UserNS describes the user namespace a daemon starts in (Options.UserNS):
// the namespace's ids 0..Size-1 are host ids HostID..HostID+Size-1, for
// users and groups alike, and the started process is root (uid and gid 0)
// in it.
type UserNS struct {
	HostID uint32
	Size   uint32
}

// sysProcAttr sets up attr to start the process in a new user namespace
// as ns describes, as its root.
func (ns *UserNS) sysProcAttr(attr *syscall.SysProcAttr) {
	attr.Cloneflags |= syscall.CLONE_NEWUSER
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ns.HostID), Size: int(ns.Size)}}
	attr.UidMappings, attr.GidMappings = m, m
	// setgroups stays allowed: the daemon gives run_as users their groups.
	attr.GidMappingsEnableSetgroups = true
	attr.Credential = &syscall.Credential{Uid: 0, Gid: 0}
}

// readIDBase returns the id base recorded in dir, and whether there is one.
func readIDBase(dir string) (uint32, bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, idBaseFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("sandbox id base: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 32)
	if err != nil || !validIDBase(uint32(n)) {
		return 0, false, fmt.Errorf("sandbox id base: %q in %s is not a block of %d ids in [%d, %d)",
			strings.TrimSpace(string(data)), filepath.Join(dir, idBaseFile), idBlockSize, minSandboxUID, maxSandboxUID)
	}
	return uint32(n), true, nil
}

// validIDBase reports whether base starts an id block of the range.
func validIDBase(base uint32) bool {
	return base >= minSandboxUID && uint64(base)+idBlockSize <= maxSandboxUID && base%idBlockSize == 0
}

// idBase returns the id base of the sandbox in dir: the recorded one, or a
// new block (recorded in dir) that no host account and no other sandbox
// of the state directory uses.
func (p *Provider) idBase(dir string) (uint32, error) {
	if base, ok, err := readIDBase(dir); err != nil || ok {
		return base, err
	}
	// The state directory itself is the lock around the choice (harness
	// processes sharing it included).
	lock, err := os.Open(p.cfg.StateDir)
	if err != nil {
		return 0, fmt.Errorf("sandbox id base: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return 0, fmt.Errorf("sandbox id base: lock: %w", err)
	}
	defer func() { _ = unix.Flock(int(lock.Fd()), unix.LOCK_UN) }()
	taken, err := p.takenIDBlocks()
	if err != nil {
		return 0, err
	}
	base, err := drawIDBase(taken)
	if err != nil {
		return 0, err
	}
	if err := writeFileAtomic(filepath.Join(dir, idBaseFile), []byte(strconv.FormatUint(uint64(base), 10)+"\n"), 0o600); err != nil {
		return 0, fmt.Errorf("sandbox id base: %w", err)
	}
	return base, nil
}

// takenIDBlocks returns the id blocks (by base) that a new sandbox must
// not use: those of the state directory's sandboxes (running or not: a
// stopped one's workspace keeps its owners) and those holding an id of
// the host's accounts or subordinate id ranges.
func (p *Provider) takenIDBlocks() (map[uint32]bool, error) {
	taken := map[uint32]bool{}
	entries, err := os.ReadDir(p.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("sandbox id base: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if base, ok, err := readIDBase(filepath.Join(p.cfg.StateDir, e.Name())); err == nil && ok {
			taken[base] = true
		}
	}
	takeRange := func(first, count uint64) {
		if count == 0 || first+count <= minSandboxUID || first >= maxSandboxUID {
			return
		}
		for b := first / idBlockSize; b <= (first+count-1)/idBlockSize && b*idBlockSize < maxSandboxUID; b++ {
			taken[uint32(b*idBlockSize)] = true
		}
	}
	for _, name := range []string{"/etc/passwd", "/etc/group"} {
		data, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if f := strings.Split(line, ":"); len(f) > 2 {
				if n, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					takeRange(n, 1)
				}
			}
		}
	}
	// Subordinate ids (user:first:count) belong to users' own user
	// namespaces (rootless containers).
	for _, name := range []string{"/etc/subuid", "/etc/subgid"} {
		data, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if f := strings.Split(strings.TrimSpace(line), ":"); len(f) == 3 {
				first, err1 := strconv.ParseUint(f[1], 10, 32)
				count, err2 := strconv.ParseUint(f[2], 10, 32)
				if err1 == nil && err2 == nil {
					takeRange(first, count)
				}
			}
		}
	}
	return taken, nil
}

// drawIDBase draws a block at random among those not taken.
func drawIDBase(taken map[uint32]bool) (uint32, error) {
	const blocks = (maxSandboxUID - minSandboxUID) / idBlockSize
	var b [4]byte
	for range 64 {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("sandbox id base: %w", err)
		}
		base := minSandboxUID + (binary.LittleEndian.Uint32(b[:])%blocks)*idBlockSize
		if !taken[base] {
			return base, nil
		}
	}
	return 0, fmt.Errorf("%w: sandbox id base: no free block of %d host ids in [%d, %d) after 64 draws", compute.ErrResourceExhausted, idBlockSize, minSandboxUID, maxSandboxUID)
}

// checkIDs refuses a manifest whose users or groups have ids a sandbox's
// user namespace cannot map (idBlockSize and above), naming the entry.
func checkIDs(m *manifest.Manifest) error {
	if m == nil {
		return nil
	}
	for i, u := range m.Users {
		if u.UID != nil && *u.UID >= idBlockSize {
			return fmt.Errorf("%w: users[%d].uid: user %q has uid %d; this harness's sandboxes have uids 0 to %d only (each runs in a user namespace of its own)",
				compute.ErrInvalidArgument, i, u.Name, *u.UID, idBlockSize-1)
		}
	}
	for i, g := range m.Groups {
		if g.GID != nil && *g.GID >= idBlockSize {
			return fmt.Errorf("%w: groups[%d].gid: group %q has gid %d; this harness's sandboxes have gids 0 to %d only (each runs in a user namespace of its own)",
				compute.ErrInvalidArgument, i, g.Name, *g.GID, idBlockSize-1)
		}
	}
	return nil
}

// chownToSandbox gives each path to the sandbox's root (host id base), so
// that the daemon, root in its user namespace, may write there. Paths
// that do not exist are skipped.
func chownToSandbox(base uint32, paths ...string) error {
	for _, p := range paths {
		if err := os.Lchown(p, int(base), int(base)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("give %s to the sandbox: %w", filepath.Base(p), err)
		}
	}
	return nil
}

// agentdCopyPrefix starts the name of the state directory's directories
// holding copies of the daemon binary (see reachableAgentd); session ids
// may not start with a dot (Launch), so none is a sandbox's.
const agentdCopyPrefix = ".agentd-"

// reachableAgentd returns a path of the daemon binary at agentd that any
// user may look up and execute, as the root of a sandbox's user namespace
// (no host root) must for bwrap to bind it: agentd itself when it is, else
// a copy in the state directory (made once per binary, named by its
// contents: a root harness's ~/go/bin is below a home only root may
// search).
func reachableAgentd(stateDir, agentd string) (string, error) {
	fi, err := os.Stat(agentd)
	if err != nil {
		return "", fmt.Errorf("local provider: agentd: %w", err)
	}
	if unsearchableAncestor(filepath.Dir(agentd)) == "" && fi.Mode().Perm()&0o005 == 0o005 {
		return agentd, nil
	}
	src, err := os.Open(agentd)
	if err != nil {
		return "", fmt.Errorf("local provider: agentd: %w", err)
	}
	defer src.Close()
	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", fmt.Errorf("local provider: agentd: %w", err)
	}
	dir := filepath.Join(stateDir, agentdCopyPrefix+hex.EncodeToString(h.Sum(nil))[:16])
	dst := filepath.Join(dir, filepath.Base(agentd))
	if fi, err := os.Stat(dst); err == nil && fi.Mode().IsRegular() {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("local provider: copy agentd: %w", err)
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("local provider: copy agentd: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", fmt.Errorf("local provider: copy agentd: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, src)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return "", fmt.Errorf("local provider: copy agentd: %w", err)
	}
	return dst, nil
}
