// Package wireexec is the one part of `make bench` that speaks the
// daemon's wire contract (proto/bulkhead/agentd/v1) through its raw
// generated client instead of agentclient: the exec path figure compares
// the daemon's Exec with a grpcfloor health check over the same bare
// gRPC connection, and the daemon's own share (Exec less os/exec less the
// floor's round trip) stays honest only if neither side carries the work
// of a client library (request ids, conversions, retries). Everything
// else in the benchmark goes through agentclient and compute.Session.
package wireexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// Client is the daemon's process service over a raw connection, with the
// sandbox's bearer token.
type Client struct {
	procs agentdv1.ProcessServiceClient
	token string
}

// New returns a Client over conn, sending token with every call.
func New(conn *grpc.ClientConn, token string) *Client {
	return &Client{procs: agentdv1.NewProcessServiceClient(conn), token: token}
}

func (c *Client) authed(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
}

// Exec runs argv to completion and times the call, from the request to
// the message carrying the exit; a non-zero exit is an error.
func (c *Client) Exec(ctx context.Context, argv ...string) (time.Duration, error) {
	start := time.Now()
	st, err := c.procs.Exec(c.authed(ctx), &agentdv1.ExecRequest{Spec: &agentdv1.ProcessSpec{Argv: argv}}, grpc.WaitForReady(true))
	if err != nil {
		return 0, err
	}
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return 0, errors.New("exec ended without an exit status")
		}
		if err != nil {
			return 0, err
		}
		if x := m.GetExit(); x != nil {
			d := time.Since(start)
			if x.GetExitCode() != 0 {
				return 0, fmt.Errorf("%s exited %d", argv[0], x.GetExitCode())
			}
			// Drain the end of the stream (its status), as any client does.
			for {
				if _, err := st.Recv(); err != nil {
					if err == io.EOF {
						return d, nil
					}
					return 0, err
				}
			}
		}
	}
}

// Start starts argv and returns its process id.
func (c *Client) Start(ctx context.Context, argv ...string) (string, error) {
	res, err := c.procs.Start(c.authed(ctx), &agentdv1.StartRequest{Spec: &agentdv1.ProcessSpec{Argv: argv}})
	if err != nil {
		return "", err
	}
	return res.GetProcess().GetProcessId(), nil
}

// Kill sends SIGKILL to a process's group.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := c.procs.Signal(c.authed(ctx), &agentdv1.SignalRequest{ProcessId: id, Signal: "KILL"})
	return err
}
