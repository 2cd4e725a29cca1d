package cli

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
)

// TestServeSandboxOptions: every sandbox of a service is capped: local
// sandboxes get the caps docker and kubernetes apply by default (one CPU,
// 1 GiB) and a process cap, or the operator's; a provider that cannot cap
// refuses caps.
func TestServeSandboxOptions(t *testing.T) {
	got, err := sandboxOptions("local")(service.SandboxResources{})
	want := local.Resources{CPUs: 1, Memory: 1 << 30, MaxProcesses: service.DefaultSandboxProcesses}
	if o, ok := got.(*local.CreateOptions); err != nil || !ok || o.Resources != want {
		t.Errorf("local defaults: %#v, %v; want %+v", got, err, want)
	}
	got, err = sandboxOptions("local")(service.SandboxResources{MilliCPU: 250, MemoryBytes: 2 << 30})
	want = local.Resources{CPUs: 0.25, Memory: 2 << 30, MaxProcesses: service.DefaultSandboxProcesses}
	if o, ok := got.(*local.CreateOptions); err != nil || !ok || o.Resources != want {
		t.Errorf("local caps: %#v, %v; want %+v", got, err, want)
	}
	// --sandbox-disk is a disk cap of local sandboxes (a file system of
	// their own), besides bounding restores.
	got, err = sandboxOptions("local")(service.SandboxResources{DiskBytes: 10 << 30})
	want = local.Resources{CPUs: 1, Memory: 1 << 30, MaxProcesses: service.DefaultSandboxProcesses, Disk: 10 << 30}
	if o, ok := got.(*local.CreateOptions); err != nil || !ok || o.Resources != want {
		t.Errorf("local disk cap: %#v, %v; want %+v", got, err, want)
	}
	if err := checkSandboxOptions(&local.CreateOptions{Resources: local.Resources{Disk: 1 << 20}}); err == nil || !strings.Contains(err.Error(), "--sandbox-disk") {
		t.Errorf("a disk cap below the minimum: %v", err)
	}
	if got, err := sandboxOptions("docker")(service.SandboxResources{}); got != nil || err != nil {
		t.Errorf("docker defaults: %#v, %v; want the provider's own", got, err)
	}
	if _, err := sandboxOptions("remote")(service.SandboxResources{MilliCPU: 1000}); err == nil {
		t.Error("the remote provider took a CPU cap it cannot apply")
	}
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
		// Bearer tokens never cross the network in the clear unless asked.
		{[]string{"serve", "--tokens-file", tokens, "--listen", "0.0.0.0:0"}, "--tls-cert and --tls-key, or --insecure-listen"},
		{[]string{"serve", "--tokens-file", tokens, "--listen", ":0"}, "is not a loopback address"},
		{[]string{"serve", "--tokens-file", tokens, "--tls-cert", tokens}, "--tls-cert and --tls-key go together"},
		{[]string{"serve", "--tokens-file", tokens, "--tls-cert", tokens, "--tls-key", tokens}, "--tls-cert, --tls-key"},
		{[]string{"serve", "--tokens-file", tokens, "--metrics-listen", "nonsense"}, "--metrics-listen nonsense"},
		// Quotas.
		{[]string{"serve", "--tokens-file", tokens, "--max-runs-per-tenant", "0"}, "--max-runs-per-tenant must be positive"},
		{[]string{"serve", "--tokens-file", tokens, "--max-sandboxes-per-tenant", "-2"}, "--max-sandboxes-per-tenant must be positive"},
		{[]string{"serve", "--tokens-file", tokens, "--sandbox-memory", "lots"}, "--sandbox-memory"},
		{[]string{"serve", "--tokens-file", tokens, "--max-fetch-bytes-per-tenant", "0"}, "must be positive (or none)"},
		{[]string{"serve", "--tokens-file", tokens, "--sandbox-cpus", "2000"}, "--sandbox-cpus 2000"},
		// The sandbox API's policy: positive, defaults within their maximum.
		{[]string{"serve", "--tokens-file", tokens, "--sandbox-ttl", "0s"}, "--sandbox-ttl 0s must be positive"},
		{[]string{"serve", "--tokens-file", tokens, "--sandbox-ttl", "500ms"}, "--sandbox-ttl 500ms: at least 1s"},
		{[]string{"serve", "--tokens-file", tokens, "--sandbox-ttl", "2h", "--sandbox-max-ttl", "1h"}, "--sandbox-ttl 2h0m0s is over --sandbox-max-ttl 1h0m0s"},
		{[]string{"serve", "--tokens-file", tokens, "--sandbox-idle-timeout", "-1m"}, "--sandbox-idle-timeout -1m0s must be positive"},
		{[]string{"serve", "--tokens-file", tokens, "--sandbox-idle-timeout", "48h"}, "--sandbox-idle-timeout 48h0m0s is over --sandbox-max-ttl"},
		{[]string{"serve", "--tokens-file", tokens, "--command-timeout", "2h"}, "--command-timeout 2h0m0s is over --max-command-timeout 1h0m0s"},
		{[]string{"serve", "--tokens-file", tokens, "--max-command-timeout", "0s"}, "--max-command-timeout 0s must be positive"},
		{[]string{"serve", "--tokens-file", tokens, "--max-file-bytes", "0"}, "--max-file-bytes must be positive"},
		{[]string{"serve", "--tokens-file", tokens, "--max-file-bytes", "lots"}, "--max-file-bytes"},
		{[]string{"serve", "--tokens-file", tokens, "--max-output-bytes", "0"}, "--max-output-bytes must be positive"},
		// Preview URLs' signing key: a file of at least 32 bytes.
		{[]string{"serve", "--tokens-file", tokens, "--preview-key-file", filepath.Join(dir, "none")}, "--preview-key-file"},
		{[]string{"serve", "--tokens-file", tokens, "--preview-key-file", tokens}, "--preview-key-file"},
	} {
		_, errOut, code := runCLI(t, append([]string{"--state-dir", dir}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, errOut, c.want)
		}
	}
}

