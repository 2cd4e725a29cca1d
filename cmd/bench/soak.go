package main

// The soak (issue 17): many local sandboxes alive for minutes, each running
// one Exec a second and writing a 1 MiB file every ten seconds, on this
// machine. It reports the Exec latency under that load, the daemons' total
// memory at the end and at its peak, the harness process's memory, and every
// error (the target is none). It stops by itself after the duration, and
// deletes every sandbox it made, also on an error or an interrupt.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

const (
	soakExecEvery  = time.Second      // each sandbox's Exec period
	soakWriteEvery = 10 * time.Second // each sandbox's WriteFile period
	soakWriteBytes = 1 << 20          // bytes per WriteFile
	soakInFlight   = 32               // most operations in flight at once, over all sandboxes
	soakSample     = 5 * time.Second  // memory sampling period
	soakMaxErrors  = 10               // errors kept (and printed) in full
)

// soakMarks are the times into the load at which the daemons' memory is
// reported (the first sample at or after each); a mark past the soak's
// duration is left out, and the end is always reported. Memory that rises
// from one mark to the next is memory the daemons are not giving back
// under steady load.
var soakMarks = []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 3 * time.Minute, 5 * time.Minute, 10 * time.Minute}

// soakSampleAt is one memory reading, taken at into the load.
type soakSampleAt struct {
	at time.Duration
	m  daemonMem
}

// soakConfig is one soak.
type soakConfig struct {
	agentd    string
	sandboxes int
	duration  time.Duration
}

// soakStats collects what the load saw.
type soakStats struct {
	mu          sync.Mutex
	execs       []time.Duration
	writes      []time.Duration
	errors      int
	firstErrors []string
	late        int // ticks skipped because the previous one was still running or waited too long
}

func (s *soakStats) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errors++
	if len(s.firstErrors) < soakMaxErrors {
		s.firstErrors = append(s.firstErrors, err.Error())
		fmt.Fprintln(os.Stderr, "soak: error:", err)
	}
}

// soakMem is a memory reading of the soak's daemons and of this process.
type soakMem struct {
	daemons daemonMem
	self    rss
}

