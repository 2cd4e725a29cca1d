package remote

// These tests run the real sandbox-agentd binary, built once by TestMain,
// as "a sandbox started by someone else": each test starts its own daemon
// (unix socket, or TCP with TLS and mTLS using certificates made here) and
// points the provider at it.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/syncbuf"
)

// agentdBin is the sandbox-agentd binary built by TestMain (agentdtest).
var agentdBin string

func TestMain(m *testing.M) { agentdtest.Main(m, &agentdBin) }

// ---- certificates ----

// pki is a test CA with a server certificate (127.0.0.1, "sandbox.test")
// and a client certificate, written as PEM files.
type pki struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

func newPKI(t *testing.T, dir, name string) pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := pki{CA: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, p.CA, "CERTIFICATE", caDER)
	issue := func(cn string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.DNSNames = []string{"sandbox.test"}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile := filepath.Join(dir, name+"-"+cn+".pem"), filepath.Join(dir, name+"-"+cn+"-key.pem")
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
		return certFile, keyFile
	}
	p.ServerCert, p.ServerKey = issue("server", 2, x509.ExtKeyUsageServerAuth)
	p.ClientCert, p.ClientKey = issue("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// ---- daemons ----

// daemonOptions says how to start a test daemon.
type daemonOptions struct {
	// TCP listens on 127.0.0.1 (a port the daemon picks) instead of a unix socket.
	TCP bool
	// PKI, when set, serves TLS with its server certificate.
	PKI *pki
	// MTLS also requires client certificates signed by PKI's CA.
	MTLS bool
}

// daemon is a sandbox-agentd the test started: the remote sandbox.
type daemon struct {
	Address   string // unix:///... or tcp://127.0.0.1:port
	Token     string
	TokenFile string // a copy of the token for the provider (the daemon removes its own)
	Workspace string
	cmd       *exec.Cmd
	exited    chan struct{}
	logs      *syncbuf.Buffer
}

// startDaemon starts sandbox-agentd as a remote sandbox and stops it when
// the test ends. It runs as root when the test does, with a private etc
// so that manifests can create accounts without touching the host's.
func startDaemon(t *testing.T, o daemonOptions) *daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "bh-remote-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Sandbox accounts must pass through to the workspace.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(dir, "workspace")
	etc := filepath.Join(dir, "etc")
	for _, d := range []string{ws, etc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"passwd", "group"} {
		data, err := os.ReadFile(filepath.Join("/etc", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etc, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	token := fmt.Sprintf("%x", randomBytes(t, 32))
	daemonToken := filepath.Join(dir, "daemon-token")
	d := &daemon{Token: token, TokenFile: filepath.Join(dir, "harness-token"), Workspace: ws, exited: make(chan struct{}), logs: &syncbuf.Buffer{}}
	for _, p := range []string{daemonToken, d.TokenFile} {
		if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	listen := "unix://" + filepath.Join(dir, "agentd.sock")
	if o.TCP {
		listen = "tcp://127.0.0.1:0"
	}
	args := []string{"--listen", listen, "--token-file", daemonToken, "--workspace", ws, "--etc-root", dir, "--log-format", "json"}
	if o.PKI != nil {
		args = append(args, "--tls-cert", o.PKI.ServerCert, "--tls-key", o.PKI.ServerKey)
		if o.MTLS {
			args = append(args, "--tls-client-ca", o.PKI.CA)
		}
	}
	cmd := exec.Command(agentdBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.cmd = cmd
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(d.logs, line)
			var entry struct {
				Msg     string `json:"msg"`
				Address string `json:"address"`
			}
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "listening" {
				select {
				case addr <- entry.Address:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() { d.stop(t) })
	select {
	case a := <-addr:
		d.Address = a
	case <-d.exited:
		t.Fatalf("sandbox-agentd exited at start-up:\n%s", d.logs.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("sandbox-agentd did not listen within 20s:\n%s", d.logs.String())
	}
	waitListening(t, d)
	return d
}

// waitListening waits until the daemon's listener accepts (it logs just
// before it serves).
func waitListening(t *testing.T, d *daemon) {
	t.Helper()
	ep, err := parseAddress(d.Address)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout(ep.network, ep.addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon at %s does not accept: %v", d.Address, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether the daemon process still runs.
func (d *daemon) alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// stop ends the daemon (SIGTERM, then SIGKILL to its group).
func (d *daemon) stop(t *testing.T) {
	if !d.alive() {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		t.Errorf("sandbox-agentd did not stop on SIGTERM; killing it")
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
