package service_test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
)

// tarOf makes a tar stream of members (a regular file's size is its
// body's).
func tarOf(t *testing.T, members ...tarMember) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, m := range members {
		h := m.h
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(m.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, m.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

type tarMember struct {
	h    tar.Header
	body string
}

func tarFile(name, body string) tarMember {
	return tarMember{h: tar.Header{Name: name, Typeflag: tar.TypeReg}, body: body}
}

func tarDir(name string) tarMember {
	return tarMember{h: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}}
}

// untar reads a tar stream into name -> content ("/" suffix: a directory).
func untar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("the downloaded tar: %v", err)
		}
		data, _ := io.ReadAll(tr)
		out[h.Name] = string(data)
	}
}

// TestSandboxTarRoundTrip: a tar with nested directories uploads into a
// directory (files read back with GET files), downloads again as the same
// tree, and another tenant's calls are NotFound.
func TestSandboxTarRoundTrip(t *testing.T) {
	e := newEnv(t, nil, func(c *service.Config) {
		c.Sandboxes = manager.SandboxPolicy{MaxTarEntries: 20, MaxTarBytes: 1 << 20}
	})
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	tarURL := e.url + "/v1/sandboxes/" + id + "/tar/"
	body := tarOf(t, tarDir("a/"), tarDir("a/b/"), tarFile("a/b/c.txt", "deep"), tarFile("top.txt", "top"),
		tarFile("x/y/z.txt", "no directory members"), tarFile("top.txt", "top again"))
	code, out := httpDo(t, ctx, http.MethodPost, tarURL+"up/load", acmeToken, body)
	if code != http.StatusOK || !strings.Contains(string(out), `"files":3`) || !strings.Contains(string(out), `"directories":2`) {
		t.Fatalf("upload: %d %s", code, out)
	}
	for p, want := range map[string]string{"up/load/a/b/c.txt": "deep", "up/load/top.txt": "top again", "up/load/x/y/z.txt": "no directory members"} {
		if code, got := httpDo(t, ctx, http.MethodGet, e.url+"/v1/sandboxes/"+id+"/files/"+p, acmeToken, nil); code != http.StatusOK || string(got) != want {
			t.Errorf("GET %s: %d %q, want %q", p, code, got, want)
		}
	}
	code, got := httpDo(t, ctx, http.MethodGet, tarURL+"up/load", acmeToken, nil)
	if code != http.StatusOK {
		t.Fatalf("download: %d %s", code, got)
	}
	want := map[string]string{"a/": "", "a/b/": "", "a/b/c.txt": "deep", "top.txt": "top again", "x/": "", "x/y/": "", "x/y/z.txt": "no directory members"}
	if tree := untar(t, got); fmt.Sprint(tree) != fmt.Sprint(want) {
		t.Errorf("downloaded %v, want %v (no staging directory left)", tree, want)
	}
	// The workspace root as a whole.
	code, got = httpDo(t, ctx, http.MethodGet, tarURL, acmeToken, nil)
	if tree := untar(t, got); code != http.StatusOK || tree["notes.md"] != "hello" || tree["up/load/a/b/c.txt"] != "deep" {
		t.Errorf("the workspace as a tar: %d %v", code, tree)
	}
	// Bounds: more members than MaxTarEntries.
	var many []tarMember
	for i := range 25 {
		many = append(many, tarFile(fmt.Sprintf("f%d", i), "x"))
	}
	if code, out := httpDo(t, ctx, http.MethodPost, tarURL+"many", acmeToken, tarOf(t, many...)); code != http.StatusTooManyRequests || !strings.Contains(string(out), "members") {
		t.Errorf("25 members: %d %s", code, out)
	}
	if code, got := httpDo(t, ctx, http.MethodGet, tarURL, acmeToken, nil); code != http.StatusOK || untar(t, got)["many/f0"] != "" {
		t.Errorf("a refused tar left files: %d %v", code, untar(t, got))
	}
	// Another tenant: NotFound, nothing written.
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		if code, body := httpDo(t, ctx, method, tarURL+"up", evilToken, tarOf(t, tarFile("evil.txt", "evil"))); code != http.StatusNotFound {
			t.Errorf("%s of another tenant's tar: %d %s", method, code, body)
		}
	}
	if code, _ := httpDo(t, ctx, http.MethodGet, e.url+"/v1/sandboxes/"+id+"/files/up/evil.txt", acmeToken, nil); code != http.StatusNotFound {
		t.Errorf("another tenant's upload wrote: %d", code)
	}
}

// TestSandboxTarRefusesBadMembers: a tar with a path out of the directory,
// an absolute path, a symlink, a hard link or a device is refused as a
// whole: nothing is written under the directory (the good member before
// the bad one included) nor outside it.
func TestSandboxTarRefusesBadMembers(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := ctxT(t)
	id := createSandbox(t, ctx, e, acmeToken, obj{"manifest": sbxManifest})
	abs := filepath.Join(os.TempDir(), fmt.Sprintf("bh-tar-abs-%d", os.Getpid()))
	for _, c := range []struct {
		bad  tarMember
		word string
	}{
		{tarFile("../escaped.txt", "out"), ".. is not allowed"},
		{tarFile("sub/../../escaped.txt", "out"), ".. is not allowed"},
		{tarFile(abs, "out"), "absolute path"},
		{tarMember{h: tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "../../.."}}, "a symlink"},
		{tarMember{h: tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "../notes.md"}}, "a hard link"},
		{tarMember{h: tar.Header{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}, "a device"},
		{tarMember{h: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}}, "a fifo"},
	} {
		body := tarOf(t, tarDir("d/"), tarFile("d/ok.txt", "fine"), c.bad)
		code, out := httpDo(t, ctx, http.MethodPost, e.url+"/v1/sandboxes/"+id+"/tar/in", acmeToken, body)
		if code != http.StatusBadRequest || !strings.Contains(string(out), c.word) || !strings.Contains(string(out), "nothing was written") {
			t.Errorf("%s: %d %s, want 400 saying %q", c.bad.h.Name, code, out, c.word)
		}
	}
	out := sbxOK(t, ctx, e, acmeToken, "RunCommand", obj{"sandboxId": id,
		"command": "ls -A in; ls -A; test -e ../escaped.txt && echo ESCAPED; true"})
	if got := fieldStr(out, "stdout"); got != "in\nnotes.md\n" {
		t.Errorf("after the refused uploads: %q, want an empty in/ and notes.md only", got)
	}
	if _, err := os.Lstat(abs); err == nil {
		_ = os.Remove(abs)
		t.Errorf("an absolute member was written at %s", abs)
	}
}
