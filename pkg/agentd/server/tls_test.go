package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// testCA is an in-memory certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func nextSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// issue signs a leaf certificate and returns it with its PEM forms.
func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (tls.Certificate, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair, certPEM, keyPEM
}

func writeFile0600(t *testing.T, p string, data []byte) string {
	t.Helper()
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// freeTCPPort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// runningDaemon is Run in a goroutine.
type runningDaemon struct {
	cancel   context.CancelFunc
	finished chan struct{} // closed when Run returned
	err      error         // Run's result, once finished
}

// runInBackground starts Run; cleanup cancels it and waits for it.
func runInBackground(t *testing.T, cfg Config) *runningDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningDaemon{cancel: cancel, finished: make(chan struct{})}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	go func() {
		r.err = Run(ctx, cfg, log)
		close(r.finished)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.finished:
		case <-time.After(15 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return r
}

// stop cancels Run and returns its result.
func (r *runningDaemon) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case <-r.finished:
		return r.err
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
		return nil
	}
}

func dialT(t *testing.T, opts agentclient.Options) *agentclient.Client {
	t.Helper()
	c, err := agentclient.Dial(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitServing calls Info until it succeeds or Run ends.
func waitServing(t *testing.T, c *agentclient.Client, r *runningDaemon) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Info(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-r.finished:
			t.Fatalf("Run ended before serving: %v (last call: %v)", r.err, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRunMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "bulkhead test CA")
	_, serverCert, serverKey := ca.issue(t, "sandbox", x509.ExtKeyUsageServerAuth)
	clientPair, _, _ := ca.issue(t, "harness", x509.ExtKeyUsageClientAuth)
	rogue := newTestCA(t, "rogue CA")
	roguePair, _, _ := rogue.issue(t, "intruder", x509.ExtKeyUsageClientAuth)

	port := freeTCPPort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cfg := DefaultConfig()
	cfg.Listen = []string{"tcp://" + addr}
	cfg.TokenFile = writeFile0600(t, filepath.Join(dir, "token"), []byte(testToken+"\n"))
	cfg.TLSCertFile = writeFile0600(t, filepath.Join(dir, "server.pem"), serverCert)
	cfg.TLSKeyFile = writeFile0600(t, filepath.Join(dir, "server-key.pem"), serverKey)
	cfg.ClientCAFile = writeFile0600(t, filepath.Join(dir, "client-ca.pem"), ca.pem)
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.Daemon.WorkspaceRoot = filepath.Join(dir, "ws")
	cfg.Daemon.ReapAll = false

	run := runInBackground(t, cfg)
	good := dialT(t, agentclient.Options{Address: "tcp://" + addr, Token: testToken,
		TLS: &tls.Config{RootCAs: ca.pool(), Certificates: []tls.Certificate{clientPair}, MinVersion: tls.VersionTLS12}})
	waitServing(t, good, run)

	if _, err := os.Stat(cfg.TokenFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the token file is still there after start: %v", err)
	}
	info, err := good.Info(shortCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.WorkspaceRoot != cfg.Daemon.WorkspaceRoot {
		t.Fatalf("info %v", info)
	}
	// The server name may also be checked against the DNS SAN.
	byName := dialT(t, agentclient.Options{Address: "tcp://" + addr, Token: testToken,
		TLS: &tls.Config{RootCAs: ca.pool(), Certificates: []tls.Certificate{clientPair}, ServerName: "localhost"}})
	if _, err := byName.Info(shortCtx(t)); err != nil {
		t.Fatalf("ServerName localhost: %v", err)
	}
	// Real work over mTLS.
	res, err := good.Exec(shortCtx(t), agentclient.ProcessSpec{Argv: []string{"echo", "over mtls"}}, agentclient.ExecOptions{}, nil)
	if err != nil || string(res.Stdout) != "over mtls\n" {
		t.Fatalf("exec over mTLS: %v %v", res, err)
	}

	refused := func(name string, opts agentclient.Options) {
		t.Helper()
		c := dialT(t, opts)
		_, err := c.Info(shortCtx(t))
		if err == nil {
			t.Fatalf("%s: Info succeeded", name)
		}
		if !errors.Is(err, errkind.ErrUnavailable) {
			t.Fatalf("%s: want a transport failure (ErrUnavailable), got %v", name, err)
		}
	}
	refused("no client certificate", agentclient.Options{Address: "tcp://" + addr, Token: testToken,
		TLS: &tls.Config{RootCAs: ca.pool()}})
	refused("client certificate from another CA", agentclient.Options{Address: "tcp://" + addr, Token: testToken,
		TLS: &tls.Config{RootCAs: ca.pool(), Certificates: []tls.Certificate{roguePair}}})
	refused("plaintext", agentclient.Options{Address: "tcp://" + addr, Token: testToken})
	refused("server not trusted", agentclient.Options{Address: "tcp://" + addr, Token: testToken,
		TLS: &tls.Config{RootCAs: rogue.pool(), Certificates: []tls.Certificate{clientPair}}})

	// mTLS does not replace the token.
	for name, token := range map[string]string{"wrong token": strings.Repeat("z", len(testToken)), "no token": ""} {
		c := dialT(t, agentclient.Options{Address: "tcp://" + addr, Token: token,
			TLS: &tls.Config{RootCAs: ca.pool(), Certificates: []tls.Certificate{clientPair}}})
		if _, err := c.Info(shortCtx(t)); !errors.Is(err, errkind.ErrUnauthenticated) {
			t.Fatalf("%s over mTLS: want ErrUnauthenticated, got %v", name, err)
		}
		// Health needs the certificate but not the token.
		if err := c.Health(shortCtx(t)); err != nil {
			t.Fatalf("%s: health over mTLS: %v", name, err)
		}
	}

	// Cancelling Run's context shuts down cleanly and closes the listener.
	if err := run.stop(t); err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("the listener is still open after Run returned")
	}
	if _, err := good.Info(shortCtx(t)); err == nil {
		t.Fatal("a call succeeded after shutdown")
	}
}

func TestRunRefusesNoToken(t *testing.T) {
	dir := t.TempDir()
	port := freeTCPPort(t)
	cfg := DefaultConfig()
	cfg.Listen = []string{"tcp://127.0.0.1:" + strconv.Itoa(port)}
	cfg.Daemon.WorkspaceRoot = filepath.Join(dir, "ws")
	cfg.Daemon.ReapAll = false
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	err := Run(ctx, cfg, log)
	if err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("Run without a token: want an error about no token, got %v", err)
	}
	// A token file that is too short, or missing, is refused too, before
	// anything listens.
	short := cfg
	short.TokenFile = writeFile0600(t, filepath.Join(dir, "short"), []byte("tooshort"))
	if err := Run(ctx, short, log); err == nil || !strings.Contains(err.Error(), "shorter") {
		t.Fatalf("short token: %v", err)
	}
	missing := cfg
	missing.TokenFile = filepath.Join(dir, "does-not-exist")
	if err := Run(ctx, missing, log); err == nil {
		t.Fatal("Run with a missing token file succeeded")
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
		conn.Close()
		t.Fatal("something listens although Run refused to start")
	}
	// The configuration is refused before anything is created.
	assertMissing(t, cfg.Daemon.WorkspaceRoot)
}

func TestRunInsecureNoAuth(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "agentd.sock")
	cfg := DefaultConfig()
	cfg.Listen = []string{"unix://" + socket}
	cfg.InsecureNoAuth = true
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.Daemon.WorkspaceRoot = filepath.Join(dir, "ws")
	cfg.Daemon.ReapAll = false

	run := runInBackground(t, cfg)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Lstat(socket); err == nil || time.Now().After(deadline) {
			break // (a first failed call would cost a reconnection backoff)
		}
	}
	c := dialT(t, agentclient.Options{Address: "unix://" + socket})
	waitServing(t, c, run)
	if _, err := c.WriteFile(shortCtx(t), "hello.txt", agentclient.WriteFileOptions{}, strings.NewReader("hi")); err != nil {
		t.Fatalf("write without a token under --insecure-no-auth: %v", err)
	}
	if diskContent(t, filepath.Join(cfg.Daemon.WorkspaceRoot, "hello.txt")) != "hi" {
		t.Fatal("write did not land")
	}
	// Any token is accepted too (there is nothing to check it against).
	if _, err := dialT(t, agentclient.Options{Address: "unix://" + socket, Token: "whatever-token-value"}).Info(shortCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := run.stop(t); err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket is left behind: %v", err)
	}
	// --insecure-no-auth together with a token is a contradiction.
	bad := cfg
	bad.TokenFile = writeFile0600(t, filepath.Join(dir, "token"), []byte(testToken))
	if err := Run(context.Background(), bad, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))); err == nil || !strings.Contains(err.Error(), "insecure-no-auth") {
		t.Fatalf("token + insecure: %v", err)
	}
}
