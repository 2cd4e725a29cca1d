package archive

import (
	"archive/tar"
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
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// tm describes one member of a crafted archive.
type tm struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	size     int64 // declared size when no body is given
	uid, gid int
}

// craft builds a tar archive from members (with the end marker), zstd
// compressed when z is set.
func craft(t testing.TB, z bool, members ...tm) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, m := range members {
		writeMember(t, tw, m)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if !z {
		return raw.Bytes()
	}
	return zstdBytes(t, raw.Bytes())
}

// writeMember writes one member; a regular member without a body gets
// size zero bytes.
func writeMember(t testing.TB, tw *tar.Writer, m tm) {
	t.Helper()
	if m.typ == tar.TypeXGlobalHeader {
		if err := tw.WriteHeader(&tar.Header{Typeflag: m.typ, Name: m.name, PAXRecords: map[string]string{"comment": m.body}}); err != nil {
			t.Fatal(err)
		}
		return
	}
	hdr := &tar.Header{Name: m.name, Typeflag: m.typ, Linkname: m.link, Mode: m.mode,
		Uid: m.uid, Gid: m.gid, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
	if hdr.Typeflag == 0 {
		hdr.Typeflag = tar.TypeReg
	}
	if hdr.Mode == 0 {
		hdr.Mode = 0o644
		if hdr.Typeflag == tar.TypeDir {
			hdr.Mode = 0o755
		}
	}
	if hdr.Typeflag == tar.TypeReg {
		hdr.Size = int64(len(m.body))
		if m.body == "" {
			hdr.Size = m.size
		}
	}
	if err := tw.WriteHeader(hdr); err != nil {
		t.Fatalf("header %q: %v", m.name, err)
	}
	if m.body != "" {
		if _, err := io.WriteString(tw, m.body); err != nil {
			t.Fatal(err)
		}
	} else if hdr.Size > 0 {
		if _, err := io.CopyN(tw, zeroReader{}, hdr.Size); err != nil {
			t.Fatal(err)
		}
	}
}

// zstdBytes compresses b.
func zstdBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// zeroReader reads zeros forever.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// countingWriter counts bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// lazyArchive streams an archive produced by gen through a pipe, so that a
// huge archive is only generated as far as it is read. The returned
// function stops the generator and reports how many uncompressed bytes it
// produced.
func lazyArchive(t testing.TB, z bool, gen func(tw *tar.Writer) error) (io.Reader, func() int64) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan int64, 1)
	go func() {
		var w io.Writer = pw
		var enc *zstd.Encoder
		if z {
			enc, _ = zstd.NewWriter(pw)
			w = enc
		}
		cw := &countingWriter{w: w}
		tw := tar.NewWriter(cw)
		err := gen(tw)
		if err == nil {
			err = tw.Close()
		}
		if enc != nil {
			if cerr := enc.Close(); err == nil {
				err = cerr
			}
		}
		pw.CloseWithError(err)
		done <- cw.n
	}()
	return pr, func() int64 {
		pr.CloseWithError(errors.New("reader done"))
		return <-done
	}
}

// describe returns a description of every entry below dir (type, mode,
// owner, mtime, content digest or link target), keyed by relative path.
func describe(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v uid=%d gid=%d", fi.Mode(), st.Uid, st.Gid)
		if rel != "." {
			desc += fmt.Sprintf(" mtime=%d", fi.ModTime().UnixNano())
		}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			desc += fmt.Sprintf(" size=%d sha=%s", len(b), hex.EncodeToString(sum[:8]))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diff lists the differences between two descriptions.
func diff(a, b map[string]string) []string {
	var d []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			d = append(d, "only before: "+k+" "+v)
		} else if v != w {
			d = append(d, "changed: "+k+": "+v+" => "+w)
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			d = append(d, "only after: "+k+" "+v)
		}
	}
	slices.Sort(d)
	return d
}

// requireSame fails when the two descriptions differ.
func requireSame(t testing.TB, what string, before, after map[string]string) {
	t.Helper()
	if d := diff(before, after); len(d) > 0 {
		t.Fatalf("%s changed:\n%s", what, strings.Join(d, "\n"))
	}
}

// requireNoStaging fails when Restore left a directory behind.
func requireNoStaging(t testing.TB, root string) {
	t.Helper()
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ReservedPrefix) {
			t.Fatalf("left behind: %s", e.Name())
		}
	}
}

// requirePathError checks that err is a *errkind.PathError wrapping
// sentinel whose Path contains name.
func requirePathError(t testing.TB, err error, sentinel error, name string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v naming %q", sentinel, name)
	}
	var pe *errkind.PathError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *errkind.PathError", err, err)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %q does not wrap %v", err, sentinel)
	}
	if !strings.Contains(pe.Path, name) {
		t.Fatalf("error %q: path %q does not name %q", err, pe.Path, name)
	}
}

// writeFile creates a file with content and mode, making parents.
func writeFile(t testing.TB, p, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// archiveOf writes the tree at root with opts and returns the bytes.
func archiveOf(t testing.TB, root string, opts WriteOptions) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := Write(context.Background(), root, &buf, opts); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return buf.Bytes()
}

// fingerprint returns Fingerprint(root) or fails.
func fingerprint(t testing.TB, root string, opts FingerprintOptions) string {
	t.Helper()
	fp, err := Fingerprint(context.Background(), root, opts)
	if err != nil {
		t.Fatalf("Fingerprint: %v", err)
	}
	return fp
}
