package main

// Service figures (`harness serve`): 100 concurrent runs against the
// scripted Responses server, each followed by an SSE client: how long a
// tool result takes from the runner to the client, the service process's
// own memory (it runs as a subprocess), and what the embedded run store
// (bbolt) costs per run on disk.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

const benchToken = "bench-token-0123456789"

// modelClock numbers the scripted model's calls and records when the
// model received each call's output: the moment the runner had the tool
// result, whatever the service then does with its event. It is the
// reference of the "from the runner" latency, which does not depend on
// where the service stamps an event's time.
type modelClock struct {
	mu  sync.Mutex
	n   int
	saw map[string]time.Time
}

// nextCall returns a new call id.
func (m *modelClock) nextCall() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	return fmt.Sprintf("c%d", m.n)
}

// got records the first time the model received call id's output.
func (m *modelClock) got(id string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.saw[id]; !ok {
		m.saw[id] = at
	}
}

// since returns how long after the model received id's output at is.
func (m *modelClock) since(id string, at time.Time) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.saw[id]
	return at.Sub(t), ok
}

// benchServe runs n concurrent runs through `harness serve` (the binary in
// binDir, a process of its own, whose memory is then the service's alone)
// on loopback, against the scripted Responses server in this process.
func benchServe(ctx context.Context, binDir string, n int) ([]row, error) {
	dir, err := os.MkdirTemp("", "bench-serve-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	script := replay.NewServer()
	defer script.Close()
	clock := &modelClock{saw: map[string]time.Time{}}
	script.SetFallback(func(req *replay.Request) replay.Turn {
		outs := req.InputOfType("function_call_output")
		if len(outs) == 0 {
			return replay.Turn{Items: []replay.Item{replay.FunctionCall(clock.nextCall(), "exec_command", `{"cmd":"echo hello"}`)}}
		}
		if id, _ := outs[0]["call_id"].(string); id != "" {
			clock.got(id, time.Now())
		}
		return replay.Turn{Items: []replay.Item{replay.Message("done")}}
	})
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(benchToken+" bench\n"), 0o600); err != nil {
		return nil, err
	}
	dbPath := filepath.Join(dir, "runs.db")
	svc, err := startServe(ctx, binDir, dir, tokens, "bolt:"+dbPath, script.URL())
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	// Its idle figure: a moment for start-up's garbage to settle.
	time.Sleep(time.Second)
	before, err := readProcMem(svc.pid())
	if err != nil {
		return nil, err
	}
	url := "http://" + svc.addr
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}

	var (
		mu        sync.Mutex
		latencies []time.Duration
		arrivals  []arrival
		peak      procMem
		firstErr  error
	)
	sample := func() {
		if m, err := readProcMem(svc.pid()); err == nil {
			mu.Lock()
			if m.rssKiB > peak.rssKiB {
				peak = m
			}
			mu.Unlock()
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, arr, err := serveOneRun(ctx, hc, url)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			latencies = append(latencies, lat...)
			arrivals = append(arrivals, arr...)
		}()
	}
	tick := time.NewTicker(50 * time.Millisecond)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
loop:
	for {
		select {
		case <-waited:
			break loop
		case <-tick.C:
			sample()
		}
	}
	tick.Stop()
	wall := time.Since(start)
	if firstErr != nil {
		return nil, firstErr
	}
	after, err := readProcMem(svc.pid())
	if err != nil {
		return nil, err
	}
	hwm, err := readPeakRSS(svc.pid())
	if err != nil {
		return nil, err
	}
	if len(latencies) == 0 {
		return nil, fmt.Errorf("no tool results were streamed")
	}
	fi, err := os.Stat(dbPath)
	if err != nil {
		return nil, err
	}
	p50, p99 := percentiles(latencies)
	// The model may get a call's output after the client got its result
	// (negative delays count as such); calls it never saw are left out.
	var fromRunner []time.Duration
	for _, a := range arrivals {
		if d, ok := clock.since(a.callID, a.at); ok {
			fromRunner = append(fromRunner, d)
		}
	}
	if len(fromRunner) == 0 {
		return nil, fmt.Errorf("the scripted model saw no tool output")
	}
	r50, r99 := percentiles(fromRunner)
	label := fmt.Sprintf("harness serve, %d concurrent runs (scripted model, exec_command in local sandboxes, one SSE client each)", n)
	return []row{
		{label + ": tool result to SSE client, from the event's time (the service got it from the runner), p50", us(p50), "", "", ""},
		{label + ": tool result to SSE client, from the event's time (the service got it from the runner), p99", us(p99), "", "", ""},
		{label + ": tool result to SSE client, from the model receiving the output (the runner had the result), p50", us(r50), "", "", ""},
		{label + ": tool result to SSE client, from the model receiving the output (the runner had the result), p99", us(r99), "", "", ""},
		{label + ": wall time for all runs", fmt.Sprintf("%.2f s", wall.Seconds()), "", "", ""},
		{label + ": service process (`harness serve`) memory before the runs", before.String(), "", "", ""},
		{label + ": service process memory at its peak RSS (sampled every 50 ms; VmHWM " + fmt.Sprintf("%.1f MiB", float64(hwm)/1024) + ")", peak.String(),
			"", fmt.Sprintf("%+.1f MiB RSS over before", float64(peak.rssKiB-before.rssKiB)/1024), "bounded"},
		{label + ": service process memory after the runs", after.String(), "", fmt.Sprintf("%+.1f MiB RSS over before", float64(after.rssKiB-before.rssKiB)/1024), ""},
		{label + ": bbolt store: bytes on disk per run", fmt.Sprintf("%.1f KiB", float64(fi.Size())/float64(n)/1024), "", "", ""},
	}, nil
}

