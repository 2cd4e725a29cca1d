package server

import (
	"context"
	"errors"
	"os"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/internal/buildinfo"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// systemService adapts the daemon's description to SystemService.
type systemService struct {
	agentdv1.UnimplementedSystemServiceServer
	d    *agentd.Daemon
	auth *tokenAuth
	// metricsUnix: the daemon serves metrics on a unix socket, which a
	// checkpoint cannot save (see PrepareCheckpoint in checkpoint.go).
	metricsUnix bool
}

// RotateToken replaces the bearer token (see tokenAuth.rotate). Neither the
// log nor the returned status ever carries a token.
func (s *systemService) RotateToken(ctx context.Context, req *agentdv1.RotateTokenRequest) (*agentdv1.RotateTokenResponse, error) {
	if s.auth == nil || s.auth.none {
		return nil, status.Error(codes.FailedPrecondition, "the daemon runs without authentication (--insecure-no-auth); there is no token to rotate")
	}
	err := s.auth.rotate(bearerToken(ctx), req.GetNewToken())
	switch {
	case err == nil:
		return &agentdv1.RotateTokenResponse{}, nil
	case errors.Is(err, errRotationRaced):
		return nil, status.Error(codes.Aborted, err.Error())
	default:
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
}

func (s *systemService) Info(context.Context, *agentdv1.InfoRequest) (*agentdv1.InfoResponse, error) {
	cfg := s.d.Config()
	last, running := s.d.LastActivity()
	grants := make([]*agentdv1.PathGrant, 0, len(cfg.Grants))
	for _, g := range s.d.Workspace().Grants() {
		grants = append(grants, &agentdv1.PathGrant{Path: g.Path, ReadOnly: g.ReadOnly})
	}
	return &agentdv1.InfoResponse{
		Version:       buildinfo.Version(),
		Commit:        buildinfo.Commit(),
		WorkspaceRoot: cfg.WorkspaceRoot,
		Features:      agentd.Features(),
		RunningAsRoot: os.Geteuid() == 0,
		Uid:           uint32(os.Geteuid()),
		Gid:           uint32(os.Getegid()),
		DefaultUser:   cfg.DefaultUser,
		Limits: &agentdv1.Limits{
			MaxProcesses:      int32(cfg.MaxProcesses),
			OutputBufferBytes: int64(cfg.OutputBufferBytes),
			MaxReadBytes:      int32(cfg.MaxReadBytes),
			MaxFileBytes:      cfg.MaxFileBytes,
			MaxPatchBytes:     cfg.MaxPatchBytes,
		},
		Grants:    grants,
		StartedAt: timestamppb.New(s.d.StartedAt()),
		Pid:       int32(os.Getpid()),
		Platform:  agentd.Platform(),
		// Never before started_at: the clock starts there.
		LastActivity:     timestamppb.New(last),
		RunningProcesses: int32(running),
	}, nil
}
