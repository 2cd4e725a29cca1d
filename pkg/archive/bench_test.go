package archive

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// The benchmark tree: 100 directories of 100 files, ~200 MB in all: 9,900
// text-like files of 2-18 KB and 100 files of 1 MiB, half text-like, half
// random. It is built once per test binary, below $BULKHEAD_ARCHIVE_BENCH_DIR
// when set (to compare filesystems), else the system's temporary directory.
const (
	benchDirs  = 100
	benchFiles = 100
)

var benchTree struct {
	once  sync.Once
	base  string // temporary directory holding everything below
	src   string // the tree
	zst   string // our archive of it
	bytes int64  // content bytes
	err   error
}

func TestMain(m *testing.M) {
	if os.Getenv(crashHelperEnv) != "" {
		os.Exit(crashHelper())
	}
	code := m.Run()
	if benchTree.base != "" {
		_ = os.RemoveAll(benchTree.base)
	}
	os.Exit(code)
}

// words make text-like (compressible) content.
var words = []string{"func ", "return ", "if err != nil {\n", "\t", "}\n", "package ", "import ", "x := ",
	"for i := range ", "the ", "workspace ", "archive ", "0x1f", "// comment\n", "string", "(ctx, ", ")\n"}

// textLike fills b with words chosen by r, with a sprinkling of noise.
func textLike(r *rand.Rand, b []byte) {
	for i := 0; i < len(b); {
		if r.IntN(16) == 0 {
			b[i] = byte(r.IntN(256))
			i++
			continue
		}
		i += copy(b[i:], words[r.IntN(len(words))])
	}
}

// benchSetup builds the tree and our archive of it.
func benchSetup(b *testing.B) {
	b.Helper()
	benchTree.once.Do(func() {
		base, err := os.MkdirTemp(os.Getenv("BULKHEAD_ARCHIVE_BENCH_DIR"), "archive-bench-")
		if err != nil {
			benchTree.err = err
			return
		}
		benchTree.base, benchTree.src, benchTree.zst = base, filepath.Join(base, "src"), filepath.Join(base, "tree.tar.zst")
		r := rand.New(rand.NewPCG(1, 2))
		buf := make([]byte, 1<<20)
		for d := range benchDirs {
			dir := filepath.Join(benchTree.src, fmt.Sprintf("dir%03d", d))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				benchTree.err = err
				return
			}
			for f := range benchFiles {
				var data []byte
				switch {
				case f == 0 && d%2 == 0:
					data = buf
					textLike(r, data)
				case f == 0:
					data = buf
					for i := range data {
						data[i] = byte(r.Uint32())
					}
				default:
					data = buf[:2<<10+r.IntN(16<<10)]
					textLike(r, data)
				}
				benchTree.bytes += int64(len(data))
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("file%03d.txt", f)), data, 0o644); err != nil {
					benchTree.err = err
					return
				}
			}
		}
		out, err := os.Create(benchTree.zst)
		if err != nil {
			benchTree.err = err
			return
		}
		defer out.Close()
		_, benchTree.err = Write(context.Background(), benchTree.src, out, WriteOptions{})
	})
	if benchTree.err != nil {
		b.Fatal(benchTree.err)
	}
	b.SetBytes(benchTree.bytes)
}

// needTar skips a baseline when GNU tar or zstd is missing.
func needTar(b *testing.B) {
	b.Helper()
	testenv.Require(b, testenv.Tool("tar"), testenv.Tool("zstd"))
}

// run runs a command or fails, and returns the CPU time it used (with
// the children it waited for, such as tar's zstd).
func run(b *testing.B, name string, args ...string) time.Duration {
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%s: %v\n%s", name, err, out)
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// cpuTime returns the CPU time this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports CPU time per operation: on a loaded machine it varies
// less than wall time.
func reportCPU(b *testing.B, total time.Duration) {
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "cpu-ms/op")
}

func BenchmarkWrite(b *testing.B) { benchWrite(b, WriteOptions{}) }

// BenchmarkWriteParallel compresses on every core.
func BenchmarkWriteParallel(b *testing.B) {
	benchWrite(b, WriteOptions{Concurrency: max(runtime.NumCPU(), 2)})
}

func benchWrite(b *testing.B, opts WriteOptions) {
	benchSetup(b)
	out := filepath.Join(benchTree.base, "out.tar.zst")
	start := cpuTime()
	for b.Loop() {
		f, err := os.Create(out)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Write(context.Background(), benchTree.src, f, opts); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, cpuTime()-start)
	if fi, err := os.Stat(out); err == nil {
		b.ReportMetric(float64(fi.Size())/float64(benchTree.bytes), "ratio")
	}
}

func BenchmarkTarZstdCreate(b *testing.B) {
	needTar(b)
	benchSetup(b)
	out := filepath.Join(benchTree.base, "out-tar.tar.zst")
	var cpu time.Duration
	for b.Loop() {
		cpu += run(b, "tar", "--zstd", "-cf", out, "-C", benchTree.src, ".")
	}
	reportCPU(b, cpu)
	if fi, err := os.Stat(out); err == nil {
		b.ReportMetric(float64(fi.Size())/float64(benchTree.bytes), "ratio")
	}
}

// benchExtract times extract into a fresh empty directory per iteration.
// extract returns the CPU time it used outside this process.
func benchExtract(b *testing.B, extract func(dst string) time.Duration) {
	benchSetup(b)
	tmp, err := os.MkdirTemp(benchTree.base, "extract-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	var cpu time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		dst := filepath.Join(tmp, fmt.Sprintf("dst%d", i))
		if err := os.Mkdir(dst, 0o755); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := cpuTime()
		cpu += extract(dst) + cpuTime() - start
		b.StopTimer()
		if err := os.RemoveAll(dst); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportCPU(b, cpu)
}

func BenchmarkRestore(b *testing.B) {
	benchExtract(b, func(dst string) time.Duration {
		f, err := os.Open(benchTree.zst)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if _, err := Restore(context.Background(), dst, f, RestoreOptions{PreserveOwnership: true}); err != nil {
			b.Fatal(err)
		}
		return 0
	})
}

func BenchmarkTarZstdExtract(b *testing.B) {
	needTar(b)
	benchExtract(b, func(dst string) time.Duration {
		return run(b, "tar", "--zstd", "-xpf", benchTree.zst, "-C", dst)
	})
}

func BenchmarkFingerprint(b *testing.B) {
	benchSetup(b)
	for b.Loop() {
		if _, err := Fingerprint(context.Background(), benchTree.src, FingerprintOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