// arrival is when a client received the tool result of a call.
type arrival struct {
	callID string
	at     time.Time
}

// serveOneRun starts a run with a JSON POST, follows its SSE stream to the
// end, and returns the delay from each tool result's publication (the
// event's time) to its arrival at the client, and the arrivals.
func serveOneRun(ctx context.Context, hc *http.Client, url string) ([]time.Duration, []arrival, error) {
	body := `{"input": "say hello", "agent": {"name": "bench"}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/bulkhead.harness.v1.RunService/StartRun", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	var started struct {
		Run struct {
			RunID string `json:"runId"`
		} `json:"run"`
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(b, &started); err != nil || resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("start run: %d %s", resp.StatusCode, b)
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/runs/"+started.Run.RunID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err = hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var out []time.Duration
	var arr []arrival
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && name == "tool_result":
			now := time.Now()
			var ev struct {
				Time       time.Time `json:"time"`
				ToolResult struct {
					CallID string `json:"callId"`
				} `json:"toolResult"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				return nil, nil, err
			}
			out = append(out, now.Sub(ev.Time))
			arr = append(arr, arrival{ev.ToolResult.CallID, now})
		case strings.HasPrefix(line, "data: ") && name == "run_failed":
			return nil, nil, fmt.Errorf("run failed: %s", line)
		}
	}
	return out, arr, sc.Err()
}

// procMem is a process's resident memory in KiB: RSS and PSS from
// smaps_rollup, RSS split into anonymous and file pages from status.
type procMem struct{ rssKiB, pssKiB, anonKiB, fileKiB int64 }

func (m procMem) String() string {
	return fmt.Sprintf("%.1f MiB RSS (%.1f anonymous + %.1f file), %.1f MiB PSS",
		float64(m.rssKiB)/1024, float64(m.anonKiB)/1024, float64(m.fileKiB)/1024, float64(m.pssKiB)/1024)
}

func readProcMem(pid int) (procMem, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return procMem{}, err
	}
	r, err := readRSS(pid)
	if err != nil {
		return procMem{}, err
	}
	return procMem{rssKiB: smapsField(b, "Rss"), pssKiB: smapsField(b, "Pss"), anonKiB: r.anon, fileKiB: r.file}, nil
}

// serveProc is a `harness serve` subprocess.
type serveProc struct {
	cmd    *exec.Cmd
	addr   string // host:port it serves on
	agentd string
	dir    string // its state directory's parent: every sandbox of it is under it
	exited chan struct{}
	mu     sync.Mutex
	tail   []string // the last lines of its stderr
}

func (p *serveProc) pid() int { return p.cmd.Process.Pid }

func (p *serveProc) stderrTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// startServe starts `harness serve` from binDir with its state under dir,
// local sandboxes without isolation (plain processes, as the other figures'
// sandboxes), the tokens file, the run store, and the model at modelURL,
// and waits until it listens.
func startServe(ctx context.Context, binDir, dir, tokens, storeSpec, modelURL string) (*serveProc, error) {
	harness, err := filepath.Abs(filepath.Join(binDir, "harness"))
	if err != nil {
		return nil, err
	}
	agentd, err := filepath.Abs(filepath.Join(binDir, local.AgentdBinary))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(harness); err != nil {
		return nil, fmt.Errorf("harness serve: %w (build it with `make build`)", err)
	}
	cmd := exec.Command(harness, "--provider", "local", "--isolation", "none", "--agentd", agentd, "--state-dir", filepath.Join(dir, "state"),
		"serve", "--listen", "127.0.0.1:0", "--tokens-file", tokens, "--store", storeSpec, "--model", "scripted",
		"--sandbox-retention", "0", "--drain-timeout", "10s",
		// One tenant runs all n runs at once: no per-tenant quotas.
		"--max-runs-per-tenant", "-1", "--max-sandboxes-per-tenant", "-1")
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY=bench", "OPENAI_BASE_URL="+modelURL)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness serve: %w", err)
	}
	p := &serveProc{cmd: cmd, agentd: agentd, dir: dir, exited: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.tail = append(p.tail, line)
			if len(p.tail) > 20 {
				p.tail = p.tail[1:]
			}
			p.mu.Unlock()
			if rest, ok := strings.CutPrefix(line, "harness: serving on http://"); ok {
				addr, _, _ := strings.Cut(rest, " ")
				select {
				case ready <- addr:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	select {
	case p.addr = <-ready:
		return p, nil
	case <-p.exited:
		p.stop()
		return nil, fmt.Errorf("harness serve exited before serving: %s", p.stderrTail())
	case <-time.After(30 * time.Second):
		p.stop()
		return nil, fmt.Errorf("harness serve did not serve within 30 s: %s", p.stderrTail())
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
}

// stop ends the service (SIGTERM, then SIGKILL after a minute) and kills
// any sandbox daemon of it still running.
func (p *serveProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	mark := []byte(p.dir + "/")
	_ = eachDaemon(p.agentd, func(cmdline []byte) bool { return bytes.Contains(cmdline, mark) }, func(pid string) {
		var n int
		if _, err := fmt.Sscan(pid, &n); err == nil {
			fmt.Fprintf(os.Stderr, "harness serve: killing its leftover sandbox daemon %d\n", n)
			_ = syscall.Kill(n, syscall.SIGKILL)
		}
	})
}
