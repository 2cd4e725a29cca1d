package service_test

// Attacks a tenant can make with nothing but the service's API (issue #27):
// every field of a request is policed like an untrusted manifest, tenants
// of different sources never meet, quotas hold (also under concurrent
// requests and across a restart), and the service speaks TLS (HTTP/2 for
// gRPC clients) when asked to.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// refusedWith fails unless err has code and its message names every word.
func refusedWith(t *testing.T, what string, err error, code connect.Code, words ...string) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
		return
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not name %q", what, err.Error(), w)
		}
	}
}

// TestStartRunFieldsArePolicedLikeManifests: every field of StartRun (and
// of ResumeRun's spec) is untrusted input; a bad one is InvalidArgument
// naming the field, and nothing is created.
func TestStartRunFieldsArePolicedLikeManifests(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.Models = []string{"scripted-large"} })
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	many := func(n int, s string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d", s, i)
		}
		return out
	}
	for _, c := range []struct {
		name  string
		req   *harnessv1.StartRunRequest
		field string
	}{
		{"run as root", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{RunAs: "root"}}, "agent.run_as"},
		{"run as a system account", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{RunAs: "daemon"}}, "agent.run_as"},
		{"run as an undeclared account", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{RunAs: "mallory"}}, "agent.run_as"},
		{"run as a declared system account", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{RunAs: "bin"},
			Manifest: "users:\n  - name: bin\n"}, "bin"},
		{"the manifest's run_as root", &harnessv1.StartRunRequest{Manifest: "run_as: root\n"}, "run_as"},
		{"root by number", &harnessv1.StartRunRequest{Manifest: "users:\n  - name: toor\n    uid: 0\nrun_as: toor\n"}, "uid"},
		{"a fixed uid", &harnessv1.StartRunRequest{Manifest: "users:\n  - name: u\n    uid: 70000\nrun_as: u\n"}, "manifest: users[0].uid"},
		{"a fixed gid", &harnessv1.StartRunRequest{Manifest: "groups:\n  - name: g\n    gid: 70000\n"}, "manifest: groups[0].gid"},
		{"a system user declared", &harnessv1.StartRunRequest{Manifest: "users:\n  - name: daemon\nrun_as: daemon\n"}, "manifest: users[0].name"},
		{"a system group declared", &harnessv1.StartRunRequest{Manifest: "groups:\n  - name: shadow\nusers:\n  - name: u\n    groups: [shadow]\n"},
			"manifest: groups[0].name"},
		{"a home outside /home", &harnessv1.StartRunRequest{Manifest: "users:\n  - name: u\n    home: /etc\n"}, "manifest: users[0].home"},
		{"a host file", &harnessv1.StartRunRequest{Manifest: "entries:\n  a:\n    type: local_file\n    src: /etc/passwd\n"}, "manifest"},
		{"an absolute workdir", &harnessv1.StartRunRequest{Workdir: "/etc"}, "workdir"},
		{"a workdir above the root", &harnessv1.StartRunRequest{Workdir: "../.."}, "workdir"},
		{"a workdir that climbs out", &harnessv1.StartRunRequest{Workdir: "a/../../b"}, "workdir"},
		{"a workdir with NUL", &harnessv1.StartRunRequest{Workdir: "a\x00b"}, "workdir"},
		{"no input", &harnessv1.StartRunRequest{Input: " \n"}, "input"},
		{"an input too large", &harnessv1.StartRunRequest{Input: strings.Repeat("x", 1<<20+1)}, "input"},
		{"instructions too large", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{Instructions: strings.Repeat("x", 256<<10+1)}}, "agent.instructions"},
		{"a name with escapes", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{Name: "a\x1b[2Jb"}}, "agent.name"},
		{"a name too long", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{Name: strings.Repeat("n", 129)}}, "agent.name"},
		{"a model not offered", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{Model: "gpt-expensive"}}, "agent.model"},
		{"an unknown capability", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{Capabilities: []string{"network"}}}, "agent.capabilities"},
		{"a capability twice", &harnessv1.StartRunRequest{Agent: &harnessv1.AgentSpec{Capabilities: []string{"shell", "shell"}}}, "agent.capabilities"},
		{"negative max_turns", &harnessv1.StartRunRequest{MaxTurns: -1}, "max_turns"},
		{"too many approval names", &harnessv1.StartRunRequest{Approvals: &harnessv1.ApprovalPolicy{RequireApproval: many(65, "t")}}, "approvals.require_approval"},
		{"an empty approval name", &harnessv1.StartRunRequest{Approvals: &harnessv1.ApprovalPolicy{RequireApproval: []string{""}}}, "approvals.require_approval[0]"},
		{"too many patterns", &harnessv1.StartRunRequest{Approvals: &harnessv1.ApprovalPolicy{AllowedCommands: many(33, "^x")}}, "approvals.allowed_commands"},
		{"a pattern too large a program", &harnessv1.StartRunRequest{Approvals: &harnessv1.ApprovalPolicy{AllowedCommands: []string{`(\w+\s+\w+){1000}`}}},
			"approvals.allowed_commands[0]"},
		{"a pattern too long", &harnessv1.StartRunRequest{Approvals: &harnessv1.ApprovalPolicy{AllowedCommands: []string{strings.Repeat("a", 1025)}}},
			"approvals.allowed_commands[0]"},
		{"a bad pattern", &harnessv1.StartRunRequest{Approvals: &harnessv1.ApprovalPolicy{AllowedCommands: []string{"("}}}, "approvals.allowed_commands[0]"},
	} {
		if c.req.Input == "" {
			c.req.Input = "Do it."
		}
		_, err := acme.runs.StartRun(ctx, connect.NewRequest(c.req))
		refusedWith(t, c.name, err, connect.CodeInvalidArgument, c.field)
	}
	// A client's run state goes through the same policy.
	st, err := (&harness.RunState{Version: harness.RunStateVersion, Agent: "agent", Items: []model.Item{model.UserMessage("x")}}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	_, err = acme.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunState: st, Agent: &harnessv1.AgentSpec{RunAs: "root"}}))
	refusedWith(t, "resume as root", err, connect.CodeInvalidArgument, "agent.run_as")
	// Nothing was started.
	list, err := acme.runs.ListRuns(ctx, connect.NewRequest(&harnessv1.ListRunsRequest{}))
	if err != nil || len(list.Msg.GetRuns()) != 0 {
		t.Fatalf("runs after refusals: %v %v", list, err)
	}
	// A model of the operator's list is accepted.
	ok, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "Do it.",
		Agent: &harnessv1.AgentSpec{Model: "scripted-large"}, Approvals: &harnessv1.ApprovalPolicy{RequireApproval: []string{"exec_command"}}}))
	if err != nil {
		t.Fatalf("an offered model: %v", err)
	}
	if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: ok.Msg.GetRun().GetRunId()})); err != nil {
		t.Fatal(err)
	}
}

