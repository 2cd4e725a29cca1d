package filesystem_test

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
)

// Minimal files carrying each supported signature; view_image goes by
// content, so the rest of the bytes need not be a valid picture.
var imageSignatures = []struct {
	name, mime string
	data       []byte
}{
	{"pic.png", "image/png", append([]byte("\x89PNG\r\n\x1a\n"), "\x00\x00\x00\rIHDR"...)},
	{"pic.jpg", "image/jpeg", []byte("\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01")},
	{"pic87.gif", "image/gif", []byte("GIF87a\x01\x00\x01\x00\x00\x00\x00;")},
	{"pic89.gif", "image/gif", []byte("GIF89a\x01\x00\x01\x00\x80\x00\x00")},
	{"pic.webp", "image/webp", []byte("RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00")},
	// The extension does not matter, only the content.
	{"png-without-extension", "image/png", []byte("\x89PNG\r\n\x1a\n")},
}

func TestViewImageTypes(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	for _, img := range imageSignatures {
		t.Run(img.name, func(t *testing.T) {
			s.write("img/"+img.name, string(img.data))
			res := s.call("view_image", "", `{"path":"img/`+img.name+`"}`)
			if res.IsError {
				t.Fatalf("error: %s", res.Output)
			}
			want := "Image `img/" + img.name + "` (" + img.mime + ", " + strconv.Itoa(len(img.data)) + " bytes)."
			if res.Output != want {
				t.Errorf("output %q, want %q", res.Output, want)
			}
			if len(res.Images) != 1 {
				t.Fatalf("images = %d", len(res.Images))
			}
			wantImage := model.Content{Kind: model.ContentImage, Detail: "auto",
				ImageURL: "data:" + img.mime + ";base64," + base64.StdEncoding.EncodeToString(img.data)}
			if res.Images[0] != wantImage {
				t.Errorf("image = %+v, want %+v", res.Images[0], wantImage)
			}
		})
	}
}

// Relative paths resolve against the working directory; absolute paths
// inside the workspace work too; a symlink inside the workspace is followed.
func TestViewImagePaths(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	png := imageSignatures[0].data
	s.write("proj/assets/logo.png", string(png))
	if err := os.Symlink("assets/logo.png", filepath.Join(s.d.Workspace, "proj", "link.png")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ workdir, path string }{
		{"proj", "assets/logo.png"},
		{"proj/assets", "logo.png"},
		{"proj/assets", "./../assets/logo.png"},
		{"", "proj/assets/logo.png"},
		{"elsewhere", s.d.Workspace + "/proj/assets/logo.png"},
		{"proj", "link.png"},
	} {
		res := s.call("view_image", tc.workdir, `{"path":"`+tc.path+`"}`)
		if res.IsError || len(res.Images) != 1 {
			t.Errorf("workdir %q path %q: %+v", tc.workdir, tc.path, res)
		}
	}
	res := s.call("view_image", "", `{"path":"assets/logo.png"}`)
	if !res.IsError || res.Output != "image path `assets/logo.png` was not found" {
		t.Errorf("resolved against the root instead of failing: %+v", res)
	}
}

func TestViewImageFailures(t *testing.T) {
	s := newSandbox(t, filesystem.Options{})
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.png"), imageSignatures[0].data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(s.d.Workspace, "link")); err != nil {
		t.Fatal(err)
	}
	s.write("notes.txt", "just some text, long enough to sniff\n")
	s.write("fake.png", "not a png at all, whatever the name says")
	s.write("tiny.png", "\x89PN")
	s.write("empty.png", "")
	s.write("dir/keep", "")
	// Far larger than the cap, created sparse so it is cheap to make:
	// view_image refuses it from its size without reading it, and behind a
	// symlink (whose Stat does not tell the target's size) reads no more
	// than the cap plus one byte.
	big := filepath.Join(s.d.Workspace, "huge.png")
	if err := os.WriteFile(big, imageSignatures[0].data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("huge.png", filepath.Join(s.d.Workspace, "huge-link.png")); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ name, workdir, input, want string }{
		{"missing", "", `{"path":"nope.png"}`, "image path `nope.png` was not found"},
		{"missing in workdir", "dir", `{"path":"nope.png"}`, "image path `nope.png` was not found"},
		{"not an image", "", `{"path":"notes.txt"}`, "image path `notes.txt` is not a supported image file (PNG, JPEG, GIF or WebP, recognized by content)"},
		{"wrong content", "", `{"path":"fake.png"}`, "image path `fake.png` is not a supported image file (PNG, JPEG, GIF or WebP, recognized by content)"},
		{"truncated signature", "", `{"path":"tiny.png"}`, "image path `tiny.png` is not a supported image file (PNG, JPEG, GIF or WebP, recognized by content)"},
		{"empty", "", `{"path":"empty.png"}`, "image path `empty.png` is not a supported image file (PNG, JPEG, GIF or WebP, recognized by content)"},
		{"directory", "", `{"path":"dir"}`, "image path `dir` is a directory, not an image file"},
		{"too large", "", `{"path":"huge.png"}`, "image path `huge.png` exceeded the allowed size of 10MB; resize or compress the image and try again"},
		{"too large behind a symlink", "", `{"path":"huge-link.png"}`, "image path `huge-link.png` exceeded the allowed size of 10MB; resize or compress the image and try again"},
		{"escape", "", `{"path":"../secret.png"}`, "image path `../secret.png` is outside the workspace"},
		{"escape from workdir", "dir", `{"path":"../../x.png"}`, "image path `../../x.png` is outside the workspace (relative paths are resolved from the working directory 'dir')"},
		{"escape absolute", "", `{"path":"` + outside + `/secret.png"}`, "image path `" + outside + "/secret.png` is outside the workspace"},
		{"escape through symlink", "", `{"path":"link/secret.png"}`, "image path `link/secret.png` is outside the workspace"},
		{"empty path", "", `{"path":"  "}`, "view_image: path must not be empty"},
		{"bad arguments", "", `"x.png"`, `view_image: the arguments must be a JSON object {"path": "<image file>"}: json: cannot unmarshal string into Go value of type filesystem.viewImageArgs`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := s.call("view_image", tc.workdir, tc.input)
			if !res.IsError || len(res.Images) != 0 {
				t.Fatalf("not a clean error: %+v", res)
			}
			if res.Output != tc.want {
				t.Errorf("output:\n%s\nwant:\n%s", res.Output, tc.want)
			}
			if strings.Contains(res.Output, s.d.Workspace) {
				t.Errorf("output reveals the workspace's host path: %q", res.Output)
			}
		})
	}
}

// The cap is configurable; a file of exactly the cap is accepted.
func TestViewImageCap(t *testing.T) {
	s := newSandbox(t, filesystem.Options{MaxImageBytes: 64})
	png := imageSignatures[0].data
	s.write("ok.png", string(png)+strings.Repeat("\x00", 64-len(png)))
	s.write("over.png", string(png)+strings.Repeat("\x00", 65-len(png)))
	if res := s.call("view_image", "", `{"path":"ok.png"}`); res.IsError || len(res.Images) != 1 {
		t.Errorf("file at the cap: %+v", res)
	}
	res := s.call("view_image", "", `{"path":"over.png"}`)
	if !res.IsError || res.Output != "image path `over.png` exceeded the allowed size of 64 bytes; resize or compress the image and try again" {
		t.Errorf("file over the cap: %+v", res)
	}
	if !bytes.Equal([]byte(s.read("ok.png"))[:len(png)], png) {
		t.Error("file changed")
	}
}
