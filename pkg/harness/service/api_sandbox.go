package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// sandboxAPI implements SandboxService.
type sandboxAPI struct{ s *Service }

// errNoSandbox: the id names no live sandbox of the tenant.
var errNoSandbox = fmt.Errorf("sandbox: %w", store.ErrNotFound)

// sandbox returns the live session of a tenant's sandbox. Another tenant's
// sandbox and a deleted sandbox answer NotFound; a malformed id
// InvalidArgument.
func (s *Service) sandbox(ctx context.Context, tenant, id string) (*compute.Session, error) {
	if err := checkSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	runID := runIDOf(id)
	if runID == "" {
		return nil, errNoSandbox
	}
	rec, err := s.cfg.Store.GetRun(ctx, tenant, runID)
	if err != nil {
		return nil, errNoSandbox
	}
	if rec.SandboxID != id || rec.SandboxGone {
		return nil, errNoSandbox
	}
	s.mu.Lock()
	h := s.sessions[runID]
	lr := s.runs[runID]
	s.mu.Unlock()
	if h != nil {
		return h.sess, nil
	}
	if lr == nil {
		// A finished run whose sandbox this service does not hold.
		return nil, errNoSandbox
	}
	// An active run recovered from an earlier service: reattach.
	return s.acquireSession(ctx, tenant, rec, lr.spec)
}

func (a *sandboxAPI) ListSandboxes(ctx context.Context, req *connect.Request[harnessv1.ListSandboxesRequest]) (*connect.Response[harnessv1.ListSandboxesResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	var runs []*store.Run
	if id := req.Msg.GetRunId(); id != "" {
		if err := checkRunID("run_id", id); err != nil {
			return nil, apiError(err)
		}
		r, err := a.s.cfg.Store.GetRun(ctx, tenant, id)
		if err != nil {
			return nil, apiError(err)
		}
		runs = []*store.Run{r}
	} else {
		// Only the runs holding a sandbox, through the store's index.
		if runs, err = a.s.cfg.Store.SandboxRuns(ctx, tenant); err != nil {
			return nil, apiError(err)
		}
	}
	out := &harnessv1.ListSandboxesResponse{}
	a.s.mu.Lock()
	for _, r := range runs {
		if r.SandboxID == "" || r.SandboxGone {
			continue
		}
		_, live := a.s.sessions[r.ID]
		_, active := a.s.runs[r.ID]
		if !live && !active {
			continue
		}
		sb := &harnessv1.Sandbox{SandboxId: r.SandboxID, RunId: r.ID, Provider: r.Provider, CreateTime: timestamppb.New(r.Created),
			Status: harnessv1.SandboxStatus_SANDBOX_STATUS_STOPPED}
		if live {
			sb.Status = harnessv1.SandboxStatus_SANDBOX_STATUS_RUNNING
		}
		if !r.SandboxExpires.IsZero() && terminal(r.Status) {
			sb.ExpireTime = timestamppb.New(r.SandboxExpires)
		}
		out.Sandboxes = append(out.Sandboxes, sb)
	}
	a.s.mu.Unlock()
	return connect.NewResponse(out), nil
}

func fileType(t compute.FileType) harnessv1.FileType {
	switch t {
	case compute.FileRegular:
		return harnessv1.FileType_FILE_TYPE_FILE
	case compute.FileDirectory:
		return harnessv1.FileType_FILE_TYPE_DIRECTORY
	case compute.FileSymlink:
		return harnessv1.FileType_FILE_TYPE_SYMLINK
	}
	return harnessv1.FileType_FILE_TYPE_OTHER
}

// cleanPath checks a workspace-relative path from a request ("" is the
// root). The daemon confines paths itself; this gives a clear error first.
func cleanPath(p string) (string, error) {
	if err := checkText("path", p, maxPathBytes); err != nil {
		return "", apiError(err)
	}
	p = strings.TrimPrefix(p, "/")
	if slices.Contains(strings.Split(p, "/"), "..") {
		return "", invalid("path %q: .. is not allowed", clip(p))
	}
	if p == "" {
		return ".", nil
	}
	return p, nil
}

func (a *sandboxAPI) ListSandboxDir(ctx context.Context, req *connect.Request[harnessv1.ListSandboxDirRequest]) (*connect.Response[harnessv1.ListSandboxDirResponse], error) {
	tenant, err := tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	sess, err := a.s.sandbox(ctx, tenant, req.Msg.GetSandboxId())
	if err != nil {
		return nil, apiError(err)
	}
	p, err := cleanPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	out := &harnessv1.ListSandboxDirResponse{}
	token := ""
	for {
		resp, err := sess.ListDir(ctx, p, compute.ListDirOptions{User: sess.Manifest().RunAs, PageToken: token})
		if err != nil {
			return nil, apiError(err)
		}
		for _, e := range resp.Entries {
			rel := e.Name
			if p != "." {
				rel = strings.TrimSuffix(p, "/") + "/" + e.Name
			}
			var mtime *timestamppb.Timestamp
			if !e.ModifiedAt.IsZero() {
				mtime = timestamppb.New(e.ModifiedAt)
			}
			out.Entries = append(out.Entries, &harnessv1.FileEntry{Name: e.Name, Path: rel, Type: fileType(e.Type),
				Size: e.Size, Mode: e.Mode, ModifyTime: mtime})
		}
		if token = resp.NextPageToken; token == "" || len(out.Entries) > 10000 {
			break
		}
	}
	slices.SortFunc(out.Entries, func(x, y *harnessv1.FileEntry) int { return strings.Compare(x.Name, y.Name) })
	return connect.NewResponse(out), nil
}

// chunkWriter turns the daemon's file stream into chunks of at most size.
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
	sess, err := a.s.sandbox(ctx, tenant, m.GetSandboxId())
	if err != nil {
		return apiError(err)
	}
	p, err := cleanPath(m.GetPath())
	if err != nil {
		return err
	}
	if m.GetOffset() < 0 || m.GetLimit() < 0 {
		return invalid("offset, limit: must not be negative")
	}
	w := &chunkWriter{offset: m.GetOffset(), send: func(data []byte, off int64) error {
		return stream.Send(&harnessv1.ReadSandboxFileResponse{Data: data, Offset: off})
	}}
	_, err = sess.ReadFile(ctx, p, compute.ReadFileOptions{Offset: m.GetOffset(), Limit: m.GetLimit(), User: sess.Manifest().RunAs}, w)
	return apiError(err)
}

