package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Overwrite says what WriteFile does when the target already exists.
type Overwrite int

// Overwrite policies.
const (
	// OverwriteAlways creates the file or replaces an existing one.
	OverwriteAlways Overwrite = iota
	// OverwriteNever only creates: an existing target is
	// errkind.ErrAlreadyExists (checked atomically by the final rename).
	OverwriteNever
	// OverwriteOnlyIfExists only replaces: a missing target is
	// errkind.ErrNotFound.
	OverwriteOnlyIfExists
)

// DefaultFileMode is the mode of a new file written without a Mode.
const DefaultFileMode fs.FileMode = 0o644

// UnknownSize is the ExpectedSize of a write whose length is not announced.
const UnknownSize int64 = -1

// WriteOptions describes one WriteFile.
type WriteOptions struct {
	// Path is the target. A symbolic link there is followed (inside the
	// workspace and grants): the file it points to is replaced and the link
	// stays.
	Path string
	// Mode holds permission bits only (setuid, setgid and sticky are
	// refused: a model must not be able to plant a set-id file). 0 keeps
	// the permission bits of the file being replaced, or DefaultFileMode
	// for a new file. The mode is applied exactly (no umask).
	Mode fs.FileMode
	// CreateParents creates missing parent directories (0755, as the user).
	CreateParents bool
	// Overwrite is the policy for an existing target.
	Overwrite Overwrite
	// ExpectedSize is the announced length, or UnknownSize (-1). Note that
	// 0 announces an empty file.
	ExpectedSize int64
	// ExpectedSHA256 is the announced SHA-256 of the content (nil: none).
	ExpectedSHA256 []byte
	// ComputeSHA256 asks for the content's SHA-256 in the result. It is
	// implied by ExpectedSHA256. Hashing costs CPU (about a second per
	// 2 GiB), so it is done only when asked for.
	ComputeSHA256 bool
}

// WriteResult describes a completed write.
type WriteResult struct {
	// Info describes the new file.
	Info FileInfo
	// SHA256 is the digest of the bytes written, when it was asked for
	// (WriteOptions.ComputeSHA256 or ExpectedSHA256); nil otherwise.
	SHA256 []byte
}

// stagedWrite is a write between its temporary file's creation and the
// final rename.
type stagedWrite struct {
	dir     *os.File // O_PATH parent directory of the target
	name    string   // target name in dir
	base    string   // final component of the resolved target
	tmp     *os.File
	tmpName string
	exists  bool
	old     unix.Stat_t // the replaced file, when exists
}

// WriteFile writes the content read from r to opts.Path as user u (nil:
// the daemon's identity), atomically: the bytes go to a temporary file in
// the target's directory (TempPrefix, O_EXCL, mode 0600, created as u), are
// fsynced and checked, and the file is then renamed over the target. A
// reader never sees a partial file; a failure (including r failing, ctx
// ending, or a size or checksum mismatch) leaves the old file untouched and
// removes the temporary file. A crash may leave the temporary file behind
// for CleanupTemp.
//
// Replacing an existing file: u must be allowed to write to it (a read-only
// file stays read-only even though rename only needs the directory). The
// new file keeps the old permission bits unless opts.Mode is set, and keeps
// the old owner and group when the daemon writes as itself (as root);
// written as a run_as user it belongs to that user, like a file saved by an
// editor that renames. Hard links to the old file keep the old content: the
// target name gets a new inode.
//
// A size or checksum mismatch is errkind.ErrConflict: the request
// contradicts itself, and retrying it unchanged cannot help. Exceeding
// Config.MaxWriteBytes is errkind.ErrResourceExhausted. Writing over a
// directory is errkind.ErrIsDirectory; over a FIFO, socket or device,
// errkind.ErrInvalidArgument.
func (w *Workspace) WriteFile(ctx context.Context, u *userdb.User, opts WriteOptions, r io.Reader) (WriteResult, error) {
	p := opts.Path
	if err := w.checkWriteOptions(opts); err != nil {
		return WriteResult{}, pathErr("write", p, err)
	}
	var s *stagedWrite
	err := w.runAs(ctx, u, func() (err error) {
		s, err = w.stageWrite(opts)
		return err
	})
	if err != nil {
		return WriteResult{}, pathErr("write", p, err)
	}
	defer s.dir.Close()
	res, err := w.fillAndCommit(ctx, u, opts, s, r)
	if err != nil {
		_ = s.tmp.Close()
		if uerr := unlinkAt(s.dir, s.tmpName, false); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
			w.log.Warn("remove temporary file", zap.String("path", p), zap.Error(uerr))
		}
		return WriteResult{}, pathErr("write", p, err)
	}
	newNamer(w.users).fill(&res.Info)
	return res, nil
}

