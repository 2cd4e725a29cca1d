package agentclient_test

import (
	"context"
	"errors"
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

// TestAPIShape pins the shape the package doc promises: every method
// takes ctx first (Close excepted), returns an error last, and no type
// reachable from a method's signature (through pointers, slices, maps,
// funcs and struct fields) is a type of the wire contract: the API is in
// Go types, the wire stays inside the package.
func TestAPIShape(t *testing.T) {
	ctxType := reflect.TypeFor[context.Context]()
	ct := reflect.TypeFor[*agentclient.Client]()
	seen := map[reflect.Type]bool{}
	for i := range ct.NumMethod() {
		m := ct.Method(i)
		ft := m.Type // receiver first
		if m.Name != "Close" && (ft.NumIn() < 2 || ft.In(1) != ctxType) {
			t.Errorf("%s%s: want ctx first", m.Name, strings.TrimPrefix(ft.String(), "func"))
		}
		if ft.NumOut() == 0 || ft.Out(ft.NumOut()-1) != reflect.TypeFor[error]() {
			t.Errorf("%s: want an error last, got %s", m.Name, ft)
		}
		for j := 1; j < ft.NumIn(); j++ {
			checkNoWire(t, m.Name, ft.In(j), seen)
		}
		for j := range ft.NumOut() {
			checkNoWire(t, m.Name, ft.Out(j), seen)
		}
	}
	for _, f := range []any{agentclient.WaitReady, agentclient.PatchRejection} {
		checkNoWire(t, "function", reflect.TypeOf(f), seen)
	}
	if len(seen) < 30 {
		t.Fatalf("only %d types reached: the walk is not looking at the API", len(seen))
	}
}

// checkNoWire fails when t, or a type reachable from it, belongs to the
// wire contract's package or implements proto.Message.
func checkNoWire(t *testing.T, method string, typ reflect.Type, seen map[reflect.Type]bool) {
	t.Helper()
	if seen[typ] {
		return
	}
	seen[typ] = true
	if strings.HasPrefix(typ.PkgPath(), "github.com/bulkhead-dev/bulkhead/proto/") || typ.Implements(reflect.TypeFor[proto.Message]()) {
		t.Errorf("%s: %s is a wire type", method, typ)
		return
	}
	switch typ.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Chan:
		checkNoWire(t, method, typ.Elem(), seen)
	case reflect.Map:
		checkNoWire(t, method, typ.Key(), seen)
		checkNoWire(t, method, typ.Elem(), seen)
	case reflect.Func:
		for i := range typ.NumIn() {
			checkNoWire(t, method, typ.In(i), seen)
		}
		for i := range typ.NumOut() {
			checkNoWire(t, method, typ.Out(i), seen)
		}
	case reflect.Struct:
		if typ.PkgPath() != "github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient" {
			return // time.Time and the like
		}
		for i := range typ.NumField() {
			if f := typ.Field(i); f.IsExported() {
				checkNoWire(t, method, f.Type, seen)
			}
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
