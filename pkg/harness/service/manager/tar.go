package manager

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// A directory of a tenant's sandbox as one tar stream (POST and GET
// /v1/sandboxes/{id}/tar/{dir}). Every file and directory is written and
// read through the sandbox's daemon as the sandbox's account (WriteFile,
// MakeDir, Rename, ListDir, ReadFile), so the daemon's confinement applies
// as to any other call.
//
// Upload is all or nothing for the tar's members: it is extracted into a
// staging directory of its own inside dir (.bulkhead-tar-RANDOM, on the
// same file system), checking each member as it comes; a bad member (a
// path with .. or absolute, a symlink, hard link, device, fifo or any type
// but regular files and directories), a stream past the bounds, or a
// failed write removes the staging directory, and nothing under dir has
// changed (dir itself and its missing parents, made for the staging
// directory, are left, empty). Once every member is staged, they are moved
// into place (directories made, files renamed over what is there); a
// failure then (a file of the tar where dir has a directory, say) leaves
// what was moved so far, removes the rest and says so.

// TarResult is what UploadTar extracted.
type TarResult struct {
	Files, Dirs int
	Bytes       int64
}

// tarTooLarge is a tar past the policy's bounds (resource exhausted).
type tarTooLarge struct{ msg string }

func (e *tarTooLarge) Error() string { return e.msg }
func (e *tarTooLarge) Unwrap() error { return errkind.ErrResourceExhausted }

// MaxTarStreamBytes bounds the raw bytes of an uploaded tar stream: its
// files' bytes, and room for every member's headers and padding.
func (m *Manager) MaxTarStreamBytes() int64 {
	p := m.api.policy
	return p.MaxTarBytes + int64(p.MaxTarEntries)*4096 + 1<<20
}

// tarMemberName checks a member's name and returns it cleaned and relative
// ("." for the directory itself).
func tarMemberName(name string) (string, error) {
	if err := checkText("tar", name, maxPathBytes); err != nil {
		return "", badField("tar", "member %q: a bad name", clip(name))
	}
	switch {
	case name == "":
		return "", badField("tar", "a member with no name")
	case strings.HasPrefix(name, "/"):
		return "", badField("tar", "member %q: an absolute path (members are relative to the directory)", clip(name))
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", badField("tar", "member %q: .. is not allowed", clip(name))
		}
	}
	return path.Clean(name), nil
}

// tarMember is a staged member.
type tarMember struct {
	name string
	dir  bool
	mode uint32
}

// UploadTar extracts a tar stream into the directory dir (workspace
// relative; "" is the workspace root) of a tenant's sandbox: regular files
// and directories only, at most the policy's MaxTarEntries members and
// MaxTarBytes bytes (each file at most MaxFileBytes). See above for what a
// refusal leaves.
func (m *Manager) UploadTar(ctx context.Context, tenant, sandboxID, dir string, r io.Reader) (*TarResult, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	d, err := cleanPath(dir)
	if err != nil {
		return nil, err
	}
	d = path.Clean(d)
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	defer done()
	user := sess.Manifest().RunAs
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	stage := path.Join(d, ".bulkhead-tar-"+hex.EncodeToString(nonce[:]))
	if _, err := sess.MakeDir(ctx, stage, compute.MakeDirOptions{Mode: 0o700, Parents: true, User: user}); err != nil {
		return nil, err
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer ccancel()
		if err := sess.Remove(cctx, stage, compute.RemoveOptions{Recursive: true, User: user}); err != nil {
			m.log.Debug("tar upload: removing the staging directory failed")
		}
	}()
	members, res, err := m.stageTar(ctx, sess, stage, r)
	if err != nil {
		return nil, err
	}
	// Move into place: directories first made (parents too), files
	// renamed over what is there.
	made := map[string]bool{".": true}
	mkdir := func(rel string, mode uint32) error {
		if made[rel] {
			return nil
		}
		if _, err := sess.MakeDir(ctx, path.Join(d, rel), compute.MakeDirOptions{Mode: mode, Parents: true, User: user}); err != nil {
			return err
		}
		made[rel] = true
		return nil
	}
	for i, mb := range members {
		if mb.dir {
			err = mkdir(mb.name, mb.mode)
		} else if err = mkdir(path.Dir(mb.name), 0); err == nil {
			err = sess.Rename(ctx, path.Join(stage, mb.name), path.Join(d, mb.name), compute.RenameOptions{Overwrite: true, User: user})
		}
		if err != nil {
			return nil, fmt.Errorf("tar: moving member %q into place: %w (the %d members before it were moved and stay; the rest were not)", mb.name, err, i)
		}
	}
	return res, nil
}

