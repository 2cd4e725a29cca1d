package archive

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

const (
	// maxWindow bounds the zstd window (and so the decoder's memory) an
	// archive may ask for: zstd --ultra -22 uses 128 MiB.
	maxWindow = 128 << 20
	// maxTrailing bounds the bytes accepted after the end-of-archive
	// marker (tar pads to its record size with zeros).
	maxTrailing = 1 << 20
)

// zstdMagicLen is the length of the magic number that starts a zstd frame.
const zstdMagicLen = 4

// isZstd reports whether a stream starting with b is zstd: a frame (magic
// 0xFD2FB528, little-endian) or a skippable frame (0x184D2A50 to
// 0x184D2A5F).
func isZstd(b []byte) bool {
	if len(b) < zstdMagicLen {
		return false
	}
	return (b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd) ||
		(b[0]&0xf0 == 0x50 && b[1] == 0x2a && b[2] == 0x4d && b[3] == 0x18)
}

// member is what the extractor knows about one path of the archive.
type member struct {
	kind     kind // kindDir, kindFile (hard links too) or kindSymlink
	implicit bool // a directory made for the members below it
	target   string
}

// dirMeta is the metadata a directory gets once its contents are in place.
type dirMeta struct {
	path     string
	mode     uint32
	uid, gid int
	mtime    time.Time
	explicit bool // named by the archive (otherwise: mode 0755 only)
}

// extractor reads an archive into an empty staging directory. Because the
// staging directory starts empty and only the extractor writes to it, the
// members map describes it completely, and every check is made on the map
// before the filesystem is touched.
type extractor struct {
	ctx     context.Context
	opts    *RestoreOptions
	lim     Limits
	log     *zap.Logger
	exclude excludeSet
	spine   map[string]bool // directories that hold preserved excluded paths
	stage   *os.Root
	chown   bool

	meter    *meter
	tr       *tar.Reader
	members  map[string]*member
	dirs     []dirMeta
	dirIndex map[string]int
	symlinks []string
	// spineMeta is the archive's metadata for spine directories, applied
	// by the swap to the directories that stay in place.
	spineMeta map[string]dirMeta
	written   int64
	stats     Stats
	buf       []byte
	last      string // name of the last member read

	parentPath string // the directory parentFile is open on
	parentFile *os.File

	// sync fsyncs what the extraction wrote (see stageSyncer).
	sync *stageSyncer
}

// run extracts the archive read from r and checks it completely: when it
// returns nil, the staging directory holds the restored tree with its final
// metadata (spine directories aside).
func (x *extractor) run(r io.Reader) error {
	x.members = make(map[string]*member)
	x.dirIndex = make(map[string]int)
	x.spineMeta = make(map[string]dirMeta)
	x.buf = make([]byte, copyBufSize)
	x.meter = &meter{lim: &x.lim}
	defer x.closeParent()
	x.sync = newStageSyncer(x.opts.hooks.sync)
	defer x.sync.stop()

	br := bufio.NewReaderSize(x.meter.input(r), 64<<10)
	var src io.Reader = br
	if magic, _ := br.Peek(zstdMagicLen); isZstd(magic) {
		dec, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderMaxMemory(maxWindow))
		if err != nil {
			return pathErr(opRestore, streamName, err)
		}
		defer dec.Close()
		src = dec
	}
	out := x.meter.output(src)
	x.tr = tar.NewReader(out)
	for {
		if err := x.ctx.Err(); err != nil {
			return pathErr(opRestore, streamName, err)
		}
		hdr, err := x.tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil && !(errors.Is(err, tar.ErrInsecurePath) && hdr != nil) {
			name := streamName
			if x.meter.check() != nil && x.last != "" {
				// Crossed while skipping the rest of the last member.
				name = shown(x.last)
			}
			return x.streamErr(name, err)
		}
		x.stats.Members++
		x.last = hdr.Name
		if x.stats.Members > x.lim.MaxMembers {
			return refuse(opRestore, shown(hdr.Name), errkind.ErrResourceExhausted,
				"the archive has more than %d members", x.lim.MaxMembers)
		}
		if err := x.member(hdr); err != nil {
			return err
		}
	}
	if err := x.meter.check(); err != nil {
		return &errkind.PathError{Op: opRestore, Path: streamName, Err: err}
	}
	if x.meter.zeros < endMarker {
		return x.refuseStream(errkind.ErrInvalidArgument, "the archive ends without an end-of-archive marker (truncated?)")
	}
	if err := x.drain(out); err != nil {
		return err
	}
	x.closeParent()
	return x.finish()
}

