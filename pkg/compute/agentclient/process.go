package agentclient

import (
	"context"
	"errors"
	"io"
	"math"

	"google.golang.org/grpc"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// Start starts a process. Without opts.RequestID the call gets one, so it
// is retried across a dropped connection without ever starting twice.
func (c *Client) Start(ctx context.Context, spec ProcessSpec, opts StartOptions) (*StartResult, error) {
	req := &agentdv1.StartRequest{Spec: specToProto(spec), RequestId: opts.RequestID}
	if req.RequestId == "" {
		req.RequestId = NewRequestID()
	}
	var resp *agentdv1.StartResponse
	err := retry(ctx, func() error {
		var err error
		resp, err = c.process.Start(ctx, req)
		return wrap(err)
	})
	if err != nil {
		return nil, err
	}
	return &StartResult{Process: processOf(resp.GetProcess()), Existing: resp.GetExisting()}, nil
}

// ReadOutput reads a process's output from opts.Cursor, waiting up to
// opts.YieldTime for some. It is retried across a dropped connection (a
// read from a cursor is safe to repeat).
func (c *Client) ReadOutput(ctx context.Context, processID string, opts ReadOutputOptions) (*Output, error) {
	req := &agentdv1.ReadOutputRequest{ProcessId: processID, Cursor: opts.Cursor, YieldTime: durationOf(opts.YieldTime),
		MaxBytes: clampInt32(opts.MaxBytes)}
	var resp *agentdv1.ReadOutputResponse
	err := retry(ctx, func() error {
		var err error
		resp, err = c.process.ReadOutput(ctx, req, bulk)
		return wrap(err)
	})
	if err != nil {
		return nil, err
	}
	out := &Output{}
	outputOf(out, resp)
	return out, nil
}

// Follow attaches to a process (the Attach RPC) and streams its output
// from opts.Cursor to fn until the process exits, and returns its exit
// status. When the connection drops it re-attaches from the last cursor
// it delivered, so no output is lost or repeated (output the daemon's
// buffer already dropped is reported through DroppedBytes).
//
// The Output passed to fn, its chunks and their data are valid only until
// fn returns: the data is the buffer the message was received into, which
// is then reused, and so is the Output. Copy what you keep.
func (c *Client) Follow(ctx context.Context, processID string, opts FollowOptions, fn func(*Output) error) (*ExitStatus, error) {
	cursor := opts.Cursor
	var exit *ExitStatus
	var out Output
	err := retry(ctx, func() error {
		fc := &followCodec{}
		defer fc.release()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // releases the stream when it ends before its trailers
		stream, err := c.process.Attach(ctx, &agentdv1.AttachRequest{ProcessId: processID, Cursor: cursor}, grpc.ForceCodecV2(fc))
		if err != nil {
			return wrap(err)
		}
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return errkind.MarkRetryable(&errkind.ProcessError{Op: "attach", ProcessID: processID, Err: errStreamEnded})
			}
			if err != nil {
				return wrap(err)
			}
			cursor = msg.GetNextCursor()
			outputOf(&out, msg)
			err = fn(&out)
			clear(out.Chunks) // drops the references to msg's data
			fc.release()      // msg's data is reused from now on
			if err != nil {
				return err
			}
			if msg.GetExit() != nil {
				exit = exitOf(msg.GetExit())
				return nil
			}
		}
	})
	return exit, err
}

// WriteStdin writes data to the process's stdin at offset (the stdin
// offset of data's first byte) and returns the offset after it. Bytes
// before the daemon's current offset were applied already and are
// skipped, so the call is retried across a dropped connection and never
// applies bytes twice.
func (c *Client) WriteStdin(ctx context.Context, processID string, offset int64, data []byte) (nextOffset int64, err error) {
	req := &agentdv1.WriteStdinRequest{ProcessId: processID, Offset: offset, Data: data}
	var resp *agentdv1.WriteStdinResponse
	err = retry(ctx, func() error {
		var err error
		resp, err = c.process.WriteStdin(ctx, req)
		return wrap(err)
	})
	if err != nil {
		return 0, err
	}
	return resp.GetNextOffset(), nil
}

// CloseStdin closes the process's stdin.
func (c *Client) CloseStdin(ctx context.Context, processID string) error {
	_, err := c.process.CloseStdin(ctx, &agentdv1.CloseStdinRequest{ProcessId: processID})
	return wrap(err)
}

