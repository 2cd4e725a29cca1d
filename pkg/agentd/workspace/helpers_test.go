package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// env is a workspace under test with a sentinel tree outside it.
type env struct {
	w       *Workspace
	base    string // holds everything below
	root    string // the workspace root
	outside string // sentinel tree that must never change
	grantRO string // a read-only grant
	grantRW string // a writable grant
	users   *userdb.DB
}

// newEnv builds base/{ws,outside,ro,rw} and opens the workspace with a
// read-only and a writable grant. Directories are world-searchable so that
// run_as tests can reach them.
func newEnv(t testing.TB) *env {
	t.Helper()
	base := t.TempDir()
	openUp(t, base)
	e := &env{
		base:    base,
		root:    filepath.Join(base, "ws"),
		outside: filepath.Join(base, "outside"),
		grantRO: filepath.Join(base, "ro"),
		grantRW: filepath.Join(base, "rw"),
	}
	for _, d := range []string{e.root, e.outside, filepath.Join(e.outside, "sub"), e.grantRO, e.grantRW} {
		must(t, os.Mkdir(d, 0o755))
		must(t, os.Chmod(d, 0o755))
	}
	must(t, os.WriteFile(filepath.Join(e.outside, "secret.txt"), []byte("top secret\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(e.outside, "sub", "inner.txt"), []byte("inner\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(e.grantRO, "data.txt"), []byte("read only data\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(e.grantRW, "data.txt"), []byte("writable data\n"), 0o644))
	e.users = userdb.New(writeEtc(t, base))
	w, err := New(Config{Root: e.root, Users: e.users, Logger: zaptest.NewLogger(t)})
	must(t, err)
	t.Cleanup(func() { _ = w.Close() })
	must(t, w.SetGrants([]Grant{{Path: e.grantRO, ReadOnly: true}, {Path: e.grantRW}}))
	e.w = w
	return e
}

// openUp makes dir and its parents up to the temp root searchable by all.
func openUp(t testing.TB, dir string) {
	t.Helper()
	tmp := filepath.Clean(os.TempDir())
	for d := dir; d != tmp && d != "/" && strings.HasPrefix(d, tmp); d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}
}

// writeEtc writes a private passwd and group for userdb.
func writeEtc(t testing.TB, base string) string {
	t.Helper()
	etc := filepath.Join(base, "etcroot")
	must(t, os.MkdirAll(filepath.Join(etc, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(etc, "etc", "passwd"), []byte(
		"root:x:0:0:root:/root:/bin/sh\n"+
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"+
			"alice:x:1001:1001:Alice:/home/alice:/bin/sh\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(etc, "etc", "group"), []byte(
		"root:x:0:\n"+
			"nogroup:x:65534:\n"+
			"alice:x:1001:\n"+
			"devs:x:2000:alice\n"), 0o644))
	return etc
}

func (e *env) path(rel string) string { return filepath.Join(e.root, rel) }

// put writes a file inside the workspace directly (as root).
func (e *env) put(t testing.TB, rel, content string, mode fs.FileMode) {
	t.Helper()
	p := e.path(rel)
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(content), mode))
	must(t, os.Chmod(p, mode))
}

func (e *env) user(t testing.TB, name string) *userdb.User {
	t.Helper()
	u, err := e.users.Lookup(name)
	must(t, err)
	return u
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// snapshot records every entry below dir: type, mode, size, mtime, owner,
// content digest and link target.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v size=%d mtime=%d uid=%d gid=%d ino=%d", fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), st.Uid, st.Gid, st.Ino)
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			desc += " sha=" + hex.EncodeToString(sum[:8])
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = desc
		return nil
	})
	must(t, err)
	return out
}

// fileSnapshot is snapshot without directory metadata (a commit or write
// that fails may still change a directory's mtime).
func fileSnapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := snapshot(t, dir)
	for k, v := range out {
		if strings.HasPrefix(v, "d") {
			out[k] = "dir"
		}
	}
	return out
}

func diffSnapshots(a, b map[string]string) string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		if a[k] != b[k] {
			fmt.Fprintf(&sb, "  %q: %q -> %q\n", k, a[k], b[k])
		}
	}
	return sb.String()
}

// tempFiles lists leftover temporary files below dir.
func tempFiles(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && IsTempName(d.Name()) {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// readAll reads a whole file through the API.
func readAll(ctx context.Context, w *Workspace, u *userdb.User, path string) ([]byte, error) {
	r, err := w.ReadFile(ctx, u, path, 0, 0)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// writeString writes content through the API with default options.
func writeString(ctx context.Context, w *Workspace, u *userdb.User, path, content string) error {
	_, err := w.WriteFile(ctx, u, WriteOptions{Path: path, ExpectedSize: UnknownSize}, strings.NewReader(content))
	return err
}

// checkErr asserts err wraps want (nil: no error) and is a *errkind.PathError
// that mentions no host path of the test tree.
func checkErr(t testing.TB, e *env, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Fatalf("error = %v, want %v", err, want)
	}
	var pe *errkind.PathError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *errkind.PathError", err, err)
	}
	if e != nil && strings.Contains(err.Error(), e.base) && !strings.Contains(pe.Path, e.base) {
		t.Fatalf("error %q leaks a host path", err)
	}
}

// bytesEqual is bytes.Equal with a readable failure.
func bytesEqual(t testing.TB, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("content = %q, want %q", trunc(got), trunc(want))
	}
}

func trunc(b []byte) []byte {
	if len(b) > 64 {
		return append(b[:64:64], "..."...)
	}
	return b
}
