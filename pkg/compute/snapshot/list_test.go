package snapshot

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestLocalListAndStat(t *testing.T) {
	ctx := context.Background()
	s, err := NewLocal(filepath.Join(t.TempDir(), "snaps"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b", "a", "c"} {
		if _, err := s.Put(ctx, id, strings.NewReader(id+id)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := s.List(ctx, func(in Info) error {
		if in.Size != 2 || in.Modified.IsZero() {
			t.Errorf("%s: %+v", in.ID, in)
		}
		got = append(got, in.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "a,b,c" {
		t.Fatalf("listed %v", got)
	}
	stop := errors.New("stop")
	if err := s.List(ctx, func(Info) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("list did not stop: %v", err)
	}
	if in, err := s.Stat(ctx, "b"); err != nil || in.Size != 2 {
		t.Fatalf("stat: %+v %v", in, err)
	}
	if _, err := s.Stat(ctx, "zz"); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("stat absent: %v", err)
	}
}
