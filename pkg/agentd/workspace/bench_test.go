package workspace

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"testing"
)

const benchSize = 256 << 20

// discard is a writer without ReadFrom, so copies go through the reader's
// Read with the given buffer.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// benchSource writes a random 256 MiB file outside the workspace.
func benchSource(b *testing.B, e *env) string {
	b.Helper()
	p := filepath.Join(e.base, "source.bin")
	f, err := os.Create(p)
	must(b, err)
	_, err = io.CopyN(f, rand.Reader, benchSize)
	must(b, err)
	must(b, f.Sync()) // no writeback of the source during the benchmark
	must(b, f.Close())
	return p
}

// BenchmarkWriteFile streams 256 MiB through WriteFile (temp file, SHA-256,
// fsync, rename) from a plain reader.
func BenchmarkWriteFile(b *testing.B) {
	e := newEnv(b)
	src := benchSource(b, e)
	b.SetBytes(benchSize)
	for b.Loop() {
		f, err := os.Open(src)
		must(b, err)
		_, err = e.w.WriteFile(context.Background(), nil, WriteOptions{Path: "out.bin", ExpectedSize: benchSize}, struct{ io.Reader }{f})
		must(b, err)
		f.Close()
	}
}

// BenchmarkWriteFileAsUser is BenchmarkWriteFile as a run_as user.
func BenchmarkWriteFileAsUser(b *testing.B) {
	requireRoot(b)
	e := newEnv(b)
	must(b, os.Chmod(e.root, 0o777))
	nobody := e.user(b, "nobody")
	src := benchSource(b, e)
	b.SetBytes(benchSize)
	for b.Loop() {
		f, err := os.Open(src)
		must(b, err)
		_, err = e.w.WriteFile(context.Background(), nobody, WriteOptions{Path: "out.bin", ExpectedSize: benchSize}, struct{ io.Reader }{f})
		must(b, err)
		f.Close()
	}
}

// BenchmarkBaselineCopyWrite is io.Copy between plain files plus fsync,
// the floor for an atomic write.
func BenchmarkBaselineCopyWrite(b *testing.B) {
	e := newEnv(b)
	src := benchSource(b, e)
	b.SetBytes(benchSize)
	for b.Loop() {
		in, err := os.Open(src)
		must(b, err)
		out, err := os.Create(e.path("out.bin"))
		must(b, err)
		_, err = io.Copy(out, in)
		must(b, err)
		must(b, out.Sync())
		out.Close()
		in.Close()
	}
}

// BenchmarkBaselineStreamWrite copies from a plain reader (as a gRPC
// stream delivers bytes) through a 1 MiB buffer, plus fsync: WriteFile
// without the hash, temp file and rename.
func BenchmarkBaselineStreamWrite(b *testing.B) {
	e := newEnv(b)
	src := benchSource(b, e)
	buf := make([]byte, 1<<20)
	b.SetBytes(benchSize)
	for b.Loop() {
		in, err := os.Open(src)
		must(b, err)
		out, err := os.Create(e.path("out.bin"))
		must(b, err)
		_, err = io.CopyBuffer(out, struct{ io.Reader }{in}, buf)
		must(b, err)
		must(b, out.Sync())
		out.Close()
		in.Close()
	}
}

// BenchmarkBaselineCopyWriteNoSync is io.Copy between plain files.
func BenchmarkBaselineCopyWriteNoSync(b *testing.B) {
	e := newEnv(b)
	src := benchSource(b, e)
	b.SetBytes(benchSize)
	for b.Loop() {
		in, err := os.Open(src)
		must(b, err)
		out, err := os.Create(e.path("out.bin"))
		must(b, err)
		_, err = io.Copy(out, in)
		must(b, err)
		out.Close()
		in.Close()
	}
}

// BenchmarkReadFile streams 256 MiB out through ReadFile.
func BenchmarkReadFile(b *testing.B) {
	e := newEnv(b)
	src := benchSource(b, e)
	must(b, os.Rename(src, e.path("in.bin")))
	buf := make([]byte, 1<<20)
	b.SetBytes(benchSize)
	for b.Loop() {
		r, err := e.w.ReadFile(context.Background(), nil, "in.bin", 0, 0)
		must(b, err)
		n, err := io.CopyBuffer(discard{}, r, buf)
		must(b, err)
		if n != benchSize {
			b.Fatalf("read %d", n)
		}
		r.Close()
	}
}

// BenchmarkBaselineRead reads the same file with os.Open.
func BenchmarkBaselineRead(b *testing.B) {
	e := newEnv(b)
	src := benchSource(b, e)
	buf := make([]byte, 1<<20)
	b.SetBytes(benchSize)
	for b.Loop() {
		f, err := os.Open(src)
		must(b, err)
		_, err = io.CopyBuffer(discard{}, struct{ io.Reader }{f}, buf)
		must(b, err)
		f.Close()
	}
}

// BenchmarkStat and BenchmarkStatAsUser show the cost of switching
// credentials (a fresh locked thread per operation).
func BenchmarkStat(b *testing.B) {
	e := newEnv(b)
	e.put(b, "a/b/c.txt", "x", 0o644)
	for b.Loop() {
		_, err := e.w.Stat(context.Background(), nil, "a/b/c.txt")
		must(b, err)
	}
}

func BenchmarkStatAsUser(b *testing.B) {
	requireRoot(b)
	e := newEnv(b)
	e.put(b, "a/b/c.txt", "x", 0o644)
	nobody := e.user(b, "nobody")
	for b.Loop() {
		_, err := e.w.Stat(context.Background(), nobody, "a/b/c.txt")
		must(b, err)
	}
}