// stageTar writes the tar's members under stage, checking each, and
// returns them in their first order (a name given twice once, as its last
// member).
func (m *Manager) stageTar(ctx context.Context, sess *compute.Session, stage string, r io.Reader) ([]tarMember, *TarResult, error) {
	pol := m.api.policy
	user := sess.Manifest().RunAs
	tr := tar.NewReader(r)
	var (
		members []tarMember
		index   = map[string]int{}
		entries int
		total   int64
	)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var tl *tarTooLarge
			if errors.As(err, &tl) {
				return nil, nil, err
			}
			return nil, nil, badField("tar", "not a readable tar stream: %v (nothing was written)", err)
		}
		if entries++; entries > pol.MaxTarEntries {
			return nil, nil, &tarTooLarge{fmt.Sprintf("tar: more than %d members; the limit is %d (nothing was written)", pol.MaxTarEntries, pol.MaxTarEntries)}
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := tarMemberName(h.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("%w (nothing was written)", err)
		}
		mode := uint32(h.Mode) & 0o777
		var mb tarMember
		switch h.Typeflag {
		case tar.TypeDir:
			mb = tarMember{name: name, dir: true, mode: mode | 0o700}
			if name != "." {
				if _, err := sess.MakeDir(ctx, path.Join(stage, name), compute.MakeDirOptions{Mode: mb.mode, Parents: true, User: user}); err != nil {
					return nil, nil, fmt.Errorf("tar: member %q: %w (nothing was written)", clip(h.Name), err)
				}
			}
		case tar.TypeReg:
			if name == "." {
				return nil, nil, badField("tar", "member %q: a file cannot be the directory itself (nothing was written)", clip(h.Name))
			}
			if h.Size > pol.MaxFileBytes {
				return nil, nil, &tarTooLarge{fmt.Sprintf("tar: member %q: %d bytes; the limit of a file is %d (nothing was written)", clip(h.Name), h.Size, pol.MaxFileBytes)}
			}
			if total += h.Size; total > pol.MaxTarBytes {
				return nil, nil, &tarTooLarge{fmt.Sprintf("tar: more than %d bytes of files; the limit is %d (nothing was written)", pol.MaxTarBytes, pol.MaxTarBytes)}
			}
			size := h.Size
			mb = tarMember{name: name, mode: mode}
			if _, err := sess.WriteFile(ctx, path.Join(stage, name), compute.WriteFileOptions{Mode: mode, User: user,
				CreateParents: true, Overwrite: compute.OverwriteAlways, ExpectedSize: &size}, tr); err != nil {
				return nil, nil, fmt.Errorf("tar: member %q: %w (nothing was written)", clip(h.Name), err)
			}
		default:
			return nil, nil, badField("tar", "member %q is %s; only regular files and directories are taken (nothing was written)", clip(h.Name), tarTypeName(h.Typeflag))
		}
		if mb.name == "." {
			continue
		}
		if i, ok := index[mb.name]; ok {
			if members[i].dir != mb.dir {
				return nil, nil, badField("tar", "member %q is both a file and a directory (nothing was written)", clip(h.Name))
			}
			members[i] = mb
			continue
		}
		index[mb.name] = len(members)
		members = append(members, mb)
	}
	res := &TarResult{Bytes: total}
	for _, mb := range members {
		if mb.dir {
			res.Dirs++
		} else {
			res.Files++
		}
	}
	return members, res, nil
}

// tarTypeName says what kind of member a type flag is.
func tarTypeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "a symlink"
	case tar.TypeLink:
		return "a hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "a device"
	case tar.TypeFifo:
		return "a fifo"
	}
	return fmt.Sprintf("of type %q", t)
}

// tarEntry is a file or directory DownloadTar sends.
type tarEntry struct {
	rel string
	fi  compute.FileInfo
}

// DownloadTar writes the directory dir (workspace relative; "" is the
// workspace root) of a tenant's sandbox as a tar stream to the writer
// start returns: its regular files and directories, with names relative
// to dir (symlinks, devices and the like are left out). The tree is
// listed first, and a tree of more than the policy's MaxTarEntries or
// MaxTarBytes is refused before start is called; a file that changes
// while it is sent cuts the stream (an error after start).
func (m *Manager) DownloadTar(ctx context.Context, tenant, sandboxID, dir string, start func(name string) io.Writer) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	d, err := cleanPath(dir)
	if err != nil {
		return err
	}
	d = path.Clean(d)
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return err
	}
	defer done()
	user := sess.Manifest().RunAs
	info, err := sess.Stat(ctx, d, compute.StatOptions{User: user})
	if err != nil {
		return err
	}
	if info.Type != compute.FileDirectory {
		return badField("path", "%s is not a directory", d)
	}
	pol := m.api.policy
	var (
		entries []tarEntry
		total   int64
		queue   = []string{"."}
	)
	for len(queue) > 0 {
		rel := queue[0]
		queue = queue[1:]
		token := ""
		for {
			page, err := sess.ListDir(ctx, path.Join(d, rel), compute.ListDirOptions{User: user, PageToken: token})
			if err != nil {
				return err
			}
			for _, fi := range page.Entries {
				name := path.Join(rel, fi.Name)
				switch fi.Type {
				case compute.FileDirectory:
					queue = append(queue, name)
				case compute.FileRegular:
					total += fi.Size
				default:
					continue
				}
				entries = append(entries, tarEntry{rel: name, fi: fi})
				if len(entries) > pol.MaxTarEntries {
					return &tarTooLarge{fmt.Sprintf("tar: %s has more than %d files and directories; the limit is %d", d, pol.MaxTarEntries, pol.MaxTarEntries)}
				}
				if total > pol.MaxTarBytes {
					return &tarTooLarge{fmt.Sprintf("tar: %s holds more than %d bytes; the limit is %d", d, pol.MaxTarBytes, pol.MaxTarBytes)}
				}
			}
			if token = page.NextPageToken; token == "" {
				break
			}
		}
	}
	tw := tar.NewWriter(start(path.Base(d)))
	for _, e := range entries {
		h := &tar.Header{Name: e.rel, Mode: int64(e.fi.Mode & 0o777), ModTime: e.fi.ModifiedAt}
		if e.fi.Type == compute.FileDirectory {
			h.Typeflag, h.Name = tar.TypeDir, e.rel+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, e.fi.Size
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Size > 0 {
			if _, err := sess.ReadFile(ctx, path.Join(d, e.rel), compute.ReadFileOptions{User: user, Limit: h.Size}, tw); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}
