package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/syncbuf"
	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

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

// served is a `harness serve` started by startServe on a free loopback
// port, with a local provider, a tokens file and a scripted model.
type served struct {
	t     *testing.T
	ctx   context.Context
	url   string
	token string
	errb  *syncbuf.Buffer
	done  chan int
	stop  context.CancelFunc
}

// startServe starts `harness serve` whose scripted model asks for the
// shell command cmd and then answers final; modelKey is the service's
// model key (which must never reach a client or the output).
func startServe(t *testing.T, cmd, final, modelKey string) *served {
	t.Helper()
	testenv.Require(t, testenv.Linux)
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	s := &served{t: t, token: "tok-" + strings.ToLower(t.Name()) + "-0123456789", errb: &syncbuf.Buffer{}, done: make(chan int, 1)}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(s.token+" acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := replay.NewServer()
	t.Cleanup(script.Close)
	script.SetFallback(func(req *replay.Request) replay.Turn {
		if len(req.InputOfType("function_call_output")) == 0 {
			return replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "exec_command", `{"cmd": "`+cmd+`"}`)}}
		}
		return replay.Turn{Items: []replay.Item{replay.Message(final)}}
	})
	t.Setenv("OPENAI_API_KEY", modelKey)
	t.Setenv("OPENAI_BASE_URL", script.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	s.ctx = ctx
	sctx, stop := context.WithCancel(ctx)
	s.stop = stop
	go func() {
		s.done <- Execute(sctx, []string{"--state-dir", state, "--agentd", bin, "--isolation", "none", "serve",
			"--listen", "127.0.0.1:0", "--tokens-file", tokens, "--model", "scripted", "--sandbox-retention", "0"},
			Streams{In: strings.NewReader(""), Out: io.Discard, Err: s.errb})
	}()
	addr := regexp.MustCompile(`serving on (http://\S+)`)
	for {
		if m := addr.FindStringSubmatch(s.errb.String()); m != nil {
			s.url = m[1]
			return s
		}
		select {
		case code := <-s.done:
			t.Fatalf("serve exited %d: %s", code, s.errb.String())
		case <-ctx.Done():
			t.Fatalf("serve did not start: %s", s.errb.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// post calls a RunService method with a JSON body, as curl would.
func (s *served) post(method, body string) map[string]any {
	s.t.Helper()
	req, _ := http.NewRequestWithContext(s.ctx, http.MethodPost, s.url+"/bulkhead.harness.v1.RunService/"+method, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK {
		s.t.Fatalf("%s: %d %s", method, resp.StatusCode, b)
	}
	return out
}

// waitFor polls the run until it has status, and returns it.
func (s *served) waitFor(id, status string) map[string]any {
	s.t.Helper()
	for {
		run := s.post("GetRun", `{"runId": "`+id+`"}`)["run"].(map[string]any)
		if run["status"] == status {
			return run
		}
		if run["status"] == "RUN_STATUS_FAILED" {
			s.t.Fatalf("run failed: %v", run["error"])
		}
		select {
		case <-s.ctx.Done():
			s.t.Fatalf("run never reached %s: %v", status, run)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// scrape reads /metrics.
func (s *served) scrape() string {
	s.t.Helper()
	req, _ := http.NewRequestWithContext(s.ctx, http.MethodGet, s.url+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// shutdown stops the service as SIGTERM would and wants exit code 0; it
// returns what the service wrote on stderr.
func (s *served) shutdown() string {
	s.t.Helper()
	s.stop()
	if code := <-s.done; code != 0 {
		s.t.Fatalf("serve exit %d: %s", code, s.errb.String())
	}
	return s.errb.String()
}

// TestServeRunsAndDrains starts `harness serve`, runs an agent through a
// curl-like JSON request against the scripted model, and stops it with its
// context (as SIGTERM would).
func TestServeRunsAndDrains(t *testing.T) {
	s := startServe(t, "echo served", "All done.", "sk-test-serve")
	started := s.post("StartRun", `{"input": "say it", "agent": {"name": "a"}}`)
	id := started["run"].(map[string]any)["runId"].(string)
	if run := s.waitFor(id, "RUN_STATUS_SUCCEEDED"); run["finalOutput"] != "All done." {
		t.Errorf("final output %v", run["finalOutput"])
	}
	// The Prometheus metrics (pkg/harness/metrics) saw the run.
	if text := s.scrape(); !strings.Contains(text, `bulkhead_harness_tool_calls_total{`) {
		t.Errorf("/metrics:\n%s", text)
	}
	if out := s.shutdown(); strings.Contains(out, "sk-test-serve") {
		t.Errorf("the model key reached the output: %s", out)
	}
}
