package mount_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/s3mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

const (
	testFS = "fs-0123456789abcdef0"
	testAP = "fsap-0123456789abcdef0"
)

// s3FilesEntry is an s3_files_mount of testFS; mount_target_ip is set
// and ignored (no NFS connection is made).
func s3FilesEntry(readOnly bool, subpath string) *manifest.Entry {
	return &manifest.Entry{Type: manifest.TypeS3FilesMount, Mount: &manifest.Mount{FileSystemID: testFS, Region: "us-east-1", Subpath: subpath,
		MountTargetIP: "10.0.0.7", ExtraOptions: []string{"nconnect=4"}, ReadOnly: &readOnly}}
}

// TestS3FilesMountReadOnly: an s3_files_mount of a subpath (no access
// point) brings in exactly the objects under the file system's prefix and
// that subpath in its backing bucket, read-only (root's, not writable by
// run_as); no credential reaches the sandbox; the mount is not in the
// snapshot. (Through an access point: TestMounts, backend s3_files.)
func TestS3FilesMountReadOnly(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newEnvOn(t, s3FilesStorage(t), nil, nil)
	for key, body := range map[string]string{"fsroot/projects/readme.md": "# shared\n", "fsroot/projects/sub/data.csv": "a,b\n1,2\n",
		"fsroot/other/secret.txt": "another directory of the file system", "projects/outside.txt": "outside the file system's prefix"} {
		if err := e.putObject(ctxT(t), key, body); err != nil {
			t.Fatal(err)
		}
	}
	s := e.started(t, map[string]*manifest.Entry{
		"notes.txt": {Type: manifest.TypeFile, Content: []byte("mine")},
		"shared":    s3FilesEntry(true, "/projects"),
	})
	out, _ := sh(t, s, "", "cd shared && find . | sort && cat readme.md sub/data.csv && stat -c '%n %U %a' . readme.md sub")
	want := ".\n./readme.md\n./sub\n./sub/data.csv\n# shared\na,b\n1,2\n. root 555\nreadme.md root 444\nsub root 555\n"
	if out != want {
		t.Fatalf("mount:\n%s\nwant:\n%s", out, want)
	}
	assertReadOnly(t, s, "shared")
	assertNoSecret(t, e, s)
	assertStoppedWithout(t, e, s, "shared")
}

// TestS3FilesMountRefused: an unknown file system, an access point the
// configuration does not root, and an NFS option contradicting read_only
// are refused before anything is written, each naming what to fix.
func TestS3FilesMountRefused(t *testing.T) {
	m, err := mount.New(testConfig{S3: s3mount.Config{FileSystems: map[string]s3mount.FileSystem{testFS: {Bucket: "b"}}}}.build())
	if err != nil {
		t.Fatal(err)
	}
	plan := func(e *manifest.Entry) error {
		_, err := m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: e})
		return err
	}
	unknown := s3FilesEntry(true, "")
	unknown.Mount.FileSystemID = "fs-00000000000000000"
	if err := plan(unknown); !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fs-00000000000000000") || !strings.Contains(err.Error(), "s3mount.Config.FileSystems") {
		t.Fatalf("unknown file system: %v", err)
	}
	ap := s3FilesEntry(true, "")
	ap.Mount.AccessPoint = "fsap-0000000000000000f"
	if err := plan(ap); !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fsap-0000000000000000f") || !strings.Contains(err.Error(), "AccessPoints") {
		t.Fatalf("unconfigured access point: %v", err)
	}
	ro := s3FilesEntry(false, "")
	ro.Mount.ExtraOptions = []string{"ro"}
	if err := plan(ro); !errors.Is(err, errkind.ErrInvalidArgument) || !strings.Contains(err.Error(), "read_only") {
		t.Fatalf("ro on a writable mount: %v", err)
	}
	noBucket, err := mount.New(testConfig{S3: s3mount.Config{FileSystems: map[string]s3mount.FileSystem{testFS: {}}}}.build())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noBucket.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: s3FilesEntry(true, "")}); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Fatalf("a file system configured without a bucket: %v", err)
	}
	// Through the materializer: refused naming the entry, before a plan
	// (so before anything is written).
	man := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"task.md":     {Type: manifest.TypeFile, Content: []byte("t")},
		"data/shared": unknown,
	}}
	if err := man.Validate(); err != nil {
		t.Fatal(err)
	}
	_, err = materializer.Prepare(context.Background(), man, materializer.Options{Mounts: m})
	if !errors.Is(err, compute.ErrFailedPrecondition) || !strings.Contains(err.Error(), "entry data/shared: ") {
		t.Fatalf("through the materializer: %v", err)
	}
}

// TestS3FilesUnknownNothingWritten: a session whose manifest names an
// unconfigured file system fails Start with nothing written.
func TestS3FilesUnknownNothingWritten(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newEnvOn(t, s3FilesStorage(t), nil, nil)
	unknown := s3FilesEntry(true, "")
	unknown.Mount.FileSystemID = "fs-00000000000000000"
	s := e.session(t, map[string]*manifest.Entry{
		"first.txt": {Type: manifest.TypeFile, Content: []byte("x")},
		"data":      unknown,
	})
	if err := s.Start(ctxT(t)); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Fatalf("Start = %v", err)
	}
	ls, err := s.ListDir(ctxT(t), ".", compute.ListDirOptions{User: "root"})
	if err != nil || len(ls.Entries) != 0 {
		t.Fatalf("something was written: %+v %v", ls, err)
	}
}
