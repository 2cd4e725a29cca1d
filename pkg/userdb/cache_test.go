package userdb

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// setSettleTime changes settleTime for one test (not parallel).
func setSettleTime(t *testing.T, d time.Duration) {
	old := settleTime
	settleTime = d
	t.Cleanup(func() { settleTime = old })
}

func TestCacheSeesChanges(t *testing.T) {
	setSettleTime(t, 0) // trust files at once, so that the cache is used
	db := writeEtc(t, testPasswd, testGroup)
	passwd := filepath.Join(db.root, "etc", "passwd")
	if _, err := db.Lookup("agent"); err != nil {
		t.Fatal(err)
	}
	if db.cache["passwd"] == nil || db.cache["group"] == nil {
		t.Fatal("the parsed files were not cached")
	}
	if _, err := db.Lookup("newuser"); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("Lookup(newuser) before it exists = %v", err)
	}

	// Appended in place (as useradd may): the size changes.
	f, err := os.OpenFile(passwd, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("newuser:x:1500:1500::/home/newuser:/bin/sh\n")
	f.Close()
	if u, err := db.Lookup("newuser"); err != nil || u.UID != 1500 {
		t.Fatalf("Lookup(newuser) after append = %+v, %v", u, err)
	}

	// Replaced by rename with a file of the same size: the inode changes.
	body, _ := os.ReadFile(passwd)
	same := []byte(string(body[:len(body)-len("1500:1500::/home/newuser:/bin/sh\n")]) + "1600:1600::/home/newuser:/bin/sh\n")
	tmp := passwd + ".tmp"
	if err := os.WriteFile(tmp, same, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, passwd); err != nil {
		t.Fatal(err)
	}
	if u, err := db.Lookup("newuser"); err != nil || u.UID != 1600 {
		t.Fatalf("Lookup(newuser) after rename = %+v, %v", u, err)
	}

	// Removed: every user is unknown again.
	os.Remove(passwd)
	if _, err := db.Lookup("agent"); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("Lookup(agent) without passwd = %v", err)
	}

	// Group membership changes are seen too.
	group := filepath.Join(db.root, "etc", "group")
	os.WriteFile(passwd, []byte(testPasswd), 0o644)
	if u, err := db.Lookup("other"); err != nil || len(u.Groups) != 0 {
		t.Fatalf("Lookup(other) = %+v, %v", u, err)
	}
	os.WriteFile(group, []byte(testGroup+"extra:x:4242:other\n"), 0o644)
	if u, err := db.Lookup("other"); err != nil || len(u.Groups) != 1 || u.Groups[0] != 4242 {
		t.Fatalf("Lookup(other) after a group change = %+v, %v", u, err)
	}
}

func TestCacheIgnoresFreshFiles(t *testing.T) {
	// A file changed within settleTime is re-read on every lookup, so even
	// an in-place rewrite of the same size within one timestamp tick is
	// seen.
	db := writeEtc(t, "alice:x:1000:1000::/home/alice:/bin/sh\n", "")
	if u, err := db.Lookup("alice"); err != nil || u.UID != 1000 {
		t.Fatalf("Lookup(alice) = %+v, %v", u, err)
	}
	if db.cache["passwd"] != nil {
		t.Fatal("a file changed just now was cached")
	}
	f, err := os.OpenFile(filepath.Join(db.root, "etc", "passwd"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("alice:x:1001") // same size, same inode
	f.Close()
	if u, err := db.Lookup("alice"); err != nil || u.UID != 1001 {
		t.Fatalf("Lookup(alice) after an in-place rewrite = %+v, %v", u, err)
	}
}

func BenchmarkLookup(b *testing.B) {
	db := New("/")
	for b.Loop() {
		if _, err := db.Lookup("0"); err != nil {
			b.Fatal(err)
		}
	}
}
