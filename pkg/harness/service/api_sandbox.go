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
type sandboxAPI struct {
	m *manager.Manager
	// previewURL is the URL of a preview token (ports.go).
	previewURL func(token string) string
}

func (a *sandboxAPI) ListSandboxes(ctx context.Context, req *connect.Request[harnessv1.ListSandboxesRequest]) (*connect.Response[harnessv1.ListSandboxesResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	o, err := listSandboxesOptionsOf(req.Msg)
	if err != nil {
		return nil, apiError(err)
	}
	sbs, next, err := a.m.ListSandboxesPage(ctx, tenant, o)
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ListSandboxesResponse{NextPageToken: next}
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

func (a *sandboxAPI) CreateSandbox(ctx context.Context, req *connect.Request[harnessv1.CreateSandboxRequest]) (*connect.Response[harnessv1.CreateSandboxResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	spec, err := sandboxSpecOf(req.Msg)
	if err != nil {
		return nil, apiError(err)
	}
	sb, err := a.m.CreateSandbox(ctx, tenant, spec)
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.CreateSandboxResponse{Sandbox: sandboxProto(*sb)}), nil
}

func (a *sandboxAPI) GetSandbox(ctx context.Context, req *connect.Request[harnessv1.GetSandboxRequest]) (*connect.Response[harnessv1.GetSandboxResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	sb, err := a.m.GetSandbox(ctx, tenant, req.Msg.GetSandboxId())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.GetSandboxResponse{Sandbox: sandboxProto(*sb)}), nil
}

func (a *sandboxAPI) DeleteSandbox(ctx context.Context, req *connect.Request[harnessv1.DeleteSandboxRequest]) (*connect.Response[harnessv1.DeleteSandboxResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.m.DeleteSandbox(ctx, tenant, req.Msg.GetSandboxId()); err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.DeleteSandboxResponse{}), nil
}

func (a *sandboxAPI) SetTimeout(ctx context.Context, req *connect.Request[harnessv1.SetTimeoutRequest]) (*connect.Response[harnessv1.SetTimeoutResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	ttl, err := durationOf("ttl", req.Msg.GetTtl())
	if err != nil {
		return nil, apiError(err)
	}
	idle, err := durationOf("idle_timeout", req.Msg.GetIdleTimeout())
	if err != nil {
		return nil, apiError(err)
	}
	sb, err := a.m.SetTimeout(ctx, tenant, req.Msg.GetSandboxId(), ttl, idle)
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.SetTimeoutResponse{Sandbox: sandboxProto(*sb)}), nil
}

func (a *sandboxAPI) RunCommand(ctx context.Context, req *connect.Request[harnessv1.RunCommandRequest]) (*connect.Response[harnessv1.RunCommandResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	spec, err := commandOf(m.GetCommand(), m.GetArgv(), m.GetCwd(), m.GetEnv(), m.GetUser(), m.GetTimeout())
	if err != nil {
		return nil, apiError(err)
	}
	spec.Stdin = []byte(m.GetStdin())
	res, err := a.m.RunCommand(ctx, tenant, m.GetSandboxId(), spec)
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(runCommandProto(res)), nil
}

func (a *sandboxAPI) Exec(ctx context.Context, req *connect.Request[harnessv1.ExecRequest], stream *connect.ServerStream[harnessv1.ExecResponse]) error {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return err
	}
	m := req.Msg
	spec, err := commandOf(m.GetCommand(), m.GetArgv(), m.GetCwd(), m.GetEnv(), m.GetUser(), m.GetTimeout())
	if err != nil {
		return apiError(err)
	}
	spec.Stdin = m.GetStdin()
	return apiError(a.m.Exec(ctx, tenant, m.GetSandboxId(), spec, func(ev manager.ExecEvent) error {
		for _, msg := range execProtos(ev) {
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		return nil
	}))
}

func (a *sandboxAPI) StartProcess(ctx context.Context, req *connect.Request[harnessv1.StartProcessRequest]) (*connect.Response[harnessv1.StartProcessResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	spec, err := commandOf(m.GetCommand(), m.GetArgv(), m.GetCwd(), m.GetEnv(), m.GetUser(), m.GetTimeout())
	if err != nil {
		return nil, apiError(err)
	}
	spec.KeepStdin = m.GetStdin()
	p, err := a.m.StartProcess(ctx, tenant, m.GetSandboxId(), spec)
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.StartProcessResponse{Process: processProto(*p)}), nil
}

func (a *sandboxAPI) ReadProcessOutput(ctx context.Context, req *connect.Request[harnessv1.ReadProcessOutputRequest]) (*connect.Response[harnessv1.ReadProcessOutputResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	wait, err := durationOf("wait", m.GetWait())
	if err != nil {
		return nil, apiError(err)
	}
	o, err := a.m.ReadProcessOutput(ctx, tenant, m.GetSandboxId(), m.GetProcessId(), m.GetCursor(), wait)
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(processOutputProto(o)), nil
}

func (a *sandboxAPI) WriteStdin(ctx context.Context, req *connect.Request[harnessv1.WriteStdinRequest]) (*connect.Response[harnessv1.WriteStdinResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	next, err := a.m.WriteStdin(ctx, tenant, m.GetSandboxId(), m.GetProcessId(), m.GetOffset(), m.GetData(), m.GetClose())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.WriteStdinResponse{NextOffset: next}), nil
}

func (a *sandboxAPI) SignalProcess(ctx context.Context, req *connect.Request[harnessv1.SignalProcessRequest]) (*connect.Response[harnessv1.SignalProcessResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	if err := a.m.SignalProcess(ctx, tenant, m.GetSandboxId(), m.GetProcessId(), m.GetSignal()); err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.SignalProcessResponse{}), nil
}

func (a *sandboxAPI) ListProcesses(ctx context.Context, req *connect.Request[harnessv1.ListProcessesRequest]) (*connect.Response[harnessv1.ListProcessesResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := a.m.ListProcesses(ctx, tenant, req.Msg.GetSandboxId())
	if err != nil {
		return nil, apiError(err)
	}
	out := &harnessv1.ListProcessesResponse{}
	for _, p := range ps {
		out.Processes = append(out.Processes, processProto(p))
	}
	return connect.NewResponse(out), nil
}

// streamReader reads a WriteFile's data messages after its header.
type streamReader struct {
	stream *connect.ClientStream[harnessv1.WriteFileRequest]
	buf    []byte
	err    error
}

func (r *streamReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if !r.stream.Receive() {
			r.err = r.stream.Err()
			if r.err == nil {
				r.err = io.EOF
			}
			return 0, r.err
		}
		msg := r.stream.Msg()
		if msg.GetHeader() != nil {
			r.err = invalid("header", "only the first message is a header")
			return 0, r.err
		}
		r.buf = msg.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (a *sandboxAPI) WriteFile(ctx context.Context, stream *connect.ClientStream[harnessv1.WriteFileRequest]) (*connect.Response[harnessv1.WriteFileResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, apiError(err)
		}
		return nil, apiError(invalid("header", "missing: the first message is a header"))
	}
	h := stream.Msg().GetHeader()
	if h == nil {
		return nil, apiError(invalid("header", "missing: the first message is a header"))
	}
	fe, err := a.m.WriteFile(ctx, tenant, h.GetSandboxId(), h.GetPath(),
		manager.WriteFileOptions{Mode: h.GetMode(), CreateParents: h.GetCreateParents()}, &streamReader{stream: stream})
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.WriteFileResponse{File: fileEntryProto(*fe)}), nil
}

func (a *sandboxAPI) Stat(ctx context.Context, req *connect.Request[harnessv1.StatRequest]) (*connect.Response[harnessv1.StatResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	fe, err := a.m.Stat(ctx, tenant, req.Msg.GetSandboxId(), req.Msg.GetPath())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.StatResponse{File: fileEntryProto(*fe)}), nil
}

func (a *sandboxAPI) Remove(ctx context.Context, req *connect.Request[harnessv1.RemoveRequest]) (*connect.Response[harnessv1.RemoveResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.m.Remove(ctx, tenant, req.Msg.GetSandboxId(), req.Msg.GetPath(), req.Msg.GetRecursive()); err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.RemoveResponse{}), nil
}

func (a *sandboxAPI) MakeDir(ctx context.Context, req *connect.Request[harnessv1.MakeDirRequest]) (*connect.Response[harnessv1.MakeDirResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	fe, err := a.m.MakeDir(ctx, tenant, m.GetSandboxId(), m.GetPath(), m.GetParents(), m.GetMode())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(&harnessv1.MakeDirResponse{File: fileEntryProto(*fe)}), nil
}

func (a *sandboxAPI) ApplyPatch(ctx context.Context, req *connect.Request[harnessv1.ApplyPatchRequest]) (*connect.Response[harnessv1.ApplyPatchResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	res, err := a.m.ApplyPatch(ctx, tenant, m.GetSandboxId(), m.GetPatch(), m.GetCwd(), m.GetDryRun())
	if err != nil {
		return nil, apiError(err)
	}
	return connect.NewResponse(patchResultProto(res)), nil
}
