package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"

	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// Archive streams the workspace as an archive (tar, zstd unless
// opts.Compression says otherwise) into w and returns what it holds.
func (c *Client) Archive(ctx context.Context, opts ArchiveOptions, w io.Writer) (*ArchiveStats, error) {
	req := &agentdv1.ArchiveRequest{Exclude: opts.Exclude, Compression: compressionToProto(opts.Compression), Level: clampInt32(opts.Level)}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // releases the stream, which ends at the stats before its trailers
	stream, err := c.workspace.Archive(ctx, req)
	if err != nil {
		return nil, wrap(err)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("archive: %w", errStreamEnded)
		}
		if err != nil {
			return nil, wrap(err)
		}
		if len(msg.GetData()) > 0 {
			if _, err := w.Write(msg.GetData()); err != nil {
				return nil, fmt.Errorf("archive: write to destination: %w", err)
			}
		}
		if msg.GetStats() != nil {
			stats := statsOf(msg.GetStats())
			return &stats, nil
		}
	}
}

// Restore replaces the workspace's contents with the archive read from r.
// On any failure (a malicious member, a limit, a dropped connection) the
// workspace is left exactly as it was.
func (c *Client) Restore(ctx context.Context, opts RestoreOptions, r io.Reader) (*RestoreResult, error) {
	header := restoreHeaderToProto(opts)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.workspace.Restore(ctx)
	if err != nil {
		return nil, wrap(err)
	}
	err = upload(r,
		func() error {
			return stream.Send(&agentdv1.RestoreRequest{Message: &agentdv1.RestoreRequest_Header{Header: header}})
		},
		func(p []byte) error {
			return stream.Send(&agentdv1.RestoreRequest{Message: &agentdv1.RestoreRequest_Data{Data: p}})
		})
	if err != nil {
		return nil, uploadError(stream.CloseAndRecv, err, "restore", "")
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, wrap(err)
	}
	return &RestoreResult{Stats: statsOf(resp.GetStats())}, nil
}

// Fingerprint returns the workspace's fingerprint ("v1:<sha256 hex>"):
// the tree less opts.Exclude, then opts.Extra.
func (c *Client) Fingerprint(ctx context.Context, opts FingerprintOptions) (string, error) {
	resp, err := c.workspace.Fingerprint(ctx, &agentdv1.FingerprintRequest{Exclude: opts.Exclude, Extra: opts.Extra})
	if err != nil {
		return "", wrap(err)
	}
	return resp.GetFingerprint(), nil
}

// Materialize applies a plan: the plan first, then the tar stream read from
// r that carries the bytes of the plan's file entries in plan order. On
// failure the workspace's files are as they were.
func (c *Client) Materialize(ctx context.Context, plan *MaterializePlan, r io.Reader) (*MaterializeResult, error) {
	wirePlan := planToProto(plan)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.workspace.Materialize(ctx)
	if err != nil {
		return nil, wrap(err)
	}
	err = upload(r,
		func() error {
			return stream.Send(&agentdv1.MaterializeRequest{Message: &agentdv1.MaterializeRequest_Plan{Plan: wirePlan}})
		},
		func(p []byte) error {
			return stream.Send(&agentdv1.MaterializeRequest{Message: &agentdv1.MaterializeRequest_Data{Data: p}})
		})
	if err != nil {
		return nil, uploadError(stream.CloseAndRecv, err, "materialize", "")
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, wrap(err)
	}
	return materializeResultOf(resp), nil
}
