package main

// Download and upload throughput of the daemon's ReadFile and WriteFile,
// over a unix socket and over TCP loopback, each beside a same-run
// baseline on the same transport: the same bytes moved by a plain process
// (this program re-executed as a socket copier) with read(2)/write(2) and
// a buffer of the daemon's chunk size, no framing and no protocol. The
// file read straight from the page cache (os.File.Read into a buffer) is
// the ceiling of both.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// socketCopyEnv, when set in this program's environment, makes it the
// baseline's socket copier instead of the bench: "network address dir",
// see serveSocketCopy.
const socketCopyEnv = "BENCHREPORT_SOCKET_COPY"

// copyBufBytes is the baseline's read and write size: the daemon's
// ReadFile chunk.
const copyBufBytes = 512 << 10

// transferRounds is how many times each figure is measured (the median is
// shown), the daemon and the baseline alternating.
const transferRounds = 5

func init() {
	// The copier is this binary re-executed: a process of its own, as the
	// daemon is, without a tool (socat, nc) the machine may not have.
	if v := os.Getenv(socketCopyEnv); v != "" {
		if err := serveSocketCopy(strings.Fields(v)); err != nil {
			fmt.Fprintln(os.Stderr, "socket copier:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// serveSocketCopy listens on args[0] (network) args[1] (address), prints
// "ready" and serves one connection at a time: a first byte 'R' asks for
// the file dir/src.bin, sent whole before the connection is closed; 'W'
// sends a file, received into a temporary file in args[2] that is fsynced
// and renamed to dir/upload.bin (as WriteFile does) before a one-byte
// answer.
func serveSocketCopy(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("want network, address and directory, got %q", args)
	}
	l, err := net.Listen(args[0], args[1])
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println("ready")
	buf := make([]byte, copyBufBytes)
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		if err := serveCopy(c, args[2], buf); err != nil {
			fmt.Fprintln(os.Stderr, "socket copier:", err)
		}
		c.Close()
	}
}

// serveCopy serves one connection of serveSocketCopy. It copies with
// plain reads and writes (never io.Copy, which would use sendfile or
// splice, a path gRPC has no access to).
func serveCopy(c net.Conn, dir string, buf []byte) error {
	var op [1]byte
	if _, err := io.ReadFull(c, op[:]); err != nil {
		return err
	}
	switch op[0] {
	case 'R':
		f, err := os.Open(filepath.Join(dir, "src.bin"))
		if err != nil {
			return err
		}
		defer f.Close()
		return plainCopy(c, f, buf)
	case 'W':
		f, err := os.CreateTemp(dir, ".upload-")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		err = plainCopy(f, c, buf)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(f.Name(), filepath.Join(dir, "upload.bin"))
		}
		if err != nil {
			return err
		}
		_, err = c.Write([]byte{'k'})
		return err
	}
	return fmt.Errorf("unknown request %q", op[0])
}

// plainCopy copies src to dst through buf with Read and Write only.
func plainCopy(dst io.Writer, src io.Reader, buf []byte) error {
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// onlyWriter hides a destination's other methods (io.ReaderFrom), so that
// a copy into it is plain reads and writes.
type onlyWriter struct{ io.Writer }

// onlyReader hides a source's other methods (io.WriterTo).
type onlyReader struct{ io.Reader }

// transferBench is a daemon and a socket copier, both serving on a unix
// socket and on TCP loopback, with the daemon's workspace holding the file.
type transferBench struct {
	dir     string
	ws      string
	daemon  *exec.Cmd
	copiers []*exec.Cmd
	clients map[string]*agentclient.Client
	copyTo  map[string][2]string // network, address
}

func (b *transferBench) close() {
	for _, c := range b.clients {
		c.Close()
	}
	for _, c := range append([]*exec.Cmd{b.daemon}, b.copiers...) {
		if c != nil && c.Process != nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	os.RemoveAll(b.dir)
}

func startTransferBench(ctx context.Context, binDir string, size int64) (_ *transferBench, err error) {
	dir, err := os.MkdirTemp("", "bench-transfer-")
	if err != nil {
		return nil, err
	}
	b := &transferBench{dir: dir, ws: filepath.Join(dir, "ws"), clients: map[string]*agentclient.Client{}, copyTo: map[string][2]string{}}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	daemon, token, addrs, err := startDaemonBoth(binDir, dir)
	if err != nil {
		return nil, err
	}
	b.daemon = daemon
	if err := makeFile(filepath.Join(b.ws, "src.bin"), size); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	b.copyTo["unix"] = [2]string{"unix", filepath.Join(dir, "copy.sock")}
	b.copyTo["tcp"] = [2]string{"tcp", fmt.Sprintf("127.0.0.1:%d", port)}
	for _, t := range execTransports {
		to := b.copyTo[t]
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), socketCopyEnv+"="+to[0]+" "+to[1]+" "+b.ws)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start the socket copier: %w", err)
		}
		b.copiers = append(b.copiers, cmd)
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
			return nil, fmt.Errorf("socket copier over %s did not start: %q, %v", t, line, err)
		}
		address := "tcp://" + addrs[t]
		if t == "unix" {
			address = addrs[t]
		}
		c, err := agentclient.Dial(agentclient.Options{Address: address, Token: token})
		if err != nil {
			return nil, err
		}
		b.clients[t] = c
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = agentclient.WaitReady(wctx, c, agentclient.ReadyOptions{})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("sandbox-agentd over %s: %w", t, err)
		}
	}
	return b, nil
}