// toolOutputs returns the outputs of a finished run's tool results.
func toolOutputs(t *testing.T, ctx context.Context, c clients, runID string) string {
	t.Helper()
	st, err := c.grpc.StreamRunEvents(ctx, connect.NewRequest(&harnessv1.StreamRunEventsRequest{RunId: runID}))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for st.Receive() {
		if r := st.Msg().GetEvent().GetToolResult(); r != nil {
			out.WriteString(r.GetOutput())
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// TestRunAsIsTheSandboxAccount: the agent's commands run as the account
// the request chose among the manifest's users, or as the sandbox's own
// account, never as root (the service once ran them as the request's
// agent.run_as text, "root" included).
func TestRunAsIsTheSandboxAccount(t *testing.T) {
	// The sandbox's accounts are made by a root daemon.
	testenv.Require(t, testenv.Root)
	e := newEnv(t, nil, nil)
	e.script.SetFallback(agentScript("echo UID=$(id -u)."))
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	uidOf := func(manifest, runAs string) string {
		t.Helper()
		resp, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "Who am I?", Manifest: manifest,
			Agent: &harnessv1.AgentSpec{RunAs: runAs}}))
		if err != nil {
			t.Fatalf("run as %q: %v", runAs, err)
		}
		id := resp.Msg.GetRun().GetRunId()
		waitStatus(t, ctx, acme, id, harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
		out := toolOutputs(t, ctx, acme, id)
		_, rest, ok := strings.Cut(out, "UID=")
		uid, _, ok2 := strings.Cut(rest, ".")
		if !ok || !ok2 || uid == "" || uid == "0" {
			t.Fatalf("run as %q (manifest %q): %q, want a uid that is not 0", runAs, manifest, out)
		}
		return uid
	}
	worker := uidOf("users:\n  - name: worker\n", "worker")
	own := uidOf("", "")
	ownByName := uidOf("users:\n  - name: worker\nrun_as: worker\n", compute.DefaultRunAsName)
	if worker == own || worker == ownByName {
		t.Errorf("the declared account (uid %s) is the sandbox's own (uids %s, %s)", worker, own, ownByName)
	}
}

// TestRequestIDsAndSizes: ids, cursors, paths, reasons and terminal sizes
// of every other request are checked too, and a request message larger
// than the service's bound is refused before it is decoded.
func TestRequestIDsAndSizes(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.MaxRequestBytes = 2 << 20 })
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := startRun(t, ctx, acme, "exec_command")
	run = waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	id, sbx := run.GetRunId(), run.GetSandboxId()

	var err error
	_, err = acme.runs.GetRun(ctx, connect.NewRequest(&harnessv1.GetRunRequest{RunId: "../../etc/passwd"}))
	refusedWith(t, "GetRun of a path", err, connect.CodeInvalidArgument, "run_id")
	_, err = acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{}))
	refusedWith(t, "CancelRun of nothing", err, connect.CodeInvalidArgument, "run_id")
	_, err = acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: id, Reason: strings.Repeat("r", 4097)}))
	refusedWith(t, "a cancel reason too long", err, connect.CodeInvalidArgument, "reason")
	_, err = acme.runs.ApproveToolCall(ctx, connect.NewRequest(&harnessv1.ApproveToolCallRequest{RunId: id}))
	refusedWith(t, "an approval of no call", err, connect.CodeInvalidArgument, "call_id")
	_, err = acme.runs.ApproveToolCall(ctx, connect.NewRequest(&harnessv1.ApproveToolCallRequest{RunId: id, CallId: "c1", Reason: strings.Repeat("r", 4097)}))
	refusedWith(t, "a rejection reason too long", err, connect.CodeInvalidArgument, "reason")
	_, err = acme.runs.ListRuns(ctx, connect.NewRequest(&harnessv1.ListRunsRequest{PageToken: "x'; DROP TABLE runs"}))
	refusedWith(t, "a forged page token", err, connect.CodeInvalidArgument, "page_token")
	_, err = acme.runs.ListRuns(ctx, connect.NewRequest(&harnessv1.ListRunsRequest{Status: harnessv1.RunStatus(99)}))
	refusedWith(t, "an unknown status", err, connect.CodeInvalidArgument, "status")
	_, err = acme.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunId: "run-" + strings.Repeat("0", 65)}))
	refusedWith(t, "a run id too long", err, connect.CodeInvalidArgument, "run_id")
	_, err = acme.sandbox.ListSandboxDir(ctx, connect.NewRequest(&harnessv1.ListSandboxDirRequest{SandboxId: "sbx-../x"}))
	refusedWith(t, "a sandbox id with a path", err, connect.CodeInvalidArgument, "sandbox_id")
	_, err = acme.sandbox.ListSandboxDir(ctx, connect.NewRequest(&harnessv1.ListSandboxDirRequest{SandboxId: sbx, Path: "a\x00b"}))
	refusedWith(t, "a path with NUL", err, connect.CodeInvalidArgument, "path")
	_, err = acme.sandbox.ListSandboxes(ctx, connect.NewRequest(&harnessv1.ListSandboxesRequest{RunId: "RUN-1"}))
	refusedWith(t, "ListSandboxes of a bad id", err, connect.CodeInvalidArgument, "run_id")
	for name, start := range map[string]*harnessv1.TerminalStart{
		"a huge terminal":   {SandboxId: sbx, Cols: 5000, Rows: 24},
		"an empty program":  {SandboxId: sbx, Command: []string{""}},
		"too many args":     {SandboxId: sbx, Command: make([]string, 257)},
		"a bad sandbox id":  {SandboxId: "sandbox"},
		"an arg with a NUL": {SandboxId: sbx, Command: []string{"/bin/sh", "-c", "a\x00b"}},
	} {
		term := acme.sandbox.OpenTerminal(ctx)
		_ = term.Send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Start{Start: start}})
		_, err := term.Receive()
		_ = term.CloseRequest()
		_ = term.CloseResponse()
		refusedWith(t, name, err, connect.CodeInvalidArgument)
	}
	// A resize out of bounds ends the terminal.
	term := acme.sandbox.OpenTerminal(ctx)
	_ = term.Send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Start{Start: &harnessv1.TerminalStart{SandboxId: sbx, Command: []string{"/bin/cat"}}}})
	_ = term.Send(&harnessv1.OpenTerminalRequest{Kind: &harnessv1.OpenTerminalRequest_Resize{Resize: &harnessv1.TerminalSize{Cols: 0, Rows: 1 << 20}}})
	for {
		if _, err = term.Receive(); err != nil {
			break
		}
	}
	_ = term.CloseRequest()
	_ = term.CloseResponse()
	refusedWith(t, "a resize out of bounds", err, connect.CodeInvalidArgument, "resize")
	// The hand-written routes check theirs.
	for path, want := range map[string]int{
		"/v1/runs/run-ABC/events":                                http.StatusBadRequest,
		"/v1/sandboxes/" + sbx + "/terminal?cols=x":              http.StatusBadRequest,
		"/v1/sandboxes/" + sbx + "/terminal?cols=9999":           http.StatusBadRequest,
		"/v1/sandboxes/" + sbx + "/files/..%2f..%2fetc%2fpasswd": http.StatusBadRequest,
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+acmeToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	// A message over MaxRequestBytes is refused without being decoded.
	_, err = acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "x", Manifest: "# " + strings.Repeat("x", 3<<20)}))
	refusedWith(t, "a request over the bound", err, connect.CodeResourceExhausted)
	if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: id})); err != nil {
		t.Fatal(err)
	}
}

