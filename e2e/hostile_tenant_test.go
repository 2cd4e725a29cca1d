package e2e

// The hostile-tenant suite: two tenants who do not trust each other share
// one real `harness serve`, run as root (as a platform team runs it) with
// local bubblewrap sandboxes on the sandbox image's own root file system.
// The model is a scripted Responses server that runs whatever shell line a
// run's input names, and answers with what it printed, so each case is an
// attack a tenant can make with nothing but the service's API and the
// commands its agent runs. Every case asserts what the attack must NOT
// reach, and also that its command really ran (so a case cannot pass
// because nothing happened).
//
// Attacks covered at the level where they happen, in their own packages:
// the daemon's header and stream limits (pkg/agentd/server), the
// crash-safe restore (pkg/archive, pkg/agentd), PTY sizes
// (pkg/agentd/server), the git fetch policy and its environment
// (pkg/compute/materializer).

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// hostileService is one `harness serve` process with two static-token
// tenants (alice, bob) and a JWT issuer whose tokens may claim any
// subject.
type hostileService struct {
	t      *testing.T
	url    string
	state  string // the service's state directory
	tokens string // the service's 0600 tokens file
	tok    map[string]string
	jwtKey *ecdsa.PrivateKey
	key    string // the model API key the service holds
	errb   *syncbuf.Buffer
}

const (
	jwtIssuer   = "https://issuer.hostile.test"
	jwtAudience = "bulkhead-hostile"
)

// runInput wraps a shell line into a run's input; the scripted model
// runs it with exec_command and answers "OUT:" and the tool's output.
func runInput(cmd string) string {
	return "RUN[" + base64.StdEncoding.EncodeToString([]byte(cmd)) + "]"
}

var runInputRE = regexp.MustCompile(`RUN\[([A-Za-z0-9+/=]+)\]`)

// hostileModel answers every run: the first turn runs the input's command,
// the second reports its output.
func hostileModel(req *replay.Request) replay.Turn {
	outs := callOutputs(req)
	if out, ok := outs["c1"]; ok {
		return replay.Turn{Items: []replay.Item{replay.Message("OUT:" + out)}}
	}
	raw, _ := json.Marshal(req.Input())
	m := runInputRE.FindSubmatch(raw)
	if m == nil {
		return replay.Turn{Items: []replay.Item{replay.Message("no command")}}
	}
	cmd, err := base64.StdEncoding.DecodeString(string(m[1]))
	if err != nil {
		return replay.Turn{Items: []replay.Item{replay.Message("bad command")}}
	}
	args, _ := json.Marshal(map[string]any{"cmd": string(cmd), "yield_time_ms": 10000})
	return replay.Turn{Items: []replay.Item{replay.FunctionCall("c1", "exec_command", string(args))}}
}