// download times a ReadFile of the whole file over transport t into a
// discarding destination.
func (b *transferBench) download(ctx context.Context, t string) (time.Duration, error) {
	start := time.Now()
	_, err := b.clients[t].ReadFile(ctx, "src.bin", agentclient.ReadFileOptions{}, io.Discard)
	return time.Since(start), err
}

// upload times a WriteFile of the whole file over transport t.
func (b *transferBench) upload(ctx context.Context, t string) (time.Duration, error) {
	f, err := os.Open(filepath.Join(b.ws, "src.bin"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	start := time.Now()
	_, err = b.clients[t].WriteFile(ctx, "upload.bin", agentclient.WriteFileOptions{}, f)
	return time.Since(start), err
}

// copyDown times the socket copier sending the file over transport t.
func (b *transferBench) copyDown(t string, size int64) (time.Duration, error) {
	start := time.Now()
	c, err := net.Dial(b.copyTo[t][0], b.copyTo[t][1])
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'R'}); err != nil {
		return 0, err
	}
	buf := make([]byte, copyBufBytes)
	n, err := io.CopyBuffer(onlyWriter{io.Discard}, onlyReader{c}, buf)
	if err == nil && n != size {
		err = fmt.Errorf("socket copier sent %d bytes, want %d", n, size)
	}
	return time.Since(start), err
}

// copyUp times the socket copier receiving the file over transport t.
func (b *transferBench) copyUp(t string) (time.Duration, error) {
	f, err := os.Open(filepath.Join(b.ws, "src.bin"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	start := time.Now()
	c, err := net.Dial(b.copyTo[t][0], b.copyTo[t][1])
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'W'}); err != nil {
		return 0, err
	}
	if err := plainCopy(c, f, make([]byte, copyBufBytes)); err != nil {
		return 0, err
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return 0, err
	}
	var ok [1]byte
	if _, err := io.ReadFull(c, ok[:]); err != nil {
		return 0, fmt.Errorf("socket copier's answer: %w", err)
	}
	return time.Since(start), nil
}