// Resize sets a TTY process's terminal size.
func (c *Client) Resize(ctx context.Context, processID string, size TerminalSize) error {
	_, err := c.process.Resize(ctx, &agentdv1.ResizeRequest{ProcessId: processID, Size: &agentdv1.TerminalSize{Rows: size.Rows, Cols: size.Cols}})
	return wrap(err)
}

// Signal sends a signal by name (TERM, KILL, INT, HUP, QUIT, USR1, USR2,
// STOP, CONT; the SIG prefix is optional) to the process group.
func (c *Client) Signal(ctx context.Context, processID, signal string) error {
	_, err := c.process.Signal(ctx, &agentdv1.SignalRequest{ProcessId: processID, Signal: signal})
	return wrap(err)
}

// Wait blocks until the process exits and returns how it ended. It is
// retried across a dropped connection.
func (c *Client) Wait(ctx context.Context, processID string) (*ExitStatus, error) {
	req := &agentdv1.WaitRequest{ProcessId: processID}
	var resp *agentdv1.WaitResponse
	err := retry(ctx, func() error {
		var err error
		resp, err = c.process.Wait(ctx, req)
		return wrap(err)
	})
	if err != nil {
		return nil, err
	}
	if exit := exitOf(resp.GetExit()); exit != nil {
		return exit, nil
	}
	return &ExitStatus{}, nil
}

// List returns the processes the daemon keeps (running, or exited and
// not yet reaped).
func (c *Client) List(ctx context.Context) ([]ProcessInfo, error) {
	resp, err := c.process.List(ctx, &agentdv1.ListRequest{})
	if err != nil {
		return nil, wrap(err)
	}
	out := make([]ProcessInfo, 0, len(resp.GetProcesses()))
	for _, p := range resp.GetProcesses() {
		out = append(out, processOf(p))
	}
	return out, nil
}

// Exec runs a process to completion. With fn nil the output is collected in
// the result (for short commands); otherwise each event is delivered to fn
// as it comes and not kept. The process is killed if ctx ends first. A
// transport failure after the process started is not retried: the error
// is not marked retryable, because the command may have run.
func (c *Client) Exec(ctx context.Context, spec ProcessSpec, opts ExecOptions, fn func(*ExecEvent) error) (*ExecResult, error) {
	req := &agentdv1.ExecRequest{Spec: specToProto(spec), RequestId: opts.RequestID, Stdin: opts.Stdin}
	if req.RequestId == "" {
		req.RequestId = NewRequestID()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // releases the stream, which ends at the exit before its trailers
	stream, err := c.process.Exec(ctx, req, bulk)
	if err != nil {
		return nil, wrap(err)
	}
	res := &ExecResult{}
	started := false
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return res, &errkind.ProcessError{Op: "exec", ProcessID: res.Process.ProcessID, Err: errStreamEnded}
		}
		if err != nil {
			err = wrap(err)
			if started {
				// The command started: repeating it is not safe.
				err = &errkind.ProcessError{Op: "exec", ProcessID: res.Process.ProcessID, Err: notRetryable{err}}
			}
			return res, err
		}
		if msg.GetStarted() != nil {
			res.Process, started = processOf(msg.GetStarted()), true
		}
		res.Dropped += msg.GetDroppedBytes()
		if fn != nil {
			if err := fn(execEventOf(msg)); err != nil {
				return res, err
			}
		} else {
			for _, ch := range msg.GetChunks() {
				if ch.GetStream() == agentdv1.OutputStream_OUTPUT_STREAM_STDERR {
					res.Stderr = append(res.Stderr, ch.GetData()...)
				} else {
					res.Stdout = append(res.Stdout, ch.GetData()...)
				}
			}
		}
		if exit := exitOf(msg.GetExit()); exit != nil {
			res.Exit = *exit
			return res, nil
		}
	}
}

// clampInt32 is n within int32's range (a wire field's).
func clampInt32(n int) int32 {
	return int32(max(min(n, math.MaxInt32), math.MinInt32))
}

// notRetryable hides the retryable mark of an inner error (the sentinel stays
// visible to errors.Is).
type notRetryable struct{ err error }

func (e notRetryable) Error() string { return e.err.Error() }
func (e notRetryable) Is(target error) bool {
	return errors.Is(e.err, target)
}
