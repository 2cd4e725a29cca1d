package main

// exec_command's round trips (issue #28): a command whose output comes in
// 50 bursts within the yield time, run by the shell capability (Start and
// one Attach stream, whatever the output) beside the loop it replaced
// (Start, then ReadOutput after ReadOutput, each returning at the first
// byte: 1+k round trips for k bursts), against the same daemon in the same
// run. The daemon calls of each side are counted by a client interceptor.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/shell"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// burstyCommand prints 50 lines 20 ms apart (a second in all), well
// within burstyYield.
const (
	burstyCommand = `for i in $(seq 50); do echo line$i; sleep 0.02; done`
	burstyLines   = 50
	burstyYield   = 10 * time.Second
	burstyFigure  = "exec_command of a command printing 50 lines 20 ms apart (yield 10 s)"
)

// callCounter counts the daemon calls made through a client: unary calls
// and streams opened alike.
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.n.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.n.Add(1)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// execCommandRun is one side's calls: wall time and daemon calls of each.
type execCommandRun struct {
	walls []time.Duration
	calls []int64
	cpu   []time.Duration // the daemon's processor time (when known)
}

// execCommandTimer runs the two sides, interleaved, against one daemon
// reached through c (whose calls cnt counts); daemonPID, when positive,
// is read for the daemon's processor time per call.
type execCommandTimer struct {
	c         *agentclient.Client
	cnt       *callCounter
	daemonPID int
}

// measure times one call of run and counts its daemon calls.
func (t *execCommandTimer) measure(side *execCommandRun, run func() error) (time.Duration, error) {
	var cpu0 time.Duration
	if t.daemonPID > 0 {
		var err error
		if cpu0, err = processCPU(t.daemonPID); err != nil {
			return 0, err
		}
	}
	n0 := t.cnt.n.Load()
	start := time.Now()
	if err := run(); err != nil {
		return 0, err
	}
	d := time.Since(start)
	side.walls = append(side.walls, d)
	side.calls = append(side.calls, t.cnt.n.Load()-n0)
	if t.daemonPID > 0 {
		cpu, err := processCPU(t.daemonPID)
		if err != nil {
			return 0, err
		}
		side.cpu = append(side.cpu, cpu-cpu0)
	}
	return d, nil
}

// viaCapability is the new path: exec_command of the shell capability.
func (t *execCommandTimer) viaCapability(ctx context.Context) error {
	s := shell.New(shell.Options{})
	defer s.(capability.Closer).Close()
	exec := s.Tools(capability.Env{HasSession: true})[0]
	res, err := exec.Call(ctx, tool.Context{Agent: t.c, CallID: "bench", Log: zap.NewNop()},
		fmt.Sprintf(`{"cmd":%q,"yield_time_ms":%d,"login":false}`, burstyCommand, burstyYield.Milliseconds()))
	if err != nil {
		return err
	}
	if res.IsError || !strings.Contains(res.Output, "Process exited with code 0\n") || strings.Count(res.Output, "\nline") != burstyLines {
		return fmt.Errorf("exec_command: unexpected result %.300q", res.Output)
	}
	return nil
}

// viaReadLoop is the old path, kept here as the baseline: Start, then
// ReadOutput from the cursor with the rest of the yield time until the
// exit (or the yield time passes).
func (t *execCommandTimer) viaReadLoop(ctx context.Context) error {
	st, err := t.c.Start(ctx, agentclient.ProcessSpec{Command: burstyCommand}, agentclient.StartOptions{})
	if err != nil {
		return err
	}
	pid := st.Process.ProcessID
	deadline := time.Now().Add(burstyYield)
	var out []byte
	var cursor int64
	for {
		r, err := t.c.ReadOutput(ctx, pid, agentclient.ReadOutputOptions{Cursor: cursor, YieldTime: max(time.Until(deadline), 0)})
		if err != nil {
			return err
		}
		for _, ch := range r.Chunks {
			out = append(out, ch.Data...)
		}
		cursor = r.NextCursor
		if r.Exit != nil {
			if r.Exit.ExitCode != 0 || strings.Count(string(out), "line") != burstyLines {
				return fmt.Errorf("read loop: exit %d, output %.300q", r.Exit.ExitCode, out)
			}
			return nil
		}
		if !time.Now().Before(deadline) {
			_ = t.c.Signal(ctx, pid, "KILL")
			return fmt.Errorf("read loop: the command still ran after %s", burstyYield)
		}
	}
}

