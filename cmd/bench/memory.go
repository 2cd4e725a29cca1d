package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

// burstSettle is how long after a burst the daemon's RSS is read: the
// figure a fleet of idle sandboxes pays after each served a large transfer.
const burstSettle = 10 * time.Second

// burstSlackKiB is what the daemon may keep above its idle RSS once it
// settled after a burst (the target).
const burstSlackKiB = 4 << 10

// burstConfig is one burst of benchMemoryBurst.
type burstConfig struct {
	agentd     string // the daemon binary
	streamSize int64  // bytes streamed from a process's output
	fileSize   int64  // bytes written, then read back
	execN      int    // Exec /bin/true round trips
	args       []string
	env        []string // extra environment for the daemon, whose log then goes to stderr (diagnostics)
}

// benchMemoryBurst starts a fresh daemon, reads its idle RSS, puts it
// through a burst (a process's output streamed, a file written and read
// back, many Execs, one after the other as a busy agent would), and reads
// its RSS burstSettle after the burst ended, beside the idle figure of the
// same daemon, together with its peak RSS during the burst (VmHWM, reset
// after the idle reading).
func benchMemoryBurst(ctx context.Context, bc burstConfig) ([]row, error) {
	opts := local.Options{AgentdPath: bc.agentd, Args: bc.args}
	if len(bc.env) > 0 {
		opts.Stderr = os.Stderr
		opts.Wrap = func(argv []string) []string {
			return append(append([]string{"env"}, bc.env...), argv...)
		}
	}
	sb, err := local.Start(ctx, opts, zap.NewNop())
	if err != nil {
		return nil, fmt.Errorf("start daemon for the burst: %w", err)
	}
	defer sb.Close(context.Background())
	c, pid := sb.Client, sb.PID()
	// The source of the write, outside the workspace, made before the
	// idle reading: the page cache it fills is not the daemon's.
	dir, err := os.MkdirTemp(filepath.Dir(sb.Workspace), "bench-burst-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "src.bin")
	if err := makeFile(src, bc.fileSize); err != nil {
		return nil, err
	}
	// Idle: one call made (a client is connected, as in the idle row),
	// then a moment for start-up's garbage to settle.
	if _, err := c.Stat(ctx, ".", agentclient.StatOptions{}); err != nil {
		return nil, err
	}
	time.Sleep(time.Second)
	idle, err := readRSS(pid)
	if err != nil {
		return nil, err
	}
	// Peak RSS from here on: "5" resets the high-water mark (VmHWM) to the
	// current RSS. Without it VmHWM still bounds the burst's peak, since
	// start-up's is lower.
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)

	fmt.Fprintln(os.Stderr, "memory burst: streaming ...")
	var phases []string
	phaseStart := time.Now()
	phase := func(name string) {
		phases = append(phases, fmt.Sprintf("%s %.1f s", name, time.Since(phaseStart).Seconds()))
		phaseStart = time.Now()
	}
	// Streamed by Exec, which frees the process's output once the exit is
	// sent; a Start-ed process would keep its last --output-buffer-bytes
	// (4 MiB) for the exit retention, by design, for later readers.
	if _, err := c.Exec(ctx, agentclient.ProcessSpec{Command: "head -c " + strconv.FormatInt(bc.streamSize, 10) + " /dev/zero"}, agentclient.ExecOptions{},
		func(*agentclient.ExecEvent) error { return nil }); err != nil {
		return nil, fmt.Errorf("burst stream: %w", err)
	}
	phase("stream")
	fmt.Fprintln(os.Stderr, "memory burst: writing and reading a file ...")
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	_, err = c.WriteFile(ctx, "burst.bin", agentclient.WriteFileOptions{}, f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("burst write: %w", err)
	}
	phase("write")
	if _, err := c.ReadFile(ctx, "burst.bin", agentclient.ReadFileOptions{}, io.Discard); err != nil {
		return nil, fmt.Errorf("burst read: %w", err)
	}
	phase("read")
	if err := c.Remove(ctx, "burst.bin", agentclient.RemoveOptions{}); err != nil {
		return nil, err
	}
	fmt.Fprintln(os.Stderr, "memory burst: execs ...")
	for i := 0; i < bc.execN; i++ {
		if _, err := c.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"/bin/true"}}, agentclient.ExecOptions{}, nil); err != nil {
			return nil, fmt.Errorf("burst exec %d: %w", i, err)
		}
	}
	phase("execs")
	end := time.Now()
	atEnd, err := readRSS(pid)
	if err != nil {
		return nil, err
	}
	peak, err := readPeakRSS(pid)
	if err != nil {
		return nil, err
	}
	// Poll until burstSettle: when did the RSS first come within the
	// target, and where is it at burstSettle.
	target := idle.total + burstSlackKiB
	var within time.Duration = -1
	var settled rss
	for {
		r, err := readRSS(pid)
		if err != nil {
			return nil, err
		}
		since := time.Since(end)
		if within < 0 && r.total <= target {
			within = since
		}
		if since >= burstSettle {
			settled = r
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	what := fmt.Sprintf("%s streamed by Exec, %s written, %s read, %d execs", gib(bc.streamSize), gib(bc.fileSize), gib(bc.fileSize), bc.execN)
	reached := "not within " + burstSettle.String()
	if within >= 0 {
		reached = "within target " + within.Round(100*time.Millisecond).String() + " after"
	}
	idleNote := idle.String() + " (idle RSS, same daemon before the burst)"
	return []row{
		{"sandbox-agentd RSS after a burst (" + what + "), " + burstSettle.String() + " after", settled.String() + "; " + atEnd.String() + " as it ended; " + reached,
			idleNote, fmt.Sprintf("%.2fx, %+.1f MiB", float64(settled.total)/float64(idle.total), float64(settled.total-idle.total)/1024), "<= idle + 4 MiB"},
		{"sandbox-agentd peak RSS during that burst (VmHWM)", fmt.Sprintf("%.1f MiB (burst: %s)", float64(peak)/1024, strings.Join(phases, ", ")),
			idleNote, fmt.Sprintf("%.2fx", float64(peak)/float64(idle.total)), ""},
	}, nil
}

// readPeakRSS is a process's peak RSS (VmHWM) in KiB.
func readPeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok && len(strings.Fields(v)) > 0 {
			return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmHWM for pid %d", pid)
}

func gib(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return mib(n)
}
