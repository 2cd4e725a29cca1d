package agentclient_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// healthOnly serves the health service (in the status the test sets) and
// an Info that answers, on a unix socket, and returns its address.
func healthOnly(t *testing.T, hs *health.Server) string {
	t.Helper()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	agentdv1.RegisterSystemServiceServer(srv, infoServer{})
	sock := filepath.Join(t.TempDir(), "h.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return "unix://" + sock
}

func dial(t *testing.T, address, token string) *agentclient.Client {
	t.Helper()
	c, err := agentclient.Dial(agentclient.Options{Address: address, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestWaitReadyServingDaemon(t *testing.T) {
	d := agentdtest.Start(t, nil)
	info, err := agentclient.WaitReady(testCtx(t), d.Client, agentclient.ReadyOptions{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if info.WorkspaceRoot != d.Workspace {
		t.Errorf("Info's workspace = %q, want %q", info.WorkspaceRoot, d.Workspace)
	}
}

// A daemon that serves but refuses the token fails at once, as
// unauthenticated: health alone does not prove the credentials.
func TestWaitReadyChecksTheToken(t *testing.T) {
	d := agentdtest.Start(t, nil)
	c := dial(t, "unix://"+d.Socket, "not-the-token")
	start := time.Now()
	_, err := agentclient.WaitReady(testCtx(t), c, agentclient.ReadyOptions{Timeout: 10 * time.Second})
	if !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("WaitReady with a wrong token = %v, want ErrUnauthenticated", err)
	}
	if errkind.Retryable(err) {
		t.Errorf("a refused token is retryable: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("a refused token took %s: it must not wait for the timeout", time.Since(start))
	}
}

// Nothing listens: the wait ends at Timeout as unavailable and retryable,
// and the error does not carry gRPC's text (which names the host socket).
func TestWaitReadyTimesOut(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nobody-listens.sock")
	c := dial(t, "unix://"+sock, "t")
	start := time.Now()
	_, err := agentclient.WaitReady(testCtx(t), c, agentclient.ReadyOptions{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) {
		t.Fatalf("WaitReady with no daemon = %v, want a retryable ErrUnavailable", err)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 5*time.Second {
		t.Errorf("the wait took %s, want about the 300ms timeout", el)
	}
	for _, raw := range []string{sock, "rpc error", "code ="} {
		if strings.Contains(err.Error(), raw) {
			t.Errorf("the error carries %q: %v", raw, err)
		}
	}
	if !strings.Contains(err.Error(), "300ms") {
		t.Errorf("the error does not say how long it waited: %v", err)
	}
}

// NOT_SERVING is waited out, not final: the wait goes on until the daemon
// serves.
func TestWaitReadyWaitsForServing(t *testing.T) {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	c := dial(t, healthOnly(t, hs), "t")
	go func() {
		time.Sleep(200 * time.Millisecond)
		hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	}()
	if _, err := agentclient.WaitReady(testCtx(t), c, agentclient.ReadyOptions{Timeout: 10 * time.Second}); err != nil {
		t.Fatalf("WaitReady across NOT_SERVING -> SERVING: %v", err)
	}

	never := health.NewServer()
	never.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	_, err := agentclient.WaitReady(testCtx(t), dial(t, healthOnly(t, never), "t"), agentclient.ReadyOptions{Timeout: 200 * time.Millisecond})
	if !errors.Is(err, errkind.ErrUnavailable) || !strings.Contains(err.Error(), "NOT_SERVING") {
		t.Fatalf("WaitReady on a daemon that never serves = %v, want ErrUnavailable naming NOT_SERVING", err)
	}
}

// Alive's error ends the wait at once, as it is.
func TestWaitReadyStopsWhenTheDaemonIsGone(t *testing.T) {
	c := dial(t, "unix://"+filepath.Join(t.TempDir(), "gone.sock"), "t")
	gone := errors.New("the daemon exited")
	calls := 0
	start := time.Now()
	_, err := agentclient.WaitReady(testCtx(t), c, agentclient.ReadyOptions{Timeout: 30 * time.Second,
		Alive: func(context.Context) error {
			if calls++; calls < 3 {
				return nil
			}
			return gone
		}})
	if !errors.Is(err, gone) || calls != 3 {
		t.Fatalf("WaitReady = %v after %d Alive calls, want Alive's error after 3", err, calls)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("the wait went on for %s after the daemon was gone", time.Since(start))
	}
}

func TestWaitReadyContext(t *testing.T) {
	c := dial(t, "unix://"+filepath.Join(t.TempDir(), "none.sock"), "t")
	ctx, cancel := context.WithCancel(testCtx(t))
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := agentclient.WaitReady(ctx, c, agentclient.ReadyOptions{Timeout: 30 * time.Second}); !errors.Is(err, errkind.ErrCanceled) {
		t.Errorf("WaitReady with a canceled context = %v, want ErrCanceled", err)
	}
	ctx, cancel = context.WithTimeout(testCtx(t), 100*time.Millisecond)
	defer cancel()
	_, err := agentclient.WaitReady(ctx, c, agentclient.ReadyOptions{Timeout: 30 * time.Second})
	if !errors.Is(err, errkind.ErrDeadlineExceeded) || errors.Is(err, errkind.ErrUnavailable) {
		t.Errorf("WaitReady past the caller's deadline = %v, want ErrDeadlineExceeded", err)
	}
}
