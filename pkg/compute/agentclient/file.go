package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/wirecodec"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// fileChunkBytes is the size of each data message of WriteFile. Large data
// always moves as a stream of chunks, never as one message.
const fileChunkBytes = 256 << 10

// ReadFile streams a file (from offset, at most limit bytes when limit > 0)
// into w and returns the file's info.
func (c *Client) ReadFile(ctx context.Context, req *agentdv1.ReadFileRequest, w io.Writer) (*agentdv1.FileInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // releases the stream when the destination fails
	rc := &readFileCodec{}
	defer rc.release()
	stream, err := c.file.ReadFile(ctx, req, grpc.ForceCodecV2(rc))
	if err != nil {
		return nil, wrap(err)
	}
	var info *agentdv1.FileInfo
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return info, nil
		}
		if err != nil {
			return info, wrap(err)
		}
		if msg.GetInfo() != nil {
			info = msg.GetInfo()
		}
		// A data-only message was left in its frames (readFileCodec),
		// written out from there; a message with the info (the first) was
		// decoded, its data with it.
		if rc.held != nil {
			_, err = wirecodec.WriteSkip(w, rc.held, rc.skip)
			rc.release() // Write keeps no reference
		} else if data := msg.GetData(); len(data) > 0 {
			_, err = w.Write(data)
		}
		if err != nil {
			return info, fmt.Errorf("read %s: write to destination: %w", req.GetPath(), err)
		}
	}
}

// WriteFile streams r into a file described by header. The daemon writes a
// temporary file and renames it into place only when everything arrived, so
// an interrupted call leaves the old file as it was.
func (c *Client) WriteFile(ctx context.Context, header *agentdv1.WriteFileHeader, r io.Reader) (*agentdv1.WriteFileResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // aborts the stream (and so the write) on an early return
	stream, err := c.file.WriteFile(ctx, grpc.ForceCodecV2(handOffCodec{}))
	if err != nil {
		return nil, wrap(err)
	}
	err = uploadHandOff(r,
		func() error {
			return stream.Send(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Header{Header: header}})
		},
		func(p []byte) error {
			// p goes to the transport as it is (handOffCodec).
			return stream.Send(&agentdv1.WriteFileRequest{Message: &agentdv1.WriteFileRequest_Data{Data: p}})
		})
	if err != nil {
		return nil, uploadError(stream.CloseAndRecv, err, "write", header.GetPath())
	}
	resp, err := stream.CloseAndRecv()
	return resp, wrap(err)
}

// upload sends a client stream's header, then r's bytes in chunks. Large
// data always moves as a stream of chunks, never as one message.
func upload(r io.Reader, sendHeader func() error, sendData func([]byte) error) error {
	if err := sendHeader(); err != nil {
		return &sendError{err}
	}
	buf := make([]byte, fileChunkBytes)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			// The message is serialized before Send returns, so buf is reused.
			if err := sendData(buf[:n]); err != nil {
				return &sendError{err}
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read source: %w", rerr)
		}
	}
}

// uploadHandOff is upload for a stream whose codec hands every data
// chunk over to the transport without copying it (handOffCodec): each
// chunk is read into a buffer of its own from the pool, which the
// transport returns to the pool once written.
func uploadHandOff(r io.Reader, sendHeader func() error, sendData func([]byte) error) error {
	if err := sendHeader(); err != nil {
		return &sendError{err}
	}
	for {
		b := pool.Get(fileChunkBytes)
		n, rerr := r.Read(*b)
		if n > 0 {
			if err := sendData((*b)[:n]); err != nil {
				return &sendError{err}
			}
		} else {
			pool.Put(b)
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read source: %w", rerr)
		}
	}
}

// sendError marks a failure of the stream (not of the source).
type sendError struct{ err error }

func (e *sendError) Error() string { return e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }

// uploadError turns an upload failure into the error to return: the
// server's own error when it ended the stream (Send then only reports
// io.EOF), a compute error for a broken stream, or a PathError for a source
// that failed to read.
func uploadError[T any](closeAndRecv func() (T, error), err error, op, path string) error {
	var se *sendError
	if !errors.As(err, &se) {
		if path == "" {
			return fmt.Errorf("%s: %w", op, err)
		}
		return &errkind.PathError{Op: op, Path: path, Err: err}
	}
	if errors.Is(se.err, io.EOF) {
		if _, rerr := closeAndRecv(); rerr != nil {
			return wrap(rerr)
		}
	}
	return wrap(se.err)
}

// Stat describes a path without following a final symlink.
func (c *Client) Stat(ctx context.Context, req *agentdv1.StatRequest) (*agentdv1.StatResponse, error) {
	resp, err := c.file.Stat(ctx, req)
	return resp, wrap(err)
}

// ListDir returns one page of a directory listing.
func (c *Client) ListDir(ctx context.Context, req *agentdv1.ListDirRequest) (*agentdv1.ListDirResponse, error) {
	resp, err := c.file.ListDir(ctx, req)
	return resp, wrap(err)
}

// MakeDir creates a directory.
func (c *Client) MakeDir(ctx context.Context, req *agentdv1.MakeDirRequest) (*agentdv1.MakeDirResponse, error) {
	resp, err := c.file.MakeDir(ctx, req)
	return resp, wrap(err)
}

// Remove removes a path (recursively only when asked).
func (c *Client) Remove(ctx context.Context, req *agentdv1.RemoveRequest) (*agentdv1.RemoveResponse, error) {
	resp, err := c.file.Remove(ctx, req)
	return resp, wrap(err)
}

// Rename moves a path.
func (c *Client) Rename(ctx context.Context, req *agentdv1.RenameRequest) (*agentdv1.RenameResponse, error) {
	resp, err := c.file.Rename(ctx, req)
	return resp, wrap(err)
}

// ApplyPatch applies a patch all-or-nothing. On rejection the error matches
// errkind.ErrPatchRejected and PatchRejection(err) explains it.
func (c *Client) ApplyPatch(ctx context.Context, req *agentdv1.ApplyPatchRequest) (*agentdv1.ApplyPatchResponse, error) {
	resp, err := c.workspace.ApplyPatch(ctx, req)
	return resp, wrap(err)
}