// jwtIssuer is a JWT issuer of tests: a key, and its JWKS file.
type jwtIssuer struct {
	key  *ecdsa.PrivateKey
	jwks string
	iss  string
}

func newJWTIssuer(t *testing.T, iss string) *jwtIssuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(jwks, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return &jwtIssuer{key: key, jwks: jwks, iss: iss}
}

func (j *jwtIssuer) token(t *testing.T, sub string) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: j.key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(map[string]any{"iss": j.iss, "aud": "bulkhead", "sub": sub, "exp": time.Now().Add(time.Hour).Unix()}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestJWTTenantIsNotTheTokenTenant: a JWT whose sub is "bob" is not the
// static token tenant bob: every route, the hand-written ones included,
// answers it as another tenant; and the other way round.
func TestJWTTenantIsNotTheTokenTenant(t *testing.T) {
	const bobToken = "tok-bob-0123456789abcdef"
	issuer := newJWTIssuer(t, "https://issuer.test")
	tokens, err := auth.ParseTokens([]byte(bobToken+" bob\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := auth.NewJWT(auth.JWTConfig{JWKSFile: issuer.jwks, Issuer: issuer.iss, Audience: "bulkhead"})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, envOptions{auth: auth.Chain{Tokens: tokens, JWT: verifier}})
	ctx := ctxT(t)
	jwtBob := issuer.token(t, "bob")
	static, fromJWT := e.clients(bobToken), e.clients(jwtBob)

	run := startRun(t, ctx, static, "exec_command")
	run = waitStatus(t, ctx, static, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	if rec, err := e.store.GetRun(ctx, "token:bob", run.GetRunId()); err != nil || rec.Tenant != "token:bob" {
		t.Fatalf("the stored run's tenant: %v %v", rec, err)
	}
	assertStranger(t, ctx, e, fromJWT, jwtBob, run)

	// The JWT's bob has runs of its own, which the static bob does not see.
	own := startRun(t, ctx, fromJWT, "exec_command")
	own = waitStatus(t, ctx, fromJWT, own.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	if _, err := e.store.GetRun(ctx, "jwt:https://issuer.test:bob", own.GetRunId()); err != nil {
		t.Fatalf("the JWT tenant's run: %v", err)
	}
	assertStranger(t, ctx, e, static, bobToken, own)
	for _, c := range []struct {
		c  clients
		id string
	}{{static, run.GetRunId()}, {fromJWT, own.GetRunId()}} {
		if _, err := c.c.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: c.id})); err != nil {
			t.Fatal(err)
		}
	}
}

// assertStranger checks that c (bearer) reaches nothing of run.
func assertStranger(t *testing.T, ctx context.Context, e *env, c clients, bearer string, run *harnessv1.Run) {
	t.Helper()
	checks := map[string]error{}
	_, checks["GetRun"] = c.runs.GetRun(ctx, connect.NewRequest(&harnessv1.GetRunRequest{RunId: run.GetRunId()}))
	_, checks["CancelRun"] = c.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: run.GetRunId()}))
	_, checks["ApproveToolCall"] = c.runs.ApproveToolCall(ctx, connect.NewRequest(&harnessv1.ApproveToolCallRequest{RunId: run.GetRunId(), CallId: "c1", Approved: true}))
	_, checks["ListSandboxes"] = c.sandbox.ListSandboxes(ctx, connect.NewRequest(&harnessv1.ListSandboxesRequest{RunId: run.GetRunId()}))
	_, checks["ListSandboxDir"] = c.sandbox.ListSandboxDir(ctx, connect.NewRequest(&harnessv1.ListSandboxDirRequest{SandboxId: run.GetSandboxId()}))
	es, err := c.grpc.StreamRunEvents(ctx, connect.NewRequest(&harnessv1.StreamRunEventsRequest{RunId: run.GetRunId()}))
	if err == nil {
		for es.Receive() {
			t.Errorf("a stranger received an event: %v", es.Msg())
		}
		err = es.Err()
	}
	checks["StreamRunEvents"] = err
	for name, err := range checks {
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%s as a stranger: %v, want NotFound", name, err)
		}
	}
	list, err := c.runs.ListRuns(ctx, connect.NewRequest(&harnessv1.ListRunsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.Msg.GetRuns() {
		if r.GetRunId() == run.GetRunId() {
			t.Errorf("a stranger lists %s", run.GetRunId())
		}
	}
	sbs, err := c.sandbox.ListSandboxes(ctx, connect.NewRequest(&harnessv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs.Msg.GetSandboxes() {
		if s.GetSandboxId() == run.GetSandboxId() {
			t.Errorf("a stranger lists sandbox %s", s.GetSandboxId())
		}
	}
	for _, path := range []string{"/v1/runs/" + run.GetRunId() + "/events", "/v1/sandboxes/" + run.GetSandboxId() + "/files/notes.md",
		"/v1/sandboxes/" + run.GetSandboxId() + "/terminal"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s as a stranger: %d, want 404", path, resp.StatusCode)
		}
	}
	// The WebSocket's subprotocol credential too.
	url := strings.Replace(e.url, "http://", "ws://", 1) + "/v1/sandboxes/" + run.GetSandboxId() + "/terminal"
	if conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"bulkhead.terminal.v1", "bearer." + bearer}}); err == nil {
		conn.CloseNow()
		t.Error("a stranger opened the terminal over the WebSocket")
	} else if resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("WebSocket as a stranger: %v %v", resp, err)
	}
}

