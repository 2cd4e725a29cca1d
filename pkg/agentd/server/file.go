package server

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// readChunkBytes is the size of each ReadFile data message.
const readChunkBytes = 512 << 10

// fileService adapts the confined workspace to FileService.
type fileService struct {
	agentdv1.UnimplementedFileServiceServer
	d *agentd.Daemon
	m *metrics.Set // nil: metrics off
}

func (s *fileService) ReadFile(req *agentdv1.ReadFileRequest, stream agentdv1.FileService_ReadFileServer) error {
	ctx := stream.Context()
	if req.GetOffset() < 0 || req.GetLimit() < 0 {
		return errmap.ToStatus(&errkind.PathError{Op: "read", Path: req.GetPath(), Err: errkind.Errorf(errkind.ErrInvalidArgument, "negative offset or limit")})
	}
	user, err := s.d.User(req.GetUser())
	if err != nil {
		return errmap.ToStatus(&errkind.PathError{Op: "read", Path: req.GetPath(), Err: err})
	}
	r, err := s.d.Workspace().ReadFile(ctx, user, req.GetPath(), req.GetOffset(), req.GetLimit())
	if err != nil {
		return errmap.ToStatus(err)
	}
	defer r.Close()
	msg := &agentdv1.ReadFileResponse{Info: fileInfo(r.Info)}
	size := min(readChunkBytes, max(r.Length, 1))
	for {
		// A buffer of its own for every chunk: a data-only message hands
		// it to the transport, which returns it to the pool once sent
		// (see codec), so it is not touched after Send.
		buf := pool.Get(int(size))
		n, rerr := io.ReadFull(r, *buf)
		if n > 0 || msg.Info != nil {
			msg.Data = (*buf)[:n]
			if err := stream.Send(msg); err != nil {
				return err
			}
			s.m.FileReadBytes(n)
			msg = &agentdv1.ReadFileResponse{}
		} else {
			pool.Put(buf)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return nil
		}
		if rerr != nil {
			return errmap.ToStatus(rerr)
		}
	}
}

func (s *fileService) WriteFile(stream agentdv1.FileService_WriteFileServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return errmap.ToStatus(errkind.Errorf(errkind.ErrInvalidArgument, "WriteFile: the first message must be the header"))
	}
	fail := func(err error) error {
		return errmap.ToStatus(&errkind.PathError{Op: "write", Path: h.GetPath(), Err: err})
	}
	user, err := s.d.User(h.GetUser())
	if err != nil {
		return fail(err)
	}
	mode, err := fileMode(h.GetMode())
	if err != nil {
		return fail(err)
	}
	opts := workspace.WriteOptions{
		Path:           h.GetPath(),
		Mode:           mode,
		CreateParents:  h.GetCreateParents(),
		Overwrite:      overwritePolicy(h.GetOverwrite()),
		ExpectedSize:   workspace.UnknownSize,
		ExpectedSHA256: h.GetExpectedSha256(),
		ComputeSHA256:  h.GetComputeSha256(),
	}
	if h.ExpectedSize != nil {
		opts.ExpectedSize = h.GetExpectedSize()
	}
	next := func() ([]byte, bool, error) {
		m, err := stream.Recv()
		s.m.FileWrittenBytes(len(m.GetData()))
		return m.GetData(), m.GetHeader() != nil, err
	}
	res, err := s.d.Workspace().WriteFile(stream.Context(), user, opts, &chunkReader{next: next, release: pool.PutBytes})
	if err != nil {
		return errmap.ToStatus(err)
	}
	return stream.SendAndClose(&agentdv1.WriteFileResponse{Info: fileInfo(res.Info), Sha256: res.SHA256})
}

// chunkReader reads the data messages of a client stream (WriteFile,
// Restore) as one byte stream. next returns the next message's data, whether
// it was a header instead (a protocol error), and io.EOF at the end.
//
// It is also a workspace.ChunkReader: WriteFile takes the messages' data
// as they are (decoded straight into pooled buffers by codec) and gives
// each back through Release once written and hashed.
type chunkReader struct {
	next    func() (data []byte, header bool, err error)
	buf     []byte
	release func([]byte) // nil: chunks are left to the garbage collector
}

// NextChunk returns the rest of the current message's data, or the next
// message's, whole; io.EOF at the end of the stream.
func (c *chunkReader) NextChunk() ([]byte, error) {
	for len(c.buf) == 0 {
		data, header, err := c.next()
		if err != nil {
			return nil, err
		}
		if header {
			return nil, errkind.Errorf(errkind.ErrInvalidArgument, "a second header arrived")
		}
		c.buf = data
	}
	b := c.buf
	c.buf = nil
	return b, nil
}

