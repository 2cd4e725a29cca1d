package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestServeBadFlags(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("tok-acme-0123456789 acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OPENAI_API_KEY", "sk-test")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve"}, "give --tokens-file or --jwks-file"},
		{[]string{"serve", "--tokens-file", filepath.Join(dir, "none")}, "--tokens-file"},
		{[]string{"serve", "--tokens-file", tokens, "--jwt-issuer", "x"}, "need --jwks-file"},
		{[]string{"serve", "--jwks-file", tokens}, "needs --jwt-issuer and --jwt-audience"},
		{[]string{"serve", "--tokens-file", tokens, "--store", "mysql://x"}, "want bolt:PATH or postgres://"},
		{[]string{"serve", "--tokens-file", tokens, "--listen", "nonsense"}, "--listen nonsense"},
		{[]string{"serve", "--tokens-file", tokens, "--max-turns", "0"}, "--max-turns must be positive"},
	} {
		_, errOut, code := runCLI(t, append([]string{"--state-dir", dir}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, errOut, c.want)
		}
	}
}

// TestServeRunsAndDrains starts `harness serve`, runs an agent through a
// curl-like JSON request against the scripted model, and stops it with its
// context (as SIGTERM would).
func TestServeRunsAndDrains(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("tok-acme-0123456789 acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := replay.NewServer()
	defer script.Close()
	script.SetFallback(func(req *replay.Request) replay.Turn {
		if len(req.InputOfType("function_call_output")) == 0 {
			return replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "exec_command", `{"cmd": "echo served"}`)}}
		}
		return replay.Turn{Items: []replay.Item{replay.Message("All done.")}}
	})
	t.Setenv("OPENAI_API_KEY", "sk-test-serve")
	t.Setenv("OPENAI_BASE_URL", script.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	var errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Execute(sctx, []string{"--state-dir", state, "--agentd", bin, "--isolation", "none", "serve",
			"--listen", "127.0.0.1:0", "--tokens-file", tokens, "--model", "scripted", "--sandbox-retention", "0"},
			Streams{In: strings.NewReader(""), Out: io.Discard, Err: &errb})
	}()
	addr := regexp.MustCompile(`serving on (http://\S+)`)
	var url string
	for url == "" {
		if m := addr.FindStringSubmatch(errb.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, errb.String())
		case <-ctx.Done():
			t.Fatalf("serve did not start: %s", errb.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	post := func(method, body string) map[string]any {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/bulkhead.harness.v1.RunService/"+method, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer tok-acme-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", method, resp.StatusCode, b)
		}
		return out
	}
	started := post("StartRun", `{"input": "say it", "agent": {"name": "a"}}`)
	id := started["run"].(map[string]any)["runId"].(string)
	for {
		run := post("GetRun", `{"runId": "`+id+`"}`)["run"].(map[string]any)
		if run["status"] == "RUN_STATUS_SUCCEEDED" {
			if run["finalOutput"] != "All done." {
				t.Errorf("final output %v", run["finalOutput"])
			}
			break
		}
		if run["status"] == "RUN_STATUS_FAILED" {
			t.Fatalf("run failed: %v", run["error"])
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run never finished: %v", run)
		case <-time.After(20 * time.Millisecond):
		}
	}
	// The Prometheus metrics (pkg/harness/metrics) saw the run.
	mreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	mresp, err := http.DefaultClient.Do(mreq)
	if err != nil {
		t.Fatal(err)
	}
	mbody, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if mresp.StatusCode != http.StatusOK || !strings.Contains(string(mbody), `bulkhead_harness_tool_calls_total{`) {
		t.Errorf("/metrics: %d\n%s", mresp.StatusCode, mbody)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("serve exit %d: %s", code, errb.String())
	}
	if strings.Contains(errb.String(), "sk-test-serve") {
		t.Errorf("the model key reached the output: %s", errb.String())
	}
}