// checkWriteOptions validates the request before anything is touched.
func (w *Workspace) checkWriteOptions(opts WriteOptions) error {
	switch {
	case opts.Mode&^fs.ModePerm != 0:
		return errorf(errkind.ErrInvalidArgument, "mode %v: only permission bits may be set", opts.Mode)
	case opts.Overwrite < OverwriteAlways || opts.Overwrite > OverwriteOnlyIfExists:
		return errorf(errkind.ErrInvalidArgument, "unknown overwrite policy %d", opts.Overwrite)
	case opts.ExpectedSize < UnknownSize:
		return errorf(errkind.ErrInvalidArgument, "expected size %d is negative", opts.ExpectedSize)
	case opts.ExpectedSHA256 != nil && len(opts.ExpectedSHA256) != sha256.Size:
		return errorf(errkind.ErrInvalidArgument, "expected SHA-256 has %d bytes, not %d", len(opts.ExpectedSHA256), sha256.Size)
	case w.maxWrite > 0 && opts.ExpectedSize > w.maxWrite:
		return errorf(errkind.ErrResourceExhausted, "the file (%d bytes) exceeds the %d-byte write limit", opts.ExpectedSize, w.maxWrite)
	}
	return nil
}

// stageWrite resolves the target, checks it and creates the temporary
// file. It runs as the writing user.
func (w *Workspace) stageWrite(opts WriteOptions) (*stagedWrite, error) {
	l, err := w.locate(opts.Path, true)
	if err != nil {
		return nil, err
	}
	if err := l.writable(); err != nil {
		return nil, err
	}
	if l.isRoot() {
		return nil, syscall.EISDIR
	}
	if opts.CreateParents && l.dir() != "." {
		if err := l.m.root.MkdirAll(l.dir(), 0o755); err != nil {
			return nil, err
		}
	}
	d, name, err := l.openParent()
	if err != nil {
		return nil, err
	}
	s := &stagedWrite{dir: d, name: name, base: filepath.Base(l.abs())}
	if err := s.checkTarget(opts.Overwrite); err != nil {
		_ = d.Close()
		return nil, err
	}
	if s.tmp, s.tmpName, err = createTemp(d); err != nil {
		_ = d.Close()
		return nil, err
	}
	return s, nil
}

// checkTarget inspects the existing target against the policy and, when it
// exists, checks the calling thread may write to it.
func (s *stagedWrite) checkTarget(policy Overwrite) error {
	st, err := fstatat(s.dir, s.name)
	switch {
	case errors.Is(err, unix.ENOENT):
		if policy == OverwriteOnlyIfExists {
			return errorf(errkind.ErrNotFound, "the file does not exist and the write may only replace")
		}
		return nil
	case err != nil:
		return err
	}
	if err := writableType(st.Mode); err != nil {
		return err
	}
	if policy == OverwriteNever {
		return errorf(errkind.ErrAlreadyExists, "the file exists and the write may not replace it")
	}
	s.exists, s.old = true, st
	return checkWritable(s.dir, s.name)
}

// writableType refuses replacing anything but a regular file.
func writableType(mode uint32) error {
	switch t := fileTypeOf(mode); t {
	case TypeRegular:
		return nil
	case TypeDirectory:
		return syscall.EISDIR
	case TypeSymlink:
		return errorf(errkind.ErrConflict, "the target was replaced by a symbolic link concurrently")
	default:
		return errorf(errkind.ErrInvalidArgument, "the target is not a regular file (%s)", t)
	}
}

