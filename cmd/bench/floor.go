package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// floor is grpcfloor (the smallest grpc-go server: health and reflection
// only, built with the daemon's flags) running beside the daemon, with a
// client connected, as the daemon is when its idle RSS is read.
type floor struct {
	cmd    *exec.Cmd
	conn   *grpc.ClientConn
	health healthpb.HealthClient
	dir    string
}

// startFloor starts binDir/grpcfloor (built by `make bench`) and waits
// until it answers a health check.
func startFloor(ctx context.Context, binDir string) (*floor, error) {
	return startFloorWith(ctx, binDir, nil, nil)
}

// startFloorWith is startFloor with extra environment for grpcfloor and
// a writer for its stderr (nil: discarded); close waits until all it wrote
// was copied there.
func startFloorWith(ctx context.Context, binDir string, env []string, stderr io.Writer) (*floor, error) {
	bin := filepath.Join(binDir, "grpcfloor")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("grpcfloor is not built (make bench builds it): %w", err)
	}
	dir, err := os.MkdirTemp("", "grpcfloor-")
	if err != nil {
		return nil, err
	}
	f := &floor{dir: dir}
	sock := filepath.Join(dir, "floor.sock")
	f.cmd = exec.Command(bin, "-socket", sock)
	if len(env) > 0 {
		f.cmd.Env = append(os.Environ(), env...)
	}
	f.cmd.Stderr = stderr
	if err := f.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if f.conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		f.close()
		return nil, err
	}
	f.health = healthpb.NewHealthClient(f.conn)
	deadline := time.Now().Add(5 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := f.health.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil {
			return f, nil
		}
		if time.Now().After(deadline) {
			f.close()
			return nil, fmt.Errorf("grpcfloor did not answer: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *floor) pid() int { return f.cmd.Process.Pid }

// roundTrip times one health check.
func (f *floor) roundTrip(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	_, err := f.health.Check(ctx, &healthpb.HealthCheckRequest{})
	return time.Since(start), err
}

func (f *floor) close() {
	if f.conn != nil {
		f.conn.Close()
	}
	if f.cmd.Process != nil {
		_ = f.cmd.Process.Kill()
		_ = f.cmd.Wait()
	}
	os.RemoveAll(f.dir)
}

// hasUser reports whether /etc/passwd lists name (the bench's daemon reads
// the host's accounts).
func hasUser(name string) bool {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if strings.HasPrefix(s.Text(), name+":") {
			return true
		}
	}
	return false
}
