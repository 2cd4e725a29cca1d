package main

// Pause figures (issue #30): a local gVisor sandbox whose process touched
// 64 MiB, 512 MiB or 2 GiB of memory is paused with its memory and
// processes (Session.Pause) and resumed (Client.Resume), over and over.
// For each size: the pause's time (and its parts: workspace snapshot,
// daemon prepare and release, runsc checkpoint writing the image, and the
// image's write-back to the disk, timed after it), the checkpoint image's
// bytes, resume to the first exec with the image in the page cache and
// with it evicted (and the restore's parts: prepare, runsc restore,
// daemon ready), and how long the process takes to read all its memory
// again right after a resume beside the same read before the pause.
// Beside them, same run: a cold gVisor create to first exec of the same
// sandbox, and E2B's published figures as text (published, not measured).
//
// The memory is touched by a tiny static Go program (memtouchSource),
// built here and written into the sandbox's workspace: it allocates N MiB,
// fills it with pseudo-random bytes (nothing a zero-page scan or a
// compressor could skip), says so, and sleeps; on SIGUSR1 it reads all of
// it again and prints how long that took by its own clock.

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// E2B's published pause and resume figures (their documentation of
// sandbox persistence, as cited in issue #30): shown as text, never
// measured here.
const (
	e2bPausePerGiB = 4 * time.Second
	e2bResume      = time.Second
	// gvisorColdReference is the cold gVisor create to first exec the
	// issue took as its reference (the isolation row of 2026-11-26: the
	// host's root file system, the default run_as).
	gvisorColdReference = "304 ms"
)

// memtouchSource is the program that touches the sandbox's memory.
const memtouchSource = `package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	mib, err := strconv.Atoi(os.Args[1])
	if err != nil {
		panic(err)
	}
	buf := make([]byte, mib<<20)
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i+8 <= len(buf); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(buf[i:], x)
	}
	fmt.Printf("touched %d MiB pid %d\n", mib, os.Getpid())
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	for range usr1 {
		start := time.Now()
		var sum uint64
		for i := 0; i+8 <= len(buf); i += 4096 {
			sum += binary.LittleEndian.Uint64(buf[i:])
		}
		fmt.Printf("read %d us sum %x\n", time.Since(start).Microseconds(), sum)
	}
}
`

// pauseConfig configures the pause figures.
type pauseConfig struct {
	agentd, rootfs string
	sizes          []int64 // bytes touched
	rounds         int     // per size and page cache state
}

