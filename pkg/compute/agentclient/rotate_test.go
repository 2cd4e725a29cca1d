package agentclient_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestMain(m *testing.M) { os.Exit(agentdtest.Run(m)) }

func hexToken(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestRotateTokenRealDaemon runs the real sandbox-agentd binary and rotates
// its token over gRPC: the rotating client goes on with the new token, a
// stream opened before the rotation runs to its end, the old token is
// refused for every new call at once, a weak token is refused without
// being quoted, and no token ever appears in the daemon's debug log.
func TestRotateTokenRealDaemon(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	bin := agentdtest.Binaries(t)
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	oldTok, newTok := hexToken(t), hexToken(t)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(oldTok), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agentd.sock")
	cmd := exec.Command(bin.Agentd, "--listen", "unix://"+sock, "--token-file", tokenFile, "--workspace", ws, "--log-level", "debug")
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", stderr.String())
		}
	})
	ctx := testCtx(t)
	c := dial(t, "unix://"+sock, oldTok)
	if _, err := agentclient.WaitReady(ctx, c, agentclient.ReadyOptions{Timeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}

	// A stream authenticated before the rotation.
	st, err := c.Start(ctx, agentclient.ProcessSpec{Command: "echo ready; read x; echo got-$x", Stdin: true}, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid := st.Process.ProcessID
	ready := make(chan struct{})
	type followed struct {
		out  string
		exit *agentclient.ExitStatus
		err  error
	}
	done := make(chan followed, 1)
	go func() {
		var out strings.Builder
		var once sync.Once
		exit, err := c.Follow(ctx, pid, agentclient.FollowOptions{}, func(r *agentclient.Output) error {
			for _, ch := range r.Chunks {
				out.Write(ch.Data)
			}
			if strings.Contains(out.String(), "ready") {
				once.Do(func() { close(ready) })
			}
			return nil
		})
		done <- followed{out.String(), exit, err}
	}()
	select {
	case <-ready:
	case f := <-done:
		t.Fatalf("follow ended early: %+v", f)
	}

	if err := c.RotateToken(ctx, newTok); err != nil {
		t.Fatal(err)
	}
	// New calls on the same client carry the new token.
	if _, err := c.WriteStdin(ctx, pid, 0, []byte("yes\n")); err != nil {
		t.Fatalf("write stdin after the rotation: %v", err)
	}
	f := <-done
	if f.err != nil || f.exit.ExitCode != 0 || !strings.Contains(f.out, "got-yes") {
		t.Fatalf("the stream opened before the rotation: out %q, exit %v, err %v", f.out, f.exit, f.err)
	}
	// The old token is refused at once, on a fresh connection.
	old := dial(t, "unix://"+sock, oldTok)
	if _, err := old.Info(ctx); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("old token after the rotation: want unauthenticated, got %v", err)
	}
	if _, err := dial(t, "unix://"+sock, newTok).Info(ctx); err != nil {
		t.Fatalf("new token on a fresh connection: %v", err)
	}
	weak := strings.Repeat("z", 48)
	if err := c.RotateToken(ctx, weak); !errors.Is(err, errkind.ErrInvalidArgument) || strings.Contains(err.Error(), weak) {
		t.Fatalf("weak token: want invalid argument not quoting it, got %v", err)
	}
	if _, err := c.Info(ctx); err != nil {
		t.Fatalf("after a refused rotation the client keeps the new token: %v", err)
	}

	_ = cmd.Process.Signal(os.Interrupt)
	_ = cmd.Wait()
	logs := stderr.String()
	if !strings.Contains(logs, "RotateToken") {
		t.Errorf("the debug log does not show the RotateToken calls:\n%s", logs)
	}
	for _, tok := range []string{oldTok, newTok, weak} {
		if strings.Contains(logs, tok) {
			t.Errorf("a token appears in the daemon's log")
		}
	}
}
