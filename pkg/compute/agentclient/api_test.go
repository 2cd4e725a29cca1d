package agentclient_test

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// TestAPIShape pins the shape the package doc promises: every method that
// is one RPC takes ctx and one proto message (the request, or the header
// that opens a client stream), then at most the stream's other end; a
// unary call returns the RPC's response message. The helpers that are not
// one RPC of the daemon's services are listed here by name.
func TestAPIShape(t *testing.T) {
	helpers := map[string]bool{"Close": true, "Health": true, "ListenLocal": true}
	ctxType := reflect.TypeFor[context.Context]()
	msgType := reflect.TypeFor[proto.Message]()
	writer, reader := reflect.TypeFor[io.Writer](), reflect.TypeFor[io.Reader]()
	ct := reflect.TypeFor[*agentclient.Client]()
	for i := range ct.NumMethod() {
		m := ct.Method(i)
		if helpers[m.Name] {
			continue
		}
		ft := m.Type // receiver first
		if ft.NumIn() < 3 || ft.NumIn() > 4 || ft.In(1) != ctxType || !ft.In(2).Implements(msgType) {
			t.Errorf("%s%s: want (ctx, *agentdv1.<Request or Header>[, stream end])", m.Name, strings.TrimPrefix(ft.String(), "func"))
			continue
		}
		if ft.NumOut() != 2 || ft.Out(1) != reflect.TypeFor[error]() {
			t.Errorf("%s: want (result, error), got %s", m.Name, ft)
			continue
		}
		if ft.NumIn() == 4 {
			if end := ft.In(3); end != writer && end != reader && end.Kind() != reflect.Func {
				t.Errorf("%s: the parameter after the request must be an io.Writer, io.Reader or callback, got %s", m.Name, ft.In(3))
			}
			continue
		}
		req := ft.In(2).Elem().Name()
		if !strings.HasSuffix(req, "Request") {
			continue // a stream's opening message (Forward's ForwardStart)
		}
		if want := strings.TrimSuffix(req, "Request") + "Response"; ft.Out(0).Kind() != reflect.Pointer || ft.Out(0).Elem().Name() != want {
			t.Errorf("%s: a unary call returns *agentdv1.%s, got %s", m.Name, want, ft.Out(0))
		}
	}
}

// Health is one check of the standard health service: nil when SERVING,
// ErrUnavailable (with the status) otherwise, and a compute error when no
// daemon answers.
func TestHealth(t *testing.T) {
	hs := health.NewServer()
	c := dial(t, healthOnly(t, hs), "")
	ctx := testCtx(t)
	if err := c.Health(ctx); err != nil {
		t.Fatalf("serving: %v", err)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	err := c.Health(ctx)
	if !errors.Is(err, errkind.ErrUnavailable) || !strings.Contains(err.Error(), "NOT_SERVING") {
		t.Fatalf("not serving: want ErrUnavailable naming NOT_SERVING, got %v", err)
	}

	sock := filepath.Join(t.TempDir(), "none.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.Close() // nothing listens there any more
	gone := dial(t, "unix://"+sock, "")
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := gone.Health(sctx); err == nil || !errkind.Retryable(err) && !errors.Is(err, errkind.ErrDeadlineExceeded) {
		t.Fatalf("no daemon: want a retryable compute error, got %v", err)
	}
}
