package server

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/process"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// processService adapts agentd's process engine to ProcessService.
type processService struct {
	agentdv1.UnimplementedProcessServiceServer
	d *agentd.Daemon
	m *metrics.Set // nil: metrics off
}

func (s *processService) Start(ctx context.Context, req *agentdv1.StartRequest) (*agentdv1.StartResponse, error) {
	info, existing, err := s.d.StartProcess(ctx, startOptions(req.GetSpec(), req.GetRequestId()))
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	if !existing {
		s.m.ProcessStarted()
	}
	return &agentdv1.StartResponse{Process: processInfo(info), Existing: existing}, nil
}

func (s *processService) ReadOutput(ctx context.Context, req *agentdv1.ReadOutputRequest) (*agentdv1.ReadOutputResponse, error) {
	maxBytes := s.d.ReadLimit(int(req.GetMaxBytes()))
	res, err := s.d.Processes().Read(ctx, req.GetProcessId(), req.GetCursor(), req.GetYieldTime().AsDuration(), maxBytes)
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	countOutput(s.m, res.Chunks)
	return &agentdv1.ReadOutputResponse{Chunks: chunks(res.Chunks), NextCursor: res.NextCursor, DroppedBytes: res.Dropped, Exit: exitStatus(res.Exit)}, nil
}

// Attach follows a process's output (process.Manager.Attach: flow control
// holds the process back while this client is slow, up to the stall
// timeout). The chunks' data is the output ring's memory, valid until the
// callback returns, which is fine because Send marshals the message before
// it returns (no stats handler keeps messages).
func (s *processService) Attach(req *agentdv1.AttachRequest, stream agentdv1.ProcessService_AttachServer) error {
	err := s.d.Processes().Attach(stream.Context(), req.GetProcessId(), req.GetCursor(), func(res process.ReadResult) error {
		countOutput(s.m, res.Chunks)
		return stream.Send(&agentdv1.AttachResponse{Chunks: chunks(res.Chunks), NextCursor: res.NextCursor, DroppedBytes: res.Dropped, Exit: exitStatus(res.Exit)})
	})
	return errmap.ToStatus(err)
}

func (s *processService) WriteStdin(ctx context.Context, req *agentdv1.WriteStdinRequest) (*agentdv1.WriteStdinResponse, error) {
	next, err := s.d.Processes().WriteStdin(ctx, req.GetProcessId(), req.GetOffset(), req.GetData())
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	s.m.StdinBytes(len(req.GetData()))
	return &agentdv1.WriteStdinResponse{NextOffset: next}, nil
}

func (s *processService) CloseStdin(_ context.Context, req *agentdv1.CloseStdinRequest) (*agentdv1.CloseStdinResponse, error) {
	if err := s.d.Processes().CloseStdin(req.GetProcessId()); err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.CloseStdinResponse{}, nil
}

// Resize passes the size on as given: the process manager checks it as
// Start checks its own (each dimension 1 to process.MaxTerminalDimension).
func (s *processService) Resize(_ context.Context, req *agentdv1.ResizeRequest) (*agentdv1.ResizeResponse, error) {
	if err := s.d.Processes().Resize(req.GetProcessId(), req.GetSize().GetRows(), req.GetSize().GetCols()); err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.ResizeResponse{}, nil
}

func (s *processService) Signal(_ context.Context, req *agentdv1.SignalRequest) (*agentdv1.SignalResponse, error) {
	if err := s.d.Processes().Signal(req.GetProcessId(), req.GetSignal()); err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.SignalResponse{}, nil
}

func (s *processService) Wait(ctx context.Context, req *agentdv1.WaitRequest) (*agentdv1.WaitResponse, error) {
	exit, err := s.d.Processes().Wait(ctx, req.GetProcessId())
	if err != nil {
		return nil, errmap.ToStatus(err)
	}
	return &agentdv1.WaitResponse{Exit: exitStatus(&exit)}, nil
}

func (s *processService) List(context.Context, *agentdv1.ListRequest) (*agentdv1.ListResponse, error) {
	infos := s.d.Processes().List()
	out := make([]*agentdv1.ProcessInfo, 0, len(infos))
	for _, info := range infos {
		out = append(out, processInfo(info))
	}
	return &agentdv1.ListResponse{Processes: out}, nil
}

// execStartedWithin is how long Exec may hold back the message announcing
// the started process, so that a quick command's started process, output
// and exit travel in one message.
const execStartedWithin = 2 * time.Millisecond

