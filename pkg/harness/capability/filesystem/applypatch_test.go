package filesystem_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
)

const rejected = "\nNo file was changed: the patch applies completely or not at all. Correct it and send it again."

const fiveLines = "one\ntwo\nthree\nfour\nfive\n"

func TestApplyPatchSuccessSummary(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	s.write("a.txt", fiveLines)
	s.write("sub/b.txt", "alpha\nbeta\n")
	s.write("old.txt", "bye\n")
	res := s.call("apply_patch", "", "*** Begin Patch\n"+
		"*** Add File: new.txt\n+hello\n+\n+world\n"+
		"*** Update File: a.txt\n@@\n one\n-two\n+2\n three\n"+
		"*** Update File: sub/b.txt\n*** Move to: sub/c.txt\n@@\n alpha\n-beta\n+gamma\n"+
		"*** Delete File: old.txt\n"+
		"*** End Patch")
	const want = "Created new.txt\nUpdated a.txt\nUpdated sub/b.txt\nMoved sub/b.txt to sub/c.txt\nDeleted old.txt"
	if res.IsError || res.Output != want {
		t.Fatalf("result = %+v, want output %q", res, want)
	}
	for p, content := range map[string]string{
		"new.txt": "hello\n\nworld\n", "a.txt": "one\n2\nthree\nfour\nfive\n",
		"sub/b.txt": "<missing>", "sub/c.txt": "alpha\ngamma\n", "old.txt": "<missing>",
	} {
		if got := s.read(p); got != content {
			t.Errorf("%s = %q, want %q", p, got, content)
		}
	}
}

// Every rejection names the file and what did not match, says that nothing
// changed, is marked as an error, and leaves the workspace as it was.
func TestApplyPatchRejections(t *testing.T) {
	for _, tc := range []struct {
		name, workdir, patch, want string
	}{
		{
			name:  "missing file",
			patch: "*** Begin Patch\n*** Update File: missing.txt\n@@\n-x\n+y\n*** End Patch\n",
			want:  "apply_patch verification failed: patch rejected: update missing.txt: the file to update does not exist (use '*** Add File: <path>' to create it)",
		},
		{
			name:  "missing file to delete",
			patch: "*** Begin Patch\n*** Delete File: gone.txt\n*** End Patch\n",
			want:  "apply_patch verification failed: patch rejected: delete gone.txt: the file to delete does not exist",
		},
		{
			name:  "context mismatch",
			patch: "*** Begin Patch\n*** Update File: a.txt\n@@\n two\n-thre\n+3\n four\n*** End Patch\n",
			want: "apply_patch verification failed: patch rejected: line 3 (update a.txt): hunk 1 does not match: its context and removed lines " +
				"do not occur anywhere in the file, even ignoring whitespace and typographic quotes and dashes; copy them exactly from the current file\n" +
				"The patch looked for these lines in a.txt (shown without their ' ', '-' or '@@ ' prefix):\n" +
				"    two\n    thre\n    four\n" +
				"The closest part of a.txt starts at line 2 and currently reads:\n" +
				"     2 | two\n     3 | three\n     4 | four",
		},
		{
			name:  "second hunk mismatch",
			patch: "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+1\n@@\n-FIVE!\n+5\n*** End Patch\n",
			want: "apply_patch verification failed: patch rejected: line 6 (update a.txt): hunk 2 does not match: its context and removed lines " +
				"do not occur at or after line 2 (where the previous hunk or anchor left the search), even ignoring whitespace and typographic quotes and dashes; copy them exactly from the current file\n" +
				"The patch looked for these lines in a.txt (shown without their ' ', '-' or '@@ ' prefix):\n" +
				"    FIVE!",
		},
		{
			name:  "anchor not found",
			patch: "*** Begin Patch\n*** Update File: a.txt\n@@ def nope():\n-two\n+2\n*** End Patch\n",
			want: "apply_patch verification failed: patch rejected: line 3 (update a.txt): anchor '@@ def nope():' of hunk 1 is not a line of the file " +
				"at or after line 1; an anchor must repeat a line of the file, such as the class or function line enclosing the change\n" +
				"The patch looked for these lines in a.txt (shown without their ' ', '-' or '@@ ' prefix):\n" +
				"    def nope():",
		},
		{
			name:  "add where a directory exists",
			patch: "*** Begin Patch\n*** Add File: dir\n+x\n*** End Patch\n",
			want:  "apply_patch verification failed: patch rejected: add dir: a directory exists at this path",
		},
		{
			name:  "malformed",
			patch: "*** Begin Patch\n*** Frobnicate File: a.txt\n*** End Patch\n",
			want: "apply_patch verification failed: invalid patch: line 2: '*** Frobnicate File: a.txt' is not a file operation header; each operation " +
				"starts with '*** Add File: <path>', '*** Delete File: <path>' or '*** Update File: <path>', and the patch ends with '*** End Patch'",
		},
		{
			name:  "empty patch",
			patch: "*** Begin Patch\n*** End Patch\n",
			want:  "apply_patch verification failed: invalid patch: the patch contains no file operations",
		},
		{
			name:  "escape with dot-dot",
			patch: "*** Begin Patch\n*** Add File: ../escape.txt\n+x\n*** End Patch\n",
			want: "apply_patch verification failed: the path '../escape.txt' leads outside the workspace; " +
				"every path of a patch must stay inside the workspace, also through symbolic links.",
		},
		{
			name:    "escape from the workdir",
			workdir: "dir",
			patch:   "*** Begin Patch\n*** Update File: ../../etc/passwd\n@@\n-root\n+toor\n*** End Patch\n",
			want: "apply_patch verification failed: the path '../../etc/passwd' leads outside the workspace " +
				"(relative paths are resolved from the working directory 'dir'); every path of a patch must stay inside the workspace, also through symbolic links.",
		},
		{
			name:  "escape with an absolute path",
			patch: "*** Begin Patch\n*** Add File: /etc/bulkhead-test\n+x\n*** End Patch\n",
			want: "apply_patch verification failed: the path '/etc/bulkhead-test' leads outside the workspace; " +
				"every path of a patch must stay inside the workspace, also through symbolic links.",
		},
		{
			name:  "escape through a symlink",
			patch: "*** Begin Patch\n*** Add File: link/evil\n+x\n*** End Patch\n",
			want: "apply_patch verification failed: the path 'link/evil' leads outside the workspace; " +
				"every path of a patch must stay inside the workspace, also through symbolic links.",
		},
		{
			name:  "file below a file",
			patch: "*** Begin Patch\n*** Add File: a.txt/inner.txt\n+x\n*** End Patch\n",
			want:  "apply_patch verification failed: 'a.txt/inner.txt': not a directory: a parent of this path is a file.",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t, filesystem.Options{})
			s.write("a.txt", fiveLines)
			s.write("dir/keep.txt", "keep\n")
			outside := t.TempDir()
			if err := os.Symlink(outside, filepath.Join(s.d.Workspace, "link")); err != nil {
				t.Fatal(err)
			}
			res := s.call("apply_patch", tc.workdir, tc.patch)
			if !res.IsError {
				t.Fatalf("not marked as an error: %q", res.Output)
			}
			if res.Output != tc.want+rejected {
				t.Errorf("output:\n%s\nwant:\n%s", res.Output, tc.want+rejected)
			}
			if strings.Contains(res.Output, s.d.Workspace) || strings.Contains(res.Output, filepath.Dir(s.d.Workspace)) || strings.Contains(res.Output, outside) {
				t.Errorf("output reveals a host path: %q", res.Output)
			}
			if s.read("a.txt") != fiveLines || s.read("dir/keep.txt") != "keep\n" {
				t.Errorf("workspace changed: a.txt=%q", s.read("a.txt"))
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Errorf("wrote outside the workspace: %v", entries)
			}
			for _, p := range []string{"escape.txt", "../escape.txt", "missing.txt"} {
				if s.read(p) != "<missing>" {
					t.Errorf("%s was created", p)
				}
			}
		})
	}
}

