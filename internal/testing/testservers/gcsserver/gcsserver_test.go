package gcsserver

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStartSeeded starts a server over a seed directory and reads a seeded
// object back, writes one and reads it, and checks that a stopped server
// refuses requests.
func TestStartSeeded(t *testing.T) {
	seed := t.TempDir()
	if err := os.MkdirAll(filepath.Join(seed, "seeded", "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seed, "seeded", "d", "a.txt"), []byte("from the seed"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := StartSeeded(t, seed)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b, found, err := s.Get(ctx, "seeded", "d/a.txt"); err != nil || !found || string(b) != "from the seed" {
		t.Fatalf("seeded object: %q, %v, %v", b, found, err)
	}
	bucket := s.Bucket(t)
	if _, err := s.Put(ctx, bucket, "x/y", []byte("put")); err != nil {
		t.Fatal(err)
	}
	if b, found, err := s.Get(ctx, bucket, "x/y"); err != nil || !found || string(b) != "put" {
		t.Fatalf("put object: %q, %v, %v", b, found, err)
	}
	s.Stop()
	s.Stop()
	if _, _, err := s.Get(ctx, bucket, "x/y"); err == nil {
		t.Fatal("a stopped server answered")
	}
}
