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

// ReadFile streams a file (from opts.Offset, at most opts.Limit bytes when
// it is set) into w and returns the file's info (never nil without an
// error; with one, the info when it arrived before the failure).
func (c *Client) ReadFile(ctx context.Context, path string, opts ReadFileOptions, w io.Writer) (*FileInfo, error) {
	req := &agentdv1.ReadFileRequest{Path: path, Offset: opts.Offset, Limit: opts.Limit, User: opts.User}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // releases the stream when the destination fails
	rc := &readFileCodec{}
	defer rc.release()
	stream, err := c.file.ReadFile(ctx, req, grpc.ForceCodecV2(rc))
	if err != nil {
		return nil, wrap(err)
	}
	var info *FileInfo
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if info == nil { // the daemon sends the info first, always
				return nil, errkind.Errorf(errkind.ErrInternal, "read %s: %v", path, errStreamEnded)
			}
			return info, nil
		}
		if err != nil {
			return info, wrap(err)
		}
		if msg.GetInfo() != nil {
			info = fileInfoPtr(msg.GetInfo())
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
			return info, fmt.Errorf("read %s: write to destination: %w", path, err)
		}
	}
}

// WriteFile streams r into the file at path. The daemon writes a
// temporary file and renames it into place only when everything arrived,
// so an interrupted call leaves the old file as it was.
func (c *Client) WriteFile(ctx context.Context, path string, opts WriteFileOptions, r io.Reader) (*WriteFileResult, error) {
	header := writeHeaderToProto(path, opts)
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
		return nil, uploadError(stream.CloseAndRecv, err, "write", path)
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, wrap(err)
	}
	return &WriteFileResult{Info: fileInfoOf(resp.GetInfo()), SHA256: resp.GetSha256()}, nil
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
func (c *Client) Stat(ctx context.Context, path string, opts StatOptions) (*FileInfo, error) {
	resp, err := c.file.Stat(ctx, &agentdv1.StatRequest{Path: path, User: opts.User})
	if err != nil {
		return nil, wrap(err)
	}
	info := fileInfoOf(resp.GetInfo())
	return &info, nil
}

// ListDir returns one page of a directory listing (the first page, or the
// one opts.PageToken names).
func (c *Client) ListDir(ctx context.Context, path string, opts ListDirOptions) (*DirPage, error) {
	resp, err := c.file.ListDir(ctx, &agentdv1.ListDirRequest{Path: path, User: opts.User, PageSize: clampInt32(opts.PageSize),
		PageToken: opts.PageToken})
	if err != nil {
		return nil, wrap(err)
	}
	page := &DirPage{Entries: make([]FileInfo, 0, len(resp.GetEntries())), NextPageToken: resp.GetNextPageToken()}
	for _, e := range resp.GetEntries() {
		page.Entries = append(page.Entries, fileInfoOf(e))
	}
	return page, nil
}

// MakeDir creates a directory and returns its info.
func (c *Client) MakeDir(ctx context.Context, path string, opts MakeDirOptions) (*FileInfo, error) {
	resp, err := c.file.MakeDir(ctx, &agentdv1.MakeDirRequest{Path: path, Mode: opts.Mode, Parents: opts.Parents, User: opts.User})
	if err != nil {
		return nil, wrap(err)
	}
	info := fileInfoOf(resp.GetInfo())
	return &info, nil
}

// Remove removes a path (a non-empty directory only when opts.Recursive).
func (c *Client) Remove(ctx context.Context, path string, opts RemoveOptions) error {
	_, err := c.file.Remove(ctx, &agentdv1.RemoveRequest{Path: path, Recursive: opts.Recursive, User: opts.User})
	return wrap(err)
}

// Rename moves a path (over an existing one only when opts.Overwrite).
func (c *Client) Rename(ctx context.Context, from, to string, opts RenameOptions) error {
	_, err := c.file.Rename(ctx, &agentdv1.RenameRequest{From: from, To: to, Overwrite: opts.Overwrite, User: opts.User})
	return wrap(err)
}

// ApplyPatch applies a patch in V4A form (the whole `*** Begin Patch` ...
// `*** End Patch` text), all or nothing. On rejection the error matches
// errkind.ErrPatchRejected (or ErrInvalidArgument for a malformed patch)
// and PatchRejection(err) explains it.
func (c *Client) ApplyPatch(ctx context.Context, patch string, opts ApplyPatchOptions) (*PatchResult, error) {
	return c.applyPatch(ctx, &agentdv1.ApplyPatchRequest{Input: &agentdv1.ApplyPatchRequest_Patch{Patch: patch}}, opts)
}

// ApplyOperations applies a patch in the per-file operation form, all or
// nothing, as ApplyPatch does.
func (c *Client) ApplyOperations(ctx context.Context, ops []PatchOperation, opts ApplyPatchOptions) (*PatchResult, error) {
	return c.applyPatch(ctx, &agentdv1.ApplyPatchRequest{Input: &agentdv1.ApplyPatchRequest_Operations{Operations: operationsToProto(ops)}}, opts)
}

func (c *Client) applyPatch(ctx context.Context, req *agentdv1.ApplyPatchRequest, opts ApplyPatchOptions) (*PatchResult, error) {
	req.Cwd, req.User, req.DryRun = opts.Cwd, opts.User, opts.DryRun
	resp, err := c.workspace.ApplyPatch(ctx, req)
	if err != nil {
		return nil, wrap(err)
	}
	return patchResultOf(resp), nil
}