// Add File on an existing file replaces it, as in the reference.
func TestApplyPatchAddReplacesExistingFile(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	s.write("dup.txt", "old\n")
	res := s.call("apply_patch", "", "*** Begin Patch\n*** Add File: dup.txt\n+new\n*** End Patch\n")
	if res.IsError || res.Output != "Created dup.txt" || s.read("dup.txt") != "new\n" {
		t.Fatalf("result %+v, file %q", res, s.read("dup.txt"))
	}
}

// A patch whose second file does not apply changes neither file: the
// daemon plans the whole patch before it writes anything.
func TestApplyPatchIsAtomicAcrossFiles(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	s.write("first.txt", fiveLines)
	s.write("second.txt", "alpha\nbeta\n")
	res := s.call("apply_patch", "", "*** Begin Patch\n"+
		"*** Update File: first.txt\n@@\n-one\n+ONE\n"+
		"*** Add File: third.txt\n+new\n"+
		"*** Update File: second.txt\n@@\n-gamma\n+delta\n"+
		"*** End Patch\n")
	if !res.IsError || !strings.Contains(res.Output, "line 9 (update second.txt): hunk 1 does not match") {
		t.Fatalf("result = %+v", res)
	}
	if got := s.read("first.txt"); got != fiveLines {
		t.Errorf("first.txt changed: %q", got)
	}
	if got := s.read("second.txt"); got != "alpha\nbeta\n" {
		t.Errorf("second.txt changed: %q", got)
	}
	if got := s.read("third.txt"); got != "<missing>" {
		t.Errorf("third.txt created: %q", got)
	}
}

