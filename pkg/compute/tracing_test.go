package compute_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

const (
	secretContent = "TOPSECRET-file-content"
	secretEnv     = "TOPSECRET-env-value"
)

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// The sandbox operations have spans with the session, provider and
// snapshot ids, nested under the caller's span, and nothing of the
// workspace's contents or environment.
func TestSessionSpans(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	store, err := snapshot.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := agentdtest.NewProvider(t, nil)
	c := compute.NewClient(p, compute.ClientOptions{Snapshots: store, TracerProvider: tp})

	ctx, parent := tp.Tracer("test").Start(ctx, "run")
	m := &manifest.Manifest{
		Entries:     map[string]*manifest.Entry{"notes.txt": {Type: manifest.TypeFile, Content: []byte(secretContent + "\n")}},
		Environment: map[string]manifest.EnvValue{"API_KEY": manifest.Literal(secretEnv)},
	}
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: m, SessionID: "s-trace", SnapshotID: "snap-trace"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	// The sandbox is gone: a replacement is restored from the snapshot.
	s2, err := c.Resume(ctx, st, compute.WithTrustedManifest(m))
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, s2); err != nil {
		t.Fatal(err)
	}
	// A failure is recorded by its class.
	bad := *st
	bad.Provider = "other"
	if _, err := c.Resume(ctx, &bad); err == nil {
		t.Fatal("resume of another provider's state succeeded")
	}
	parent.End()

	spans := rec.Ended()
	count := map[string]int{}
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		count[sp.Name()]++
		byID[sp.SpanContext().SpanID().String()] = sp
	}
	want := map[string]int{
		"compute.create": 1, "compute.resume": 2, "compute.delete": 2,
		"session.start": 2, "session.materialize": 2, "session.restore": 2,
		"session.stop": 2, "session.archive": 2, "session.shutdown": 1, "session.close": 1,
	}
	for name, n := range want {
		if count[name] != n {
			t.Errorf("%d %q spans, want %d (all: %v)", count[name], name, n, count)
		}
	}
	var restores []string
	for _, sp := range spans {
		if sp.Name() == "run" {
			continue
		}
		a := attrsOf(sp)
		if a["bulkhead.provider"].AsString() != "inprocess" {
			t.Errorf("%s: provider = %q", sp.Name(), a["bulkhead.provider"].String())
		}
		if sp.Status().Code != codes.Error && a["bulkhead.session.id"].AsString() != "s-trace" {
			t.Errorf("%s: session id = %q", sp.Name(), a["bulkhead.session.id"].String())
		}
		if strings.HasPrefix(sp.Name(), "session.") && a["bulkhead.snapshot.id"].AsString() != "snap-trace" {
			t.Errorf("%s: snapshot id = %q", sp.Name(), a["bulkhead.snapshot.id"].String())
		}
		// Every span is under the caller's.
		root := sp
		for root.Parent().IsValid() {
			next, ok := byID[root.Parent().SpanID().String()]
			if !ok {
				break
			}
			root = next
		}
		if root.Name() != "run" {
			t.Errorf("%s is not under the caller's span", sp.Name())
		}
		switch sp.Name() {
		case "session.restore":
			restores = append(restores, a["bulkhead.snapshot.restore"].AsString())
		case "session.stop":
			if !a["bulkhead.snapshot.persisted"].AsBool() {
				t.Errorf("session.stop: persisted = false")
			}
		case "compute.resume":
			if sp.Status().Code == codes.Error {
				if got := a["error.type"].AsString(); got != "invalid_argument" || sp.Status().Description != got {
					t.Errorf("failed resume: error.type %q, status %v", got, sp.Status())
				}
			} else if got := a["bulkhead.session.resume"].AsString(); got != "replaced" {
				t.Errorf("resume: %q, want replaced", got)
			}
		}
		for _, kv := range sp.Attributes() {
			v := kv.Value.String()
			if strings.Contains(v, secretContent) || strings.Contains(v, secretEnv) {
				t.Errorf("%s: %s = %q", sp.Name(), kv.Key, v)
			}
		}
		if d := sp.Status().Description; strings.Contains(d, secretContent) || strings.Contains(d, secretEnv) {
			t.Errorf("%s: status %q", sp.Name(), d)
		}
	}
	if strings.Join(restores, ",") != "absent,restored" {
		t.Errorf("restores = %v, want a fresh start then a restore", restores)
	}
}

// A client without a TracerProvider uses the global one (a no-op here):
// nothing changes for existing users.
func TestNoTracerProvider(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := compute.NewClient(agentdtest.NewProvider(t, nil), compute.ClientOptions{})
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
}
