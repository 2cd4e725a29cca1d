package mount_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/internal/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

const (
	testFS = "fs-0123456789abcdef0"
	testAP = "fsap-0123456789abcdef0"
)

// newS3FilesEnv is newEnv (a Versity gateway, a Mounter, a local client)
// with testFS configured as kept under "fsroot/" of the env's bucket,
// signed with the env's secrets, and one access point rooted at
// /teams/a.
func newS3FilesEnv(t *testing.T, mutate func(*mount.Config)) *env {
	t.Helper()
	// The bucket exists once the server runs: the map handed to the
	// Mounter is filled after, before any mount is planned.
	fss := map[string]mount.S3FileSystem{}
	e := newEnv(t, func(c *mount.Config) {
		c.S3FileSystems = fss
		if mutate != nil {
			mutate(c)
		}
	})
	fss[testFS] = mount.S3FileSystem{
		Bucket: e.bucket, Prefix: "/fsroot/", Endpoint: e.srv.Endpoint, Region: e.srv.Region,
		Credentials:  map[string]manifest.SecretRef{"access_key_id": manifest.Secret("MOUNT_KEY_ID"), "secret_access_key": manifest.Secret("MOUNT_SECRET")},
		AccessPoints: map[string]string{testAP: "/teams/a"},
	}
	return e
}

// s3FilesEntry is an s3_files_mount of testFS; mount_target_ip is set
// and ignored (no NFS connection is made).
func s3FilesEntry(readOnly bool, subpath string) *manifest.Entry {
	return &manifest.Entry{Type: manifest.TypeS3FilesMount, Mount: &manifest.Mount{FileSystemID: testFS, Region: "us-east-1", Subpath: subpath,
		MountTargetIP: "10.0.0.7", ExtraOptions: []string{"nconnect=4"}, ReadOnly: &readOnly}}
}