// benchPause measures the pause figures, or says why this machine
// cannot (rows of their own, not an error).
func benchPause(ctx context.Context, cfg pauseConfig) ([]row, error) {
	skip := func(why string) ([]row, error) {
		return []row{{"pause / resume of a gVisor sandbox with its memory and processes", "skipped: " + why, "", "", ""}}, nil
	}
	if os.Geteuid() != 0 {
		return skip("needs root (runsc restores only as root)")
	}
	runscBin, why := findRunsc(ctx)
	if why != "" {
		return skip(strings.TrimPrefix(why, "skipped: "))
	}
	if _, err := exec.LookPath("go"); err != nil {
		return skip("no go command to build the program that touches the memory")
	}
	work, err := os.MkdirTemp("", "bench-pause-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o711); err != nil {
		return nil, err
	}
	rootfs, err := filepath.Abs(cfg.rootfs)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(rootfs, "bin", "sh")); err != nil {
		fmt.Fprintf(os.Stderr, "pause: no root file system at %s (`make rootfs`): building one ...\n", rootfs)
		rootfs = filepath.Join(work, "rootfs")
		if out, err := exec.CommandContext(ctx, "images/build.sh", "rootfs", rootfs).CombinedOutput(); err != nil {
			return skip(fmt.Sprintf("no root file system (`make rootfs`; images/build.sh rootfs: %v: %s)", err, lastLine(out)))
		}
	}
	memtouch, err := buildMemtouch(ctx, work)
	if err != nil {
		return nil, err
	}
	state := filepath.Join(work, "state")
	if err := os.Mkdir(state, 0o711); err != nil {
		return nil, err
	}
	store, err := snapshot.NewLocal(filepath.Join(work, "snapshots"))
	if err != nil {
		return nil, err
	}
	logs := newRestoreLogs()
	lcfg := local.Config{StateDir: state, AgentdPath: cfg.agentd, Isolation: local.IsolationGVisor, Runsc: runscBin, RootFS: rootfs,
		ReadyTimeout: 3 * time.Minute}
	// A fresh client per resume, as a harness after a restart.
	newClient := func() (*compute.Client, error) {
		return local.NewClient(lcfg, compute.ClientOptions{Snapshots: store, Log: logs.log})
	}
	c, err := newClient()
	if err != nil {
		return nil, err
	}
	// Run the sandbox's work as (gVisor's) root: the state directory lies
	// below /tmp, which a sandbox on a root file system of its own gets
	// as a fresh tmpfs that other accounts cannot pass.
	m := &manifest.Manifest{RunAs: "root"}

	fmt.Fprintln(os.Stderr, "pause: cold gVisor create to first exec ...")
	cold, err := medianOf(cfg.rounds, func() (time.Duration, error) {
		start := time.Now()
		s, err := c.Create(ctx, compute.CreateOptions{Manifest: m})
		if err != nil {
			return 0, err
		}
		defer func() { _ = c.Delete(context.Background(), s) }()
		if err := s.Start(ctx); err != nil {
			return 0, err
		}
		if err := execTrue(ctx, s); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	})
	if err != nil {
		return nil, fmt.Errorf("cold create: %w", err)
	}
	rows := []row{
		{"pause: cold gVisor create to first exec of the same sandbox (busybox root file system, run_as root; Create, Start, Exec `/bin/true`), median of " + strconv.Itoa(cfg.rounds),
			ms1(cold), gvisorColdReference + " (issue #30's reference, isolation row of 2026-11-26: the host's /)", "", ""},
		{"pause: E2B's figures (published, not measured)", fmt.Sprintf("about %.0f s per GiB to pause, about %.0f s to resume", e2bPausePerGiB.Seconds(), e2bResume.Seconds()), "", "", ""},
	}
	for _, size := range cfg.sizes {
		fmt.Fprintf(os.Stderr, "pause: a sandbox holding %s ...\n", mib(size))
		r, err := pauseFigures(ctx, c, newClient, m, memtouch, size, cfg.rounds, cold, logs)
		if err != nil {
			return nil, fmt.Errorf("pause, %s: %w", mib(size), err)
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// pauseRound is one pause and resume.
type pauseRound struct {
	pause, persisted, checkpointed, writeback time.Duration
	bytes                                     int64
	resume, prepare, restore, ready           time.Duration
	readBack                                  time.Duration
}

// pauseFigures measures one size: rounds pauses resumed with the image in
// the page cache, then rounds with it evicted.
func pauseFigures(ctx context.Context, c *compute.Client, newClient func() (*compute.Client, error), m *manifest.Manifest,
	memtouch []byte, size int64, rounds int, cold time.Duration, logs *restoreLogs) (_ []row, err error) {
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: m})
	if err != nil {
		return nil, err
	}
	var paused *compute.State
	defer func() {
		if paused != nil {
			_ = c.DeleteState(context.Background(), paused)
		} else if s != nil {
			_ = c.Delete(context.Background(), s)
		}
	}()
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	if _, err := s.WriteFile(ctx, "memtouch", compute.WriteFileOptions{Mode: 0o755}, bytes.NewReader(memtouch)); err != nil {
		return nil, err
	}
	st, err := s.StartProcess(ctx, compute.ProcessSpec{Argv: []string{"./memtouch", strconv.FormatInt(size>>20, 10)}}, compute.StartOptions{})
	if err != nil {
		return nil, err
	}
	proc := &memtouchProc{id: st.Process.ProcessID}
	line, err := proc.next(ctx, s, "touched ", 5*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("the program touching the memory: %w", err)
	}
	f := strings.Fields(line) // touched N MiB pid P
	if len(f) != 5 {
		return nil, fmt.Errorf("the program touching the memory said %q", line)
	}
	proc.pid = f[4]
	before, err := proc.read(ctx, s)
	if err != nil {
		return nil, err
	}

	var warm, evicted []pauseRound
	for i := 0; i < 2*rounds; i++ {
		evict := i >= rounds
		var r pauseRound
		start := time.Now()
		info, err := s.Pause(ctx)
		if err != nil {
			return nil, fmt.Errorf("round %d: pause: %w", i, err)
		}
		r.pause = time.Since(start)
		r.persisted, r.checkpointed, r.bytes = info.Persisted, info.Checkpointed, info.Bytes
		if paused, err = s.State(); err != nil {
			return nil, err
		}
		s = nil
		if r.writeback, err = syncTree(info.Checkpoint, evict); err != nil {
			return nil, fmt.Errorf("round %d: write the image back: %w", i, err)
		}
		rc, err := newClient()
		if err != nil {
			return nil, err
		}
		logs.reset()
		start = time.Now()
		s, err = rc.Resume(ctx, paused)
		if err != nil {
			return nil, fmt.Errorf("round %d: resume: %w", i, err)
		}
		paused = nil
		if err := execTrue(ctx, s); err != nil {
			return nil, fmt.Errorf("round %d: first exec after the resume: %w", i, err)
		}
		r.resume = time.Since(start)
		if !s.Restored() {
			return nil, fmt.Errorf("round %d: resumed without its memory (not restored)", i)
		}
		r.prepare, r.restore, r.ready = logs.restored()
		if r.readBack, err = proc.read(ctx, s); err != nil {
			return nil, fmt.Errorf("round %d: after the resume: %w", i, err)
		}
		if evict {
			evicted = append(evicted, r)
		} else {
			warm = append(warm, r)
		}
	}

	all := append(append([]pauseRound(nil), warm...), evicted...)
	med := func(rs []pauseRound, f func(pauseRound) time.Duration) time.Duration {
		ds := make([]time.Duration, len(rs))
		for i, r := range rs {
			ds[i] = f(r)
		}
		p50, _ := percentiles(ds)
		return p50
	}
	list := func(rs []pauseRound, f func(pauseRound) time.Duration) string {
		var ss []string
		for _, r := range rs {
			ss = append(ss, strconv.FormatInt(f(r).Milliseconds(), 10))
		}
		return strings.Join(ss, ", ") + " ms"
	}
	gib := float64(size) / (1 << 30)
	what := "a gVisor sandbox whose process touched " + mib(size)
	pause := med(all, func(r pauseRound) time.Duration { return r.pause })
	e2bPause := time.Duration(float64(e2bPausePerGiB) * gib)
	var bytesList []string
	var imageSum int64
	for _, r := range all {
		imageSum += r.bytes
		bytesList = append(bytesList, mib(r.bytes))
	}
	image := imageSum / int64(len(all))
	resumeTarget := ""
	if size <= 64<<20 {
		resumeTarget = "< 300 ms"
	}
	warmResume := med(warm, func(r pauseRound) time.Duration { return r.resume })
	coldResume := med(evicted, func(r pauseRound) time.Duration { return r.resume })
	n := strconv.Itoa(len(all))
	nw, ne := strconv.Itoa(len(warm)), strconv.Itoa(len(evicted))
	return []row{
		{"pause (workspace snapshot + checkpoint) of " + what + ", median of " + n,
			fmt.Sprintf("%s (%.2f s per GiB; rounds: %s)", ms1(pause), pause.Seconds()/gib, list(all, func(r pauseRound) time.Duration { return r.pause })),
			fmt.Sprintf("E2B: about %.1f s (%.0f s per GiB, published, not measured)", e2bPause.Seconds(), e2bPausePerGiB.Seconds()), ratio(pause, e2bPause), "< 1 s per GiB"},
		{"  of which: workspace snapshot / daemon prepare and release / runsc checkpoint writing the image, medians",
			fmt.Sprintf("%s / %s / %s", ms1(med(all, func(r pauseRound) time.Duration { return r.persisted })),
				ms1(med(all, func(r pauseRound) time.Duration { return r.pause - r.persisted - r.checkpointed })),
				ms1(med(all, func(r pauseRound) time.Duration { return r.checkpointed }))),
			fmt.Sprintf("after the pause: the image's write-back to the disk (fdatasync) %s, not part of it", ms1(med(all, func(r pauseRound) time.Duration { return r.writeback }))), "", ""},
		{"  checkpoint image, " + mib(size) + " touched", fmt.Sprintf("%s (rounds: %s)", mib(image), strings.Join(uniq(bytesList), ", ")),
			mib(size) + " touched", fmt.Sprintf("%.2fx", float64(image)/float64(size)), ""},
		{"resume to first exec of " + what + ", image in the page cache, median of " + nw,
			fmt.Sprintf("%s (rounds: %s)", ms1(warmResume), list(warm, func(r pauseRound) time.Duration { return r.resume })),
			ms1(cold) + " (cold gVisor create to first exec, same sandbox, same run)", ratio(warmResume, cold), resumeTarget},
		{"  of which: prepare / runsc restore until the container runs / daemon ready / first exec, medians",
			fmt.Sprintf("%s / %s / %s / %s", ms1(med(warm, func(r pauseRound) time.Duration { return r.prepare })),
				ms1(med(warm, func(r pauseRound) time.Duration { return r.restore })), ms1(med(warm, func(r pauseRound) time.Duration { return r.ready })),
				ms1(med(warm, func(r pauseRound) time.Duration { return r.resume - r.prepare - r.restore - r.ready }))), "", "", ""},
		{"resume to first exec of " + what + ", image evicted from the page cache (fadvise DONTNEED), median of " + ne,
			fmt.Sprintf("%s (rounds: %s)", ms1(coldResume), list(evicted, func(r pauseRound) time.Duration { return r.resume })),
			fmt.Sprintf("%s (cold create, same run); E2B: about %.0f s (published, not measured)", ms1(cold), e2bResume.Seconds()), ratio(coldResume, cold), ""},
		{"  of which: prepare / runsc restore / daemon ready / first exec, medians",
			fmt.Sprintf("%s / %s / %s / %s", ms1(med(evicted, func(r pauseRound) time.Duration { return r.prepare })),
				ms1(med(evicted, func(r pauseRound) time.Duration { return r.restore })), ms1(med(evicted, func(r pauseRound) time.Duration { return r.ready })),
				ms1(med(evicted, func(r pauseRound) time.Duration { return r.resume - r.prepare - r.restore - r.ready }))), "", "", ""},
		{"  the process reading all its " + mib(size) + " again (a word per page) right after the first exec, median (page cache / evicted)",
			fmt.Sprintf("%s / %s", ms1(med(warm, func(r pauseRound) time.Duration { return r.readBack })), ms1(med(evicted, func(r pauseRound) time.Duration { return r.readBack }))),
			ms1(before) + " (the same read before the first pause)", ratio(med(all, func(r pauseRound) time.Duration { return r.readBack }), before), ""},
	}, nil
}