// TestQuotaRuns: a tenant at its active runs' quota is refused with
// ResourceExhausted naming the quota (a run waiting for approval holds its
// slot); another tenant is not affected; the slot comes back when the run
// ends.
func TestQuotaRuns(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Runs: 1} })
	ctx := ctxT(t)
	acme, evil := e.clients(acmeToken), e.clients(evilToken)
	run := startRun(t, ctx, acme, "exec_command")
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	_, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "another"}))
	refusedWith(t, "a second run", err, connect.CodeResourceExhausted, "runs per tenant")
	code, body := rawPost(t, ctx, e.url+"/bulkhead.harness.v1.RunService/StartRun", acmeToken, `{"input": "again"}`)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "resource_exhausted") {
		t.Errorf("JSON StartRun over the quota: %d %s", code, body)
	}
	other := startRun(t, ctx, evil) // another tenant's quota
	waitStatus(t, ctx, evil, other.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: run.GetRunId()})); err != nil {
		t.Fatal(err)
	}
	next := startRun(t, ctx, acme)
	waitStatus(t, ctx, acme, next.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	// A finished run resumed is active again: it needs a slot too.
	blocker := startRun(t, ctx, acme, "exec_command")
	waitStatus(t, ctx, acme, blocker.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: blocker.GetRunId()})); err != nil {
		t.Fatal(err)
	}
	third := startRun(t, ctx, acme, "exec_command")
	waitStatus(t, ctx, acme, third.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	_, err = acme.runs.ResumeRun(ctx, connect.NewRequest(&harnessv1.ResumeRunRequest{RunId: blocker.GetRunId()}))
	refusedWith(t, "resuming over the quota", err, connect.CodeResourceExhausted, "runs per tenant")
	if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: third.GetRunId()})); err != nil {
		t.Fatal(err)
	}
}