// member extracts one member.
func (x *extractor) member(hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader { // global PAX records: nothing to extract
		return nil
	}
	name := shown(hdr.Name)
	p, err := cleanMember(hdr.Name, &x.lim)
	if err != nil {
		return &errkind.PathError{Op: opRestore, Path: name, Err: err}
	}
	var k kind
	switch hdr.Typeflag {
	case tar.TypeReg, '\x00', tar.TypeCont, tar.TypeGNUSparse:
		k = kindFile
	case tar.TypeDir:
		k = kindDir
	case tar.TypeSymlink:
		k = kindSymlink
	case tar.TypeLink:
		k = kindHardLink
	case tar.TypeChar, tar.TypeBlock:
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "device members are not allowed")
	case tar.TypeFifo:
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "FIFO members are not allowed")
	default:
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "unsupported member type %q", hdr.Typeflag)
	}
	if p == "" {
		// The workspace root: its own metadata is never changed.
		if k != kindDir {
			return refuse(opRestore, name, errkind.ErrInvalidArgument, "the archive root must be a directory")
		}
		return nil
	}
	if x.exclude.covers(p) {
		x.stats.Skipped++
		return nil
	}
	if err := x.parents(p, name); err != nil {
		return err
	}
	if m, ok := x.members[p]; ok {
		if k == kindDir && m.kind == kindDir && m.implicit {
			m.implicit = false
			x.dirs[x.dirIndex[p]] = x.dirMeta(p, hdr)
			x.stats.Dirs++
			return nil
		}
		if m.implicit {
			return refuse(opRestore, name, errkind.ErrInvalidArgument, "member conflicts with the directory that earlier members imply")
		}
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "duplicate member")
	}
	if x.spine[p] && k != kindDir {
		return refuse(opRestore, name, errkind.ErrInvalidArgument,
			"member would replace a directory that holds a preserved (excluded) path")
	}
	switch k {
	case kindDir:
		return x.dir(p, name, hdr)
	case kindFile:
		return x.file(p, name, hdr)
	case kindSymlink:
		return x.symlink(p, name, hdr)
	default:
		return x.hardLink(p, name, hdr)
	}
}

// parents checks that every ancestor of p is a directory of the archive,
// making the missing ones.
func (x *extractor) parents(p, name string) error {
	dir, _ := split(p)
	if dir == "" {
		return nil
	}
	if m, ok := x.members[dir]; ok && m.kind == kindDir {
		return nil // its own ancestors were checked when it was made
	}
	for i := 0; i <= len(dir); i++ {
		if i < len(dir) && dir[i] != '/' {
			continue
		}
		a := dir[:i]
		if m, ok := x.members[a]; ok {
			switch m.kind {
			case kindDir:
				continue
			case kindSymlink:
				return refuse(opRestore, name, errkind.ErrPathEscape, "member lies below the symbolic link %s", shown(a))
			default:
				return refuse(opRestore, name, errkind.ErrInvalidArgument, "member lies below the non-directory %s", shown(a))
			}
		}
		if err := x.stage.Mkdir(a, 0o700); err != nil {
			return pathErr(opRestore, name, err)
		}
		x.members[a] = &member{kind: kindDir, implicit: true}
		x.dirIndex[a] = len(x.dirs)
		x.dirs = append(x.dirs, dirMeta{path: a, mode: 0o755})
	}
	return nil
}