// fillAndCommit copies r into the temporary file, checks it, sets its mode
// and owner and renames it over the target.
func (w *Workspace) fillAndCommit(ctx context.Context, u *userdb.User, opts WriteOptions, s *stagedWrite, r io.Reader) (WriteResult, error) {
	limit := int64(-1) // most bytes accepted
	if w.maxWrite > 0 {
		limit = w.maxWrite
	}
	if opts.ExpectedSize >= 0 && (limit < 0 || opts.ExpectedSize < limit) {
		limit = opts.ExpectedSize
	}
	var h hash.Hash
	if opts.ComputeSHA256 || opts.ExpectedSHA256 != nil {
		h = sha256.New()
	}
	n, err := copyLimited(ctx, &writeBehind{f: s.tmp}, h, r, limit)
	if err != nil {
		return WriteResult{}, err
	}
	var sum []byte
	if h != nil {
		sum = h.Sum(nil)
	}
	switch {
	case opts.ExpectedSize >= 0 && n != opts.ExpectedSize:
		return WriteResult{}, errorf(errkind.ErrConflict, "received %d bytes but %d were announced", n, opts.ExpectedSize)
	case w.maxWrite > 0 && n > w.maxWrite:
		return WriteResult{}, errorf(errkind.ErrResourceExhausted, "the content exceeds the %d-byte write limit", w.maxWrite)
	case opts.ExpectedSHA256 != nil && !bytes.Equal(sum, opts.ExpectedSHA256):
		return WriteResult{}, errorf(errkind.ErrConflict, "the content's SHA-256 does not match the announced one")
	}
	mode := opts.Mode
	if mode == 0 {
		mode = DefaultFileMode
		if s.exists {
			mode = fs.FileMode(s.old.Mode & 0o777)
		}
	}
	if err := finishTemp(s.tmp, mode, s.exists && u == nil && w.euid == 0, s.old.Uid, s.old.Gid); err != nil {
		return WriteResult{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(s.tmp.Fd()), &st); err != nil {
		return WriteResult{}, err
	}
	if err := s.tmp.Close(); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	err = w.runAs(context.WithoutCancel(ctx), u, func() error {
		switch opts.Overwrite {
		case OverwriteNever:
			return renameNoReplace(s.dir, s.tmpName, s.dir, s.name)
		case OverwriteOnlyIfExists:
			if _, err := fstatat(s.dir, s.name); err != nil {
				return err
			}
		}
		return renameAt(s.dir, s.tmpName, s.dir, s.name)
	})
	if err != nil {
		return WriteResult{}, err
	}
	if err := syncDir(s.dir); err != nil {
		w.log.Debug("sync directory after write", zap.String("path", opts.Path), zap.Error(err))
	}
	info := statInfo(s.base, &st)
	info.Path = opts.Path
	return WriteResult{Info: info, SHA256: sum}, nil
}

// finishTemp sets the final mode (and owner, when chown is set) of a
// temporary file through its descriptor, then syncs it.
func finishTemp(f *os.File, mode fs.FileMode, chown bool, uid, gid uint32) error {
	if chown {
		if err := f.Chown(int(uid), int(gid)); err != nil {
			return err
		}
	}
	// After chown, which clears set-id bits, so the mode is exact.
	if err := f.Chmod(mode); err != nil {
		return err
	}
	return f.Sync()
}

// copyLimited copies r to dst until EOF, failing once more than limit bytes
// arrive (limit < 0: no limit) or when ctx ends, and feeds every byte to h
// (nil: no hashing). Hashing runs on a second goroutine, overlapping the
// read and write system calls. It returns the bytes copied (limit+1 when
// the limit was exceeded).
func copyLimited(ctx context.Context, dst io.Writer, h hash.Hash, r io.Reader, limit int64) (int64, error) {
	if cr, ok := r.(ChunkReader); ok {
		return copyChunks(ctx, dst, h, cr, limit)
	}
	const bufSize, nbuf = 1 << 20, 3
	free := make(chan []byte, nbuf)
	for range nbuf {
		free <- make([]byte, bufSize)
	}
	written := func(b []byte) { free <- b[:cap(b)] } // unhashed: reusable at once
	if h != nil {
		full := make(chan []byte, nbuf)
		hashed := make(chan struct{})
		go func() {
			defer close(hashed)
			for b := range full {
				h.Write(b)
				free <- b[:cap(b)]
			}
		}()
		defer func() {
			close(full)
			<-hashed
		}()
		written = func(b []byte) { full <- b }
	}
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		buf := <-free
		if limit >= 0 && int64(len(buf)) > limit-n+1 {
			buf = buf[:limit-n+1]
		}
		m, rerr := r.Read(buf)
		if m > 0 {
			if _, err := dst.Write(buf[:m]); err != nil {
				return n, err
			}
			n += int64(m)
		}
		written(buf[:m])
		if limit >= 0 && n > limit {
			return n, nil
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, fmt.Errorf("reading the content: %w", rerr)
		}
	}
}