// TestS3FilesMountReadOnly: an s3_files_mount of a subpath brings in the
// objects under the file system's prefix and that subpath in its backing
// bucket, read-only (root's, not writable by run_as); no credential
// reaches the sandbox; the mount is not in the snapshot.
func TestS3FilesMountReadOnly(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newS3FilesEnv(t, nil)
	e.put(t, "fsroot/projects/readme.md", "# shared\n")
	e.put(t, "fsroot/projects/sub/data.csv", "a,b\n1,2\n")
	e.put(t, "fsroot/other/secret.txt", "another directory of the file system")
	e.put(t, "projects/outside.txt", "outside the file system's prefix")
	s := e.session(t, map[string]*manifest.Entry{
		"notes.txt": {Type: manifest.TypeFile, Content: []byte("mine")},
		"shared":    s3FilesEntry(true, "/projects"),
	})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	out, _ := sh(t, s, "", "cd shared && find . | sort && cat readme.md sub/data.csv && stat -c '%n %U %a' . readme.md sub")
	want := ".\n./readme.md\n./sub\n./sub/data.csv\n# shared\na,b\n1,2\n. root 555\nreadme.md root 444\nsub root 555\n"
	if out != want {
		t.Fatalf("mount:\n%s\nwant:\n%s", out, want)
	}
	runAs := s.Manifest().RunAs
	for _, cmd := range []string{"echo x >> shared/readme.md", "echo x > shared/new.txt", "rm -f shared/readme.md"} {
		if out, code := sh(t, s, runAs, cmd); code == 0 {
			t.Fatalf("run_as %s could %q in a read-only mount: %s", runAs, cmd, out)
		}
	}
	for _, user := range []string{runAs, ""} {
		out, _ := sh(t, s, user, "env; cat /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n'; grep -r -F -l -- '"+e.srv.SecretKey+"' . ; true")
		if strings.Contains(out, e.srv.SecretKey) || strings.Contains(out, e.srv.AccessKey) {
			t.Fatalf("the file system's bucket credentials reached the sandbox (user %q):\n%s", user, out)
		}
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(snapshotMembers(t, e.store, s.ID()), "\n")
	if !strings.Contains(joined, "notes.txt") || strings.Contains(joined, "shared") {
		t.Fatalf("snapshot members:\n%s", joined)
	}
}

// TestS3FilesMountWritable: a writable s3_files_mount through an access
// point (its configured root directory, then the subpath) is uploaded
// back to the backing bucket at Close; a remote change is a conflict, not
// overwritten.
func TestS3FilesMountWritable(t *testing.T) {
	testenv.Require(t, testenv.Root)
	e := newS3FilesEnv(t, nil)
	e.put(t, "fsroot/teams/a/work/edit.txt", "before")
	e.put(t, "fsroot/teams/a/work/gone.txt", "delete me")
	e.put(t, "fsroot/teams/a/work/theirs.txt", "t1")
	e.put(t, "fsroot/teams/b/work/edit.txt", "team b's, not under the access point")
	entry := s3FilesEntry(false, "/work")
	entry.Mount.AccessPoint = testAP
	s := e.session(t, map[string]*manifest.Entry{"w": entry})
	ctx := ctxT(t)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, s, "w/edit.txt"); got != "before" {
		t.Fatalf("w/edit.txt = %q (the access point's root was not applied?)", got)
	}
	if out, code := sh(t, s, s.Manifest().RunAs, "cd w && printf after > edit.txt && printf new > new.txt && rm gone.txt && printf mine > theirs.txt"); code != 0 {
		t.Fatalf("run_as could not write its writable mount: %s", out)
	}
	e.put(t, "fsroot/teams/a/work/theirs.txt", "t2 remote")
	err := s.Close(ctx)
	if !errors.Is(err, errkind.ErrConflict) || !strings.Contains(err.Error(), "w/theirs.txt") {
		t.Fatalf("Close = %v, want a conflict naming w/theirs.txt", err)
	}
	for key, want := range map[string]string{"fsroot/teams/a/work/edit.txt": "after", "fsroot/teams/a/work/new.txt": "new",
		"fsroot/teams/a/work/theirs.txt": "t2 remote", "fsroot/teams/b/work/edit.txt": "team b's, not under the access point"} {
		if got, ok := e.get(t, key); !ok || got != want {
			t.Fatalf("%s = %q (present %v), want %q", key, got, ok, want)
		}
	}
	if _, ok := e.get(t, "fsroot/teams/a/work/gone.txt"); ok {
		t.Fatal("gone.txt was deleted in the sandbox but not in the bucket")
	}
}

// TestS3FilesMountRefused: an unknown file system, an access point the
// configuration does not root, and an NFS option contradicting read_only
// are refused before anything is written, each naming what to fix.
func TestS3FilesMountRefused(t *testing.T) {
	m, err := mount.New(mount.Config{S3FileSystems: map[string]mount.S3FileSystem{testFS: {Bucket: "b"}}})
	if err != nil {
		t.Fatal(err)
	}
	plan := func(e *manifest.Entry) error {
		_, err := m.PlanMount(context.Background(), materializer.MountRequest{Path: "data", Entry: e})
		return err
	}
	unknown := s3FilesEntry(true, "")
	unknown.Mount.FileSystemID = "fs-00000000000000000"
	if err := plan(unknown); !errors.Is(err, errkind.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fs-00000000000000000") || !strings.Contains(err.Error(), "S3FileSystems") {
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
	noBucket, err := mount.New(mount.Config{S3FileSystems: map[string]mount.S3FileSystem{testFS: {}}})
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
	e := newS3FilesEnv(t, nil)
	unknown := s3FilesEntry(true, "")
	unknown.Mount.FileSystemID = "fs-00000000000000000"
	s := e.session(t, map[string]*manifest.Entry{
		"first.txt": {Type: manifest.TypeFile, Content: []byte("x")},
		"data":      unknown,
	})
	if err := s.Start(ctxT(t)); !errors.Is(err, errkind.ErrFailedPrecondition) {
		t.Fatalf("Start = %v", err)
	}
	ls, err := s.Agent().ListDir(ctxT(t), &agentdv1.ListDirRequest{Path: ".", User: "root"})
	if err != nil || len(ls.GetEntries()) != 0 {
		t.Fatalf("something was written: %v %v", ls.GetEntries(), err)
	}
}