// benchSoak runs the soak. The context's cancellation, SIGINT or SIGTERM end
// it early (an error), after the sandboxes are deleted.
func benchSoak(ctx context.Context, sc soakConfig) (rows []row, err error) {
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	c, done, err := localKind(sc.agentd, local.IsolationNone).client()
	if err != nil {
		return nil, err
	}
	defer done()
	sessions := make([]*compute.Session, sc.sandboxes)
	// Cleanup first deferred, so it runs after everything else returned;
	// with a context of its own (the soak's may be cancelled).
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if derr := deleteSessions(dctx, c, sessions); derr != nil {
			fmt.Fprintln(os.Stderr, "soak: cleanup:", derr)
			if err == nil {
				err = derr
				rows = nil
			}
		}
	}()

	fmt.Fprintf(os.Stderr, "soak: creating %d local sandboxes ...\n", sc.sandboxes)
	if err := createSandboxes(ctx, c, sessions); err != nil {
		return nil, err
	}
	// Every daemon is found before the load starts.
	if _, err := daemonsMemory(sc.agentd, sessions); err != nil {
		return nil, err
	}
	data := bytes.Repeat([]byte("soak 0123456789abcdef\n"), soakWriteBytes/22+1)[:soakWriteBytes]

	fmt.Fprintf(os.Stderr, "soak: %d sandboxes, %s ...\n", sc.sandboxes, sc.duration)
	stats := &soakStats{}
	var (
		memMu    sync.Mutex
		peak     soakMem // peaks of each figure, taken separately
		samples  int
		timeline []soakSampleAt // every reading, in order
		memErr   error
		sampling = make(chan struct{})
	)
	var start time.Time // when the load started; set before the first sample
	sample := func() {
		at := time.Since(start)
		m, err := daemonsMemory(sc.agentd, sessions)
		self, serr := readRSS(os.Getpid())
		memMu.Lock()
		defer memMu.Unlock()
		if err = errors.Join(err, serr); err != nil {
			if memErr == nil {
				memErr = err
			}
			return
		}
		samples++
		timeline = append(timeline, soakSampleAt{at, m})
		fmt.Fprintf(os.Stderr, "soak: %5s  daemons %.1f MiB PSS, %.1f MiB RSS (%.2f / %.2f MiB each)\n", at.Round(time.Second),
			float64(m.pssKiB)/1024, float64(m.rssKiB)/1024, float64(m.pssKiB)/1024/float64(max(m.count, 1)), float64(m.rssKiB)/1024/float64(max(m.count, 1)))
		peak.daemons.count = m.count
		peak.daemons.rssKiB = max(peak.daemons.rssKiB, m.rssKiB)
		peak.daemons.pssKiB = max(peak.daemons.pssKiB, m.pssKiB)
		if self.total > peak.self.total {
			peak.self = self
		}
	}
	lctx, stopLoad := context.WithTimeout(ctx, sc.duration)
	defer stopLoad()
	start = time.Now()
	go func() {
		defer close(sampling)
		t := time.NewTicker(soakSample)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
				sample()
			}
		}
	}()
	sem := make(chan struct{}, soakInFlight)
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			soakOne(lctx, s.Agent(), i, data, sem, stats)
		}()
	}
	wg.Wait()
	<-sampling
	wall := time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("soak interrupted after %s: %w", wall.Round(time.Second), err)
	}
	// At the end: the load stopped, every sandbox still alive.
	sample()
	end, err := daemonsMemory(sc.agentd, sessions)
	if err != nil {
		return nil, err
	}
	runtime.GC()
	self, err := readRSS(os.Getpid())
	if err != nil {
		return nil, err
	}
	selfPeak, err := readPeakRSS(os.Getpid())
	if err != nil {
		return nil, err
	}
	load, _ := os.ReadFile("/proc/loadavg")
	loadFields := strings.Fields(string(load))
	if len(loadFields) > 3 {
		loadFields = loadFields[:3]
	}

	stats.mu.Lock()
	defer stats.mu.Unlock()
	memMu.Lock()
	defer memMu.Unlock()
	if memErr != nil {
		stats.errors++
		stats.firstErrors = append(stats.firstErrors, "memory sampling: "+memErr.Error())
	}
	label := fmt.Sprintf("soak: %d local sandboxes for %s, each Exec `/bin/true` every %s and WriteFile %s every %s",
		sc.sandboxes, sc.duration, soakExecEvery, mib(soakWriteBytes), soakWriteEvery)
	rows = []row{
		{label + ": load average (1, 5, 15 min) at the end", strings.Join(loadFields, ", "), fmt.Sprintf("%d CPUs", runtime.NumCPU()), "", ""},
	}
	if len(stats.execs) > 0 {
		p50, p99 := percentiles(stats.execs)
		rows = append(rows,
			row{label + ": Exec round trip, p50", us(p50), fmt.Sprintf("%d execs", len(stats.execs)), "", ""},
			row{label + ": Exec round trip, p99", us(p99), "", "", "reported"})
	}
	if len(stats.writes) > 0 {
		w50, w99 := percentiles(stats.writes)
		rows = append(rows, row{label + ": WriteFile " + mib(soakWriteBytes) + " (fsynced), p50 / p99", ms1(w50) + " / " + ms1(w99), fmt.Sprintf("%d writes", len(stats.writes)), "", ""})
	}
	memFig := func(m daemonMem) string {
		return fmt.Sprintf("%.1f MiB PSS, %.1f MiB RSS (%.2f / %.2f MiB each)", float64(m.pssKiB)/1024, float64(m.rssKiB)/1024,
			float64(m.pssKiB)/1024/float64(max(m.count, 1)), float64(m.rssKiB)/1024/float64(max(m.count, 1)))
	}
	errFig := "0"
	if stats.errors > 0 {
		errFig = fmt.Sprintf("%d: %s", stats.errors, strings.ReplaceAll(strings.Join(stats.firstErrors, "; "), "|", "/"))
	}
	var over []string // PSS each at the marks, then at the end
	for _, mark := range soakMarks {
		if i := slices.IndexFunc(timeline, func(s soakSampleAt) bool { return s.at >= mark }); i >= 0 && mark < sc.duration {
			over = append(over, fmt.Sprintf("%s %.2f", fmtMark(mark), float64(timeline[i].m.pssKiB)/1024/float64(max(timeline[i].m.count, 1))))
		}
	}
	over = append(over, fmt.Sprintf("end %.2f MiB", float64(end.pssKiB)/1024/float64(max(end.count, 1))))
	rows = append(rows,
		row{label + ": daemons' PSS each over time", strings.Join(over, ", "), "", "", "flat"},
		row{label + ": daemons' total memory at the end", memFig(end), "", "", ""},
		row{label + ": daemons' total memory at its peak", memFig(peak.daemons), fmt.Sprintf("sampled every %s (%d samples; PSS and RSS peaks taken separately)", soakSample, samples), "", ""},
		row{label + ": harness (this) process RSS at the end / sampled peak / VmHWM", fmt.Sprintf("%.1f / %.1f / %.1f MiB", float64(self.total)/1024, float64(peak.self.total)/1024, float64(selfPeak)/1024), "", "", ""},
		row{label + ": ticks skipped (the sandbox's previous operation still running)", fmt.Sprint(stats.late), "", "", "0"},
		row{label + ": errors", errFig, "", "", "0"},
	)
	return rows, nil
}