// Exec starts a process, streams its output and ends with its exit. If the
// client goes away first, the process group is killed: Exec is for commands
// whose caller waits for them; Start + Attach is for processes that must
// outlive a connection.
//
// The first message carries the started process, together with the output
// and exit that arrived within execStartedWithin (a quick command is one
// message); it is not held back when stdin is written.
//
// Once the exit was sent, the process's output is freed (unless another
// Attach or Exec stream follows it right then): the client has it all, and
// the daemon would otherwise keep a chatty command's last
// --output-buffer-bytes for the exit retention. A later ReadOutput or
// Attach reports it as dropped.
func (s *processService) Exec(req *agentdv1.ExecRequest, stream agentdv1.ProcessService_ExecServer) error {
	ctx := stream.Context()
	opts := startOptions(req.GetSpec(), req.GetRequestId())
	if len(req.GetStdin()) > 0 {
		opts.Stdin = true
	}
	opts.HoldOutput = true // the Attach below follows from 0: nothing is lost before it
	info, existing, err := s.d.StartProcess(ctx, opts)
	if err != nil {
		return errmap.ToStatus(err)
	}
	if !existing {
		s.m.ProcessStarted()
	}
	procs := s.d.Processes()
	exited := false
	defer func() {
		if !exited {
			_ = procs.Signal(info.ID, "KILL")
		}
	}()
	started := processInfo(info)
	attach := process.AttachOptions{ReleaseAtExit: true}
	if len(req.GetStdin()) > 0 {
		if err := stream.Send(&agentdv1.ExecResponse{Started: started}); err != nil {
			return err
		}
		started = nil
		if _, err := procs.WriteStdin(ctx, info.ID, 0, req.GetStdin()); err != nil {
			return errmap.ToStatus(err)
		}
		s.m.StdinBytes(len(req.GetStdin()))
		if !opts.TTY { // a terminal has no end of input to send
			if err := procs.CloseStdin(info.ID); err != nil {
				return errmap.ToStatus(err)
			}
		}
	} else {
		attach.FirstWithin = execStartedWithin
	}
	err = procs.AttachWith(ctx, info.ID, 0, attach, func(res process.ReadResult) error {
		if res.Exit != nil {
			exited = true
		}
		countOutput(s.m, res.Chunks)
		msg := &agentdv1.ExecResponse{Started: started, Chunks: chunks(res.Chunks), DroppedBytes: res.Dropped, Exit: exitStatus(res.Exit)}
		started = nil
		return stream.Send(msg)
	})
	return errmap.ToStatus(err)
}

func startOptions(spec *agentdv1.ProcessSpec, requestID string) agentd.StartSpec {
	var timeout time.Duration
	if spec.GetTimeout() != nil {
		timeout = spec.GetTimeout().AsDuration()
	}
	return agentd.StartSpec{
		StartOptions: process.StartOptions{
			RequestID: requestID,
			Argv:      spec.GetArgv(),
			Command:   spec.GetCommand(),
			Shell:     spec.GetShell(),
			Login:     spec.GetLogin(),
			Env:       spec.GetEnv(),
			User:      spec.GetUser(),
			TTY:       spec.GetTty(),
			Rows:      spec.GetSize().GetRows(), // checked by the process manager, never truncated
			Cols:      spec.GetSize().GetCols(),
			Stdin:     spec.GetStdin(),
			Timeout:   timeout,
		},
		Cwd: spec.GetCwd(),
	}
}

func processInfo(info process.Info) *agentdv1.ProcessInfo {
	state := agentdv1.ProcessState_PROCESS_STATE_RUNNING
	if !info.Running {
		state = agentdv1.ProcessState_PROCESS_STATE_EXITED
	}
	return &agentdv1.ProcessInfo{
		ProcessId: info.ID,
		Pid:       int32(info.PID),
		Argv:      info.Argv,
		Cwd:       info.Dir,
		User:      info.User,
		Tty:       info.TTY,
		StartedAt: timestamppb.New(info.StartedAt),
		State:     state,
		Exit:      exitStatus(info.Exit),
		RequestId: info.RequestID,
	}
}

func exitStatus(e *process.ExitStatus) *agentdv1.ExitStatus {
	if e == nil {
		return nil
	}
	return &agentdv1.ExitStatus{ExitCode: int32(e.Code), Signal: e.Signal, TimedOut: e.TimedOut, ExitedAt: timestamppb.New(e.ExitedAt)}
}

func outputStream(s process.Stream) agentdv1.OutputStream {
	switch s {
	case process.Stdout:
		return agentdv1.OutputStream_OUTPUT_STREAM_STDOUT
	case process.Stderr:
		return agentdv1.OutputStream_OUTPUT_STREAM_STDERR
	case process.PTY:
		return agentdv1.OutputStream_OUTPUT_STREAM_PTY
	}
	return agentdv1.OutputStream_OUTPUT_STREAM_UNSPECIFIED
}

func chunks(in []process.Chunk) []*agentdv1.OutputChunk {
	out := make([]*agentdv1.OutputChunk, 0, len(in))
	for _, c := range in {
		out = append(out, &agentdv1.OutputChunk{Stream: outputStream(c.Stream), Offset: c.Offset, Data: c.Data})
	}
	return out
}