// dir makes a directory member (writable for now; its metadata is applied
// by finish, after its contents).
func (x *extractor) dir(p, name string, hdr *tar.Header) error {
	dfd, base, err := x.at(p)
	if err != nil {
		return pathErr(opRestore, name, err)
	}
	if err := ignoreEINTR(func() error { return unix.Mkdirat(dfd, base, 0o700) }); err != nil {
		return pathErr(opRestore, name, err)
	}
	x.members[p] = &member{kind: kindDir}
	x.dirIndex[p] = len(x.dirs)
	x.dirs = append(x.dirs, x.dirMeta(p, hdr))
	x.stats.Dirs++
	return nil
}

// file extracts a regular file member, counting the bytes it writes.
func (x *extractor) file(p, name string, hdr *tar.Header) error {
	if left := x.lim.MaxBytes - x.written; hdr.Size > left && !x.opts.hooks.ignoreDeclaredSize {
		return refuse(opRestore, name, errkind.ErrResourceExhausted,
			"member declares %d bytes but only %d of the %d-byte limit remain", hdr.Size, left, x.lim.MaxBytes)
	}
	dfd, base, err := x.at(p)
	if err != nil {
		return pathErr(opRestore, name, err)
	}
	fd, err := openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return pathErr(opRestore, name, err)
	}
	x.members[p] = &member{kind: kindFile}
	err = x.content(fd, name)
	if err == nil && x.chown {
		err = pathErr(opRestore, name, unix.Fchown(fd, hdr.Uid, hdr.Gid))
	}
	if err == nil {
		err = pathErr(opRestore, name, ignoreEINTR(func() error { return unix.Fchmod(fd, x.mode(hdr)) }))
	}
	if err == nil {
		err = pathErr(opRestore, name, setMtime(dfd, base, hdr.ModTime))
	}
	if err != nil {
		_ = unix.Close(fd)
		return err
	}
	// The file is complete, its metadata too: fsynced and closed from
	// here on while the extraction goes on.
	if err := x.sync.add(fd, p); err != nil {
		return err
	}
	x.stats.Files++
	return nil
}

// content copies the current member's bytes to fd. The byte limit is
// checked before every write against the bytes actually written, whatever
// the header declared.
func (x *extractor) content(fd int, name string) error {
	for {
		if err := x.ctx.Err(); err != nil {
			return pathErr(opRestore, name, err)
		}
		n, rerr := x.tr.Read(x.buf)
		if n > 0 {
			if x.written+int64(n) > x.lim.MaxBytes {
				return refuse(opRestore, name, errkind.ErrResourceExhausted,
					"the archive's contents exceed the limit of %d bytes", x.lim.MaxBytes)
			}
			if err := writeAll(fd, x.buf[:n]); err != nil {
				return pathErr(opRestore, name, err)
			}
			x.written += int64(n)
			x.stats.Bytes += int64(n)
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return x.streamErr(name, rerr)
		}
	}
}

// symlink makes a symbolic link member after checking its target.
func (x *extractor) symlink(p, name string, hdr *tar.Header) error {
	t := hdr.Linkname
	switch {
	case t == "":
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "empty symbolic link target")
	case !utf8.ValidString(t):
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "symbolic link target is not valid UTF-8")
	case strings.IndexByte(t, 0) >= 0:
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "symbolic link target contains NUL")
	case len(t) > x.lim.MaxPathBytes:
		return refuse(opRestore, name, errkind.ErrInvalidArgument,
			"symbolic link target is %d bytes long, the limit is %d", len(t), x.lim.MaxPathBytes)
	}
	x.members[p] = &member{kind: kindSymlink, target: t}
	if err := x.checkLink(p, name); err != nil {
		return err
	}
	dfd, base, err := x.at(p)
	if err != nil {
		return pathErr(opRestore, name, err)
	}
	if err := ignoreEINTR(func() error { return unix.Symlinkat(t, dfd, base) }); err != nil {
		return pathErr(opRestore, name, err)
	}
	if x.chown {
		if err := unix.Fchownat(dfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathErr(opRestore, name, err)
		}
	}
	if err := setMtime(dfd, base, hdr.ModTime); err != nil {
		return pathErr(opRestore, name, err)
	}
	x.symlinks = append(x.symlinks, p)
	x.stats.Symlinks++
	return nil
}

