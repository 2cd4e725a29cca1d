package agentclient

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

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

// ReadOutput reads output from the request's cursor, waiting up to its
// yield time for some. It is retried across a dropped connection (a read
// from a cursor is safe to repeat).
func (c *Client) ReadOutput(ctx context.Context, req *agentdv1.ReadOutputRequest) (*agentdv1.ReadOutputResponse, error) {
	var resp *agentdv1.ReadOutputResponse
	err := retry(ctx, func() error {
		var err error
		resp, err = c.process.ReadOutput(ctx, req, bulk)
		return wrap(err)
	})
	return resp, err
}

// Follow attaches to a process (the Attach RPC) and streams its output from
// the request's cursor to fn until the process
// exits, and returns its exit status. When the connection drops it
// re-attaches from the last cursor it delivered, so no output is lost or
// repeated (output the daemon's buffer already dropped is reported through
// dropped_bytes).
//
// The chunks' data is valid only until fn returns: it is the buffer the
// message was received into, which is then reused. Copy what you keep.
func (c *Client) Follow(ctx context.Context, req *agentdv1.AttachRequest, fn func(*agentdv1.AttachResponse) error) (*agentdv1.ExitStatus, error) {
	processID, cursor := req.GetProcessId(), req.GetCursor()
	var exit *agentdv1.ExitStatus
	err := retry(ctx, func() error {
		fc := &followCodec{}
		defer fc.release()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // releases the stream when it ends before its trailers
		stream, err := c.process.Attach(ctx, attachFrom(req, cursor), grpc.ForceCodecV2(fc))
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

// WriteStdin writes the request's data at its stdin offset; the response
// has the next offset. Retrying with the same offset never applies bytes
// twice, so the call is retried across a dropped connection.
func (c *Client) WriteStdin(ctx context.Context, req *agentdv1.WriteStdinRequest) (*agentdv1.WriteStdinResponse, error) {
	var resp *agentdv1.WriteStdinResponse
	err := retry(ctx, func() error {
		var err error
		resp, err = c.process.WriteStdin(ctx, req)
		return wrap(err)
	})
	return resp, err
}

// CloseStdin closes the process's stdin.
func (c *Client) CloseStdin(ctx context.Context, req *agentdv1.CloseStdinRequest) (*agentdv1.CloseStdinResponse, error) {
	resp, err := c.process.CloseStdin(ctx, req)
	return resp, wrap(err)
}

// Resize sets a TTY process's terminal size.
func (c *Client) Resize(ctx context.Context, req *agentdv1.ResizeRequest) (*agentdv1.ResizeResponse, error) {
	resp, err := c.process.Resize(ctx, req)
	return resp, wrap(err)
}

// Signal sends a signal by name (TERM, KILL, INT, ...) to the process group.
func (c *Client) Signal(ctx context.Context, req *agentdv1.SignalRequest) (*agentdv1.SignalResponse, error) {
	resp, err := c.process.Signal(ctx, req)
	return resp, wrap(err)
}

// Wait blocks until the process exits. It is retried across a dropped
// connection.
func (c *Client) Wait(ctx context.Context, req *agentdv1.WaitRequest) (*agentdv1.WaitResponse, error) {
	var resp *agentdv1.WaitResponse
	err := retry(ctx, func() error {
		var err error
		resp, err = c.process.Wait(ctx, req)
		return wrap(err)
	})
	return resp, err
}

// List returns the daemon's processes.
func (c *Client) List(ctx context.Context, req *agentdv1.ListRequest) (*agentdv1.ListResponse, error) {
	resp, err := c.process.List(ctx, req)
	return resp, wrap(err)
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

// attachFrom is req re-aimed at cursor (a re-attach resumes where the last
// one stopped); req itself is not modified.
func attachFrom(req *agentdv1.AttachRequest, cursor int64) *agentdv1.AttachRequest {
	if cursor == req.GetCursor() {
		return req
	}
	again := proto.Clone(req).(*agentdv1.AttachRequest)
	again.Cursor = cursor
	return again
}

// notRetryable hides the retryable mark of an inner error (the sentinel stays
// visible to errors.Is).
type notRetryable struct{ err error }

func (e notRetryable) Error() string { return e.err.Error() }
func (e notRetryable) Is(target error) bool {
	return errors.Is(e.err, target)
}
