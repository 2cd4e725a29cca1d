package server

import (
	"errors"
	"io"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// portService adapts the daemon's port forwarding to PortService.
type portService struct {
	agentdv1.UnimplementedPortServiceServer
	d *agentd.Daemon
}

// Forward reads the start, then hands the stream to Daemon.ForwardPort as
// a PortTunnel.
func (s *portService) Forward(stream agentdv1.PortService_ForwardServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return errmap.ToStatus(errkind.Errorf(errkind.ErrInvalidArgument, "Forward: the first message must be the start"))
	}
	err = s.d.ForwardPort(stream.Context(), int(start.GetPort()), agentd.PortTunnel{
		Opened: func(address string) error {
			return stream.Send(&agentdv1.ForwardResponse{Message: &agentdv1.ForwardResponse_Opened{Opened: &agentdv1.ForwardOpened{Address: address}}})
		},
		Recv: func() ([]byte, error) {
			for {
				msg, err := stream.Recv()
				if err != nil {
					return nil, err // io.EOF: the harness closed its side
				}
				if msg.GetStart() != nil {
					return nil, errmap.ToStatus(errkind.Errorf(errkind.ErrInvalidArgument, "Forward: a second start"))
				}
				if len(msg.GetData()) > 0 {
					return msg.GetData(), nil
				}
			}
		},
		Send: func(b []byte) error {
			return stream.Send(&agentdv1.ForwardResponse{Message: &agentdv1.ForwardResponse_Data{Data: b}})
		},
		Closed: func() error {
			return stream.Send(&agentdv1.ForwardResponse{Message: &agentdv1.ForwardResponse_Closed{Closed: &agentdv1.ForwardClosed{}}})
		},
	})
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	return errmap.ToStatus(err)
}
