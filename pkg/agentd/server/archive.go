package server

import (
	"context"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
	"github.com/bulkhead-dev/bulkhead/pkg/archive"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// archiveChunkBytes is the size of each Archive data message.
const archiveChunkBytes = 1 << 20

func (s *workspaceService) Archive(req *agentdv1.ArchiveRequest, stream agentdv1.WorkspaceService_ArchiveServer) error {
	opts := archive.WriteOptions{Exclude: req.GetExclude(), Level: int(req.GetLevel())}
	if req.GetCompression() == agentdv1.ArchiveCompression_ARCHIVE_COMPRESSION_NONE {
		opts.Compression = archive.CompressionNone
	}
	w := &chunkWriter{send: func(p []byte) error {
		s.m.WorkspaceBytes(metrics.Archive, len(p))
		return stream.Send(&agentdv1.ArchiveResponse{Data: p})
	}, buf: make([]byte, 0, archiveChunkBytes)}
	defer s.bulk.acquire()()
	stats, err := s.d.Archive(stream.Context(), w, opts)
	if err == nil {
		err = w.flush()
	}
	if err != nil {
		return errmap.ToStatus(err)
	}
	return stream.Send(&agentdv1.ArchiveResponse{Stats: archiveStats(stats)})
}

// chunkWriter batches writes into messages of at most cap(buf) bytes.
type chunkWriter struct {
	send func([]byte) error
	buf  []byte
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), cap(w.buf)-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == cap(w.buf) {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// flush sends what is buffered. Send serializes before returning, so the
// buffer is reused.
func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.send(w.buf)
	w.buf = w.buf[:0]
	return err
}

func (s *workspaceService) Restore(stream agentdv1.WorkspaceService_RestoreServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return errmap.ToStatus(errkind.Errorf(errkind.ErrInvalidArgument, "Restore: the first message must be the header"))
	}
	defer s.bulk.acquire()()
	next := func() ([]byte, bool, error) {
		m, err := stream.Recv()
		s.m.WorkspaceBytes(metrics.Restore, len(m.GetData()))
		return m.GetData(), m.GetHeader() != nil, err
	}
	stats, err := s.d.Restore(stream.Context(), &chunkReader{next: next}, archive.RestoreOptions{
		Exclude:               h.GetExclude(),
		PreserveOwnership:     h.GetPreserveOwnership(),
		AllowExternalSymlinks: h.GetAllowExternalSymlinks(),
		Limits: archive.Limits{
			MaxMembers:    h.GetLimits().GetMaxMembers(),
			MaxBytes:      h.GetLimits().GetMaxExtractedBytes(),
			MaxInputBytes: h.GetLimits().GetMaxInputBytes(),
		},
	})
	if err != nil {
		return errmap.ToStatus(err)
	}
	return stream.SendAndClose(&agentdv1.RestoreResponse{Stats: archiveStats(stats)})
}

func (s *workspaceService) Fingerprint(ctx context.Context, req *agentdv1.FingerprintRequest) (*agentdv1.FingerprintResponse, error) {
	fp, err := s.d.Fingerprint(ctx, archive.FingerprintOptions{Exclude: req.GetExclude(), Extra: req.GetExtra()})
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.FingerprintResponse{Fingerprint: fp}, nil
}

func archiveStats(s archive.Stats) *agentdv1.ArchiveStats {
	return &agentdv1.ArchiveStats{Members: s.Members, Files: s.Files, Dirs: s.Dirs, Symlinks: s.Symlinks, HardLinks: s.HardLinks, Bytes: s.Bytes, Skipped: s.Skipped}
}