// terminalIO is one side of a terminal: a Connect bidi stream or a
// WebSocket.
type terminalIO struct {
	// recv returns the next stdin bytes or resize (io.EOF at the end).
	recv func() (stdin []byte, resize *harnessv1.TerminalSize, err error)
	// output and exited send to the client.
	output func([]byte) error
	exited func(*harnessv1.TerminalExited) error
	// stopInput, when set, makes a blocked recv return (after the exit).
	stopInput func()
}

// runTerminal runs a PTY process in the sandbox and pumps bytes both ways
// until the process exits or the client leaves (the process is then
// killed).
func (s *Service) runTerminal(ctx context.Context, sess *compute.Session, start *harnessv1.TerminalStart, tio terminalIO) error {
	spec := compute.ProcessSpec{Tty: true, User: sess.Manifest().RunAs,
		Size: compute.TerminalSize{Cols: max(start.GetCols(), 20), Rows: max(start.GetRows(), 5)},
		Env:  map[string]string{"TERM": "xterm-256color"}}
	if len(start.GetCommand()) > 0 {
		spec.Argv = start.GetCommand()
	} else {
		spec.Command, spec.Login = "exec ${SHELL:-/bin/sh}", true
	}
	agent := sess.Agent()
	resp, err := agent.Start(ctx, spec, compute.StartOptions{RequestID: newID("term-")})
	if err != nil {
		return fmt.Errorf("start terminal: %w", err)
	}
	pid := resp.Process.ProcessID
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sendMu sync.Mutex
	inDone := make(chan error, 1)
	go func() {
		var offset int64
		for {
			data, rs, err := tio.recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				inDone <- err
				return
			}
			if rs != nil {
				if err := checkTerminalSize(rs); err != nil {
					inDone <- apiError(err)
					return
				}
				if err := agent.Resize(ctx, pid, compute.TerminalSize{Rows: rs.GetRows(), Cols: rs.GetCols()}); err != nil {
					inDone <- err
					return
				}
			}
			if len(data) > 0 {
				next, err := agent.WriteStdin(ctx, pid, offset, data)
				if err != nil {
					inDone <- err
					return
				}
				offset = next
			}
		}
	}()
	outDone := make(chan error, 1)
	go func() {
		exit, err := agent.Follow(ctx, pid, compute.FollowOptions{}, func(m *compute.Output) error {
			sendMu.Lock()
			defer sendMu.Unlock()
			for _, c := range m.Chunks {
				if err := tio.output(slices.Clone(c.Data)); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil && exit != nil {
			sendMu.Lock()
			err = tio.exited(&harnessv1.TerminalExited{ExitCode: int32(exit.ExitCode), Signal: exit.Signal})
			sendMu.Unlock()
		}
		outDone <- err
	}()
	kill := func() {
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer kcancel()
		_ = agent.Signal(kctx, pid, "SIGKILL")
	}
	// Neither goroutine may touch the stream after this returns.
	select {
	case err = <-outDone:
		// The process exited: stop reading (a WebSocket read can be
		// ended) or give a gRPC client time to close its side.
		cancel()
		if tio.stopInput != nil {
			tio.stopInput()
		}
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-inDone:
		case <-t.C:
		}
	case err = <-inDone:
		// The client left (or failed): end the process.
		kill()
		cancel()
		<-outDone
	}
	return err
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
		return invalid("start: the first message must be a start")
	}
	if err := checkTerminalStart(start); err != nil {
		return apiError(err)
	}
	sess, err := a.s.sandbox(ctx, tenant, start.GetSandboxId())
	if err != nil {
		return apiError(err)
	}
	err = a.s.runTerminal(ctx, sess, start, terminalIO{
		recv: func() ([]byte, *harnessv1.TerminalSize, error) {
			m, err := stream.Receive()
			if err != nil {
				return nil, nil, err
			}
			if m.GetStart() != nil {
				return nil, nil, invalid("the terminal is already started")
			}
			return m.GetStdin(), m.GetResize(), nil
		},
		output: func(b []byte) error {
			return stream.Send(&harnessv1.OpenTerminalResponse{Kind: &harnessv1.OpenTerminalResponse_Output{Output: b}})
		},
		exited: func(e *harnessv1.TerminalExited) error {
			return stream.Send(&harnessv1.OpenTerminalResponse{Kind: &harnessv1.OpenTerminalResponse_Exited{Exited: e}})
		},
	})
	return apiError(err)
}