// Release hands back a chunk that NextChunk returned.
func (c *chunkReader) Release(b []byte) {
	if c.release != nil {
		c.release(b)
	}
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		data, header, err := c.next()
		if err != nil {
			return 0, err // io.EOF at the end of the stream
		}
		if header {
			return 0, errkind.Errorf(errkind.ErrInvalidArgument, "a second header arrived")
		}
		c.buf = data
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (s *fileService) Stat(ctx context.Context, req *agentdv1.StatRequest) (*agentdv1.StatResponse, error) {
	user, err := s.d.User(req.GetUser())
	if err != nil {
		return nil, errmap.ToStatus(&errkind.PathError{Op: "stat", Path: req.GetPath(), Err: err})
	}
	fi, err := s.d.Workspace().Stat(ctx, user, req.GetPath())
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.StatResponse{Info: fileInfo(fi)}, nil
}

func (s *fileService) ListDir(ctx context.Context, req *agentdv1.ListDirRequest) (*agentdv1.ListDirResponse, error) {
	user, err := s.d.User(req.GetUser())
	if err != nil {
		return nil, errmap.ToStatus(&errkind.PathError{Op: "list", Path: req.GetPath(), Err: err})
	}
	res, err := s.d.Workspace().ListDir(ctx, user, req.GetPath(), workspace.ListOptions{PageToken: req.GetPageToken(), PageSize: int(req.GetPageSize())})
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	out := &agentdv1.ListDirResponse{NextPageToken: validUTF8(res.NextPageToken), Entries: make([]*agentdv1.FileInfo, 0, len(res.Entries))}
	if !utf8.ValidString(res.NextPageToken) {
		// Page tokens are names; a non-UTF-8 one cannot travel as a string.
		out.NextPageToken = ""
	}
	for _, e := range res.Entries {
		out.Entries = append(out.Entries, fileInfo(e))
	}
	return out, nil
}

func (s *fileService) MakeDir(ctx context.Context, req *agentdv1.MakeDirRequest) (*agentdv1.MakeDirResponse, error) {
	fail := func(err error) error {
		return errmap.ToStatus(&errkind.PathError{Op: "mkdir", Path: req.GetPath(), Err: err})
	}
	user, err := s.d.User(req.GetUser())
	if err != nil {
		return nil, fail(err)
	}
	mode, err := fileMode(req.GetMode())
	if err != nil {
		return nil, fail(err)
	}
	if mode == 0 {
		mode = 0o755
	}
	ws := s.d.Workspace()
	if err := ws.MakeDir(ctx, user, req.GetPath(), mode, req.GetParents()); err != nil {
		return nil, errmap.ToStatus(err)
	}
	fi, err := ws.Stat(ctx, user, req.GetPath())
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.MakeDirResponse{Info: fileInfo(fi)}, nil
}

func (s *fileService) Remove(ctx context.Context, req *agentdv1.RemoveRequest) (*agentdv1.RemoveResponse, error) {
	user, err := s.d.User(req.GetUser())
	if err != nil {
		return nil, errmap.ToStatus(&errkind.PathError{Op: "remove", Path: req.GetPath(), Err: err})
	}
	if err := s.d.Workspace().Remove(ctx, user, req.GetPath(), req.GetRecursive()); err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.RemoveResponse{}, nil
}

func (s *fileService) Rename(ctx context.Context, req *agentdv1.RenameRequest) (*agentdv1.RenameResponse, error) {
	user, err := s.d.User(req.GetUser())
	if err != nil {
		return nil, errmap.ToStatus(&errkind.PathError{Op: "rename", Path: req.GetFrom(), Err: err})
	}
	if err := s.d.Workspace().Rename(ctx, user, req.GetFrom(), req.GetTo(), req.GetOverwrite()); err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.RenameResponse{}, nil
}

// fileMode converts wire permission bits (0o7777) into an fs.FileMode.
func fileMode(m uint32) (fs.FileMode, error) {
	if m&^0o7777 != 0 {
		return 0, errkind.Errorf(errkind.ErrInvalidArgument, "mode %#o has bits outside 0o7777", m)
	}
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode, nil
}

// wireMode converts an fs.FileMode to wire permission bits.
func wireMode(m fs.FileMode) uint32 {
	out := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		out |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		out |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		out |= 0o1000
	}
	return out
}

func overwritePolicy(p agentdv1.OverwritePolicy) workspace.Overwrite {
	switch p {
	case agentdv1.OverwritePolicy_OVERWRITE_POLICY_NEVER:
		return workspace.OverwriteNever
	case agentdv1.OverwritePolicy_OVERWRITE_POLICY_ONLY_IF_EXISTS:
		return workspace.OverwriteOnlyIfExists
	}
	return workspace.OverwriteAlways
}

func fileType(t workspace.FileType) agentdv1.FileType {
	switch t {
	case workspace.TypeRegular:
		return agentdv1.FileType_FILE_TYPE_REGULAR
	case workspace.TypeDirectory:
		return agentdv1.FileType_FILE_TYPE_DIRECTORY
	case workspace.TypeSymlink:
		return agentdv1.FileType_FILE_TYPE_SYMLINK
	case workspace.TypeUnknown:
		return agentdv1.FileType_FILE_TYPE_UNSPECIFIED
	}
	return agentdv1.FileType_FILE_TYPE_OTHER
}

func fileInfo(fi workspace.FileInfo) *agentdv1.FileInfo {
	out := &agentdv1.FileInfo{
		Path:          validUTF8(fi.Path),
		Name:          validUTF8(fi.Name),
		Type:          fileType(fi.Type),
		Size:          fi.Size,
		Mode:          wireMode(fi.Mode),
		Uid:           fi.UID,
		Gid:           fi.GID,
		Owner:         validUTF8(fi.Owner),
		Group:         validUTF8(fi.Group),
		ModifiedAt:    timestamppb.New(fi.ModTime),
		SymlinkTarget: validUTF8(fi.LinkTarget),
	}
	if !utf8.ValidString(fi.Name) {
		out.RawName = []byte(fi.Name)
	}
	return out
}

// validUTF8 makes s fit a proto string field (names on disk may be any bytes).
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
