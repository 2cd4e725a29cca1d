package userdb

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func writeEtc(t *testing.T, passwd, group string) *DB {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"passwd": passwd, "group": group} {
		if body == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return New(root)
}

const testPasswd = `# comment
root:x:0:0:root:/root:/bin/bash

agent:x:1000:1000:Agent,,,:/home/agent:/bin/zsh
broken:x:notanumber:1:::
2000:x:3000:3000::/home/numeric:/bin/sh
other:x:2000:2000::/home/other:/bin/sh
`

const testGroup = `root:x:0:
agent:x:1000:
docker:x:999:agent,someone
dev:x:1001:someone,agent
empty:x:1002:
other:x:2000:
`

func TestLookupByName(t *testing.T) {
	db := writeEtc(t, testPasswd, testGroup)
	u, err := db.Lookup("agent")
	if err != nil {
		t.Fatal(err)
	}
	want := User{Name: "agent", UID: 1000, GID: 1000, Groups: []uint32{999, 1001}, Home: "/home/agent", Shell: "/bin/zsh"}
	if u.Name != want.Name || u.UID != want.UID || u.GID != want.GID || u.Home != want.Home ||
		u.Shell != want.Shell || !slices.Equal(u.Groups, want.Groups) {
		t.Fatalf("Lookup(agent) = %+v, want %+v", u, want)
	}
}

func TestLookupByUID(t *testing.T) {
	db := writeEtc(t, testPasswd, testGroup)
	u, err := db.Lookup("1000")
	if err != nil || u.Name != "agent" {
		t.Fatalf("Lookup(1000) = %+v, %v", u, err)
	}
	u, err = db.Lookup("0")
	if err != nil || u.Name != "root" || len(u.Groups) != 0 {
		t.Fatalf("Lookup(0) = %+v, %v", u, err)
	}
}

func TestLookupNamePrecedesUID(t *testing.T) {
	// "2000" is both a user name (uid 3000) and the uid of "other"; like
	// the C library, an exact name wins even when the uid line comes later.
	db := writeEtc(t, "other:x:2000:2000::/home/other:/bin/sh\n2000:x:3000:3000::/home/numeric:/bin/sh\n", "")
	u, err := db.Lookup("2000")
	if err != nil || u.Name != "2000" || u.UID != 3000 {
		t.Fatalf("Lookup(2000) = %+v, %v", u, err)
	}
}

func TestLookupErrors(t *testing.T) {
	db := writeEtc(t, testPasswd, testGroup)
	for _, c := range []struct {
		name     string
		sentinel error
	}{
		{"", errkind.ErrInvalidArgument},
		{"ghost", errkind.ErrNotFound},
		{"4242", errkind.ErrNotFound},
		{"broken", errkind.ErrNotFound}, // unparsable uid
	} {
		if _, err := db.Lookup(c.name); !errors.Is(err, c.sentinel) {
			t.Errorf("Lookup(%q) error = %v, want %v", c.name, err, c.sentinel)
		}
	}
	// No account files at all: every user is unknown, not an I/O error.
	empty := New(t.TempDir())
	if _, err := empty.Lookup("root"); !errors.Is(err, errkind.ErrNotFound) {
		t.Errorf("Lookup without /etc/passwd = %v", err)
	}
	// A user without a group file has no supplementary groups.
	u, err := writeEtc(t, testPasswd, "").Lookup("agent")
	if err != nil || len(u.Groups) != 0 {
		t.Errorf("Lookup without /etc/group = %+v, %v", u, err)
	}
}

func TestGroupID(t *testing.T) {
	db := writeEtc(t, testPasswd, testGroup)
	for name, want := range map[string]uint32{"docker": 999, "dev": 1001, "12345": 12345} {
		if got, err := db.GroupID(name); err != nil || got != want {
			t.Errorf("GroupID(%q) = %d, %v; want %d", name, got, err, want)
		}
	}
	if _, err := db.GroupID("nogroup-here"); !errors.Is(err, errkind.ErrNotFound) {
		t.Errorf("GroupID(unknown) = %v", err)
	}
}

func TestNewDefaultsToRoot(t *testing.T) {
	if db := New(""); db.root != "/" {
		t.Errorf("root = %q", db.root)
	}
}

func TestAccountSkipsGroups(t *testing.T) {
	db := writeEtc(t, testPasswd, testGroup)
	for _, name := range []string{"agent", "1000", "2000"} {
		l, err := db.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		a, err := db.Account(name)
		if err != nil {
			t.Fatal(err)
		}
		if a.Name != l.Name || a.UID != l.UID || a.GID != l.GID || a.Home != l.Home || a.Shell != l.Shell || a.Groups != nil {
			t.Errorf("Account(%s) = %+v, want %+v without groups", name, a, l)
		}
	}
	if _, err := db.Account("nobody"); !errors.Is(err, errkind.ErrUserNotFound) {
		t.Errorf("Account(nobody) = %v, want ErrUserNotFound", err)
	}
	if _, err := db.Account(""); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Errorf("Account(\"\") = %v, want ErrInvalidArgument", err)
	}
	// /etc/group is not read at all: an unreadable one fails Lookup only.
	group := filepath.Join(db.root, "etc", "group")
	if err := os.Remove(group); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(group, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Lookup("agent"); err == nil {
		t.Fatal("Lookup read a directory as /etc/group")
	}
	if u, err := db.Account("agent"); err != nil || u.UID != 1000 {
		t.Errorf("Account(agent) with a broken /etc/group = %+v, %v", u, err)
	}
}