// Relative paths resolve against the working directory; the summary
// shows them as the patch wrote them.
func TestApplyPatchWorkdir(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	s.write("repo/src/main.go", "package main\n")
	s.write("top.txt", "top\n")
	res := s.call("apply_patch", "repo", "*** Begin Patch\n"+
		"*** Update File: src/main.go\n@@\n-package main\n+package app\n"+
		"*** Add File: docs/readme.md\n+# repo\n"+
		"*** Update File: ../top.txt\n@@\n-top\n+TOP\n"+
		"*** End Patch\n")
	if res.IsError || res.Output != "Updated src/main.go\nCreated docs/readme.md\nUpdated ../top.txt" {
		t.Fatalf("result = %+v", res)
	}
	if s.read("repo/src/main.go") != "package app\n" || s.read("repo/docs/readme.md") != "# repo\n" || s.read("top.txt") != "TOP\n" {
		t.Errorf("files: %q %q %q", s.read("repo/src/main.go"), s.read("repo/docs/readme.md"), s.read("top.txt"))
	}
	if s.read("src/main.go") != "<missing>" || s.read("docs/readme.md") != "<missing>" {
		t.Error("a relative path was resolved against the workspace root")
	}
}

func TestApplyPatchJSONFallback(t *testing.T) {
	s := newSandbox(t, filesystem.Options{PatchFormat: filesystem.PatchJSON})
	s.write("w/a.txt", fiveLines)
	s.write("w/b.txt", "bee\n")
	s.write("w/c.txt", "sea\n")
	res := s.call("apply_patch", "w", `{"operations":[`+
		`{"type":"create_file","path":"new.txt","diff":"+hello\n+world\n"},`+
		`{"type":"update_file","path":"a.txt","diff":"@@ two\n three\n-four\n+4\n"},`+
		`{"type":"update_file","path":"b.txt","move_to":"moved/b.txt","diff":"@@\n-bee\n+B\n"},`+
		`{"type":"delete_file","path":"c.txt"}]}`)
	const want = "Created new.txt\nUpdated a.txt\nUpdated b.txt\nMoved b.txt to moved/b.txt\nDeleted c.txt"
	if res.IsError || res.Output != want {
		t.Fatalf("result = %+v", res)
	}
	for p, content := range map[string]string{
		"w/new.txt": "hello\nworld\n", "w/a.txt": "one\ntwo\nthree\n4\nfive\n",
		"w/b.txt": "<missing>", "w/moved/b.txt": "B\n", "w/c.txt": "<missing>",
	} {
		if got := s.read(p); got != content {
			t.Errorf("%s = %q, want %q", p, got, content)
		}
	}

	for _, tc := range []struct{ name, input, want string }{
		{"unknown type", `{"operations":[{"type":"create_file","path":"x.txt","diff":"+x\n"},{"type":"rename_file","path":"a.txt"}]}`,
			"apply_patch verification failed: invalid patch: file a.txt: operation 2 (rename_file): unknown operation type 'rename_file'; want create_file, update_file or delete_file"},
		{"create without plus", `{"operations":[{"type":"create_file","path":"x.txt","diff":"x\n"}]}`,
			"apply_patch verification failed: invalid patch: line 1 (file x.txt): operation 1 (create_file): line 'x' of a create_file diff does not start with '+'; every line of a new file, blank ones too, needs a '+' prefix"},
		{"not JSON", `{"operations": [`,
			"apply_patch verification failed: the arguments are not valid operations JSON: unexpected end of JSON input"},
		{"context mismatch", `{"operations":[{"type":"create_file","path":"x.txt","diff":"+x\n"},{"type":"update_file","path":"a.txt","diff":"@@\n-nine\n+9\n"}]}`,
			"apply_patch verification failed: patch rejected: line 1 (update a.txt): hunk 1 does not match: its context and removed lines do not occur anywhere in the file, " +
				"even ignoring whitespace and typographic quotes and dashes; copy them exactly from the current file\n" +
				"The patch looked for these lines in a.txt (shown without their ' ', '-' or '@@ ' prefix):\n    nine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := s.call("apply_patch", "w", tc.input)
			if !res.IsError {
				t.Fatalf("not an error: %q", res.Output)
			}
			want := tc.want + rejected
			if res.Output != want {
				t.Errorf("output:\n%s\nwant:\n%s", res.Output, want)
			}
			if s.read("w/x.txt") != "<missing>" {
				t.Error("x.txt was created")
			}
		})
	}
}

// The freeform tool also takes the operations JSON, as the reference's
// freeform tool does.
func TestApplyPatchFreeformAcceptsJSON(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	for i, input := range []string{
		`{"type":"create_file","path":"one.txt","diff":"+1\n"}`,
		`{"operation":{"type":"create_file","path":"two.txt","diff":"+2\n"}}`,
		` [{"type":"create_file","path":"three.txt","diff":"+3\n"}]`,
	} {
		res := s.call("apply_patch", "", input)
		name := []string{"one.txt", "two.txt", "three.txt"}[i]
		if res.IsError || res.Output != "Created "+name {
			t.Errorf("%s: %+v", input, res)
		}
	}
}