// TestQuotaRunsUnderConcurrentStarts: many StartRun of one tenant at once
// never take more slots than the quota (the check and the reservation are
// one step; run it with -race).
func TestQuotaRunsUnderConcurrentStarts(t *testing.T) {
	const limit, tries = 3, 16
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Runs: limit, Sandboxes: -1} })
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		started  []string
		refused  atomic.Int32
		start    = make(chan struct{})
		failures []error
	)
	for range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "race",
				Approvals: &harnessv1.ApprovalPolicy{RequireApproval: []string{"exec_command"}}}))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				started = append(started, resp.Msg.GetRun().GetRunId())
			case connect.CodeOf(err) == connect.CodeResourceExhausted && strings.Contains(err.Error(), "runs per tenant"):
				refused.Add(1)
			default:
				failures = append(failures, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(failures) > 0 || len(started) != limit || int(refused.Load()) != tries-limit {
		t.Errorf("%d started, %d refused, failures %v; want %d and %d", len(started), refused.Load(), failures, limit, tries-limit)
	}
	for _, id := range started {
		if _, err := acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: id})); err != nil {
			t.Fatal(err)
		}
	}
	// Every slot came back.
	for range limit {
		r := startRun(t, ctx, acme, "exec_command")
		defer func() {
			_, _ = acme.runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: r.GetRunId()}))
		}()
	}
}