// uniq drops repeats from ss, keeping the order.
func uniq(ss []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// execTrue runs /bin/true in s.
func execTrue(ctx context.Context, s *compute.Session) error {
	res, err := s.Exec(ctx, compute.ProcessSpec{Argv: firstCommand}, compute.ExecOptions{}, nil)
	if err == nil && res.Exit.ExitCode != 0 {
		err = fmt.Errorf("%v exited %d", firstCommand, res.Exit.ExitCode)
	}
	return err
}

// memtouchProc is the running memtouch program.
type memtouchProc struct {
	id, pid string
	cursor  int64
	partial string
}

// next returns the program's next output line starting with prefix.
func (p *memtouchProc) next(ctx context.Context, s *compute.Session, prefix string, max time.Duration) (string, error) {
	deadline := time.Now().Add(max)
	for {
		for {
			i := strings.IndexByte(p.partial, '\n')
			if i < 0 {
				break
			}
			line := p.partial[:i]
			p.partial = p.partial[i+1:]
			if strings.HasPrefix(line, prefix) {
				return line, nil
			}
		}
		out, err := s.ReadOutput(ctx, p.id, compute.ReadOutputOptions{Cursor: p.cursor, YieldTime: time.Second})
		if err != nil {
			return "", err
		}
		for _, ch := range out.Chunks {
			p.partial += string(ch.Data)
		}
		p.cursor = out.NextCursor
		if out.Exit != nil && !strings.Contains(p.partial, "\n") {
			return "", fmt.Errorf("it exited (%+v): %q", *out.Exit, p.partial)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q line within %s: %q", prefix, max, p.partial)
		}
	}
}

// read has the program read all its memory again and returns how long
// that took by its own clock.
func (p *memtouchProc) read(ctx context.Context, s *compute.Session) (time.Duration, error) {
	res, err := s.Exec(ctx, compute.ProcessSpec{Argv: []string{"kill", "-USR1", p.pid}}, compute.ExecOptions{}, nil)
	if err != nil {
		return 0, err
	}
	if res.Exit.ExitCode != 0 {
		return 0, fmt.Errorf("kill -USR1 %s exited %d: %s", p.pid, res.Exit.ExitCode, res.Stderr)
	}
	line, err := p.next(ctx, s, "read ", 2*time.Minute)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(line) // read N us sum S
	us, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the program said %q", line)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// buildMemtouch builds memtouchSource, static, in dir and returns the
// binary.
func buildMemtouch(ctx context.Context, dir string) ([]byte, error) {
	src := filepath.Join(dir, "memtouch-src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module memtouch\n\ngo 1.22\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(memtouchSource), 0o644); err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "memtouch")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the program touching the memory: %v: %s", err, out)
	}
	return os.ReadFile(bin)
}

// syncTree writes the regular files below dir back to the disk
// (fdatasync) and returns how long that took; with evict it then drops
// their pages from the page cache (POSIX_FADV_DONTNEED, clean pages only:
// after the sync all of them), for a restore that reads them from the
// disk. Nothing else's pages are dropped.
func syncTree(dir string, evict bool) (time.Duration, error) {
	var files []string
	if err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, path)
		}
		return err
	}); err != nil {
		return 0, err
	}
	start := time.Now()
	for _, f := range files {
		fd, err := unix.Open(f, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, err
		}
		err = unix.Fdatasync(fd)
		unix.Close(fd)
		if err != nil {
			return 0, fmt.Errorf("fdatasync %s: %w", f, err)
		}
	}
	d := time.Since(start)
	if evict {
		for _, f := range files {
			fd, err := unix.Open(f, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return 0, err
			}
			err = unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
			unix.Close(fd)
			if err != nil {
				return 0, fmt.Errorf("fadvise %s: %w", f, err)
			}
		}
	}
	return d, nil
}