// startHostile starts the service as a separate process with extra flags.
func startHostile(t *testing.T, extra ...string) *hostileService {
	t.Helper()
	testenv.Require(t, testenv.Linux, testenv.Root, testenv.Bubblewrap)
	rootfs := agentdtest.RootFS(t)
	bins := agentdtest.Harness(t)
	s := &hostileService{t: t, state: stateDir(t), errb: &syncbuf.Buffer{},
		tok: map[string]string{"alice": "tok-alice-" + randomHex(t), "bob": "tok-bob-" + randomHex(t)},
		key: "sk-hostile-" + randomHex(t)}
	secrets := t.TempDir() // 0700, root's: the service's own files
	s.tokens = filepath.Join(secrets, "tokens")
	if err := os.WriteFile(s.tokens, []byte(s.tok["alice"]+" alice\n"+s.tok["bob"]+" bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.jwtKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	jwks, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &s.jwtKey.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	jwksFile := filepath.Join(secrets, "jwks.json")
	if err := os.WriteFile(jwksFile, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	script := replay.NewServer()
	t.Cleanup(script.Close)
	script.SetFallback(hostileModel)
	ctx, cancel := context.WithCancel(context.Background())
	args := append([]string{"--state-dir", s.state, "--agentd", bins.Agentd, "--isolation", "bubblewrap",
		"--sandbox-rootfs", rootfs, "serve", "--listen", "127.0.0.1:0", "--tokens-file", s.tokens,
		"--jwks-file", jwksFile, "--jwt-issuer", jwtIssuer, "--jwt-audience", jwtAudience,
		"--model", "scripted", "--sandbox-retention", "5m"}, extra...)
	cmd := exec.CommandContext(ctx, bins.Harness(), args...)
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY="+s.key, "OPENAI_BASE_URL="+script.URL(),
		"XDG_CACHE_HOME="+t.TempDir(), "XDG_STATE_HOME="+t.TempDir())
	cmd.Stderr = s.errb
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-done
		// A service keeps its sandboxes when it stops (a restart finds
		// them again); this one does not come back.
		reapAll(t, local.Config{StateDir: filepath.Join(s.state, "local"), AgentdPath: bins.Agentd, Isolation: local.IsolationBubblewrap, RootFS: rootfs})
	})
	addr := regexp.MustCompile(`serving on (https?://\S+)`)
	deadline := time.After(2 * time.Minute)
	for {
		if m := addr.FindStringSubmatch(s.errb.String()); m != nil {
			s.url = m[1]
			return s
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v\n%s", err, s.errb.String())
		case <-deadline:
			t.Fatalf("serve did not start:\n%s", s.errb.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// call posts a JSON body to a Connect method as bearer and returns the
// HTTP status and the decoded answer.
func (s *hostileService) call(bearer, service, method, body string) (int, map[string]any) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.url+"/bulkhead.harness.v1."+service+"/"+method, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	out := map[string]any{}
	_ = json.Unmarshal(b, &out)
	out["_raw"] = string(b)
	return resp.StatusCode, out
}

// startRun starts a run as tenant and returns its id; it fails the test
// when the service refuses.
func (s *hostileService) startRun(bearer string, spec map[string]any) string {
	s.t.Helper()
	body, _ := json.Marshal(spec)
	code, out := s.call(bearer, "RunService", "StartRun", string(body))
	if code != http.StatusOK {
		s.t.Fatalf("StartRun: %d %v", code, out["_raw"])
	}
	return out["run"].(map[string]any)["runId"].(string)
}

// refused asserts a call is refused with the Connect error code and a
// message containing every word of want.
func (s *hostileService) refused(bearer, service, method, body, code string, want ...string) string {
	s.t.Helper()
	status, out := s.call(bearer, service, method, body)
	if status == http.StatusOK || out["code"] != code {
		s.t.Fatalf("%s %s: %d %v, want %s", method, body, status, out["_raw"], code)
	}
	msg, _ := out["message"].(string)
	for _, w := range want {
		if !strings.Contains(msg, w) {
			s.t.Fatalf("%s: message %q does not name %q", method, msg, w)
		}
	}
	return msg
}

// runCommand runs a shell line as tenant in a fresh sandbox (with an
// optional manifest) and returns the run's final output after "OUT:".
func (s *hostileService) runCommand(bearer, manifestText, cmd string) (runID, out string) {
	s.t.Helper()
	spec := map[string]any{"input": runInput(cmd)}
	if manifestText != "" {
		spec["manifest"] = manifestText
	}
	runID = s.startRun(bearer, spec)
	run := s.waitRun(bearer, runID)
	final, _ := run["finalOutput"].(string)
	if !strings.HasPrefix(final, "OUT:") {
		s.t.Fatalf("the run's command did not run: %v", run)
	}
	return runID, strings.TrimPrefix(final, "OUT:")
}

// waitRun waits for a run to end and returns it.
func (s *hostileService) waitRun(bearer, runID string) map[string]any {
	s.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		code, out := s.call(bearer, "RunService", "GetRun", `{"runId": "`+runID+`"}`)
		if code != http.StatusOK {
			s.t.Fatalf("GetRun: %d %v", code, out["_raw"])
		}
		run := out["run"].(map[string]any)
		switch run["status"] {
		case "RUN_STATUS_SUCCEEDED":
			return run
		case "RUN_STATUS_FAILED", "RUN_STATUS_CANCELED":
			s.t.Fatalf("run %s ended %v: %v", runID, run["status"], run["error"])
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("run %s did not end\n%s", runID, s.errb.String())
	return nil
}

// jwt signs a token for sub with the service's issuer key (or another).
func (s *hostileService) jwt(key *ecdsa.PrivateKey, alg jose.SignatureAlgorithm, claims map[string]any) string {
	s.t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
	if err != nil {
		s.t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		s.t.Fatal(err)
	}
	return tok
}

func jwtClaims(sub string, exp time.Duration) map[string]any {
	now := time.Now()
	return map[string]any{"iss": jwtIssuer, "aud": []string{jwtAudience}, "sub": sub,
		"iat": now.Unix(), "exp": now.Add(exp).Unix()}
}

// TestHostileTenant runs every attack against one service.
func TestHostileTenant(t *testing.T) {
	s := startHostile(t)
	alice, bob := s.tok["alice"], s.tok["bob"]

	t.Run("RunAsRoot", func(t *testing.T) {
		s.t = t
		s.refused(alice, "RunService", "StartRun", `{"input": "x", "agent": {"runAs": "root"}}`, "invalid_argument", "agent.run_as")
		// Root by number under another name.
		s.refused(alice, "RunService", "StartRun", `{"input": "x", "manifest": "version: 1\nusers:\n  - name: toor\n    uid: 0\nrun_as: toor\n"}`,
			"invalid_argument", "uid")
		// An account the manifest does not declare.
		s.refused(alice, "RunService", "StartRun", `{"input": "x", "agent": {"runAs": "daemon"}}`, "invalid_argument", "agent.run_as")
	})

	t.Run("UIDOutsideTheSandboxRange", func(t *testing.T) {
		s.t = t
		s.refused(alice, "RunService", "StartRun", `{"input": "x", "manifest": "version: 1\nusers:\n  - name: u\n    uid: 70000\nrun_as: u\n"}`,
			"invalid_argument", "uid")
	})

	t.Run("WorkdirEscape", func(t *testing.T) {
		s.t = t
		for _, wd := range []string{"/etc", "../..", "a/../../b"} {
			s.refused(alice, "RunService", "StartRun", `{"input": "x", "workdir": "`+wd+`"}`, "invalid_argument", "workdir")
		}
	})

	t.Run("HostFilesFromInside", func(t *testing.T) {
		s.t = t
		// The service's files, the host's secrets, the other sandboxes,
		// the harness's process: nothing of the host is there.
		cmd := fmt.Sprintf("id -u; echo ROOT:$(ls /); cat %s; cat /etc/shadow /etc/os-release /usr/lib/os-release; ls /root; ls %s; cat /proc/*/environ; cat /proc/*/cmdline; echo END",
			s.tokens, filepath.Join(s.state, "local"))
		_, out := s.runCommand(alice, "", cmd)
		if !strings.Contains(out, "END") || !strings.Contains(out, "ROOT:") {
			t.Fatalf("the command did not run to its end: %q", out)
		}
		hostOS, _ := os.ReadFile("/etc/os-release")
		osName, _, _ := strings.Cut(string(hostOS), "\n")
		for name, secret := range map[string]string{"alice's token": alice, "bob's token": bob, "the model key": s.key,
			"the shadow file": "root:", "the service's command line": "serve", "the host's os-release": osName} {
			if secret == "" {
				continue
			}
			if strings.Contains(out, secret) {
				t.Errorf("the sandbox read %s: %q", name, out)
			}
		}
		// The root is the sandbox image's (busybox), not the host's.
		if !strings.Contains(out, "workspace") || strings.Contains(out, "ROOT:"+strings.Join(hostRoot(t), " ")) {
			t.Errorf("the sandbox's / is not its own: %q", out)
		}
	})

	t.Run("RootInsideIsNotHostRoot", func(t *testing.T) {
		s.t = t
		// The manifest may declare root's own name only as an error;
		// the default account's id is not 0 either. A process that is
		// root inside (the daemon itself) holds no host capability: the
		// daemon's own process on the host is not uid 0.
		_, out := s.runCommand(alice, "", "id -u; cat /proc/self/status | grep -i '^Cap'")
		if strings.HasPrefix(strings.TrimSpace(out), "0\n") {
			t.Errorf("the agent runs as uid 0: %q", out)
		}
		for _, pid := range sandboxDaemons(t, s.state) {
			if uid := hostUID(t, pid); uid == 0 {
				t.Errorf("sandbox daemon %d runs as host uid 0", pid)
			}
		}
	})

	t.Run("OtherTenantsSandbox", func(t *testing.T) {
		s.t = t
		runID, _ := s.runCommand(alice, "", "echo alice-secret-file > secret.txt; echo done")
		_, out := s.call(alice, "RunService", "GetRun", `{"runId": "`+runID+`"}`)
		sandboxID, _ := out["run"].(map[string]any)["sandboxId"].(string)
		if sandboxID == "" {
			t.Fatalf("alice's run has no sandbox: %v", out["_raw"])
		}
		// Through the API: bob gets NotFound for alice's run and sandbox.
		s.refused(bob, "RunService", "GetRun", `{"runId": "`+runID+`"}`, "not_found")
		s.refused(bob, "SandboxService", "ListSandboxDir", `{"sandboxId": "`+sandboxID+`", "path": "."}`, "not_found")
		s.refused(bob, "SandboxService", "ListSandboxes", `{"runId": "`+runID+`"}`, "not_found")
		req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/sandboxes/"+sandboxID+"/files/secret.txt", nil)
		req.Header.Set("Authorization", "Bearer "+bob)
		if resp, err := http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound || bytes.Contains(b, []byte("alice-secret-file")) {
				t.Errorf("bob's GET of alice's file: %d %q", resp.StatusCode, b)
			}
		}
		// From inside bob's sandbox: alice's workspace is not there.
		_, bout := s.runCommand(bob, "", "cat "+filepath.Join(s.state, "local", "*", "workspace", "secret.txt")+"; ls -R /run /var /tmp 2>&1 | head -50; echo END")
		if strings.Contains(bout, "alice-secret-file") || !strings.Contains(bout, "END") {
			t.Errorf("bob's sandbox read alice's file: %q", bout)
		}
	})

	t.Run("GitToLoopback", func(t *testing.T) {
		s.t = t
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var accepted atomic.Int32
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		for _, host := range []string{"127.0.0.1:" + port, "127.0.0.1", "[::1]:" + port, "localhost:" + port, "github.com"} {
			m := fmt.Sprintf("version: 1\nentries:\n  repo:\n    type: git_repo\n    host: %q\n    repo: o/r\n", host)
			body, _ := json.Marshal(map[string]any{"input": "x", "manifest": m})
			msg := s.refused(alice, "RunService", "StartRun", string(body), "invalid_argument")
			if strings.Contains(msg, "connection refused") || strings.Contains(msg, "connect") {
				t.Errorf("%s: the refusal says what the network did: %q", host, msg)
			}
		}
		if n := accepted.Load(); n != 0 {
			t.Errorf("the service connected to the loopback listener %d times", n)
		}
	})

	t.Run("MetricsNotOnTheAPIPort", func(t *testing.T) {
		s.t = t
		resp, err := http.Get(s.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || bytes.Contains(b, []byte("bulkhead_")) {
			t.Errorf("/metrics answered without a token: %d %.200q", resp.StatusCode, b)
		}
	})

	t.Run("JWTTenantsAreNotTokenTenants", func(t *testing.T) {
		s.t = t
		runID, _ := s.runCommand(bob, "", "echo hi")
		fake := s.jwt(s.jwtKey, jose.ES256, jwtClaims("bob", time.Hour))
		s.refused(fake, "RunService", "GetRun", `{"runId": "`+runID+`"}`, "not_found")
		code, out := s.call(fake, "RunService", "ListRuns", `{}`)
		if code != http.StatusOK {
			t.Fatalf("ListRuns as jwt bob: %d %v", code, out["_raw"])
		}
		if strings.Contains(out["_raw"].(string), runID) {
			t.Errorf("jwt bob lists token bob's run: %v", out["_raw"])
		}
	})

	t.Run("ForgedJWTs", func(t *testing.T) {
		s.t = t
		other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
		claims, _ := json.Marshal(jwtClaims("alice", time.Hour))
		forged := map[string]string{
			"another key":  s.jwt(other, jose.ES256, jwtClaims("alice", time.Hour)),
			"expired":      s.jwt(s.jwtKey, jose.ES256, jwtClaims("alice", -time.Minute)),
			"alg none":     header + "." + base64.RawURLEncoding.EncodeToString(claims) + ".",
			"wrong issuer": s.jwt(s.jwtKey, jose.ES256, map[string]any{"iss": "https://evil.test", "aud": []string{jwtAudience}, "sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}),
		}
		for name, tok := range forged {
			if code, out := s.call(tok, "RunService", "ListRuns", `{}`); code != http.StatusUnauthorized {
				t.Errorf("%s: %d %v", name, code, out["_raw"])
			}
		}
	})
}

// TestHostileTenantQuota: a tenant cannot take more than its share.
func TestHostileTenantQuota(t *testing.T) {
	s := startHostile(t, "--max-runs-per-tenant", "1")
	alice, bob := s.tok["alice"], s.tok["bob"]
	// A run waiting for approval keeps its slot.
	waiting := s.startRun(alice, map[string]any{"input": runInput("echo one"), "approvals": map[string]any{"requireApproval": []string{"exec_command"}}})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, out := s.call(alice, "RunService", "GetRun", `{"runId": "`+waiting+`"}`)
		if st, _ := out["run"].(map[string]any)["status"].(string); st == "RUN_STATUS_WAITING_APPROVAL" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run never waited for approval: %v", out["_raw"])
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.refused(alice, "RunService", "StartRun", `{"input": "`+runInput("echo two")+`"}`, "resource_exhausted", "runs")
	// Another tenant is not affected.
	s.runCommand(bob, "", "echo bob")
	// The slot comes back when the run ends.
	if code, out := s.call(alice, "RunService", "CancelRun", `{"runId": "`+waiting+`"}`); code != http.StatusOK {
		t.Fatalf("CancelRun: %d %v", code, out["_raw"])
	}
	s.runCommand(alice, "", "echo three")
}

// TestHostileServeTransport: a service reachable from other hosts never
// serves bearer tokens in the clear unless told to, by name.
func TestHostileServeTransport(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	dir := stateDir(t)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("tok-alice-0123456789abcdef alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := harness(t, "", "--state-dir", dir, "--isolation", "none", "serve", "--listen", "0.0.0.0:0", "--tokens-file", tokens)
	if code == 0 || !strings.Contains(errOut, "--tls-cert") || !strings.Contains(errOut, "--insecure-listen") {
		t.Errorf("a non-loopback plain listener: exit %d, %q", code, errOut)
	}
}

// hostRoot lists the host's / (to tell it from the sandbox's).
func hostRoot(t *testing.T) []string {
	entries, err := os.ReadDir("/")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// sandboxDaemons returns the pids of the sandbox daemons of the service
// whose state directory is state.
func sandboxDaemons(t *testing.T, state string) []int {
	t.Helper()
	var pids []int
	for _, pid := range processesWith(filepath.Join(state, "local")) {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && strings.HasSuffix(exe, "sandbox-agentd") {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		t.Fatalf("no sandbox daemon of %s found", state)
	}
	return pids
}

// hostUID is the real uid of a process as the host sees it.
func hostUID(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			var uid int
			fmt.Sscan(f[1], &uid)
			return uid
		}
	}
	t.Fatalf("no Uid line for %d", pid)
	return -1
}