// TestQuotaSandboxes: a finished run's sandbox, kept for its files, counts
// until it is deleted; then the slot comes back.
func TestQuotaSandboxes(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) {
		c.Quotas = service.Quotas{Sandboxes: 1}
		c.SandboxRetention = 4 * time.Second
	})
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := startRun(t, ctx, acme)
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	_, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "another"}))
	refusedWith(t, "a run while the kept sandbox lives", err, connect.CodeResourceExhausted, "sandboxes per tenant")
	// The retention ends, the sandbox is deleted, the slot is back.
	for {
		resp, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "after"}))
		if err == nil {
			waitStatus(t, ctx, acme, resp.Msg.GetRun().GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
			break
		}
		if connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the sandbox slot never came back")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestQuotasRecountedAfterRestart: a restarted service counts the runs it
// recovers against their tenants' quotas.
func TestQuotasRecountedAfterRestart(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) { c.Quotas = service.Quotas{Runs: 1} })
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	run := startRun(t, ctx, acme, "exec_command")
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_WAITING_APPROVAL)
	e.restart()
	acme = e.clients(acmeToken)
	_, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "after the restart"}))
	refusedWith(t, "a run over the recovered one", err, connect.CodeResourceExhausted, "runs per tenant")
	if _, err := acme.runs.ApproveToolCall(ctx, connect.NewRequest(&harnessv1.ApproveToolCallRequest{RunId: run.GetRunId(), CallId: "c1", Approved: true})); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	next := startRun(t, ctx, acme)
	waitStatus(t, ctx, acme, next.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
}

// recordingProvider is the local provider, recording the provider options
// every launch gets.
type recordingProvider struct {
	*local.Provider
	mu   sync.Mutex
	opts []any
}

func (p *recordingProvider) Launch(ctx context.Context, spec compute.LaunchSpec) (compute.Sandbox, error) {
	p.mu.Lock()
	p.opts = append(p.opts, spec.Options)
	p.mu.Unlock()
	// The recorded options stand for a provider's own (capsOption); the
	// local provider refuses options of another type than its own.
	spec.Options = nil
	return p.Provider.Launch(ctx, spec)
}

// capsOption stands for a provider's per-sandbox options.
type capsOption struct{ r service.SandboxResources }

