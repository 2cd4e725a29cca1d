package manifest

import (
	"fmt"
	"strings"
	"testing"
)

// The reference's worked example: lexicographic siblings, "/" on
// directories, the comment column two spaces after the longest label.
func referenceExample() *Manifest {
	return &Manifest{Entries: map[string]*Entry{
		"repo": {Type: TypeDir, Description: "my repo", Children: map[string]*Entry{
			"README.md": {Type: TypeFile, Content: []byte("# hi\n")},
		}},
		"mount-data": {Type: TypeS3Mount, Mount: &Mount{Bucket: "b"}},
		"notes.txt":  {Type: TypeFile},
	}}
}

func TestRenderTreeExact(t *testing.T) {
	deep := &Manifest{Root: "/srv/ws", Entries: map[string]*Entry{
		"a/b/c.txt": {Type: TypeFile, Description: "deep\nfile\t with  spaces"},
		"a/x":       {Type: TypeDir, Children: map[string]*Entry{"y": {Type: TypeFile}}},
		"z":         {Type: TypeFile},
	}}
	cases := []struct {
		name string
		m    *Manifest
		opts TreeOptions
		want string
	}{
		{"reference example, depth 2", referenceExample(), TreeOptions{Depth: 2},
			"/workspace\n" +
				"├── mount-data/    # /workspace/mount-data\n" +
				"├── notes.txt      # /workspace/notes.txt\n" +
				"└── repo/          # /workspace/repo — my repo\n" +
				"    └── README.md  # /workspace/repo/README.md\n"},
		{"reference example, depth 1", referenceExample(), TreeOptions{Depth: 1},
			"/workspace\n" +
				"├── mount-data/  # /workspace/mount-data\n" +
				"├── notes.txt    # /workspace/notes.txt\n" +
				"└── repo/        # /workspace/repo — my repo\n"},
		{"intermediate dirs, unlimited depth", deep, TreeOptions{Depth: -1},
			"/srv/ws\n" +
				"├── a/             # /srv/ws/a\n" +
				"│   ├── b/         # /srv/ws/a/b\n" +
				"│   │   └── c.txt  # /srv/ws/a/b/c.txt — deep file with spaces\n" +
				"│   └── x/         # /srv/ws/a/x\n" +
				"│       └── y      # /srv/ws/a/x/y\n" +
				"└── z              # /srv/ws/z\n"},
		{"cut by depth, still a directory", deep, TreeOptions{Depth: 2},
			"/srv/ws\n" +
				"├── a/      # /srv/ws/a\n" +
				"│   ├── b/  # /srv/ws/a/b\n" +
				"│   └── x/  # /srv/ws/a/x\n" +
				"└── z       # /srv/ws/z\n"},
		{"default depth is 3", &Manifest{Entries: map[string]*Entry{"a/b/c/d": {Type: TypeFile}}}, TreeOptions{},
			"/workspace\n" +
				"└── a/          # /workspace/a\n" +
				"    └── b/      # /workspace/a/b\n" +
				"        └── c/  # /workspace/a/b/c\n"},
		{"s3 files mount is a directory", &Manifest{Entries: map[string]*Entry{
			"data/shared": {Type: TypeS3FilesMount, Description: "team results", Mount: &Mount{FileSystemID: "fs-0123456789abcdef0", Region: "us-east-1"}},
			"notes.txt":   {Type: TypeFile},
		}}, TreeOptions{},
			"/workspace\n" +
				"├── data/        # /workspace/data\n" +
				"│   └── shared/  # /workspace/data/shared — team results\n" +
				"└── notes.txt    # /workspace/notes.txt\n"},
		{"empty manifest", &Manifest{}, TreeOptions{}, "/workspace\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.m.RenderTree(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("RenderTree:\n%s\nwant:\n%s\n(got %q)", got, tc.want, got)
			}
		})
	}
}

func tenFiles() *Manifest {
	m := &Manifest{Entries: map[string]*Entry{}}
	for i := range 10 {
		m.Entries[fmt.Sprintf("f%d", i)] = &Entry{Type: TypeFile}
	}
	return m
}