// pageCacheRead times reading the file into a buffer (it is cached).
func (b *transferBench) pageCacheRead() (time.Duration, error) {
	f, err := os.Open(filepath.Join(b.ws, "src.bin"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	start := time.Now()
	_, err = io.CopyBuffer(onlyWriter{io.Discard}, onlyReader{f}, make([]byte, copyBufBytes))
	return time.Since(start), err
}

// sample is one timed transfer: its wall time and the processor time the
// serving process (the daemon or the copier) and this client spent on it.
// Processor time is what the other load of a shared machine inflates
// least.
type sample struct{ wall, server, client time.Duration }

// measure runs f, a transfer served by the process pid, as a sample.
func measure(pid int, f func() (time.Duration, error)) (sample, error) {
	s0, err := processCPU(pid)
	if err != nil {
		return sample{}, err
	}
	c0, err := processCPU(os.Getpid())
	if err != nil {
		return sample{}, err
	}
	wall, err := f()
	if err != nil {
		return sample{}, err
	}
	s1, err := processCPU(pid)
	if err != nil {
		return sample{}, err
	}
	c1, err := processCPU(os.Getpid())
	return sample{wall, s1 - s0, c1 - c0}, err
}

// medians returns the median of each part of ss.
func medians(ss []sample) sample {
	var w, s, c []time.Duration
	for _, x := range ss {
		w, s, c = append(w, x.wall), append(s, x.server), append(c, x.client)
	}
	var m sample
	m.wall, _ = percentiles(w)
	m.server, _ = percentiles(s)
	m.client, _ = percentiles(c)
	return m
}

// cpuPerGiB formats a processor time spent on size bytes as ms per GiB.
func cpuPerGiB(d time.Duration, size int64) string {
	return fmt.Sprintf("%.0f", float64(d.Milliseconds())*float64(1<<30)/float64(size))
}

// benchTransfer measures ReadFile and WriteFile of size bytes over a unix
// socket and over TCP loopback against the socket copier on the same
// transport, transferRounds times each, interleaved (the first of each
// pair alternating), and reports the medians as ratios, with the
// processor time each side spent per GiB.
func benchTransfer(ctx context.Context, binDir string, size int64) ([]row, error) {
	b, err := startTransferBench(ctx, binDir, size)
	if err != nil {
		return nil, err
	}
	defer b.close()
	if _, err := b.pageCacheRead(); err != nil { // warm the cache
		return nil, err
	}
	copier := map[string]int{}
	for i, t := range execTransports {
		copier[t] = b.copiers[i].Process.Pid
	}
	daemon := b.daemon.Process.Pid
	type series struct{ down, downBase, up, upBase []sample }
	all := map[string]*series{}
	var cache []time.Duration
	for round := range transferRounds + 1 { // the first is a warm-up
		for _, t := range execTransports {
			steps := []func() (sample, error){
				func() (sample, error) {
					return measure(daemon, func() (time.Duration, error) { return b.download(ctx, t) })
				},
				func() (sample, error) {
					return measure(copier[t], func() (time.Duration, error) { return b.copyDown(t, size) })
				},
				func() (sample, error) {
					return measure(daemon, func() (time.Duration, error) { return b.upload(ctx, t) })
				},
				func() (sample, error) {
					return measure(copier[t], func() (time.Duration, error) { return b.copyUp(t) })
				},
			}
			var got [4]sample
			for i := range steps {
				j := i
				if round%2 == 1 { // the baseline first
					j = i ^ 1
				}
				if got[j], err = steps[j](); err != nil {
					return nil, fmt.Errorf("transfer over %s: %w", t, err)
				}
			}
			c, err := b.pageCacheRead()
			if err != nil {
				return nil, err
			}
			if round == 0 {
				continue
			}
			if all[t] == nil {
				all[t] = &series{}
			}
			s := all[t]
			s.down, s.downBase = append(s.down, got[0]), append(s.downBase, got[1])
			s.up, s.upBase = append(s.up, got[2]), append(s.upBase, got[3])
			cache = append(cache, c)
		}
	}
	c50, _ := percentiles(cache)
	var rows []row
	for _, t := range execTransports {
		name := map[string]string{"unix": "a unix socket", "tcp": "TCP loopback"}[t]
		s := all[t]
		d, db, u, ub := medians(s.down), medians(s.downBase), medians(s.up), medians(s.upBase)
		rows = append(rows,
			row{fmt.Sprintf("ReadFile %s over %s to a discarding client, median of %d", mib(size), name, transferRounds), gibps(rate(size, d.wall)),
				gibps(rate(size, db.wall)) + " (plain read/write socket copy between two processes; page cache read: " + gibps(rate(size, c50)) + ")",
				fmt.Sprintf("%.2fx", float64(db.wall)/float64(d.wall)), ">= 1.2x envd"},
			row{"  processor time per GiB read, ms: sandbox-agentd + client", cpuPerGiB(d.server, size) + " + " + cpuPerGiB(d.client, size),
				cpuPerGiB(db.server, size) + " + " + cpuPerGiB(db.client, size) + " (copier + client)",
				fmt.Sprintf("%.2fx", float64(d.server+d.client)/float64(db.server+db.client)), ""},
			row{fmt.Sprintf("WriteFile %s over %s (fsynced), median of %d", mib(size), name, transferRounds), gibps(rate(size, u.wall)),
				gibps(rate(size, ub.wall)) + " (plain socket copy into a file, fsynced and renamed)",
				fmt.Sprintf("%.2fx", float64(ub.wall)/float64(u.wall)), ""},
			row{"  processor time per GiB written, ms: sandbox-agentd + client", cpuPerGiB(u.server, size) + " + " + cpuPerGiB(u.client, size),
				cpuPerGiB(ub.server, size) + " + " + cpuPerGiB(ub.client, size) + " (copier + client)",
				fmt.Sprintf("%.2fx", float64(u.server+u.client)/float64(ub.server+ub.client)), ""})
	}
	return rows, nil
}
