package agentclient_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// realDaemon is the real sandbox-agentd binary serving a fresh workspace
// on a unix socket of a temporary directory.
type realDaemon struct {
	cmd    *exec.Cmd
	sock   string // the socket's path (dial "unix://" + sock)
	ws     string // the workspace
	stderr *syncbuf.Buffer
}

// startRealDaemon starts the binary with token and the extra flags; it is
// interrupted (and its log shown if the test failed) when the test ends.
func startRealDaemon(t *testing.T, token string, flags ...string) *realDaemon {
	t.Helper()
	testenv.Require(t, testenv.Linux)
	bin := agentdtest.Binaries(t)
	dir := t.TempDir()
	d := &realDaemon{sock: filepath.Join(dir, "agentd.sock"), ws: filepath.Join(dir, "ws"), stderr: &syncbuf.Buffer{}}
	if err := os.MkdirAll(d.ws, 0o755); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--listen", "unix://" + d.sock, "--token-file", tokenFile, "--workspace", d.ws}, flags...)
	d.cmd = exec.Command(bin.Agentd, args...)
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(os.Interrupt)
		<-exited
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", d.stderr.String())
		}
	})
	return d
}
