package userdb

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestAddGroupAndUser(t *testing.T) {
	root := t.TempDir()
	etc := filepath.Join(root, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("passwd", "root:x:0:0:root:/root:/bin/sh\nbob:x:1000:1000::/home/bob:/bin/sh", 0o644) // no final newline
	write("group", "root:x:0:\nbob:x:1000:\n", 0o644)
	write("shadow", "root:*:19000:0:99999:7:::\n", 0o640)
	db := New(root)

	gid, err := db.AddGroup(NewGroup{Name: "analysts"})
	if err != nil || gid != 1001 {
		t.Fatalf("AddGroup = %d, %v; want 1001", gid, err)
	}
	fixed := uint32(2000)
	if _, err := db.AddGroup(NewGroup{Name: "auditors", GID: &fixed}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.AddGroup(NewGroup{Name: "analysts"}); !errors.Is(err, errkind.ErrAlreadyExists) {
		t.Fatalf("duplicate group: %v", err)
	}
	if _, err := db.AddGroup(NewGroup{Name: "dup", GID: &fixed}); !errors.Is(err, errkind.ErrAlreadyExists) {
		t.Fatalf("taken gid: %v", err)
	}
	if _, err := db.AddGroup(NewGroup{Name: "Bad:Name"}); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}

	u, err := db.AddUser(NewUser{Name: "alice", Groups: []string{"analysts", "auditors"}})
	if err != nil {
		t.Fatal(err)
	}
	// uid 1001 is free in passwd; gid 1001 is taken by analysts, so the
	// private group gets the next free gid.
	if u.UID != 1001 || u.GID == 1001 || u.Home != "/home/alice" || u.Shell != "/bin/sh" {
		t.Fatalf("alice = %+v", u)
	}
	if len(u.Groups) != 2 {
		t.Errorf("alice's groups = %v", u.Groups)
	}
	if fi, err := os.Stat(filepath.Join(root, "home", "alice")); err != nil || !fi.IsDir() {
		t.Errorf("home: %v", err)
	}
	if _, err := db.AddUser(NewUser{Name: "alice"}); !errors.Is(err, errkind.ErrAlreadyExists) {
		t.Fatalf("duplicate user: %v", err)
	}
	if _, err := db.AddUser(NewUser{Name: "carol", Groups: []string{"nope"}}); !errors.Is(err, errkind.ErrNotFound) {
		t.Fatalf("unknown group: %v", err)
	}
	if _, err := db.AddUser(NewUser{Name: "dave", Home: "relative"}); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("relative home: %v", err)
	}
	shadow, _ := os.ReadFile(filepath.Join(etc, "shadow"))
	if !strings.Contains(string(shadow), "\nalice:!:") {
		t.Errorf("shadow: %q", shadow)
	}
	if fi, _ := os.Stat(filepath.Join(etc, "shadow")); fi.Mode().Perm() != 0o640 {
		t.Errorf("shadow mode %v", fi.Mode())
	}
	passwd, _ := os.ReadFile(filepath.Join(etc, "passwd"))
	if !strings.Contains(string(passwd), "/bin/sh\nalice:x:1001:") {
		t.Errorf("passwd: %q", passwd)
	}
	group, _ := os.ReadFile(filepath.Join(etc, "group"))
	for _, want := range []string{"analysts:x:1001:alice\n", "auditors:x:2000:alice\n", "\nalice:x:"} {
		if !strings.Contains(string(group), want) {
			t.Errorf("group lacks %q:\n%s", want, group)
		}
	}
	entries, _ := os.ReadDir(etc)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".bulkhead-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}