// restoreLogs keeps what the clients log (Info and above), for the local
// provider's "sandbox restored" entry, whose fields time a restore's
// parts (prepare, restore, ready).
type restoreLogs struct {
	log  *zap.Logger
	logs *observer.ObservedLogs
}

func newRestoreLogs() *restoreLogs {
	core, logs := observer.New(zapcore.InfoLevel)
	return &restoreLogs{log: zap.New(core), logs: logs}
}

func (l *restoreLogs) reset() { _ = l.logs.TakeAll() }

// restored returns the last restore's parts (zero when none was
// logged): the provider's entry, which has them (the client logs one of
// the same message after it).
func (l *restoreLogs) restored() (prepare, restore, ready time.Duration) {
	entries := l.logs.FilterMessage("sandbox restored").All()
	for i := len(entries) - 1; i >= 0; i-- {
		fields := entries[i].ContextMap()
		if _, ok := fields["prepare"]; !ok {
			continue
		}
		d := func(k string) time.Duration {
			v, _ := fields[k].(time.Duration)
			return v
		}
		return d("prepare"), d("restore"), d("ready")
	}
	return 0, 0, 0
}

// lastLine is the last non-empty line of out.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// runPause reads the pause flags and measures the pause figures.
func runPause(ctx context.Context, cfg config) ([]row, error) {
	agentd, err := filepath.Abs(filepath.Join(cfg.binDir, local.AgentdBinary))
	if err != nil {
		return nil, err
	}
	pc := pauseConfig{agentd: agentd, rootfs: cfg.pauseRootFS, rounds: max(cfg.pauseRounds, 1)}
	if pc.rootfs == "" {
		pc.rootfs = filepath.Join(cfg.binDir, "rootfs")
	}
	for _, f := range strings.Split(cfg.pauseSizes, ",") {
		if f = strings.TrimSpace(f); f != "" {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("-pause-sizes: bad size %q (MiB)", f)
			}
			pc.sizes = append(pc.sizes, n<<20)
		}
	}
	return benchPause(ctx, pc)
}
