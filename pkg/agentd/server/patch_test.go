package server

import (
	"context"

	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// patchEnvelope wraps V4A file sections in Begin/End Patch.
func patchEnvelope(lines ...string) string {
	return "*** Begin Patch\n" + strings.Join(lines, "\n") + "\n*** End Patch\n"
}

type patchChange struct {
	kind          agentclient.PatchChangeKind
	path, newPath string
}

func changesOf(resp *agentclient.PatchResult) []patchChange {
	var out []patchChange
	for _, c := range resp.Changes {
		out = append(out, patchChange{c.Kind, c.Path, c.NewPath})
	}
	return out
}

const (
	chCreated = agentclient.PatchCreated
	chUpdated = agentclient.PatchUpdated
	chMoved   = agentclient.PatchMoved
	chDeleted = agentclient.PatchDeleted
)

func opsRequest(o ...*agentdv1.PatchOperation) *agentdv1.ApplyPatchRequest {
	return &agentdv1.ApplyPatchRequest{Input: &agentdv1.ApplyPatchRequest_Operations{Operations: &agentdv1.PatchOperations{Operations: o}}}
}

func textPatch(text string) *agentdv1.ApplyPatchRequest {
	return &agentdv1.ApplyPatchRequest{Input: &agentdv1.ApplyPatchRequest_Patch{Patch: text}}
}

// applyPatch sends req, a request of the wire, through the client's Go API
// (ApplyPatch for text, ApplyOperations for operations).
func applyPatch(ctx context.Context, c *agentclient.Client, req *agentdv1.ApplyPatchRequest) (*agentclient.PatchResult, error) {
	opts := agentclient.ApplyPatchOptions{Cwd: req.Cwd, User: req.User, DryRun: req.GetDryRun()}
	if req.GetOperations() == nil {
		return c.ApplyPatch(ctx, req.GetPatch(), opts)
	}
	types := map[agentdv1.PatchOperationType]agentclient.PatchOperationType{
		opCreate: agentclient.PatchCreateFile, opUpdate: agentclient.PatchUpdateFile, opDelete: agentclient.PatchDeleteFile,
	}
	ops := []agentclient.PatchOperation{}
	for _, o := range req.GetOperations().GetOperations() {
		ops = append(ops, agentclient.PatchOperation{Type: types[o.Type], Path: o.Path, Diff: o.GetDiff(), MoveTo: o.GetMoveTo()})
	}
	return c.ApplyOperations(ctx, ops, opts)
}

var (
	opCreate = agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_CREATE_FILE
	opUpdate = agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_UPDATE_FILE
	opDelete = agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_DELETE_FILE
)

// seedPatchTree fills a workspace with the files most patch tests start from.
func seedPatchTree(t *testing.T, ws string) {
	t.Helper()
	mustWrite(t, filepath.Join(ws, "a.txt"), "one\ntwo\nthree\n", 0o644)
	mustWrite(t, filepath.Join(ws, "gone.txt"), "bye\n", 0o644)
	mustWrite(t, filepath.Join(ws, "m.txt"), "move me\nline2\n", 0o755)
	mustWrite(t, filepath.Join(ws, "keep/k.txt"), "k\n", 0o600)
}

const allKindsPatch = `*** Begin Patch
*** Add File: new/dir/new.txt
+hello
+world
*** Update File: a.txt
@@
 one
-two
+TWO
 three
*** Delete File: gone.txt
*** Update File: m.txt
*** Move to: moved/m2.txt
@@
 move me
-line2
+LINE2
*** End Patch
`

func allKindsOps() *agentdv1.ApplyPatchRequest {
	return opsRequest(
		&agentdv1.PatchOperation{Type: opCreate, Path: "new/dir/new.txt", Diff: "+hello\n+world\n"},
		&agentdv1.PatchOperation{Type: opUpdate, Path: "a.txt", Diff: "@@\n one\n-two\n+TWO\n three\n"},
		&agentdv1.PatchOperation{Type: opDelete, Path: "gone.txt"},
		&agentdv1.PatchOperation{Type: opUpdate, Path: "m.txt", MoveTo: "moved/m2.txt", Diff: "@@\n move me\n-line2\n+LINE2\n"},
	)
}

func TestApplyPatchAllKinds(t *testing.T) {
	wantChanges := []patchChange{
		{chCreated, "new/dir/new.txt", ""},
		{chUpdated, "a.txt", ""},
		{chDeleted, "gone.txt", ""},
		{chMoved, "m.txt", "moved/m2.txt"},
	}
	dir := fs.ModeDir | 0o755
	wantTree := map[string]treeEntry{
		".":               {Mode: dir},
		"a.txt":           {Mode: 0o644, Content: "one\nTWO\nthree\n"},
		"keep":            {Mode: dir},
		"keep/k.txt":      {Mode: 0o600, Content: "k\n"},
		"new":             {Mode: dir},
		"new/dir":         {Mode: dir},
		"new/dir/new.txt": {Mode: 0o644, Content: "hello\nworld\n"},
		"moved":           {Mode: dir},
		"moved/m2.txt":    {Mode: 0o755, Content: "move me\nLINE2\n"},
	}
	trees := map[string]map[string]treeEntry{}
	for name, req := range map[string]*agentdv1.ApplyPatchRequest{"text": textPatch(allKindsPatch), "operations": allKindsOps()} {
		t.Run(name, func(t *testing.T) {
			td := newTestDaemon(t, nil)
			seedPatchTree(t, td.workspace)
			resp, err := applyPatch(ctxT(t), td.client, req)
			if err != nil {
				t.Fatal(err)
			}
			if got := changesOf(resp); !slices.Equal(got, wantChanges) {
				t.Fatalf("changes %v, want %v", got, wantChanges)
			}
			tree := snapshotTree(t, td.workspace)
			assertSameTree(t, "patched workspace (want/got)", wantTree, tree)
			assertNoTemp(t, td.workspace)
			trees[name] = tree
		})
	}
	if len(trees) == 2 {
		assertSameTree(t, "text form vs operations form", trees["text"], trees["operations"])
	}
}

// richTree seeds a workspace with files of several modes, a directory and
// a symlink, for all-or-nothing checks.
func richTree(t *testing.T, ws string) {
	t.Helper()
	mustWrite(t, filepath.Join(ws, "a.txt"), "alpha\nbeta\ngamma\n", 0o644)
	mustWrite(t, filepath.Join(ws, "b.txt"), "first\nsecond\nthird\n", 0o600)
	mustWrite(t, filepath.Join(ws, "d.txt"), "doomed\n", 0o640)
	mustWrite(t, filepath.Join(ws, "bin/run.sh"), "#!/bin/sh\necho run\n", 0o755)
	mustWrite(t, filepath.Join(ws, "dir/nested/deep.txt"), "deep\n", 0o644)
	if err := os.Symlink("a.txt", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
}

func TestApplyPatchRejectedChangesNothing(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	richTree(t, td.workspace)
	before := snapshotTree(t, td.workspace)

	patch := patchEnvelope(
		"*** Update File: a.txt",
		"@@",
		"-beta",
		"+BETA",
		"*** Update File: b.txt",
		"@@",
		" first",
		"-this line is not there",
		"+replacement",
		"*** Add File: created.txt",
		"+new",
		"*** Delete File: d.txt",
		"*** Update File: bin/run.sh",
		"*** Move to: bin/renamed.sh",
		"@@",
		"-echo run",
		"+echo renamed",
	)
	_, err := applyPatch(ctx, td.client, textPatch(patch))
	if !errors.Is(err, errkind.ErrPatchRejected) {
		t.Fatalf("want ErrPatchRejected, got %v", err)
	}
	if errkind.Retryable(err) {
		t.Fatal("a rejected patch is not retryable as is")
	}
	rej := agentclient.PatchRejection(err)
	if rej == nil {
		t.Fatalf("no PatchRejection detail in %v", err)
	}
	if rej.Path != "b.txt" || !slices.Contains(rej.ExpectedLines, "this line is not there") {
		t.Fatalf("rejection %v", rej)
	}
	if !strings.Contains(err.Error(), "b.txt") {
		t.Fatalf("the error text does not name the file: %v", err)
	}
	assertSameTree(t, "workspace after a rejected patch", before, snapshotTree(t, td.workspace))
	assertNoTemp(t, td.workspace)

	// The JSON form is rejected the same way.
	_, err = applyPatch(ctx, td.client, opsRequest(
		&agentdv1.PatchOperation{Type: opUpdate, Path: "a.txt", Diff: "@@\n-beta\n+BETA\n"},
		&agentdv1.PatchOperation{Type: opUpdate, Path: "b.txt", Diff: "@@\n first\n-this line is not there\n+x\n"},
	))
	if rej := agentclient.PatchRejection(err); !errors.Is(err, errkind.ErrPatchRejected) || rej.Path != "b.txt" {
		t.Fatalf("operations form: %v (rejection %v)", err, rej)
	}

	// Missing files and deleting a directory are rejections too.
	for _, p := range []string{
		patchEnvelope("*** Add File: ok.txt", "+x", "*** Update File: missing.txt", "@@", "-a", "+b"),
		patchEnvelope("*** Add File: ok.txt", "+x", "*** Delete File: missing.txt"),
		patchEnvelope("*** Add File: ok.txt", "+x", "*** Delete File: dir"),
		patchEnvelope("*** Add File: ok.txt", "+x", "*** Add File: a.txt/child", "+x"),
	} {
		_, err := applyPatch(ctx, td.client, textPatch(p))
		if !errors.Is(err, errkind.ErrPatchRejected) {
			t.Fatalf("patch\n%s\nwant ErrPatchRejected, got %v", p, err)
		}
		assertSameTree(t, "workspace after a rejected patch", before, snapshotTree(t, td.workspace))
	}
}

func TestApplyPatchMalformed(t *testing.T) {
	td := newTestDaemon(t, func(c *agentd.Config) { c.MaxPatchBytes = 4096 })
	ctx := ctxT(t)
	richTree(t, td.workspace)
	before := snapshotTree(t, td.workspace)

	for _, req := range []*agentdv1.ApplyPatchRequest{
		textPatch("this is not a patch"),
		textPatch(""),
		{}, // neither form
		textPatch("*** Begin Patch\n*** End Patch\n"),
		textPatch(patchEnvelope("*** Frobnicate File: a.txt", "+x")),
		textPatch(patchEnvelope("*** Update File: a.txt")), // no hunks
		textPatch(patchEnvelope("*** Add File: x.txt", "not a plus line")),
		opsRequest(),
		opsRequest(&agentdv1.PatchOperation{Type: agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_UNSPECIFIED, Path: "a.txt"}),
		opsRequest(&agentdv1.PatchOperation{Type: opCreate, Path: "", Diff: "+x\n"}),
		opsRequest(&agentdv1.PatchOperation{Type: opCreate, Path: "x", Diff: "+x\nno plus\n"}),
	} {
		_, err := applyPatch(ctx, td.client, req)
		if !errors.Is(err, errkind.ErrInvalidArgument) {
			t.Fatalf("malformed patch %v: want ErrInvalidArgument, got %v", req, err)
		}
	}
	// Past the configured limit.
	_, err := applyPatch(ctx, td.client, textPatch(patchEnvelope("*** Add File: big.txt", "+"+strings.Repeat("x", 5000))))
	if !errors.Is(err, errkind.ErrResourceExhausted) {
		t.Fatalf("oversized patch: want ErrResourceExhausted, got %v", err)
	}
	assertSameTree(t, "workspace after malformed patches", before, snapshotTree(t, td.workspace))
}

func TestApplyPatchEscapeChangesNothing(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	richTree(t, ws)
	outside := t.TempDir()
	mustWrite(t, filepath.Join(outside, "secret.txt"), "secret\nline\n", 0o644)
	sibling := filepath.Join(filepath.Dir(ws), "sibling.txt")
	mustWrite(t, sibling, "sibling\n", 0o644)
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	before, outBefore := snapshotTree(t, ws), snapshotTree(t, outside)

	for _, c := range []struct {
		cwd, patch string
	}{
		{"", patchEnvelope("*** Add File: ok.txt", "+fine", "*** Add File: ../outside.txt", "+pwned")},
		{"", patchEnvelope("*** Update File: ../sibling.txt", "@@", "-sibling", "+pwned")},
		{"", patchEnvelope("*** Delete File: ../sibling.txt")},
		{"", patchEnvelope("*** Add File: ok.txt", "+fine", "*** Add File: /etc/bulkhead-pwned", "+pwned")},
		{"", patchEnvelope("*** Add File: out/new.txt", "+pwned")},
		{"", patchEnvelope("*** Delete File: out/secret.txt")},
		{"", patchEnvelope("*** Update File: out/secret.txt", "@@", "-line", "+pwned")},
		{"", patchEnvelope("*** Update File: a.txt", "*** Move to: ../moved.txt", "@@", "-beta", "+BETA")},
		{"", patchEnvelope("*** Update File: a.txt", "*** Move to: out/moved.txt", "@@", "-beta", "+BETA")},
		{"", patchEnvelope("*** Add File: dir/../../escape.txt", "+pwned")},
		{"..", patchEnvelope("*** Add File: escape.txt", "+pwned")},
		{"out", patchEnvelope("*** Add File: escape.txt", "+pwned")},
		{"dir", patchEnvelope("*** Add File: ../../escape.txt", "+pwned")},
	} {
		req := textPatch(c.patch)
		req.Cwd = c.cwd
		_, err := applyPatch(ctx, td.client, req)
		if !errors.Is(err, errkind.ErrPathEscape) {
			t.Fatalf("cwd %q patch\n%s\nwant ErrPathEscape, got %v", c.cwd, c.patch, err)
		}
		for _, h := range []string{outside, filepath.Dir(ws)} {
			if strings.Contains(err.Error(), h) {
				t.Fatalf("the error reveals host path %s: %v", h, err)
			}
		}
		assertSameTree(t, "workspace", before, snapshotTree(t, ws))
		assertSameTree(t, "outside", outBefore, snapshotTree(t, outside))
	}
	assertMissing(t, filepath.Join(filepath.Dir(ws), "outside.txt"))
	assertMissing(t, filepath.Join(filepath.Dir(ws), "escape.txt"))
	assertMissing(t, filepath.Join(filepath.Dir(ws), "moved.txt"))
	assertMissing(t, "/etc/bulkhead-pwned")
	if diskContent(t, sibling) != "sibling\n" {
		t.Fatal("a file next to the workspace changed")
	}
}

func TestApplyPatchDryRun(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	seedPatchTree(t, td.workspace)
	before := snapshotTree(t, td.workspace)
	req := textPatch(allKindsPatch)
	req.DryRun = true
	resp, err := applyPatch(ctx, td.client, req)
	if err != nil {
		t.Fatal(err)
	}
	want := []patchChange{{chCreated, "new/dir/new.txt", ""}, {chUpdated, "a.txt", ""}, {chDeleted, "gone.txt", ""}, {chMoved, "m.txt", "moved/m2.txt"}}
	if got := changesOf(resp); !slices.Equal(got, want) {
		t.Fatalf("dry run changes %v, want %v", got, want)
	}
	assertSameTree(t, "workspace after a dry run", before, snapshotTree(t, td.workspace))
	// A dry run that would not apply is rejected the same way.
	bad := textPatch(patchEnvelope("*** Update File: a.txt", "@@", "-nope", "+x"))
	bad.DryRun = true
	if _, err := applyPatch(ctx, td.client, bad); !errors.Is(err, errkind.ErrPatchRejected) || agentclient.PatchRejection(err).Path != "a.txt" {
		t.Fatalf("dry run of a bad patch: %v", err)
	}
	// And the real run then applies.
	req.DryRun = false
	if _, err := applyPatch(ctx, td.client, req); err != nil {
		t.Fatal(err)
	}
	if diskContent(t, filepath.Join(td.workspace, "a.txt")) != "one\nTWO\nthree\n" {
		t.Fatal("the real run did not apply")
	}
}

func TestApplyPatchCwd(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	mustWrite(t, filepath.Join(ws, "a.txt"), "root a\n", 0o644)
	mustWrite(t, filepath.Join(ws, "sub/a.txt"), "sub a\n", 0o644)
	patch := patchEnvelope(
		"*** Update File: a.txt",
		"@@",
		"-sub a",
		"+sub A",
		"*** Add File: b.txt",
		"+sub b",
	)
	for _, cwd := range []string{"sub", "./sub/", filepath.Join(ws, "sub")} {
		mustWrite(t, filepath.Join(ws, "sub/a.txt"), "sub a\n", 0o644)
		_ = os.Remove(filepath.Join(ws, "sub/b.txt"))
		req := textPatch(patch)
		req.Cwd = cwd
		resp, err := applyPatch(ctx, td.client, req)
		if err != nil {
			t.Fatalf("cwd %q: %v", cwd, err)
		}
		if got, want := changesOf(resp), []patchChange{{chUpdated, "a.txt", ""}, {chCreated, "b.txt", ""}}; !slices.Equal(got, want) {
			t.Fatalf("cwd %q: changes %v (paths must be as written)", cwd, got)
		}
		if diskContent(t, filepath.Join(ws, "sub/a.txt")) != "sub A\n" || diskContent(t, filepath.Join(ws, "sub/b.txt")) != "sub b\n" {
			t.Fatalf("cwd %q: sub/ not patched", cwd)
		}
		if diskContent(t, filepath.Join(ws, "a.txt")) != "root a\n" {
			t.Fatalf("cwd %q: the root's a.txt was patched", cwd)
		}
		assertMissing(t, filepath.Join(ws, "b.txt"))
	}
	// Without cwd the same patch targets the root, where it does not match.
	_, err := applyPatch(ctx, td.client, textPatch(patch))
	if rej := agentclient.PatchRejection(err); !errors.Is(err, errkind.ErrPatchRejected) || rej.Path != "a.txt" {
		t.Fatalf("no cwd: %v", err)
	}
}

func TestApplyPatchSameFileTwice(t *testing.T) {
	cases := []struct {
		name    string
		seed    map[string]treeEntry
		patch   string
		want    map[string]treeEntry
		changes []patchChange
	}{
		{
			name: "add then update",
			patch: patchEnvelope(
				"*** Add File: n.txt", "+a", "+b",
				"*** Update File: n.txt", "@@", " a", "-b", "+B",
			),
			want:    map[string]treeEntry{"n.txt": {Mode: 0o644, Content: "a\nB\n"}},
			changes: []patchChange{{chCreated, "n.txt", ""}, {chUpdated, "n.txt", ""}},
		},
		{
			name: "update twice",
			seed: map[string]treeEntry{"x.txt": {Mode: 0o600, Content: "1\n2\n3\n"}},
			patch: patchEnvelope(
				"*** Update File: x.txt", "@@", "-1", "+one",
				"*** Update File: x.txt", "@@", "-3", "+three",
			),
			want:    map[string]treeEntry{"x.txt": {Mode: 0o600, Content: "one\n2\nthree\n"}},
			changes: []patchChange{{chUpdated, "x.txt", ""}, {chUpdated, "x.txt", ""}},
		},
		{
			name: "update a file, then move another onto it",
			seed: map[string]treeEntry{
				"a.txt": {Mode: 0o755, Content: "ay\n"},
				"b.txt": {Mode: 0o600, Content: "bee\n"},
			},
			patch: patchEnvelope(
				"*** Update File: b.txt", "@@", "-bee", "+BEE",
				"*** Update File: a.txt", "*** Move to: b.txt", "@@", "-ay", "+AY",
			),
			want:    map[string]treeEntry{"b.txt": {Mode: 0o755, Content: "AY\n"}},
			changes: []patchChange{{chUpdated, "b.txt", ""}, {chMoved, "a.txt", "b.txt"}},
		},
		{
			name: "move, then update the destination",
			seed: map[string]treeEntry{
				"a.txt": {Mode: 0o755, Content: "ay\nline\n"},
				"c.txt": {Mode: 0o644, Content: "sea\n"},
			},
			patch: patchEnvelope(
				"*** Update File: a.txt", "*** Move to: c.txt", "@@", "-ay", "+AY",
				"*** Update File: c.txt", "@@", "-line", "+LINE",
			),
			want:    map[string]treeEntry{"c.txt": {Mode: 0o755, Content: "AY\nLINE\n"}},
			changes: []patchChange{{chMoved, "a.txt", "c.txt"}, {chUpdated, "c.txt", ""}},
		},
		{
			name: "delete then add",
			seed: map[string]treeEntry{"r.txt": {Mode: 0o600, Content: "old\n"}},
			patch: patchEnvelope(
				"*** Delete File: r.txt",
				"*** Add File: r.txt", "+new",
			),
			want:    map[string]treeEntry{"r.txt": {Mode: 0o644, Content: "new\n"}},
			changes: []patchChange{{chDeleted, "r.txt", ""}, {chCreated, "r.txt", ""}},
		},
		{
			name: "move away, then add at the old path",
			seed: map[string]treeEntry{"a.txt": {Mode: 0o755, Content: "ay\n"}},
			patch: patchEnvelope(
				"*** Update File: a.txt", "*** Move to: b.txt", "@@", "-ay", "+AY",
				"*** Add File: a.txt", "+fresh",
			),
			want: map[string]treeEntry{
				"a.txt": {Mode: 0o644, Content: "fresh\n"},
				"b.txt": {Mode: 0o755, Content: "AY\n"},
			},
			changes: []patchChange{{chMoved, "a.txt", "b.txt"}, {chCreated, "a.txt", ""}},
		},
		{
			name: "add, then move onto an existing file",
			seed: map[string]treeEntry{"e.txt": {Mode: 0o600, Content: "e\n"}},
			patch: patchEnvelope(
				"*** Add File: n.txt", "+x",
				"*** Update File: n.txt", "*** Move to: e.txt", "@@", "-x", "+X",
			),
			want:    map[string]treeEntry{"e.txt": {Mode: 0o644, Content: "X\n"}},
			changes: []patchChange{{chCreated, "n.txt", ""}, {chMoved, "n.txt", "e.txt"}},
		},
		{
			name: "move onto a file, then add over it",
			seed: map[string]treeEntry{"a.txt": {Mode: 0o755, Content: "ay\n"}},
			patch: patchEnvelope(
				"*** Update File: a.txt", "*** Move to: b.txt", "@@", "-ay", "+AY",
				"*** Add File: b.txt", "+replaced",
			),
			want:    map[string]treeEntry{"b.txt": {Mode: 0o755, Content: "replaced\n"}},
			changes: []patchChange{{chMoved, "a.txt", "b.txt"}, {chCreated, "b.txt", ""}},
		},
		{
			name: "two spellings of one file",
			seed: map[string]treeEntry{"s.txt": {Mode: 0o644, Content: "1\n2\n"}},
			patch: patchEnvelope(
				"*** Update File: s.txt", "@@", "-1", "+one",
				"*** Update File: ./s.txt", "@@", "-2", "+two",
			),
			want:    map[string]treeEntry{"s.txt": {Mode: 0o644, Content: "one\ntwo\n"}},
			changes: []patchChange{{chUpdated, "s.txt", ""}, {chUpdated, "./s.txt", ""}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			td := newTestDaemon(t, nil)
			for name, e := range c.seed {
				mustWrite(t, filepath.Join(td.workspace, name), e.Content, e.Mode)
			}
			resp, err := applyPatch(ctxT(t), td.client, textPatch(c.patch))
			if err != nil {
				t.Fatal(err)
			}
			if got := changesOf(resp); !slices.Equal(got, c.changes) {
				t.Fatalf("changes %v, want %v", got, c.changes)
			}
			want := map[string]treeEntry{".": {Mode: fs.ModeDir | 0o755}}
			for k, v := range c.want {
				want[k] = v
			}
			assertSameTree(t, "patched (want/got)", want, snapshotTree(t, td.workspace))
			assertNoTemp(t, td.workspace)
		})
	}
}

func TestApplyPatchMoveKeepsMode(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	mustWrite(t, filepath.Join(ws, "run.sh"), "#!/bin/sh\necho a\n", 0o755)
	mustWrite(t, filepath.Join(ws, "secret.cfg"), "k=v\n", 0o600)
	mustWrite(t, filepath.Join(ws, "dest.sh"), "replaced\n", 0o644)
	_, err := applyPatch(ctx, td.client, textPatch(patchEnvelope(
		"*** Update File: run.sh", "*** Move to: bin/run.sh", "@@", "-echo a", "+echo b",
		"*** Update File: secret.cfg", "*** Move to: conf/secret.cfg", "@@", "-k=v", "+k=w",
	)))
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{"bin/run.sh": 0o755, "conf/secret.cfg": 0o600} {
		fi, err := os.Stat(filepath.Join(ws, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Fatalf("%s: mode %v after move, want %v", p, fi.Mode(), want)
		}
	}
	if diskContent(t, filepath.Join(ws, "bin/run.sh")) != "#!/bin/sh\necho b\n" {
		t.Fatal("moved content wrong")
	}
	assertMissing(t, filepath.Join(ws, "run.sh"))
	assertMissing(t, filepath.Join(ws, "secret.cfg"))
	// Moving onto an existing file: the moved file's mode wins.
	_, err = applyPatch(ctx, td.client, textPatch(patchEnvelope(
		"*** Update File: bin/run.sh", "*** Move to: dest.sh", "@@", "-echo b", "+echo c",
	)))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(ws, "dest.sh")); fi.Mode() != 0o755 || diskContent(t, filepath.Join(ws, "dest.sh")) != "#!/bin/sh\necho c\n" {
		t.Fatalf("move onto an existing file: mode %v", fi.Mode())
	}
	// The same through the operations form, on the complex (touched-twice) path.
	_, err = applyPatch(ctx, td.client, opsRequest(
		&agentdv1.PatchOperation{Type: opUpdate, Path: "dest.sh", MoveTo: "final.sh", Diff: "@@\n-echo c\n+echo d\n"},
		&agentdv1.PatchOperation{Type: opUpdate, Path: "final.sh", Diff: "@@\n-echo d\n+echo e\n"},
	))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(ws, "final.sh")); fi.Mode() != 0o755 || diskContent(t, filepath.Join(ws, "final.sh")) != "#!/bin/sh\necho e\n" {
		t.Fatalf("move then update: mode %v", fi.Mode())
	}
}

func TestApplyPatchRunAs(t *testing.T) {
	skipUnlessRoot(t)
	etc := fakeEtc(t)
	td := newTestDaemon(t, func(c *agentd.Config) { c.EtcRoot = etc })
	ctx := ctxT(t)
	ws := td.workspace
	if err := os.Chmod(ws, 0o777); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(ws, "ro.txt"), "root\nonly\n", 0o444)
	mustWrite(t, filepath.Join(ws, "shared.txt"), "shared\n", 0o666)
	mustWrite(t, filepath.Join(ws, "locked/inner.txt"), "inner\n", 0o666) // locked/ is root's 0755
	before := snapshotTree(t, ws)

	for _, p := range []string{
		patchEnvelope("*** Update File: ro.txt", "@@", "-only", "+analyst"),
		patchEnvelope("*** Add File: analyst.txt", "+mine", "*** Update File: shared.txt", "@@", "-shared", "+SHARED", "*** Update File: ro.txt", "@@", "-only", "+analyst"),
		patchEnvelope("*** Update File: shared.txt", "@@", "-shared", "+SHARED", "*** Delete File: locked/inner.txt"),
		patchEnvelope("*** Add File: analyst.txt", "+mine", "*** Add File: locked/new.txt", "+x"),
	} {
		req := textPatch(p)
		req.User = "analyst"
		_, err := applyPatch(ctx, td.client, req)
		if !errors.Is(err, errkind.ErrPermissionDenied) {
			t.Fatalf("patch as analyst\n%s\nwant ErrPermissionDenied, got %v", p, err)
		}
		assertSameTree(t, "workspace after a denied patch", before, snapshotTree(t, ws))
		assertNoTemp(t, ws)
		assertNoTemp(t, filepath.Join(ws, "locked"))
	}
	// What analyst may do, it does, as itself.
	req := textPatch(patchEnvelope("*** Add File: analyst.txt", "+mine", "*** Update File: shared.txt", "@@", "-shared", "+SHARED"))
	req.User = "analyst"
	if _, err := applyPatch(ctx, td.client, req); err != nil {
		t.Fatal(err)
	}
	if uid, gid := diskOwner(t, filepath.Join(ws, "analyst.txt")); uid != 65534 || gid != 65534 {
		t.Fatalf("file added by analyst owned by %d:%d", uid, gid)
	}
	if diskContent(t, filepath.Join(ws, "shared.txt")) != "SHARED\n" {
		t.Fatal("analyst's update did not land")
	}
	// Root may patch its read-only file.
	if _, err := applyPatch(ctx, td.client, textPatch(patchEnvelope("*** Update File: ro.txt", "@@", "-only", "+root"))); err != nil {
		t.Fatal(err)
	}
	if diskContent(t, filepath.Join(ws, "ro.txt")) != "root\nroot\n" {
		t.Fatal("root's patch did not land")
	}
	// An unknown user.
	req = textPatch(patchEnvelope("*** Add File: ghost.txt", "+x"))
	req.User = "mallory"
	if _, err := applyPatch(ctx, td.client, req); !errors.Is(err, errkind.ErrNotFound) || !strings.Contains(err.Error(), "run_as") {
		t.Fatalf("unknown user: %v", err)
	}
	assertMissing(t, filepath.Join(ws, "ghost.txt"))
}

