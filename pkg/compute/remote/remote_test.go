package remote

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/computetest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
)

// conformanceEnv runs each conformance test against its own daemon, started
// on the test's first NewClient (clients of one test stand for harness
// processes sharing one remote sandbox). Delete only forgets, so Leaked
// reports the opposite of a leak: a daemon that did not survive.
func conformanceEnv(t *testing.T, o daemonOptions, config func(d *daemon) Config) computetest.Env {
	var mu sync.Mutex
	daemons := map[string]*daemon{}
	daemonFor := func(t *testing.T) *daemon {
		mu.Lock()
		defer mu.Unlock()
		d, ok := daemons[t.Name()]
		if !ok {
			d = startDaemon(t, o)
			daemons[t.Name()] = d
		}
		return d
	}
	return computetest.Env{
		NewClient: func(t *testing.T, store snapshot.Store) *compute.Client {
			log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
			c, err := NewClient(config(daemonFor(t)), compute.ClientOptions{Snapshots: store, Log: log})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		Users:              os.Geteuid() == 0,
		DeleteKeepsSandbox: true,
		Leaked: func(t *testing.T, _ string) []string {
			d := daemonFor(t)
			if !d.alive() {
				return []string{"the remote sandbox's daemon stopped: the remote provider must never stop or delete it"}
			}
			if _, err := os.Stat(d.Workspace); err != nil {
				return []string{"the remote sandbox's workspace is gone: " + err.Error()}
			}
			return nil
		},
	}
}

func TestConformanceUnix(t *testing.T) {
	computetest.Run(t, conformanceEnv(t, daemonOptions{}, func(d *daemon) Config {
		return Config{Address: d.Address, TokenFile: d.TokenFile}
	}))
}

func TestConformanceMutualTLS(t *testing.T) {
	p := newPKI(t, t.TempDir(), "mtls")
	computetest.Run(t, conformanceEnv(t, daemonOptions{TCP: true, PKI: &p, MTLS: true}, func(d *daemon) Config {
		return Config{Address: d.Address, Token: d.Token,
			TLS: &TLSConfig{CAFile: p.CA, CertFile: p.ClientCert, KeyFile: p.ClientKey, ServerName: "sandbox.test"}}
	}))
}

func newProvider(t *testing.T, cfg Config) *Provider {
	t.Helper()
	p, err := New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConnectErrors checks that each way a connect fails says what it is,
// and whether retrying can help.
func TestConnectErrors(t *testing.T) {
	dir := t.TempDir()
	good := newPKI(t, dir, "good")
	other := newPKI(t, dir, "other")
	mtls := startDaemon(t, daemonOptions{TCP: true, PKI: &good, MTLS: true})
	plain := startDaemon(t, daemonOptions{TCP: true})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := "tcp://" + l.Addr().String()
	l.Close()
	clientTLS := &TLSConfig{CAFile: good.CA, CertFile: good.ClientCert, KeyFile: good.ClientKey}

	for _, tc := range []struct {
		name      string
		cfg       Config
		sentinel  error
		retryable bool
		mention   string
	}{
		{"unreachable", Config{Address: closedAddr, Token: "x"}, compute.ErrUnavailable, true, "cannot reach"},
		{"missing unix socket", Config{Address: "unix://" + filepath.Join(dir, "none.sock"), Token: "x"}, compute.ErrUnavailable, true, "cannot reach"},
		{"bad token", Config{Address: mtls.Address, Token: "wrong", TLS: clientTLS}, compute.ErrUnauthenticated, false, "token"},
		{"untrusted server certificate", Config{Address: mtls.Address, Token: mtls.Token,
			TLS: &TLSConfig{CAFile: other.CA, CertFile: good.ClientCert, KeyFile: good.ClientKey}}, compute.ErrUnauthenticated, false, "not trusted"},
		{"wrong server name", Config{Address: mtls.Address, Token: mtls.Token,
			TLS: &TLSConfig{CAFile: good.CA, CertFile: good.ClientCert, KeyFile: good.ClientKey, ServerName: "elsewhere.test"}}, compute.ErrUnauthenticated, false, "not trusted"},
		{"no client certificate", Config{Address: mtls.Address, Token: mtls.Token, TLS: &TLSConfig{CAFile: good.CA}}, compute.ErrUnauthenticated, false, "client certificate"},
		{"client certificate of another CA", Config{Address: mtls.Address, Token: mtls.Token,
			TLS: &TLSConfig{CAFile: good.CA, CertFile: other.ClientCert, KeyFile: other.ClientKey}}, compute.ErrUnauthenticated, false, "client certificate"},
		{"plaintext to a TLS daemon", Config{Address: mtls.Address, Token: mtls.Token}, compute.ErrFailedPrecondition, false, "TLS"},
		{"TLS to a plaintext daemon", Config{Address: plain.Address, Token: plain.Token, TLS: &TLSConfig{CAFile: good.CA}}, compute.ErrFailedPrecondition, false, "TLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newProvider(t, tc.cfg).Launch(testCtx(t), compute.LaunchSpec{SessionID: "s"})
			t.Log(err)
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			if compute.Retryable(err) != tc.retryable {
				t.Errorf("Retryable = %v, want %v (%v)", !tc.retryable, tc.retryable, err)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
			for _, secret := range []string{mtls.Token, plain.Token} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error contains a token: %v", err)
				}
			}
		})
	}
	t.Run("good", func(t *testing.T) {
		sb, err := newProvider(t, Config{Address: mtls.Address, Token: mtls.Token, TLS: clientTLS}).Launch(testCtx(t), compute.LaunchSpec{SessionID: "s"})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close()
		if _, err := sb.Agent().Info(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no address", Config{Token: "x"}},
		{"bad scheme", Config{Address: "http://127.0.0.1:1", Token: "x"}},
		{"no port", Config{Address: "tcp://127.0.0.1", Token: "x"}},
		{"relative socket", Config{Address: "unix://agentd.sock", Token: "x"}},
		{"no token", Config{Address: "tcp://127.0.0.1:1"}},
		{"token and token file", Config{Address: "tcp://127.0.0.1:1", Token: "x", TokenFile: "/t"}},
		{"plaintext to another host", Config{Address: "tcp://192.0.2.1:7000", Token: "x"}},
		{"TLS on a unix socket", Config{Address: "unix:///run/a.sock", Token: "x", TLS: &TLSConfig{}}},
		{"half a client certificate", Config{Address: "tcp://192.0.2.1:7000", Token: "x", TLS: &TLSConfig{CertFile: "/c"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg, nil); !errors.Is(err, compute.ErrInvalidArgument) {
				t.Fatalf("New = %v, want ErrInvalidArgument", err)
			}
		})
	}
	if _, err := New(Config{Address: "tcp://192.0.2.1:7000", Token: "x", InsecurePlaintext: true}, nil); err != nil {
		t.Fatalf("InsecurePlaintext refused: %v", err)
	}
	if _, err := New(Config{Address: "tcp://localhost:7000", Token: "x"}, nil); err != nil {
		t.Fatalf("plaintext to localhost refused: %v", err)
	}
}

// TestNeverCreatesOrDeletes checks the provider's promises about someone
// else's sandbox: state without secrets, resume with the config's token,
// Delete and Close leave the daemon and its processes running, List shows
// the one sandbox, and a state naming another address is refused.
func TestNeverCreatesOrDeletes(t *testing.T) {
	ctx := testCtx(t)
	d := startDaemon(t, daemonOptions{})
	cfg := Config{Address: d.Address, TokenFile: d.TokenFile}
	c, err := NewClient(cfg, compute.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	started, err := s.Agent().Start(ctx, compute.ProcessSpec{Command: "sleep 300"}, compute.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	data, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), d.Token) || strings.Contains(string(data), d.TokenFile) {
		t.Fatalf("state holds the token or its file: %s", data)
	}
	var ps map[string]any
	if err := json.Unmarshal(st.ProviderState, &ps); err != nil || len(ps) != 1 || ps["address"] != d.Address {
		t.Fatalf("provider state = %s (%v)", st.ProviderState, err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	if !d.alive() {
		t.Fatal("Delete stopped the remote daemon")
	}
	// Another harness resumes with its own config (the token from the file).
	c2, err := NewClient(cfg, compute.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c2.Resume(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Release()
	procs, err := s2.Agent().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var running bool
	for _, p := range procs {
		running = running || (p.ProcessID == started.Process.ProcessID && p.Exit == nil)
	}
	if !running {
		t.Fatalf("the session's process did not survive Close and Delete: %v", procs)
	}
	infos, err := c2.List(ctx)
	if err != nil || len(infos) != 1 || !infos[0].Running || infos[0].ID != d.Address {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	// A state that names another address never gets this config's token.
	other := *st
	other.ProviderState = json.RawMessage(`{"address":"tcp://127.0.0.1:9"}`)
	if _, err := c2.Resume(ctx, &other); !errors.Is(err, compute.ErrFailedPrecondition) {
		t.Fatalf("resume of another address: %v", err)
	}
	// An unreachable sandbox is retryable, and not taken for a gone one.
	d.stop(t)
	if _, err := c2.Resume(ctx, st); !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
		t.Fatalf("resume of a stopped daemon: %v", err)
	}
	infos, err = c2.List(ctx)
	if err != nil || len(infos) != 1 || infos[0].Running {
		t.Fatalf("List after the daemon stopped = %+v, %v", infos, err)
	}
}

// TestTokenFileRotation checks that the token file is read at each connect.
func TestTokenFileRotation(t *testing.T) {
	ctx := testCtx(t)
	d := startDaemon(t, daemonOptions{})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, Config{Address: d.Address, TokenFile: tokenFile})
	if _, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "s"}); !errors.Is(err, compute.ErrUnauthenticated) {
		t.Fatalf("stale token: %v", err)
	}
	if err := os.WriteFile(tokenFile, []byte(d.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sb, err := p.Launch(ctx, compute.LaunchSpec{SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	_ = sb.Close()
	_ = sb.Close()
}

// TestLaunchIsBounded checks that a daemon that accepts connections but
// never answers fails the connect within ConnectTimeout, as retryable.
func TestLaunchIsBounded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	p := newProvider(t, Config{Address: "tcp://" + l.Addr().String(), Token: "x", ConnectTimeout: 300e6})
	_, err = p.Launch(context.Background(), compute.LaunchSpec{SessionID: "s"})
	if !errors.Is(err, compute.ErrUnavailable) || !compute.Retryable(err) {
		t.Fatalf("silent daemon: %v", err)
	}
}