// fmtMark prints a soak mark as 30 s or 2 min.
func fmtMark(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return fmt.Sprintf("%d s", d/time.Second)
}

// soakOne is one sandbox's load until ctx ends: an Exec every soakExecEvery
// and a WriteFile every soakWriteEvery, each schedule starting at a random
// offset within its period (so the sandboxes spread their load), at most
// soakInFlight operations in flight over all sandboxes (sem). A tick that
// comes while the previous operation still runs is skipped and counted.
func soakOne(ctx context.Context, c *agentclient.Client, i int, data []byte, sem chan struct{}, stats *soakStats) {
	rng := rand.New(rand.NewPCG(uint64(i), 17))
	now := time.Now()
	nextExec := now.Add(time.Duration(rng.Int64N(int64(soakExecEvery))))
	nextWrite := now.Add(time.Duration(rng.Int64N(int64(soakWriteEvery))))
	path := fmt.Sprintf("soak-%d.bin", i)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		next, isWrite := nextExec, false
		if nextWrite.Before(next) {
			next, isWrite = nextWrite, true
		}
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var d time.Duration
		var err error
		t0 := time.Now()
		if isWrite {
			_, err = c.WriteFile(ctx, path, compute.WriteFileOptions{}, bytes.NewReader(data))
			d = time.Since(t0)
		} else {
			var res *agentclient.ExecResult
			res, err = c.Exec(ctx, compute.ProcessSpec{Argv: []string{"/bin/true"}}, compute.ExecOptions{}, nil)
			d = time.Since(t0)
			if err == nil && res.Exit.ExitCode != 0 {
				err = fmt.Errorf("/bin/true exited %d", res.Exit.ExitCode)
			}
		}
		<-sem
		if ctx.Err() != nil {
			return // cut short by the end of the soak: neither a figure nor an error
		}
		op := "exec"
		if isWrite {
			op = "write"
		}
		if err != nil {
			stats.fail(fmt.Errorf("sandbox %d %s: %w", i, op, err))
		}
		stats.mu.Lock()
		if err == nil {
			if isWrite {
				stats.writes = append(stats.writes, d)
			} else {
				stats.execs = append(stats.execs, d)
			}
		}
		// The next tick of this schedule; ticks already past are skipped.
		every := soakExecEvery
		nextp := &nextExec
		if isWrite {
			every, nextp = soakWriteEvery, &nextWrite
		}
		*nextp = nextp.Add(every)
		for now := time.Now(); !nextp.After(now); *nextp = nextp.Add(every) {
			stats.late++
		}
		stats.mu.Unlock()
	}
}