func TestApplyPatchKeepsCRLF(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	mustWrite(t, filepath.Join(ws, "win.txt"), "a\r\nb\r\nc\r\n", 0o644)
	mustWrite(t, filepath.Join(ws, "win2.txt"), "a\r\nb\r\nc\r\n", 0o644)
	if _, err := applyPatch(ctx, td.client, textPatch(patchEnvelope("*** Update File: win.txt", "@@", " a", "-b", "+B", "+new", " c"))); err != nil {
		t.Fatal(err)
	}
	if got := diskContent(t, filepath.Join(ws, "win.txt")); got != "a\r\nB\r\nnew\r\nc\r\n" {
		t.Fatalf("CRLF file became %q", got)
	}
	if _, err := applyPatch(ctx, td.client, opsRequest(&agentdv1.PatchOperation{Type: opUpdate, Path: "win2.txt", Diff: "@@\n a\n-b\n+B\n+new\n c\n"})); err != nil {
		t.Fatal(err)
	}
	if got := diskContent(t, filepath.Join(ws, "win2.txt")); got != "a\r\nB\r\nnew\r\nc\r\n" {
		t.Fatalf("CRLF file (operations form) became %q", got)
	}
}

func TestApplyPatchMoveOntoItselfKeepsFile(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	ws := td.workspace
	mustWrite(t, filepath.Join(ws, "a.txt"), "ay\n", 0o755)
	mustWrite(t, filepath.Join(ws, "sub/b.txt"), "bee\n", 0o600)
	// The same file under another spelling (absolute; through cwd and "..").
	for _, c := range []struct{ cwd, from, to, want string }{
		{"", "a.txt", filepath.Join(ws, "a.txt"), "a.txt"},
		{"sub", "b.txt", "../sub/b.txt", "sub/b.txt"},
	} {
		req := textPatch(patchEnvelope("*** Update File: "+c.from, "*** Move to: "+c.to, "@@", "+added"))
		req.Cwd = c.cwd
		if _, err := applyPatch(ctx, td.client, req); err != nil {
			t.Fatalf("move %s onto itself as %s: %v", c.from, c.to, err)
		}
		b, err := os.ReadFile(filepath.Join(ws, c.want))
		if err != nil {
			t.Fatalf("moving %s onto itself (as %s) lost the file: %v", c.from, c.to, err)
		}
		if !strings.HasSuffix(string(b), "added\n") {
			t.Fatalf("%s: content %q", c.want, b)
		}
	}
	if fi, _ := os.Stat(filepath.Join(ws, "a.txt")); fi.Mode() != 0o755 {
		t.Fatalf("a.txt mode %v", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(ws, "sub/b.txt")); fi.Mode() != 0o600 {
		t.Fatalf("sub/b.txt mode %v", fi.Mode())
	}
}