// hardLink links a member to an earlier regular file of the archive.
func (x *extractor) hardLink(p, name string, hdr *tar.Header) error {
	t, err := cleanMember(hdr.Linkname, &x.lim)
	if err != nil {
		return &errkind.PathError{Op: opRestore, Path: name, Err: fmt.Errorf("hard link target: %w", err)}
	}
	m, ok := x.members[t]
	switch {
	case t == "":
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "hard link to the archive root")
	case !ok && x.exclude.covers(t):
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "hard link target %s is excluded", shown(t))
	case !ok:
		return refuse(opRestore, name, errkind.ErrInvalidArgument,
			"hard link target %s is not an earlier member of the archive", shown(t))
	case m.kind != kindFile:
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "hard link target %s is not a regular file", shown(t))
	}
	if err := x.stage.Link(t, p); err != nil {
		return pathErr(opRestore, name, err)
	}
	x.members[p] = &member{kind: kindFile}
	x.stats.HardLinks++
	return nil
}

// finish checks every symbolic link against the complete archive, gives
// directories their metadata, deepest first (children change their
// parent's mtime), and returns once the staged tree is durable: every
// file and directory fsynced (see stageSyncer).
func (x *extractor) finish() error {
	for _, p := range x.symlinks {
		if err := x.checkLink(p, shown(p)); err != nil {
			return err
		}
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		if err := x.ctx.Err(); err != nil {
			return pathErr(opRestore, streamName, err)
		}
		d := x.dirs[i]
		// Opened while it is still the extraction's (mode 0700): its
		// final mode may not let its owner read it.
		fd, err := x.openDir(d.path)
		if err != nil {
			return pathErr(opRestore, shown(d.path), err)
		}
		if x.spine[d.path] {
			if d.explicit {
				x.spineMeta[d.path] = d
			}
		} else if err := applyDirMeta(x.stage, d, x.chown); err != nil {
			_ = unix.Close(fd)
			return pathErr(opRestore, shown(d.path), err)
		}
		if err := x.sync.add(fd, d.path); err != nil {
			return err
		}
	}
	fd, err := x.openDir("")
	if err != nil {
		return pathErr(opRestore, ".", err)
	}
	if err := x.sync.add(fd, ""); err != nil {
		return err
	}
	return x.sync.wait()
}

// openDir opens the staged directory p ("" for the staging directory
// itself) for an fsync.
func (x *extractor) openDir(p string) (int, error) {
	dir, base := split(p)
	if p == "" {
		base = "."
	}
	dfd, err := x.dirFD(dir)
	if err != nil {
		return -1, err
	}
	return openat(dfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
}

// applyDirMeta gives the directory d.path of r its owner, mode and mtime.
func applyDirMeta(r *os.Root, d dirMeta, chown bool) error {
	if d.explicit && chown {
		if err := r.Lchown(d.path, d.uid, d.gid); err != nil {
			return err
		}
	}
	if err := r.Chmod(d.path, fileMode(d.mode)); err != nil {
		return err
	}
	if d.explicit {
		return r.Chtimes(d.path, time.Time{}, d.mtime)
	}
	return nil
}

// drain reads what follows the end-of-archive marker: zero padding only, a
// bounded amount. For zstd this also reaches the end of the frame, so that
// its checksum is verified.
func (x *extractor) drain(r io.Reader) error {
	var total int64
	for {
		n, err := r.Read(x.buf)
		total += int64(n)
		for _, b := range x.buf[:n] {
			if b != 0 {
				return x.refuseStream(errkind.ErrInvalidArgument, "data follows the end-of-archive marker")
			}
		}
		if total > maxTrailing {
			return x.refuseStream(errkind.ErrInvalidArgument, "more than %d bytes follow the end-of-archive marker", maxTrailing)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return x.streamErr(streamName, err)
		}
	}
}

// streamErr turns a failure to read the archive into a restore error for
// name: a limit the meter saw crossed, the caller's reader's own error, a
// cancellation, or a truncated or corrupt archive.
func (x *extractor) streamErr(name string, err error) error {
	if merr := x.meter.check(); merr != nil {
		return &errkind.PathError{Op: opRestore, Path: name, Err: merr}
	}
	if p := x.meter.inErr.Load(); p != nil {
		return pathErr(opRestore, name, *p)
	}
	if cerr := x.ctx.Err(); cerr != nil {
		return pathErr(opRestore, name, cerr)
	}
	after := ""
	if name == streamName && x.last != "" {
		after = " after member " + shown(x.last)
	}
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "the archive is truncated%s", after)
	case errors.Is(err, tar.ErrHeader):
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "invalid tar header%s", after)
	default:
		return refuse(opRestore, name, errkind.ErrInvalidArgument, "corrupt archive%s: %s", after, shown(err.Error()))
	}
}