// ChunkReader is a reader that can also hand over its content in chunks it
// already holds (a gRPC stream's messages), saving WriteFile a copy of
// every byte into a buffer of its own.
type ChunkReader interface {
	io.Reader
	// NextChunk returns the next non-empty chunk, or io.EOF at the end.
	// The chunk is the caller's until it passes it to Release.
	NextChunk() ([]byte, error)
	// Release gives back a chunk that the caller is done with.
	Release([]byte)
}

// copyChunks is copyLimited for a ChunkReader: each chunk is written as it
// is, then hashed on the second goroutine, which releases it (without a
// hash it is released at once). At most hashBacklogBytes (or one larger
// chunk) wait for the hash, which bounds memory; a deep backlog lets the
// writer run ahead while the hashing goroutine waits for a CPU, and the
// other way round.
func copyChunks(ctx context.Context, dst io.Writer, h hash.Hash, r ChunkReader, limit int64) (int64, error) {
	written := r.Release
	if h != nil {
		const hashBacklogBytes, hashBacklogChunks = 8 << 20, 64
		var (
			mu      sync.Mutex
			drained = sync.NewCond(&mu)
			backlog int // bytes written and not yet hashed
		)
		full := make(chan []byte, hashBacklogChunks)
		hashed := make(chan struct{})
		go func() {
			defer close(hashed)
			for b := range full {
				h.Write(b)
				r.Release(b)
				mu.Lock()
				backlog -= len(b)
				drained.Signal()
				mu.Unlock()
			}
		}()
		defer func() {
			close(full)
			<-hashed
		}()
		written = func(b []byte) {
			mu.Lock()
			for backlog > 0 && backlog+len(b) > hashBacklogBytes {
				drained.Wait()
			}
			backlog += len(b)
			mu.Unlock()
			full <- b
		}
	}
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		b, rerr := r.NextChunk()
		if len(b) > 0 {
			if limit >= 0 && int64(len(b)) > limit-n+1 {
				b = b[:limit-n+1]
			}
			if _, err := dst.Write(b); err != nil {
				return n, err
			}
			n += int64(len(b))
			written(b)
			if limit >= 0 && n > limit {
				return n, nil
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, fmt.Errorf("reading the content: %w", rerr)
		}
	}
}

// writeBehindBytes is how much written data writeBehind lets accumulate
// before it starts writing it back.
const writeBehindBytes = 8 << 20

// writeBehind writes to a file and starts the writeback of every
// writeBehindBytes written (sync_file_range SYNC_FILE_RANGE_WRITE, which
// does not wait), so that the disk works while the rest arrives and the
// final fsync has little left to wait for. Best effort: a failure only
// leaves the work to the fsync.
type writeBehind struct {
	f        *os.File
	off      int64 // bytes written
	from     int64 // start of the range not yet handed to writeback
	disabled bool
}

func (w *writeBehind) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
	if !w.disabled && w.off-w.from >= writeBehindBytes {
		if serr := unix.SyncFileRange(int(w.f.Fd()), w.from, w.off-w.from, unix.SYNC_FILE_RANGE_WRITE); serr != nil {
			w.disabled = true
		}
		w.from = w.off
	}
	return n, err
}
