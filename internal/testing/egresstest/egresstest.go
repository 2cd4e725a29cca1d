// Package egresstest holds what the egress tests of every provider share:
// the network client they run inside a sandbox and a fixed resolver that
// points test names at loopback servers.
package egresstest

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Client builds ./netclient as a static binary and returns its bytes, to
// be written into a sandbox.
func Client(t testing.TB) []byte {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	out := filepath.Join(t.TempDir(), "netclient")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./netclient")
	cmd.Dir = filepath.Dir(file)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the sandbox's network client: %v\n%s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Resolver points names at fixed addresses (DNS for the tests); other
// names do not exist.
type Resolver map[string][]netip.Addr

// LookupNetIP implements egress.Resolver.
func (r Resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}
