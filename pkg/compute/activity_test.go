package compute_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Session.LastActivity reports the daemon's last activity and running
// processes over a real socket: asking does not move it, starting a
// process does; a failed call is an error of its kind naming the session.
func TestSessionLastActivity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := compute.NewClient(agentdtest.NewProvider(t, nil), compute.ClientOptions{})
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: &manifest.Manifest{}, SessionID: "s-activity"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	last, running, err := s.LastActivity(ctx)
	if err != nil || last.IsZero() || running != 0 {
		t.Fatalf("LastActivity of a fresh session: %v, %d running, %v", last, running, err)
	}
	again, _, err := s.LastActivity(ctx)
	if err != nil || !again.Equal(last) {
		t.Fatalf("asking again moved it from %v to %v (%v)", last, again, err)
	}

	before := time.Now()
	st, err := s.StartProcess(ctx, compute.ProcessSpec{Argv: []string{"sleep", "300"}}, compute.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	last, running, err = s.LastActivity(ctx)
	if err != nil || last.Before(before) || running != 1 {
		t.Fatalf("after a start at %v: %v, %d running, %v", before, last, running, err)
	}
	if err := s.Signal(ctx, st.Process.ProcessID, "KILL"); err != nil {
		t.Fatal(err)
	}

	// A failed call is wrapped with the session and keeps its kind.
	done, stop := context.WithCancel(ctx)
	stop()
	_, _, err = s.LastActivity(done)
	if !errors.Is(err, compute.ErrCanceled) || !strings.Contains(err.Error(), "session s-activity: last activity") {
		t.Fatalf("LastActivity with a canceled context: %v, want ErrCanceled naming the session", err)
	}
}