// TestSandboxCapsReachEverySandbox: the operator's CPU, memory and disk
// caps go to every sandbox the service makes, through the provider's
// options; caps without a way to the provider refuse to start the service.
func TestSandboxCapsReachEverySandbox(t *testing.T) {
	caps := service.SandboxResources{MilliCPU: 500, MemoryBytes: 256 << 20, DiskBytes: 1 << 30}
	rec := &recordingProvider{}
	e := newEnvWith(t, envOptions{
		wrap: func(p compute.Provider) compute.Provider { rec.Provider = p.(*local.Provider); return rec },
		cfg: func(c *service.Config) {
			c.Quotas.Sandbox = caps
			c.ProviderOptions = func(r service.SandboxResources) (any, error) { return capsOption{r}, nil }
		}})
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	for range 2 {
		run := startRun(t, ctx, acme)
		waitStatus(t, ctx, acme, run.GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	}
	rec.mu.Lock()
	if len(rec.opts) != 2 {
		t.Errorf("%d launches recorded, want 2", len(rec.opts))
	}
	for _, o := range rec.opts {
		if o != (capsOption{caps}) {
			t.Errorf("a sandbox launched with options %#v, want the caps %+v", o, caps)
		}
	}
	rec.mu.Unlock()
	mdl, err := model.NewOpenAI(model.Config{Model: "scripted", APIKey: modelKey, BaseURL: e.script.URL()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = service.New(ctx, service.Config{Store: e.store, Compute: e.client, Model: mdl, DefaultModel: "scripted", Auth: auth.Chain{},
		Quotas: service.Quotas{Sandbox: service.SandboxResources{MemoryBytes: 1 << 30}}})
	if err == nil || !strings.Contains(err.Error(), "ProviderOptions") {
		t.Errorf("a memory cap no provider gets: %v", err)
	}
}

// slowGit "checks out" size bytes, a chunk every pause, like a large
// repository arriving; it counts the checkouts that were cut.
type slowGit struct {
	size  int64
	pause time.Duration
	cut   atomic.Int32
}

func (g *slowGit) Fetch(ctx context.Context, _ *manifest.GitRepo, dir string) error {
	f, err := os.Create(filepath.Join(dir, "blob"))
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for n := int64(0); n < g.size; n += int64(len(chunk)) {
		select {
		case <-ctx.Done():
			g.cut.Add(1)
			return ctx.Err()
		case <-time.After(g.pause):
		}
		if _, err := f.Write(chunk); err != nil {
			return err
		}
	}
	return nil
}

const gitManifest = "entries:\n  repo:\n    type: git_repo\n    repo: octo/big\n    ref: main\n"

// waitFailed waits for a run to fail and returns its error.
func waitFailed(t *testing.T, ctx context.Context, c clients, id string) string {
	t.Helper()
	return waitStatus(t, ctx, c, id, harnessv1.RunStatus_RUN_STATUS_FAILED).GetError()
}

// TestQuotaFetchBytesPerSandbox: a checkout larger than the per-sandbox
// quota is cut while git writes it, and the run fails naming the quota.
func TestQuotaFetchBytesPerSandbox(t *testing.T) {
	git := &slowGit{size: 8 << 20, pause: 10 * time.Millisecond}
	e := newEnvWith(t, envOptions{git: service.MeteredGit(git), cfg: func(c *service.Config) {
		c.Quotas = service.Quotas{FetchBytesPerSandbox: 1 << 20, FetchBytes: -1}
	}})
	ctx := ctxT(t)
	acme := e.clients(acmeToken)
	resp, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "x", Manifest: gitManifest}))
	if err != nil {
		t.Fatal(err)
	}
	if msg := waitFailed(t, ctx, acme, resp.Msg.GetRun().GetRunId()); !strings.Contains(msg, "git fetch bytes per sandbox") {
		t.Errorf("the run's error %q does not name the quota", msg)
	}
	if git.cut.Load() != 1 {
		t.Errorf("%d checkouts cut while they were written, want 1", git.cut.Load())
	}
}

// TestQuotaFetchBytesPerTenant: a tenant's git budget is spent across its
// runs; once spent, a run with a git entry is refused at once; another
// tenant has its own budget.
func TestQuotaFetchBytesPerTenant(t *testing.T) {
	git := &slowGit{size: 3 << 20, pause: time.Millisecond}
	e := newEnvWith(t, envOptions{git: service.MeteredGit(git), cfg: func(c *service.Config) {
		c.Quotas = service.Quotas{FetchBytesPerSandbox: -1, FetchBytes: 4 << 20, FetchWindow: time.Hour}
	}})
	ctx := ctxT(t)
	acme, evil := e.clients(acmeToken), e.clients(evilToken)
	start := func(c clients) string {
		resp, err := c.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "x", Manifest: gitManifest}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.GetRun().GetRunId()
	}
	waitStatus(t, ctx, acme, start(acme), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED) // 3 of 4 MiB
	if msg := waitFailed(t, ctx, acme, start(acme)); !strings.Contains(msg, "git fetch bytes per tenant") {
		t.Errorf("the second run's error %q does not name the quota", msg)
	}
	_, err := acme.runs.StartRun(ctx, connect.NewRequest(&harnessv1.StartRunRequest{Input: "x", Manifest: gitManifest}))
	refusedWith(t, "a git run once the budget is spent", err, connect.CodeResourceExhausted, "git fetch bytes per tenant")
	// A run without git entries is not concerned; another tenant neither.
	waitStatus(t, ctx, acme, startRun(t, ctx, acme).GetRunId(), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
	waitStatus(t, ctx, evil, start(evil), harnessv1.RunStatus_RUN_STATUS_SUCCEEDED)
}

