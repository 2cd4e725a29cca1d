// Package postgres starts a real PostgreSQL for tests, from the machine's
// packages (Debian's postgresql: /usr/lib/postgresql/<version>/bin), in a
// private temporary directory: its own cluster (initdb), listening only on a
// unix socket in that directory, stopped and removed at the end of the test.
// As root, the server runs as the postgres account (or nobody), since
// PostgreSQL refuses to run as root. A machine without PostgreSQL skips the
// test through internal/testing/testenv (and fails it under CI=true).
package postgres

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// Server is a running PostgreSQL.
type Server struct {
	// Dir holds the cluster and the socket.
	Dir  string
	sock string
	dbs  atomic.Int32
}

// binDir finds the directory of initdb and postgres: PATH first, then the
// newest /usr/lib/postgresql/<version>/bin.
func binDir() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d
		}
	}
	return ""
}

// Start starts a server for the test (stopped at its end).
func Start(t testing.TB) *Server {
	t.Helper()
	bin := binDir()
	testenv.Require(t, testenv.Condition(bin != "", "needs PostgreSQL's initdb and postgres (apt-get install postgresql)"))
	var cred *syscall.Credential
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			t.Fatalf("postgres: no unprivileged account to run the server as: %v", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Short: the socket path must fit in sun_path.
	dir, err := os.MkdirTemp("", "bh-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	for _, d := range []string{data, sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			if err := os.Chown(d, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C", "LC_ALL=C"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
		return cmd
	}
	initdb := run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("postgres: initdb: %v\n%s", err, out)
	}
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	srv := run("postgres", "-D", data, "-k", sock, "-p", "5432", "-c", "listen_addresses=", "-F",
		"-c", "max_connections=200", "-c", "shared_buffers=16MB")
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatalf("postgres: start: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = srv.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-srv.Process.Pid, syscall.SIGKILL)
			<-done
		}
		_ = logf.Close()
	})
	s := &Server{Dir: dir, sock: sock}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, s.url("postgres"))
		if err == nil {
			_ = conn.Close(ctx)
			break
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			t.Fatalf("postgres exited:\n%s", log)
		case <-ctx.Done():
			t.Fatalf("postgres did not accept connections: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return s
}

func (s *Server) url(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=5432&sslmode=disable", db, s.sock)
}

// NewDatabase creates an empty database and returns its URL.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("test_%d", s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database: %v", err)
	}
	return s.url(name)
}