// refuseStream is an error about the archive as a whole.
func (x *extractor) refuseStream(sentinel error, format string, args ...any) error {
	return refuse(opRestore, streamName, sentinel, format, args...)
}

// at returns a descriptor of p's parent directory in the staging tree and
// p's last component. The descriptor of the last parent is kept: archives
// list the entries of a directory together.
func (x *extractor) at(p string) (int, string, error) {
	dir, base := split(p)
	dfd, err := x.dirFD(dir)
	return dfd, base, err
}

// dirFD returns a descriptor of the staged directory dir ("" for the
// staging directory), kept until the next call for another directory.
func (x *extractor) dirFD(dir string) (int, error) {
	if x.parentFile == nil || x.parentPath != dir {
		x.closeParent()
		f, err := x.stage.Open(orDot(dir))
		if err != nil {
			return -1, err
		}
		x.parentFile, x.parentPath = f, dir
	}
	return int(x.parentFile.Fd()), nil
}

// closeParent closes the cached parent directory.
func (x *extractor) closeParent() {
	if x.parentFile != nil {
		_ = x.parentFile.Close()
		x.parentFile = nil
	}
}

// dirMeta is the metadata of a directory member.
func (x *extractor) dirMeta(p string, hdr *tar.Header) dirMeta {
	return dirMeta{path: p, mode: x.mode(hdr), uid: hdr.Uid, gid: hdr.Gid, mtime: hdr.ModTime, explicit: true}
}

// mode is the permission bits a member gets: setuid and setgid only when
// its owner is the archive's.
func (x *extractor) mode(hdr *tar.Header) uint32 {
	m := uint32(hdr.Mode) & 0o7777
	if !x.chown {
		m &^= 0o6000
	}
	return m
}

// fileMode converts permission bits to an fs.FileMode for os.Chmod.
func fileMode(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// setMtime sets the modification time of name in dirfd (not following a
// symbolic link), leaving its access time alone.
func setMtime(dirfd int, name string, t time.Time) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Sec: t.Unix(), Nsec: int64(t.Nanosecond())}}
	return ignoreEINTR(func() error { return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW) })
}

// writeAll writes b to fd.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// checkLink refuses the symbolic link member p when its target leads out of
// the workspace and external targets are not allowed.
func (x *extractor) checkLink(p, name string) error {
	if x.opts.AllowExternalSymlinks {
		return nil
	}
	t := x.members[p].target
	if path.IsAbs(t) {
		return refuse(opRestore, name, errkind.ErrPathEscape, "symbolic link target %s is absolute", shown(t))
	}
	if x.leaves(p) {
		return refuse(opRestore, name, errkind.ErrPathEscape, "symbolic link target %s leads outside the workspace", shown(t))
	}
	return nil
}
