package materializer_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// fakeMounter expands every mount into one directory and one file.
type fakeMounter struct {
	outside bool // plan an entry outside the mount's path
	req     materializer.MountRequest
	applied []agentclient.MaterializedFile
	closed  bool
}

func (f *fakeMounter) PlanMount(_ context.Context, req materializer.MountRequest) (*materializer.MountPlan, error) {
	f.req = req
	file := req.Path + "/sub/obj.txt"
	if f.outside {
		file = "elsewhere.txt"
	}
	return &materializer.MountPlan{
		Entries: []*agentclient.MaterializeEntry{
			{Path: req.Path, Kind: agentclient.EntryDirectory, Mode: 0o555},
			{Path: req.Path + "/sub", Kind: agentclient.EntryDirectory, Mode: 0o555},
			{Path: file, Kind: agentclient.EntryFile, Mode: 0o444, Size: 6},
		},
		Open: func(string) (io.ReadCloser, int64, error) { return io.NopCloser(strings.NewReader("object")), 6, nil },
		Applied: func(_ context.Context, _ *agentclient.Client, files []agentclient.MaterializedFile) error {
			f.applied = files
			return nil
		},
		Close: func() { f.closed = true },
	}, nil
}

// TestMounterPlan: a mount entry is expanded by Options.Mounts: its
// entries are written with the bytes Open gives, Applied sees the mount's
// files (and only them) with their sha256, and a plan reaching outside the
// mount's path is refused before anything is written.
func TestMounterPlan(t *testing.T) {
	d := agentdtest.Start(t, nil)
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"task.md": {Type: manifest.TypeFile, Content: []byte("t")},
		"data":    {Type: manifest.TypeS3Mount, Mount: &manifest.Mount{Bucket: "b"}},
	}}
	fm := &fakeMounter{}
	if _, err := materializer.Apply(ctxT(t), d.Client, m, materializer.Options{Mounts: fm, Session: "s-1"}); err != nil {
		t.Fatal(err)
	}
	if fm.req.Session != "s-1" || fm.req.Path != "data" || !fm.closed {
		t.Fatalf("request %+v, closed %v", fm.req, fm.closed)
	}
	if b, err := os.ReadFile(filepath.Join(d.Workspace, "data/sub/obj.txt")); err != nil || string(b) != "object" {
		t.Fatalf("obj.txt = %q, %v", b, err)
	}
	if len(fm.applied) != 1 || fm.applied[0].Path != "data/sub/obj.txt" || fm.applied[0].SHA256 == "" {
		t.Fatalf("Applied saw %v", fm.applied)
	}
	// The mount's entries are volatile (fetched again at every start, so
	// the daemon need not flush them); the manifest's own are not.
	p, err := materializer.Prepare(ctxT(t), m, materializer.Options{Mounts: &fakeMounter{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range p.Plan.Entries {
		if mounted := e.Path == "data" || strings.HasPrefix(e.Path, "data/"); e.Volatile != mounted {
			t.Errorf("entry %s: volatile %v", e.Path, e.Volatile)
		}
	}
	p.Close()
	d2 := agentdtest.Start(t, nil)
	_, err = materializer.Apply(ctxT(t), d2.Client, m, materializer.Options{Mounts: &fakeMounter{outside: true}})
	if !errors.Is(err, errkind.ErrInternal) {
		t.Fatalf("a plan outside the mount: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d2.Workspace, "task.md")); err == nil {
		t.Fatal("a refused plan wrote task.md")
	}
}