func TestRenderTreeTruncation(t *testing.T) {
	line := func(i int, last bool) string {
		c := "├── "
		if last {
			c = "└── "
		}
		return fmt.Sprintf("%sf%d  # /workspace/f%d\n", c, i, i) // 30 bytes
	}
	notice := func(n int) string {
		return fmt.Sprintf("... (%d more paths not shown)\n\n", n) +
			"This layout is incomplete: run `ls` on a directory before relying on a path that is not listed here.\n"
	}
	full := "/workspace\n"
	for i := range 10 {
		full += line(i, i == 9)
	}
	if len(full) != 311 || len(notice(9)) != 131 {
		t.Fatalf("test arithmetic: %d, %d", len(full), len(notice(9)))
	}
	cases := []struct {
		name string
		opts TreeOptions
		want string
	}{
		{"fits exactly", TreeOptions{MaxBytes: 311}, full},
		{"unlimited", TreeOptions{MaxBytes: -1}, full},
		{"one byte short", TreeOptions{MaxBytes: 310}, "/workspace\n" + line(0, false) + line(1, false) + line(2, false) + line(3, false) + line(4, false) + notice(5)},
		{"two lines and the notice fit exactly", TreeOptions{MaxBytes: 202}, "/workspace\n" + line(0, false) + line(1, false) + notice(8)},
		{"one line fits", TreeOptions{MaxBytes: 201}, "/workspace\n" + line(0, false) + notice(9)},
		{"no line fits", TreeOptions{MaxBytes: 150}, "/workspace\n" + notice(10)},
		{"not even the notice fits", TreeOptions{MaxBytes: 20}, "/workspace\n... (10 m"},
		{"line cap", TreeOptions{MaxLines: 3}, "/workspace\n" + line(0, false) + line(1, false) + line(2, false) + notice(7)},
		{"line cap above count", TreeOptions{MaxLines: 10}, full},
		{"both caps", TreeOptions{MaxLines: 3, MaxBytes: 201}, "/workspace\n" + line(0, false) + notice(9)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tenFiles().RenderTree(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("RenderTree:\n%s\nwant:\n%s", got, tc.want)
			}
			if tc.opts.MaxBytes > 0 && len(got) > tc.opts.MaxBytes {
				t.Errorf("%d bytes over the cap of %d", len(got), tc.opts.MaxBytes)
			}
		})
	}
	// The default cap is 5000 bytes.
	big := &Manifest{Entries: map[string]*Entry{}}
	for i := range 500 {
		big.Entries[fmt.Sprintf("file-%03d.txt", i)] = &Entry{Type: TypeFile}
	}
	got, err := big.RenderTree(TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) > DefaultTreeMaxBytes || !strings.Contains(got, "more paths not shown") {
		t.Errorf("default cap: %d bytes", len(got))
	}
	// A multi-byte character is never split.
	wide := &Manifest{Root: "/wörk", Entries: map[string]*Entry{"ü": {Type: TypeFile}}}
	for maxBytes := 1; maxBytes < 40; maxBytes++ {
		got, err := wide.RenderTree(TreeOptions{MaxBytes: maxBytes})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix("/wörk\n", got) && !strings.HasPrefix(got, "/wörk\n") || strings.ContainsRune(got, '\uFFFD') || len(got) > maxBytes {
			t.Fatalf("MaxBytes %d: %q", maxBytes, got)
		}
	}
}

func TestRenderTreeRejectsInvalid(t *testing.T) {
	m := &Manifest{Entries: map[string]*Entry{"../x": {Type: TypeFile}}}
	if _, err := m.RenderTree(TreeOptions{}); err == nil {
		t.Error("invalid manifest rendered")
	}
}

// Nothing in an entry can add a line to the rendering.
func TestRenderTreeDescriptionsStayOnOneLine(t *testing.T) {
	m := &Manifest{Entries: map[string]*Entry{
		"a": {Type: TypeFile, Description: "x\n├── fake  # /etc/shadow\r\u2028\u0085y"},
	}}
	got, err := m.RenderTree(TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := "/workspace\n└── a  # /workspace/a — x ├── fake # /etc/shadow y\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