// rows runs rounds of each side, alternating which goes first, and
// reports them as over (the transport's name).
func (t *execCommandTimer) rows(ctx context.Context, rounds int, over string) ([]row, error) {
	var ours, base execCommandRun
	for i := 0; i < rounds+1; i++ { // the first round warms up both sides
		_, _, err := timedPair(i,
			func() (time.Duration, error) { return t.measure(&ours, func() error { return t.viaCapability(ctx) }) },
			func() (time.Duration, error) { return t.measure(&base, func() error { return t.viaReadLoop(ctx) }) })
		if err != nil {
			return nil, fmt.Errorf("%s over %s: %w", burstyFigure, over, err)
		}
		if i == 0 {
			ours, base = execCommandRun{}, execCommandRun{}
		}
	}
	o50, _ := percentiles(ours.walls)
	b50, _ := percentiles(base.walls)
	oc, bc := meanCount(ours.calls), meanCount(base.calls)
	what := fmt.Sprintf("%s over %s", burstyFigure, over)
	rows := []row{
		{what + fmt.Sprintf(": wall time, median of %d", rounds), ms1(o50) + " (Start + one Attach stream)",
			ms1(b50) + " (Start + ReadOutput loop)", ratio(o50, b50), "two round trips"},
		{"  daemon round trips per call (gRPC calls and streams, counted by the client)", fmt.Sprintf("%.1f (%s)", oc, countRange(ours.calls)),
			fmt.Sprintf("%.1f (%s)", bc, countRange(base.calls)), fmt.Sprintf("%.2fx", oc/bc), "2"},
	}
	if len(ours.cpu) > 0 {
		oCPU, _ := percentiles(ours.cpu)
		bCPU, _ := percentiles(base.cpu)
		rows = append(rows, row{"  sandbox-agentd CPU time per call, median (the command's own processes not included)", us(oCPU), us(bCPU), ratio(oCPU, bCPU), ""})
	}
	return rows, nil
}

// benchExecCommand takes the figure over a unix socket to a local daemon
// of its own (started from binDir), whose processor time it reads too, and
// again through a proxy adding latency each way (0: not), a stand-in for
// a Kubernetes port-forward's hop through the API server and kubelet.
func benchExecCommand(ctx context.Context, binDir string, rounds int, latency time.Duration) ([]row, error) {
	dir, err := os.MkdirTemp("", "bench-execcommand-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	daemon, token, addrs, err := startDaemonBoth(binDir, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = daemon.Process.Kill()
		_ = daemon.Wait()
	}()
	over := func(address, name string) ([]row, error) {
		cnt := &callCounter{}
		c, err := agentclient.Dial(agentclient.Options{Address: address, Token: token, DialOptions: cnt.dialOptions()})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if _, err := agentclient.WaitReady(ctx, c, agentclient.ReadyOptions{Timeout: 10 * time.Second}); err != nil {
			return nil, fmt.Errorf("daemon over %s: %w", name, err)
		}
		t := &execCommandTimer{c: c, cnt: cnt, daemonPID: daemon.Process.Pid}
		return t.rows(ctx, rounds, name)
	}
	rows, err := over(addrs["unix"], "a unix socket")
	if err != nil || latency <= 0 {
		return rows, err
	}
	socket := strings.TrimPrefix(addrs["unix"], "unix://")
	proxy, err := startLatencyProxy(filepath.Join(dir, "p.sock"), socket, latency)
	if err != nil {
		return nil, err
	}
	defer proxy.close()
	r, err := over("unix://"+proxy.socket, fmt.Sprintf("a unix socket with %s added each way (a stand-in for a port-forward)", latency))
	return append(rows, r...), err
}

// latencyProxy forwards connections from a unix socket to another,
// delivering every byte delay after it arrived, in each direction; it
// adds latency, not a bandwidth limit.
type latencyProxy struct {
	socket string
	l      net.Listener
	delay  time.Duration
	wg     sync.WaitGroup
}

func startLatencyProxy(socket, target string, delay time.Duration) (*latencyProxy, error) {
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	p := &latencyProxy{socket: socket, l: l, delay: delay}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t, err := net.Dial("unix", target)
			if err != nil {
				c.Close()
				continue
			}
			p.wg.Add(2)
			go func() { defer p.wg.Done(); p.copy(t, c) }()
			go func() { defer p.wg.Done(); p.copy(c, t) }()
		}
	}()
	return p, nil
}

// copy forwards src to dst, each read delay later, and closes both at the
// end of either.
func (p *latencyProxy) copy(dst, src net.Conn) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	chunks := make(chan chunk, 4096)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{buf[:n], time.Now().Add(p.delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	for range chunks { // the reader ends at the closed src
	}
}

// close stops the proxy and waits for its connections (the clients
// closed them first).
func (p *latencyProxy) close() {
	p.l.Close()
	p.wg.Wait()
}

// meanCount is the mean of ns.
func meanCount(ns []int64) float64 {
	var sum int64
	for _, n := range ns {
		sum += n
	}
	return float64(sum) / float64(max(len(ns), 1))
}

// countRange is "n" when every count is n, else "min-max".
func countRange(ns []int64) string {
	if len(ns) == 0 {
		return "none"
	}
	lo, hi := ns[0], ns[0]
	for _, n := range ns {
		lo, hi = min(lo, n), max(hi, n)
	}
	if lo == hi {
		return fmt.Sprintf("all %d", lo)
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}
