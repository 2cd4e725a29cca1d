package archive

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

const (
	// copyBufSize is the chunk in which file contents are copied.
	copyBufSize = 256 << 10
	// maxConcurrency bounds WriteOptions.Concurrency.
	maxConcurrency = 64
)

// Write streams the workspace tree at root to w as a tar archive, compressed
// as opts.Compression says (zstd by default). See the package documentation
// for what is archived and in which order; the same tree always gives the
// same tar stream.
//
// Memory stays bounded whatever the sizes of the files: contents are copied
// in chunks. On error (including cancellation of ctx) the stream written so
// far is incomplete, lacks the end-of-archive marker, and must be discarded.
//
// While a restore of root that a crash interrupted is incomplete (Pending),
// Write refuses with errkind.ErrFailedPrecondition naming it, before it
// writes anything: the tree may be half replaced. Recover completes it.
func Write(ctx context.Context, root string, w io.Writer, opts WriteOptions) (Stats, error) {
	var stats Stats
	exclude, err := newExcludeSet(opArchive, opts.Exclude)
	if err != nil {
		return stats, err
	}
	level := opts.Level
	if level == 0 {
		level = DefaultLevel
	}
	if level < 1 || level > 22 {
		return stats, refuse(opArchive, ".", errkind.ErrInvalidArgument, "zstd level %d is outside 1..22", opts.Level)
	}
	if opts.Concurrency < 0 || opts.Concurrency > maxConcurrency {
		return stats, refuse(opArchive, ".", errkind.ErrInvalidArgument, "concurrency %d is outside 0..%d", opts.Concurrency, maxConcurrency)
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if err := refuseIncomplete(opArchive, root); err != nil {
		return stats, err
	}

	// The output chain: tar -> (zstd | buffer) -> w.
	var (
		out     io.Writer
		enc     *zstd.Encoder
		bufw    *bufio.Writer
		abandon = true // release the encoder without finishing the stream
	)
	switch opts.Compression {
	case CompressionZstd:
		enc, err = zstd.NewWriter(w, encoderOptions(level, opts.Concurrency)...)
		if err != nil {
			return stats, pathErr(opArchive, ".", err)
		}
		out = enc
		defer func() {
			if abandon {
				// Release the encoder without completing the frame.
				enc.Reset(io.Discard)
				_ = enc.Close()
			}
		}()
	case CompressionNone:
		bufw = bufio.NewWriterSize(w, copyBufSize)
		out = bufw
	default:
		return stats, refuse(opArchive, ".", errkind.ErrInvalidArgument, "unknown compression %d", int(opts.Compression))
	}

	tw := tar.NewWriter(out)
	aw := &archiveWriter{ctx: ctx, tw: tw, opts: &opts, log: log, stats: &stats,
		buf: make([]byte, copyBufSize), users: map[uint32]string{}, groups: map[uint32]string{}}
	wk := &walker{ctx: ctx, op: opArchive, exclude: exclude, log: log, visit: aw.visit}
	err = wk.walk(root)
	stats.Skipped = wk.skipped
	if err != nil {
		return stats, err
	}
	if err := tw.Close(); err != nil {
		return stats, pathErr(opArchive, ".", err)
	}
	if enc != nil {
		abandon = false
		if err := enc.Close(); err != nil {
			return stats, pathErr(opArchive, ".", err)
		}
	}
	if bufw != nil {
		if err := bufw.Flush(); err != nil {
			return stats, pathErr(opArchive, ".", err)
		}
	}
	return stats, nil
}

// encoderOptions configures the zstd encoder for a level and concurrency.
// Up to level 5 the window is 2 MiB, as the zstd command line has it at
// level 3: the encoder's tables then stay in cache, which makes it both
// faster and (on source trees) no worse than the library's 8 MiB default.
// With concurrency up to 1, one goroutine compresses a block while the walk
// fills the next; above, sections of four windows are compressed in
// parallel.
func encoderOptions(level, concurrency int) []zstd.EOption {
	opts := []zstd.EOption{zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(level))}
	if level <= 5 {
		opts = append(opts, zstd.WithWindowSize(2<<20))
	}
	if concurrency > 1 {
		return append(opts, zstd.WithEncoderConcurrency(concurrency), zstd.WithConcurrentBlocks(true))
	}
	return append(opts, zstd.WithEncoderConcurrency(2))
}

// archiveWriter turns walked entries into tar members.
type archiveWriter struct {
	ctx    context.Context
	tw     *tar.Writer
	opts   *WriteOptions
	log    *zap.Logger
	stats  *Stats
	buf    []byte
	users  map[uint32]string
	groups map[uint32]string
}

// visit writes the member for e.
func (a *archiveWriter) visit(e *entry) error {
	hdr := &tar.Header{
		Name:    e.rel,
		Mode:    int64(e.st.Mode & 0o7777),
		Uid:     int(e.st.Uid),
		Gid:     int(e.st.Gid),
		ModTime: time.Unix(e.st.Mtim.Sec, e.st.Mtim.Nsec),
		Format:  tar.FormatPAX,
	}
	a.names(hdr, e.st.Uid, e.st.Gid)
	switch e.kind {
	case kindDir:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		a.stats.Dirs++
	case kindFile:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = e.st.Size
		a.stats.Files++
	case kindSymlink:
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = e.target
		a.stats.Symlinks++
	case kindHardLink:
		hdr.Typeflag = tar.TypeLink
		hdr.Linkname = e.target
		a.stats.HardLinks++
	}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return pathErr(opArchive, e.rel, err)
	}
	a.stats.Members++
	if e.kind == kindFile {
		return a.copyFile(e, hdr.Size)
	}
	return nil
}

// copyFile copies exactly size bytes of e's content: a file that grew is
// cut at the size in its header, one that shrank is padded with zeros (and
// a warning logged), since the header is already written.
func (a *archiveWriter) copyFile(e *entry, size int64) error {
	left := size
	for left > 0 {
		if err := a.ctx.Err(); err != nil {
			return pathErr(opArchive, e.rel, err)
		}
		chunk := a.buf
		if int64(len(chunk)) > left {
			chunk = chunk[:left]
		}
		n, err := e.file.Read(chunk)
		if n > 0 {
			if _, werr := a.tw.Write(chunk[:n]); werr != nil {
				return pathErr(opArchive, e.rel, werr)
			}
			left -= int64(n)
			a.stats.Bytes += int64(n)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return pathErr(opArchive, e.rel, err)
		}
	}
	if left > 0 {
		a.log.Warn("file shrank while it was archived; padded with zeros",
			zap.String("path", shown(e.rel)), zap.Int64("missing_bytes", left))
		clear(a.buf)
		for left > 0 {
			n := min(left, int64(len(a.buf)))
			if _, err := a.tw.Write(a.buf[:n]); err != nil {
				return pathErr(opArchive, e.rel, err)
			}
			left -= n
		}
	}
	return nil
}

// names fills in the owner and group names when lookups were given.
func (a *archiveWriter) names(hdr *tar.Header, uid, gid uint32) {
	if f := a.opts.UserName; f != nil {
		name, ok := a.users[uid]
		if !ok {
			name = f(uid)
			a.users[uid] = name
		}
		hdr.Uname = name
	}
	if f := a.opts.GroupName; f != nil {
		name, ok := a.groups[gid]
		if !ok {
			name = f(gid)
			a.groups[gid] = name
		}
		hdr.Gname = name
	}
}
