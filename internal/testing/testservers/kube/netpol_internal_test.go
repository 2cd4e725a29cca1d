package kubeserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
)

// TestNetpolLeftoversRemoved: the enforcer table and DOCKER-USER rule of a
// cluster whose owner is gone (a test binary that was killed) are removed
// by the next cluster's start (cleanNetpolLeftovers), on the machine's
// real cluster directory, so live clusters there are left alone.
func TestNetpolLeftoversRemoved(t *testing.T) {
	testenv.Require(t, testenv.Linux, testenv.Root, testenv.Tool("nft"))
	base := filepath.Join(os.TempDir(), "bhk")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dead := randHex(4) // no directory: its cluster is gone
	t.Cleanup(func() { removeNetpol(dead, t.Logf) })
	if out, err := exec.Command("nft", "add", "table", "inet", netpolTable(dead)).CombinedOutput(); err != nil {
		t.Fatalf("nft add table: %v: %s", err, out)
	}
	docker := exec.Command("iptables", "-w", "-S", "DOCKER-USER").Run() == nil
	if docker {
		if out, err := exec.Command("iptables", append([]string{"-w", "-I"}, forwardRule(dead)...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables -I: %v: %s", err, out)
		}
	}
	if tables, err := netpolTables(); err != nil || !tables[dead] {
		t.Fatalf("the table is not listed: %v %v", tables, err)
	}
	if docker {
		if rules, err := forwardRules(); err != nil || !rules[dead] {
			t.Fatalf("the rule is not listed: %v %v", rules, err)
		}
	}

	cleanNetpolLeftovers(base, t.Logf)

	if tables, err := netpolTables(); err != nil || tables[dead] {
		t.Errorf("the dead cluster's table is still there (%v, %v)", tables, err)
	}
	if docker {
		if rules, err := forwardRules(); err != nil || rules[dead] {
			t.Errorf("the dead cluster's DOCKER-USER rule is still there (%v, %v)", rules, err)
		}
	}
}