// served is a `harness serve` started by startServe on a free loopback
// port, with a local provider, a tokens file and a scripted model, and its
// metrics on a loopback listener of their own.
type served struct {
	t          *testing.T
	ctx        context.Context
	url        string
	metricsURL string
	token      string
	client     *http.Client // trusts the service's certificate, if any
	errb       *syncbuf.Buffer
	done       chan int
	exited     chan struct{} // closed once serve returned
	stop       context.CancelFunc
}

// startServe starts `harness serve` whose scripted model asks for the
// shell command cmd and then answers final; modelKey is the service's
// model key (which must never reach a client or the output). extra are
// further serve flags.
func startServe(t *testing.T, cmd, final, modelKey string, extra ...string) *served {
	t.Helper()
	testenv.Require(t, testenv.Linux)
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
	return launchServe(t, extra...)
}

// launchServe starts `harness serve` with a local provider, a tokens file
// and the model the environment gives (or none), with further serve flags
// extra, and waits until it serves.
func launchServe(t *testing.T, extra ...string) *served {
	t.Helper()
	testenv.Require(t, testenv.Linux)
	bin := agentdtest.Binaries(t).Agentd
	state := testenv.SearchableTempDir(t)
	s := &served{t: t, token: "tok-" + strings.ToLower(t.Name()) + "-0123456789", errb: &syncbuf.Buffer{}, done: make(chan int, 1),
		exited: make(chan struct{}), client: http.DefaultClient}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(s.token+" acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	s.ctx = ctx
	sctx, stop := context.WithCancel(ctx)
	s.stop = stop
	go func() {
		defer close(s.exited)
		s.done <- Execute(sctx, append([]string{"--state-dir", state, "--agentd", bin, "--isolation", "none", "serve",
			"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--tokens-file", tokens, "--model", "scripted", "--sandbox-retention", "0"},
			extra...), Streams{In: strings.NewReader(""), Out: io.Discard, Err: s.errb})
	}()
	// A service keeps its sandboxes when it stops, for its next start;
	// this one does not come back: stop it and delete what it left.
	t.Cleanup(func() {
		stop()
		select {
		case <-s.exited:
		case <-time.After(time.Minute):
			t.Errorf("serve did not stop within a minute")
		}
		reapLocalSandboxes(t, filepath.Join(state, "local"), bin)
	})
	addr := regexp.MustCompile(`serving on (https?://\S+)`)
	metrics := regexp.MustCompile(`metrics on (http://\S+)`)
	for {
		if m := addr.FindStringSubmatch(s.errb.String()); m != nil {
			s.url = m[1]
			if mm := metrics.FindStringSubmatch(s.errb.String()); mm != nil {
				s.metricsURL = mm[1]
			}
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
	resp, err := s.client.Do(req)
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

// scrape reads /metrics from the metrics listener.
func (s *served) scrape() string {
	s.t.Helper()
	if s.metricsURL == "" {
		s.t.Fatalf("no metrics listener: %s", s.errb.String())
	}
	req, _ := http.NewRequestWithContext(s.ctx, http.MethodGet, s.metricsURL, nil)
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

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 and its
// key as PEM files, and returns their paths and a pool trusting it.
func writeSelfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "harness serve test"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestServeTLSAndMetrics: with --tls-cert and --tls-key the service speaks
// HTTPS (HTTP/2 by ALPN, so gRPC clients work), plain HTTP to its port
// reaches nothing, and /metrics is not on the API's port but on
// --metrics-listen.
func TestServeTLSAndMetrics(t *testing.T) {
	certFile, keyFile, pool := writeSelfSigned(t)
	s := startServe(t, "echo secure", "Done.", "sk-test-tls", "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.HasPrefix(s.url, "https://") {
		t.Fatalf("serving on %s", s.url)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	s.client = &http.Client{Transport: tr}
	started := s.post("StartRun", `{"input": "run it", "agent": {"name": "a"}}`)
	id := started["run"].(map[string]any)["runId"].(string)
	s.waitFor(id, "RUN_STATUS_SUCCEEDED")

	// HTTP/2 was negotiated.
	resp, err := s.client.Get(s.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
		t.Errorf("/healthz over TLS: %s, ALPN %v", resp.Proto, resp.TLS)
	}
	// The API's port has no metrics, with or without a token.
	for _, bearer := range []string{"", s.token} {
		req, _ := http.NewRequestWithContext(s.ctx, http.MethodGet, s.url+"/metrics", nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "bulkhead_") {
			t.Errorf("/metrics on the API's port (bearer %v): %d %.100q", bearer != "", resp.StatusCode, b)
		}
	}
	if text := s.scrape(); !strings.Contains(text, `bulkhead_harness_tool_calls_total{`) {
		t.Errorf("--metrics-listen:\n%.300s", text)
	}
	// Plain HTTP to the TLS port gets nothing.
	plain := strings.Replace(s.url, "https://", "http://", 1)
	if resp, err := http.Post(plain+"/bulkhead.harness.v1.RunService/GetRun", "application/json", strings.NewReader(`{"runId": "`+id+`"}`)); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), id) {
			t.Errorf("plain HTTP to the TLS port: %d %q", resp.StatusCode, b)
		}
	}
	s.shutdown()
}

// TestServeInsecureListenWarns: --insecure-listen serves plain HTTP on a
// non-loopback address, and says loudly that it does.
func TestServeInsecureListenWarns(t *testing.T) {
	s := startServe(t, "echo x", "Done.", "sk-test-insecure", "--listen", "0.0.0.0:0", "--insecure-listen")
	out := s.shutdown()
	if !strings.Contains(out, "WARNING: --insecure-listen") || !strings.Contains(out, "not a loopback address") {
		t.Errorf("no warning:\n%s", out)
	}
}

// TestServeSandboxPolicyFlags: the sandbox API's flags make the manager's
// policy, and reach the running service: a file over --max-file-bytes is
// refused.
func TestServeSandboxPolicyFlags(t *testing.T) {
	p := policyFlags{ttl: 2 * time.Hour, maxTTL: 48 * time.Hour, idle: time.Minute, command: time.Minute, maxCommand: 2 * time.Hour,
		maxOutput: "4KiB", maxFile: "1MiB"}
	got, err := p.sandboxPolicy()
	want := manager.SandboxPolicy{DefaultTTL: 2 * time.Hour, MaxTTL: 48 * time.Hour, DefaultIdleTimeout: time.Minute,
		DefaultCommandTimeout: time.Minute, MaxCommandTimeout: 2 * time.Hour, MaxOutputBytes: 4 << 10, MaxFileBytes: 1 << 20}
	if err != nil || got != want {
		t.Errorf("policy %+v, %v; want %+v", got, err, want)
	}

	s := launchServe(t, "--max-file-bytes", "16")
	call := func(method, url, body string) (int, string) {
		req, _ := http.NewRequestWithContext(s.ctx, method, s.url+url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+s.token)
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, out := call(http.MethodPost, "/bulkhead.harness.v1.SandboxService/CreateSandbox", `{}`)
	var created struct{ Sandbox struct{ SandboxID string } }
	if err := json.Unmarshal([]byte(out), &created); code != http.StatusOK || err != nil || created.Sandbox.SandboxID == "" {
		t.Fatalf("CreateSandbox: %d %s", code, out)
	}
	files := "/v1/sandboxes/" + created.Sandbox.SandboxID + "/files/"
	if code, out := call(http.MethodPut, files+"small.txt", "sixteen bytes!!!"); code != http.StatusOK {
		t.Errorf("16 bytes: %d %s", code, out)
	}
	if code, out := call(http.MethodPut, files+"big.txt", "seventeen bytes!!"); code != http.StatusTooManyRequests || !strings.Contains(out, "the limit is 16") {
		t.Errorf("17 bytes with --max-file-bytes 16: %d %s", code, out)
	}
	s.shutdown()
}

// reapLocalSandboxes deletes every local sandbox left in dir, a local
// provider's state directory.
func reapLocalSandboxes(t *testing.T, dir, agentd string) {
	t.Helper()
	p, err := local.New(local.Config{StateDir: dir, AgentdPath: agentd, Isolation: local.IsolationNone}, zap.NewNop())
	if err != nil {
		t.Errorf("reap the sandboxes left in %s: %v", dir, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	left, err := p.List(ctx)
	if err != nil {
		t.Errorf("list the sandboxes left in %s: %v", dir, err)
	}
	for _, info := range left {
		if err := p.Destroy(ctx, info.State); err != nil {
			t.Errorf("delete sandbox %s left by the service: %v", info.ID, err)
		}
	}
}