// selfSigned makes a certificate for 127.0.0.1 and the pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bulkhead test"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, pool
}

// counting counts the requests that reach a handler.
type counting struct {
	n    atomic.Int32
	next http.Handler
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	c.next.ServeHTTP(w, r)
}

// TestServeTLS: over TLS the API answers JSON over HTTP/1.1 and HTTP/2,
// and a real gRPC client (grpc-go, which insists on ALPN h2); a plain HTTP
// client, and an h2c one, reach nothing.
func TestServeTLS(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	cert, pool := selfSigned(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &counting{next: e.svc.Handler()}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- service.ServeTLS(sctx, ln, h, &tls.Config{Certificates: []tls.Certificate{cert}}, time.Second)
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("ServeTLS: %v", err)
		}
	}()
	addr := ln.Addr().String()
	url := "https://" + addr

	// JSON over HTTP/1.1 (no h2 offered) and over HTTP/2.
	run := startRun(t, ctx, e.clients(acmeToken), "exec_command")
	for _, h2 := range []bool{false, true} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP1(!h2)
		tr.Protocols.SetHTTP2(h2)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/bulkhead.harness.v1.RunService/GetRun", strings.NewReader(`{"runId": "`+run.GetRunId()+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+acmeToken)
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("JSON over TLS (h2 %v): %v", h2, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), run.GetRunId()) || resp.TLS == nil || (resp.ProtoMajor == 2) != h2 {
			t.Errorf("JSON over TLS (h2 %v): %s %d %s", h2, resp.Proto, resp.StatusCode, b)
		}
	}

	// grpc-go over TLS.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+acmeToken)
	got := &harnessv1.GetRunResponse{}
	if err := conn.Invoke(gctx, "/bulkhead.harness.v1.RunService/GetRun", &harnessv1.GetRunRequest{RunId: run.GetRunId()}, got); err != nil {
		t.Fatalf("grpc-go over TLS: %v", err)
	}
	if got.GetRun().GetRunId() != run.GetRunId() {
		t.Errorf("grpc-go GetRun: %v", got)
	}
	stream, err := conn.NewStream(gctx, &grpc.StreamDesc{ServerStreams: true}, "/bulkhead.harness.v1.RunService/StreamRunEvents")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.SendMsg(&harnessv1.StreamRunEventsRequest{RunId: run.GetRunId()}); err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	first := &harnessv1.StreamRunEventsResponse{}
	if err := stream.RecvMsg(first); err != nil || first.GetEvent().GetSequence() != 1 {
		t.Errorf("grpc-go stream over TLS: %v %v", first, err)
	}

	// Plain HTTP and h2c reach nothing.
	before := h.n.Load()
	resp, err := http.Post("http://"+addr+"/bulkhead.harness.v1.RunService/GetRun", "application/json", strings.NewReader(`{}`))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), "run") {
			t.Errorf("plain HTTP to the TLS port: %d %q", resp.StatusCode, b)
		}
	}
	if _, err := httpClient(acmeToken, true).Post("http://"+addr+"/bulkhead.harness.v1.RunService/GetRun", "application/json", strings.NewReader(`{}`)); err == nil {
		t.Error("h2c to the TLS port answered")
	}
	if n := h.n.Load(); n != before {
		t.Errorf("%d plain requests reached the API", n-before)
	}
	if _, err := e.clients(acmeToken).runs.CancelRun(ctx, connect.NewRequest(&harnessv1.CancelRunRequest{RunId: run.GetRunId()})); err != nil {
		t.Fatal(err)
	}
}

// TestNoMetricsOnTheAPI: the API's handler has no /metrics (a Prometheus
// scrape shows every tenant's activity; serve has --metrics-listen).
func TestNoMetricsOnTheAPI(t *testing.T) {
	e := newEnv(t, nil, nil)
	for _, bearer := range []string{"", acmeToken} {
		req, _ := http.NewRequest(http.MethodGet, e.url+"/metrics", nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "bulkhead_") {
			t.Errorf("/metrics (bearer %v): %d %.100q", bearer != "", resp.StatusCode, b)
		}
	}
}
