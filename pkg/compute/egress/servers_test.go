package egress

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestServersAndPolicyFile(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "egress.json")
	if _, ok, err := ReadPolicyFile(pf); ok || err != nil {
		t.Fatalf("no policy file: ok %v, err %v", ok, err)
	}
	pol, err := ParsePolicy([]string{"example.com", "*.example.org:8443"})
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePolicyFile(pf, pol); err != nil {
		t.Fatal(err)
	}
	back, ok, err := ReadPolicyFile(pf)
	if !ok || err != nil || back.String() != pol.String() {
		t.Fatalf("ReadPolicyFile = %v, %v, %v", back, ok, err)
	}

	s := NewServers(Options{}, nil)
	defer s.Close()
	sock := filepath.Join(dir, "egress.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Start("sb", sock, pol, 0o600); err == nil {
		t.Fatal("Start replaced a regular file with its socket")
	}
	_ = os.Remove(sock)
	if err := s.Start("sb", sock, pol, 0o600); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi, err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("CONNECT to an IP: %v %v", resp, err)
	}
	c.Close()
	if st, ok := s.Stats("sb"); !ok || st.Denied != 1 {
		t.Errorf("Stats = %+v, %v", st, ok)
	}
	s.Stop("sb")
	if s.Serving("sb") {
		t.Error("still serving after Stop")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after Stop: %v", err)
	}
}
