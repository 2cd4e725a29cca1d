package agentclient

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// Start starts a process. A request without a request_id gets one, so the
// call is retried across a dropped connection without ever starting twice.
func (c *Client) Start(ctx context.Context, req *agentdv1.StartRequest) (*agentdv1.StartResponse, error) {
	if req.GetRequestId() == "" {
		req.RequestId = NewRequestID()
	}
	var resp *agentdv1.StartResponse
	err := retry(ctx, func() error {
		var err error
		resp, err = c.process.Start(ctx, req)
		return wrap(err)
	})
	return resp, err
}

// ReadOutput reads output from cursor, waiting up to yield for some.
func (c *Client) ReadOutput(ctx context.Context, processID string, cursor int64, yield time.Duration, maxBytes int32) (*agentdv1.ReadOutputResponse, error) {
	req := &agentdv1.ReadOutputRequest{ProcessId: processID, Cursor: cursor, YieldTime: durationpb.New(yield), MaxBytes: maxBytes}
	var resp *agentdv1.ReadOutputResponse
	err := retry(ctx, func() error {
		var err error
		resp, err = c.process.ReadOutput(ctx, req, bulk)
		return wrap(err)
	})
	return resp, err
}

// Follow streams a process's output from cursor to fn until the process
// exits, and returns its exit status. When the connection drops it
// re-attaches from the last cursor it delivered, so no output is lost or
// repeated (output the daemon's buffer already dropped is reported through
// dropped_bytes).
//
// The chunks' data is valid only until fn returns: it is the buffer the
// message was received into, which is then reused. Copy what you keep.
func (c *Client) Follow(ctx context.Context, processID string, cursor int64, fn func(*agentdv1.AttachResponse) error) (*agentdv1.ExitStatus, error) {
	var exit *agentdv1.ExitStatus
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
			err = fn(msg)
			fc.release() // msg's data is reused from now on
			if err != nil {
				return err
			}
			if msg.GetExit() != nil {
				exit = msg.GetExit()
				return nil
			}
		}
	})
	return exit, err
}

// WriteStdin writes data at the given stdin offset and returns the next
// offset. Retrying with the same offset never applies bytes twice.
func (c *Client) WriteStdin(ctx context.Context, processID string, offset int64, data []byte) (int64, error) {
	req := &agentdv1.WriteStdinRequest{ProcessId: processID, Offset: offset, Data: data}
	var next int64
	err := retry(ctx, func() error {
		resp, err := c.process.WriteStdin(ctx, req)
		if err != nil {
			return wrap(err)
		}
		next = resp.GetNextOffset()
		return nil
	})
	return next, err
}

// CloseStdin closes the process's stdin.
func (c *Client) CloseStdin(ctx context.Context, processID string) error {
	_, err := c.process.CloseStdin(ctx, &agentdv1.CloseStdinRequest{ProcessId: processID})
	return wrap(err)
}

// Resize sets a TTY process's terminal size.
func (c *Client) Resize(ctx context.Context, processID string, rows, cols uint32) error {
	_, err := c.process.Resize(ctx, &agentdv1.ResizeRequest{ProcessId: processID, Size: &agentdv1.TerminalSize{Rows: rows, Cols: cols}})
	return wrap(err)
}

// Signal sends a signal by name (TERM, KILL, INT, ...) to the process group.
func (c *Client) Signal(ctx context.Context, processID, signal string) error {
	_, err := c.process.Signal(ctx, &agentdv1.SignalRequest{ProcessId: processID, Signal: signal})
	return wrap(err)
}

// Wait blocks until the process exits.
func (c *Client) Wait(ctx context.Context, processID string) (*agentdv1.ExitStatus, error) {
	var exit *agentdv1.ExitStatus
	err := retry(ctx, func() error {
		resp, err := c.process.Wait(ctx, &agentdv1.WaitRequest{ProcessId: processID})
		if err != nil {
			return wrap(err)
		}
		exit = resp.GetExit()
		return nil
	})
	return exit, err
}

// List returns the daemon's processes.
func (c *Client) List(ctx context.Context) ([]*agentdv1.ProcessInfo, error) {
	resp, err := c.process.List(ctx, &agentdv1.ListRequest{})
	if err != nil {
		return nil, wrap(err)
	}
	return resp.GetProcesses(), nil
}

// ExecResult is what a completed Exec produced.
type ExecResult struct {
	Process *agentdv1.ProcessInfo
	Exit    *agentdv1.ExitStatus
	// Stdout and Stderr collect the output when Exec was given no callback
	// (PTY output lands in Stdout); with a callback they stay empty, so a
	// streaming caller's memory does not grow with the output.
	Stdout  []byte
	Stderr  []byte
	Dropped int64
}

// Exec runs a process to completion. With fn nil the output is collected in
// the result (for short commands); otherwise it is delivered to fn as it
// comes and not kept. The process is killed if ctx ends first. A transport
// failure after the process started is not retried: the error is not
// marked retryable, because the command may have run.
func (c *Client) Exec(ctx context.Context, req *agentdv1.ExecRequest, fn func(*agentdv1.ExecResponse) error) (*ExecResult, error) {
	if req.GetRequestId() == "" {
		req.RequestId = NewRequestID()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // releases the stream, which ends at the exit before its trailers
	stream, err := c.process.Exec(ctx, req, bulk)
	if err != nil {
		return nil, wrap(err)
	}
	res := &ExecResult{}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return res, &errkind.ProcessError{Op: "exec", ProcessID: res.Process.GetProcessId(), Err: errStreamEnded}
		}
		if err != nil {
			err = wrap(err)
			if res.Process != nil {
				// The command started: repeating it is not safe.
				err = &errkind.ProcessError{Op: "exec", ProcessID: res.Process.GetProcessId(), Err: notRetryable{err}}
			}
			return res, err
		}
		if msg.GetStarted() != nil {
			res.Process = msg.GetStarted()
		}
		res.Dropped += msg.GetDroppedBytes()
		for _, ch := range msg.GetChunks() {
			switch {
			case fn != nil:
			case ch.GetStream() == agentdv1.OutputStream_OUTPUT_STREAM_STDERR:
				res.Stderr = append(res.Stderr, ch.GetData()...)
			default:
				res.Stdout = append(res.Stdout, ch.GetData()...)
			}
		}
		if fn != nil {
			if err := fn(msg); err != nil {
				return res, err
			}
		}
		if msg.GetExit() != nil {
			res.Exit = msg.GetExit()
			return res, nil
		}
	}
}

// notRetryable hides the retryable mark of an inner error (the sentinel stays
// visible to errors.Is).
type notRetryable struct{ err error }

func (e notRetryable) Error() string { return e.err.Error() }
func (e notRetryable) Is(target error) bool {
	return errors.Is(e.err, target)
}
