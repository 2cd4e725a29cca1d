package snapshot

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestValidateID(t *testing.T) {
	for _, id := range []string{"a", "sess-1.v2", "A_b-c.d", strings.Repeat("x", 128)} {
		if err := ValidateID(id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", ".hidden", "a/b", "../x", "a\\b", "a b", "ü", "-x", strings.Repeat("x", 129), "a\x00b"} {
		if err := ValidateID(id); !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Errorf("%q: want ErrInvalidArgument, got %v", id, err)
		}
	}
}

func TestLocalRoundTrip(t *testing.T) {
	ctx := context.Background()
	s, err := NewLocal(filepath.Join(t.TempDir(), "snaps"))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Exists(ctx, "s1"); ok || err != nil {
		t.Fatalf("exists before put: %v %v", ok, err)
	}
	if _, err := s.Get(ctx, "s1"); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("get before put: %v", err)
	}
	data := bytes.Repeat([]byte("snapshot"), 100000)
	info, err := s.Put(ctx, "s1", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(data)) || len(info.SHA256) != 64 {
		t.Fatalf("info %+v", info)
	}
	r, err := s.Get(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("content differs")
	}
	if err := s.Delete(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "s1"); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
	if ok, _ := s.Exists(ctx, "s1"); ok {
		t.Fatal("still exists")
	}
}

type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("source broke")
	}
	k := min(len(p), f.n)
	f.n -= k
	return k, nil
}

func TestLocalFailedPutKeepsOldSnapshot(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "s", strings.NewReader("old")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "s", &failingReader{n: 1 << 20}); err == nil {
		t.Fatal("want an error")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Put(cctx, "s", strings.NewReader("new")); !errors.Is(err, errkind.ErrCanceled) {
		t.Fatalf("canceled put: %v", err)
	}
	r, err := s.Get(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if string(got) != "old" {
		t.Fatalf("old snapshot damaged: %q", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

func TestLocalCleansInterruptedWrites(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, tempPrefix+"s-123"), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLocal(dir); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("leftover: %v", entries)
	}
}

func TestLocalRejectsBadIDs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, _ := NewLocal(filepath.Join(dir, "store"))
	for _, id := range []string{"../escape", "a/b", ""} {
		if _, err := s.Put(ctx, id, strings.NewReader("x")); !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Errorf("put %q: %v", id, err)
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Errorf("get %q: %v", id, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "escape.snapshot")); !os.IsNotExist(err) {
		t.Fatal("a bad id escaped the store")
	}
}

func TestLocalConcurrentPutsAreAtomic(t *testing.T) {
	ctx := context.Background()
	s, _ := NewLocal(t.TempDir())
	var wg sync.WaitGroup
	contents := []string{strings.Repeat("a", 1<<20), strings.Repeat("b", 1<<20)}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(c string) {
			defer wg.Done()
			if _, err := s.Put(ctx, "same", strings.NewReader(c)); err != nil {
				t.Error(err)
			}
		}(contents[i%2])
	}
	wg.Wait()
	r, err := s.Get(ctx, "same")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if string(got) != contents[0] && string(got) != contents[1] {
		t.Fatal("a torn snapshot")
	}
}

func TestNoop(t *testing.T) {
	ctx := context.Background()
	var s Store = Noop{}
	info, err := s.Put(ctx, "x", strings.NewReader("abc"))
	if err != nil || info.Size != 3 {
		t.Fatalf("%v %v", info, err)
	}
	if ok, _ := s.Exists(ctx, "x"); ok {
		t.Fatal("noop keeps nothing")
	}
	if _, err := s.Get(ctx, "x"); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "../x", strings.NewReader("")); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatal(err)
	}
}
