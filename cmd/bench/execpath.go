package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/bulkhead-dev/bulkhead/cmd/bench/internal/wireexec"
)

// execPath is a sandbox-agentd and a grpcfloor, each serving on a unix
// socket and on TCP loopback, with a client connection to each address:
// the exec path's figures over both transports, beside the same-run gRPC
// floor on the same transport.
type execPath struct {
	dir    string
	daemon *exec.Cmd
	floor  *exec.Cmd
	conns  []*grpc.ClientConn
	token  string
	// By transport ("unix", "tcp"). The daemon is reached through its raw
	// generated client, as the floor is: see package wireexec.
	procs  map[string]*wireexec.Client
	health map[string]healthpb.HealthClient
}

var execTransports = []string{"unix", "tcp"}

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment
// ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startExecPath starts both servers from binDir and waits until both
// answer on both transports.
func startExecPath(ctx context.Context, binDir string) (_ *execPath, err error) {
	floorBin := filepath.Join(binDir, "grpcfloor")
	if _, err := os.Stat(floorBin); err != nil {
		return nil, fmt.Errorf("grpcfloor is not built (make bench builds it): %w", err)
	}
	dir, err := os.MkdirTemp("", "bench-execpath-")
	if err != nil {
		return nil, err
	}
	e := &execPath{dir: dir, procs: map[string]*wireexec.Client{}, health: map[string]healthpb.HealthClient{}}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	var daddr map[string]string
	if e.daemon, e.token, daddr, err = startDaemonBoth(binDir, dir); err != nil {
		return nil, err
	}
	fport, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	faddr := map[string]string{"unix": "unix://" + filepath.Join(dir, "f.sock"), "tcp": "127.0.0.1:" + strconv.Itoa(fport)}
	e.floor = exec.Command(floorBin, "-socket", filepath.Join(dir, "f.sock"), "-tcp", faddr["tcp"])
	e.floor.Stderr = os.Stderr
	if err := e.floor.Start(); err != nil {
		return nil, fmt.Errorf("start grpcfloor: %w", err)
	}
	for _, t := range execTransports {
		dc, err := grpc.NewClient(daddr[t], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		fc, err := grpc.NewClient(faddr[t], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			dc.Close()
			return nil, err
		}
		e.conns = append(e.conns, dc, fc)
		e.procs[t] = wireexec.New(dc, e.token)
		e.health[t] = healthpb.NewHealthClient(fc)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, t := range execTransports {
		for {
			_, ferr := e.health[t].Check(ctx, &healthpb.HealthCheckRequest{})
			_, derr := e.exec(ctx, t)
			if ferr == nil && derr == nil {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("exec path over %s: daemon: %v; grpcfloor: %v", t, derr, ferr)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return e, nil
}

// startDaemonBoth starts sandbox-agentd from binDir with a workspace in
// dir/ws, serving on a unix socket (dir/d.sock) and on TCP loopback, and
// returns its token and its address by transport (gRPC targets).
func startDaemonBoth(binDir, dir string) (_ *exec.Cmd, token string, addrs map[string]string, err error) {
	var tok [16]byte
	rand.Read(tok[:])
	token = hex.EncodeToString(tok[:])
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return nil, "", nil, err
	}
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		return nil, "", nil, err
	}
	dport, err := freeLoopbackPort()
	if err != nil {
		return nil, "", nil, err
	}
	addrs = map[string]string{"unix": "unix://" + filepath.Join(dir, "d.sock"), "tcp": "127.0.0.1:" + strconv.Itoa(dport)}
	cmd := exec.Command(filepath.Join(binDir, "sandbox-agentd"), "--listen", addrs["unix"], "--listen", "tcp://"+addrs["tcp"],
		"--token-file", tokenFile, "--workspace", ws)
	// Its log is discarded, as the local provider's is by default.
	if err := cmd.Start(); err != nil {
		return nil, "", nil, fmt.Errorf("start sandbox-agentd: %w", err)
	}
	return cmd, token, addrs, nil
}

// exec runs /bin/true through the daemon over transport t and times the
// call, from the request to the message carrying the exit.
func (e *execPath) exec(ctx context.Context, t string) (time.Duration, error) {
	return e.procs[t].Exec(ctx, "/bin/true")
}

// floorRoundTrip times one grpcfloor health check over transport t.
func (e *execPath) floorRoundTrip(ctx context.Context, t string) (time.Duration, error) {
	start := time.Now()
	_, err := e.health[t].Check(ctx, &healthpb.HealthCheckRequest{})
	return time.Since(start), err
}

func (e *execPath) close() {
	for _, c := range e.conns {
		c.Close()
	}
	for _, c := range []*exec.Cmd{e.daemon, e.floor} {
		if c != nil && c.Process != nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	os.RemoveAll(e.dir)
}

// benchExecPath times Exec of /bin/true over a unix socket and over TCP
// loopback, interleaved with os/exec of the same and a grpcfloor health
// check over the same transport. The daemon's own share is what an Exec
// costs above running the process (os/exec) and above the floor's gRPC
// round trip: the daemon's exec path, with its extra stream messages.
func benchExecPath(ctx context.Context, binDir string, n int) ([]row, error) {
	e, err := startExecPath(ctx, binDir)
	if err != nil {
		return nil, err
	}
	defer e.close()
	execs := map[string][]time.Duration{}
	floors := map[string][]time.Duration{}
	var direct []time.Duration
	var dcpu0, fcpu0 time.Duration
	for i := 0; i < n+20; i++ { // first 20 are warm-up
		if i == 20 {
			if dcpu0, err = processCPU(e.daemon.Process.Pid); err == nil {
				fcpu0, err = processCPU(e.floor.Process.Pid)
			}
			if err != nil {
				return nil, err
			}
		}
		for _, t := range execTransports {
			d, err := e.exec(ctx, t)
			if err != nil {
				return nil, fmt.Errorf("exec over %s: %w", t, err)
			}
			start := time.Now()
			if err := exec.Command("/bin/true").Run(); err != nil {
				return nil, err
			}
			o := time.Since(start)
			f, err := e.floorRoundTrip(ctx, t)
			if err != nil {
				return nil, fmt.Errorf("grpcfloor over %s: %w", t, err)
			}
			if i >= 20 {
				execs[t] = append(execs[t], d)
				floors[t] = append(floors[t], f)
				direct = append(direct, o)
			}
		}
	}
	dcpu, err := processCPU(e.daemon.Process.Pid)
	if err != nil {
		return nil, err
	}
	fcpu, err := processCPU(e.floor.Process.Pid)
	if err != nil {
		return nil, err
	}
	calls := time.Duration(n * len(execTransports))
	dPer, fPer := (dcpu-dcpu0)/calls, (fcpu-fcpu0)/calls
	o50, _ := percentiles(direct)
	threads, err := e.threadsWhileRunning(ctx, threadsProcesses)
	if err != nil {
		return nil, err
	}
	var rows []row
	for _, t := range execTransports {
		d50, _ := percentiles(execs[t])
		f50, _ := percentiles(floors[t])
		name := map[string]string{"unix": "a unix socket", "tcp": "TCP loopback"}[t]
		rows = append(rows,
			row{"Exec /bin/true over " + name + ", p50", us(d50), us(o50) + " (os/exec)", ratio(d50, o50), ""},
			row{"  the daemon's own share over " + name + ": Exec - os/exec - grpcfloor round trip, p50s", us(d50 - o50 - f50),
				us(f50) + " (grpcfloor health check over " + name + ")", "", "<= 40 µs"})
	}
	// CPU time is what the load of other processes does not inflate: the
	// daemon's own share measured as the processor time it spends per
	// Exec, beside the floor's per round trip.
	rows = append(rows, row{"  sandbox-agentd CPU time per Exec (all its threads, both transports; the process's own exec not included)", us(dPer),
		us(fPer) + " (grpcfloor CPU per health check)", fmt.Sprintf("%.2fx", float64(dPer)/float64(fPer)), ""})
	rows = append(rows, row{fmt.Sprintf("sandbox-agentd OS threads while %d processes run (idle: %d)", threadsProcesses, threads[0]),
		strconv.Itoa(threads[1]), "", "", "no thread per process"})
	return rows, nil
}

// threadsProcesses is how many sleeping processes threadsWhileRunning
// starts (below the daemon's default process limit).
const threadsProcesses = 50

// threadsWhileRunning reads the daemon's OS thread count idle and while n
// processes run, then kills them.
func (e *execPath) threadsWhileRunning(ctx context.Context, n int) (_ [2]int, err error) {
	var out [2]int
	if out[0], err = threadCount(e.daemon.Process.Pid); err != nil {
		return out, err
	}
	var ids []string
	defer func() {
		for _, id := range ids {
			_ = e.procs["unix"].Kill(ctx, id)
		}
	}()
	for range n {
		id, err := e.procs["unix"].Start(ctx, "/bin/sleep", "30")
		if err != nil {
			return out, fmt.Errorf("start sleep: %w", err)
		}
		ids = append(ids, id)
	}
	time.Sleep(500 * time.Millisecond) // let the runtime settle
	out[1], err = threadCount(e.daemon.Process.Pid)
	return out, err
}

// processCPU is the processor time pid's threads have used so far (the
// sum of /proc/pid/task/*/schedstat, in nanoseconds: finer than the clock
// ticks of /proc/pid/stat). A thread that exited meanwhile takes its time
// with it; the Go runtime keeps its threads.
func processCPU(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/task/%s/schedstat: %w", pid, t.Name(), err)
		}
		total += time.Duration(ns)
	}
	return total, nil
}

// threadCount reads the Threads line of /proc/pid/status.
func threadCount(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no thread count in /proc/%d/status", pid)
}
