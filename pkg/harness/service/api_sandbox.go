package service

import (
	"context"
	"io"
	"slices"

	"connectrpc.com/connect"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// sandboxAPI implements SandboxService over the run manager (see runAPI).
type sandboxAPI struct{ m *manager.Manager }

func (a *sandboxAPI) ListSandboxes(ctx context.Context, req *connect.Request[harnessv1.ListSandboxesRequest]) (*connect.Response[harnessv1.ListSandboxesResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	sbs, err := a.m.ListSandboxes(ctx, tenant, req.Msg.GetRunId())
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ListSandboxesResponse{}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, sandboxProto(sb))
	}
	return connect.NewResponse(out), nil
}

func (a *sandboxAPI) ListSandboxDir(ctx context.Context, req *connect.Request[harnessv1.ListSandboxDirRequest]) (*connect.Response[harnessv1.ListSandboxDirResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	entries, err := a.m.ListDir(ctx, tenant, req.Msg.GetSandboxId(), req.Msg.GetPath())
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ListSandboxDirResponse{}
	for _, e := range entries {
		out.Entries = append(out.Entries, fileEntryProto(e))
	}
	return connect.NewResponse(out), nil
}

// chunkWriter turns a file's bytes into messages of at most chunkSize.
type chunkWriter struct {
	offset int64
	send   func(data []byte, offset int64) error
}

const chunkSize = 64 << 10

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		c := min(len(p), chunkSize)
		if err := w.send(slices.Clone(p[:c]), w.offset); err != nil {
			return 0, err
		}
		w.offset += int64(c)
		p = p[c:]
	}
	return n, nil
}

func (a *sandboxAPI) ReadSandboxFile(ctx context.Context, req *connect.Request[harnessv1.ReadSandboxFileRequest], stream *connect.ServerStream[harnessv1.ReadSandboxFileResponse]) error {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return err
	}
	m := req.Msg
	w := &chunkWriter{offset: m.GetOffset(), send: func(data []byte, off int64) error {
		return stream.Send(&harnessv1.ReadSandboxFileResponse{Data: data, Offset: off})
	}}
	return apiError(a.m.ReadFile(ctx, tenant, m.GetSandboxId(), m.GetPath(), m.GetOffset(), m.GetLimit(), w))
}

func (a *sandboxAPI) OpenTerminal(ctx context.Context, stream *connect.BidiStream[harnessv1.OpenTerminalRequest, harnessv1.OpenTerminalResponse]) error {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Receive()
	if err != nil {
		return apiError(err)
	}
	start := first.GetStart()
	if start == nil {
		return apiError(invalid("start", "the first message must be a start"))
	}
	term, err := a.m.OpenTerminal(ctx, tenant, start.GetSandboxId(), terminalOptionsOf(start))
	if err != nil {
		return apiError(err)
	}
	err = term.Run(ctx, manager.TerminalIO{
		Recv: func() ([]byte, *manager.TerminalSize, error) {
			m, err := stream.Receive()
			if err != nil {
				return nil, nil, err
			}
			if m.GetStart() != nil {
				return nil, nil, invalid("start", "the terminal is already started")
			}
			return m.GetStdin(), terminalSizeOf(m.GetResize()), nil
		},
		Output: func(b []byte) error {
			return stream.Send(&harnessv1.OpenTerminalResponse{Kind: &harnessv1.OpenTerminalResponse_Output{Output: b}})
		},
		Exited: func(e manager.TerminalExit) error {
			return stream.Send(&harnessv1.OpenTerminalResponse{Kind: &harnessv1.OpenTerminalResponse_Exited{Exited: terminalExitProto(e)}})
		},
	})
	return apiError(err)
}

var _ io.Writer = (*chunkWriter)(nil)
