package materialize

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// smallFile is the size up to which a file's bytes are buffered and
// written by a worker, so many small files are created in parallel.
const smallFile = 256 << 10

// maxBuffered bounds the bytes of small files waiting for a worker.
const maxBuffered = 8 << 20

// owner is a resolved uid/gid pair.
type owner struct{ uid, gid uint32 }

// applier holds the state of one Apply.
type applier struct {
	ctx    context.Context
	rt     *os.Root
	c      *checked
	stage  string
	owners map[*Entry]owner
	euid   uint32
	egid   uint32
	// rootOwner, when set, owns the workspace root and the parents the
	// plan creates (Plan.RootUser).
	rootOwner *owner
	flush     func(*os.File) error // Options.Flush
}

// Apply creates the plan's accounts, then builds its entries from the tar
// stream r (one regular-file member per file entry, in plan order, named by
// the entry's path) in a staging directory of the workspace at root, and
// moves them into place once everything arrived. On error the workspace's
// files are left as they were (accounts created before the failure stay).
func Apply(ctx context.Context, root string, plan Plan, r io.Reader, acct Accounts, opts Options) (Result, error) {
	c, err := validate(plan, opts)
	if err != nil {
		return Result{}, err
	}
	rt, err := os.OpenRoot(root)
	if err != nil {
		return Result{}, fmt.Errorf("open workspace: %w", errkind.ClassifyFS(err))
	}
	defer rt.Close()
	if err := precheck(rt, c); err != nil {
		return Result{}, err
	}
	var res Result
	for _, g := range plan.Groups {
		created, err := acct.EnsureGroup(ctx, g)
		if err != nil {
			return res, fmt.Errorf("create group %s: %w", g.Name, err)
		}
		if created {
			res.GroupsCreated = append(res.GroupsCreated, g.Name)
		}
	}
	for _, u := range plan.Users {
		created, err := acct.EnsureUser(ctx, u)
		if err != nil {
			return res, fmt.Errorf("create user %s: %w", u.Name, err)
		}
		if created {
			res.UsersCreated = append(res.UsersCreated, u.Name)
		}
	}
	a := &applier{ctx: ctx, rt: rt, c: c, owners: make(map[*Entry]owner, len(c.entries)),
		euid: uint32(os.Geteuid()), egid: uint32(os.Getegid()), flush: opts.Flush}
	for _, e := range c.entries {
		uid, gid, err := acct.IDs(e.User, e.Group)
		if err != nil {
			return res, &errkind.PathError{Op: "materialize", Path: e.Path, Err: err}
		}
		a.owners[e] = owner{uid, gid}
	}
	var rootOwner *owner
	if plan.RootUser != "" {
		uid, gid, err := acct.IDs(plan.RootUser, "")
		if err != nil {
			return res, &errkind.PathError{Op: "materialize", Path: ".", Err: err}
		}
		rootOwner = &owner{uid, gid}
	}
	a.rootOwner = rootOwner
	id, err := randomID()
	if err != nil {
		return res, err
	}
	a.stage = StagePrefix + id
	if err := rt.Mkdir(a.stage, 0o700); err != nil {
		return res, fmt.Errorf("create staging directory: %w", errkind.ClassifyFS(err))
	}
	defer func() { _ = rt.RemoveAll(a.stage) }()
	files, err := a.build(r)
	if err != nil {
		return res, err
	}
	res.Files = files
	for _, e := range c.entries {
		switch e.Kind {
		case KindDir:
			res.Dirs++
		case KindSymlink:
			res.Symlinks++
		}
	}
	if err := a.commit("."); err != nil {
		return res, err
	}
	if err := a.setDirModes(); err != nil {
		return res, err
	}
	if rootOwner != nil {
		if err := a.chownRoot(*rootOwner); err != nil {
			return res, err
		}
	}
	return res, nil
}

// chownRoot gives the workspace root directory to o, unless it has it.
func (a *applier) chownRoot(o owner) error {
	d, err := a.rt.Open(".")
	if err != nil {
		return &errkind.PathError{Op: "materialize", Path: ".", Err: errkind.ClassifyFS(err)}
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return &errkind.PathError{Op: "materialize", Path: ".", Err: errkind.ClassifyFS(err)}
	}
	if st, ok := fi.Sys().(*unix.Stat_t); ok && st.Uid == o.uid && st.Gid == o.gid {
		return nil
	}
	if err := d.Chown(int(o.uid), int(o.gid)); err != nil {
		err = errkind.ClassifyFS(err)
		if errors.Is(err, errkind.ErrPermissionDenied) && a.euid != 0 {
			err = errkind.Errorf(errkind.ErrFailedPrecondition, "cannot give the workspace root to %d:%d: the daemon does not run as root", o.uid, o.gid)
		}
		return &errkind.PathError{Op: "materialize", Path: ".", Err: err}
	}
	return nil
}

// setDirModes gives the directories their modes once everything is in
// place, deepest first (a read-only directory is still filled and emptied
// while it is being built and moved, also by a daemon that is not root):
// explicit entries take theirs, and parents the plan created take 0755.
// Existing directories of explicit entries also take the entry's owner.
func (a *applier) setDirModes() error {
	dirs := slices.Clone(a.c.implicit)
	for _, e := range a.c.entries {
		if e.Kind == KindDir {
			dirs = append(dirs, e.Path)
		}
	}
	slices.Sort(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		e := a.c.byPath[d]
		if e == nil {
			if a.c.existed[d] {
				continue
			}
			if err := a.rt.Chmod(d, 0o755); err != nil {
				return &errkind.PathError{Op: "materialize", Path: d, Err: errkind.ClassifyFS(err)}
			}
			continue
		}
		if a.c.existed[d] {
			if err := a.chown(e, func(uid, gid int) error { return a.rt.Lchown(d, uid, gid) }); err != nil {
				return err
			}
		}
		if err := a.rt.Chmod(d, modeOf(e)); err != nil {
			return &errkind.PathError{Op: "materialize", Path: d, Err: errkind.ClassifyFS(err)}
		}
	}
	return nil
}

// staged is the path of p inside the staging directory.
func (a *applier) staged(p string) string { return a.stage + "/" + p }

// build creates every entry in the staging directory and flushes it.
func (a *applier) build(r io.Reader) ([]File, error) {
	dirs := slices.Clone(a.c.implicit)
	for _, e := range a.c.entries {
		if e.Kind == KindDir {
			dirs = append(dirs, e.Path)
		}
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		if err := a.rt.Mkdir(a.staged(d), 0o700); err != nil {
			return nil, &errkind.PathError{Op: "materialize", Path: d, Err: errkind.ClassifyFS(err)}
		}
	}
	for _, e := range a.c.entries {
		if e.Kind != KindSymlink {
			continue
		}
		if err := a.rt.Symlink(e.LinkTarget, a.staged(e.Path)); err != nil {
			return nil, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.ClassifyFS(err)}
		}
		if err := a.chown(e, func(uid, gid int) error { return a.rt.Lchown(a.staged(e.Path), uid, gid) }); err != nil {
			return nil, err
		}
	}
	files, err := a.receive(r)
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		if e := a.c.byPath[d]; e != nil {
			if err := a.chown(e, func(uid, gid int) error { return a.rt.Lchown(a.staged(d), uid, gid) }); err != nil {
				return nil, err
			}
		} else if o := a.rootOwner; o != nil && (o.uid != a.euid || o.gid != a.egid) {
			// A parent the plan creates belongs, like the workspace root,
			// to the run_as user, who can then create files beside the
			// entries in it (an existing one keeps its owner).
			if err := a.rt.Lchown(a.staged(d), int(o.uid), int(o.gid)); err != nil {
				return nil, &errkind.PathError{Op: "materialize", Path: d, Err: errkind.ClassifyFS(err)}
			}
		}
	}
	// One flush (syncfs) makes everything staged durable before it becomes
	// visible, unless every entry is re-created at each start anyway: a
	// remote mount's objects are fetched again, so flushing them (often
	// the larger part of a mount's time on a busy disk) buys nothing.
	if !a.c.allVolatile() {
		d, err := a.rt.Open(a.stage)
		if err != nil {
			return nil, fmt.Errorf("open staging directory: %w", errkind.ClassifyFS(err))
		}
		defer d.Close()
		flush := a.flush
		if flush == nil {
			flush = func(d *os.File) error { return unix.Syncfs(int(d.Fd())) }
		}
		if err := flush(d); err != nil {
			return nil, fmt.Errorf("flush staged entries: %w", errkind.ClassifyFS(err))
		}
	}
	return files, nil
}

// modeOf returns an entry's permission bits with defaults.
func modeOf(e *Entry) fs.FileMode {
	if e.Mode != 0 {
		return e.Mode
	}
	if e.Kind == KindDir {
		return 0o755
	}
	return 0o644
}

// chown gives an entry its owner when it differs from the daemon's.
func (a *applier) chown(e *Entry, fn func(uid, gid int) error) error {
	o := a.owners[e]
	if o.uid == a.euid && o.gid == a.egid {
		return nil
	}
	if err := fn(int(o.uid), int(o.gid)); err != nil {
		err = errkind.ClassifyFS(err)
		if errors.Is(err, errkind.ErrPermissionDenied) && a.euid != 0 {
			err = errkind.Errorf(errkind.ErrFailedPrecondition, "cannot give the entry to %d:%d: the daemon does not run as root", o.uid, o.gid)
		}
		return &errkind.PathError{Op: "materialize", Path: e.Path, Err: err}
	}
	return nil
}

// job is a small file read into memory, waiting for a worker.
type job struct {
	i    int
	e    *Entry
	data []byte
}

// receive reads the tar stream and writes each file into the staging
// directory: large files inline, small ones by a pool of workers.
func (a *applier) receive(r io.Reader) ([]File, error) {
	files := make([]File, len(a.c.files))
	workers := 4
	jobs := make(chan job)
	budget := make(chan struct{}, maxBuffered/smallFile)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return firstErr
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if failed() == nil {
					f, err := a.writeFile(j.e, bytesReader(j.data))
					if err != nil {
						fail(err)
					} else {
						files[j.i] = f
					}
				}
				<-budget
			}
		}()
	}
	err := func() error {
		tr := tar.NewReader(r)
		for i, e := range a.c.files {
			if err := a.ctx.Err(); err != nil {
				return errkind.ClassifyFS(err)
			}
			if err := failed(); err != nil {
				return err
			}
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "the stream ended before this file's bytes")}
			}
			if err != nil {
				return streamError(err)
			}
			if err := matchMember(h, e); err != nil {
				return err
			}
			if e.Size <= smallFile {
				data := make([]byte, e.Size)
				if _, err := io.ReadFull(tr, data); err != nil {
					return &errkind.PathError{Op: "materialize", Path: e.Path, Err: streamError(err)}
				}
				budget <- struct{}{}
				jobs <- job{i: i, e: e, data: data}
				continue
			}
			f, err := a.writeFile(e, tr)
			if err != nil {
				return err
			}
			files[i] = f
		}
		if _, err := tr.Next(); !errors.Is(err, io.EOF) {
			if err != nil {
				return streamError(err)
			}
			return errkind.Errorf(errkind.ErrInvalidArgument, "the stream carries members beyond the plan")
		}
		// Anything after the end-of-archive marker must be padding.
		var buf [4096]byte
		for {
			n, err := r.Read(buf[:])
			for _, b := range buf[:n] {
				if b != 0 {
					return errkind.Errorf(errkind.ErrInvalidArgument, "data after the end of the tar stream")
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return streamError(err)
			}
		}
	}()
	close(jobs)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if err := failed(); err != nil {
		return nil, err
	}
	return files, nil
}

// matchMember checks that a tar member is the file entry expected next.
func matchMember(h *tar.Header, e *Entry) error {
	switch {
	case h.Name != e.Path:
		return &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "expected this file next in the stream, got member %q", h.Name)}
	case h.Typeflag != tar.TypeReg:
		return &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "member is not a regular file")}
	case h.Size != e.Size:
		return &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "member has %d bytes; the plan says %d", h.Size, e.Size)}
	}
	return nil
}

// streamError classifies a failure reading the tar stream.
func streamError(err error) error {
	if errkind.Classified(err) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return errkind.ClassifyFS(err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) || errors.Is(err, io.EOF) {
		return errkind.Errorf(errkind.ErrInvalidArgument, "truncated or malformed tar stream: %v", err)
	}
	return fmt.Errorf("read tar stream: %w", err)
}

// writeFile writes one file entry into the staging directory.
func (a *applier) writeFile(e *Entry, r io.Reader) (File, error) {
	f, err := a.rt.OpenFile(a.staged(e.Path), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return File{}, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.ClassifyFS(err)}
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, e.Size))
	if err != nil {
		return File{}, &errkind.PathError{Op: "materialize", Path: e.Path, Err: streamError(err)}
	}
	if n != e.Size {
		return File{}, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.Errorf(errkind.ErrInvalidArgument, "got %d of %d bytes", n, e.Size)}
	}
	if err := a.chown(e, f.Chown); err != nil {
		return File{}, err
	}
	mode := modeOf(e)
	if err := f.Chmod(mode); err != nil {
		return File{}, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.ClassifyFS(err)}
	}
	if err := f.Close(); err != nil {
		return File{}, &errkind.PathError{Op: "materialize", Path: e.Path, Err: errkind.ClassifyFS(err)}
	}
	return File{Path: e.Path, Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), Mode: mode}, nil
}

// commit moves the staged tree into the workspace: new paths are renamed in
// whole, existing directories are merged, existing files and links are
// replaced.
func (a *applier) commit(dir string) error {
	src := a.stage
	if dir != "." {
		src = a.staged(dir)
	}
	d, err := a.rt.Open(src)
	if err != nil {
		return fmt.Errorf("commit %s: %w", dir, errkind.ClassifyFS(err))
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("commit %s: %w", dir, errkind.ClassifyFS(err))
	}
	slices.Sort(names)
	for _, name := range names {
		if err := a.ctx.Err(); err != nil {
			return errkind.ClassifyFS(err)
		}
		p := name
		if dir != "." {
			p = path.Join(dir, name)
		}
		fi, err := a.rt.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := a.rt.Rename(a.staged(p), p); err != nil {
				return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.ClassifyFS(err)}
			}
			continue
		case err != nil:
			return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.ClassifyFS(err)}
		}
		sfi, err := a.rt.Lstat(a.staged(p))
		if err != nil {
			return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.ClassifyFS(err)}
		}
		if !sfi.IsDir() {
			if fi.IsDir() {
				return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrIsDirectory, "a directory is in the way")}
			}
			if err := a.rt.Rename(a.staged(p), p); err != nil {
				return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.ClassifyFS(err)}
			}
			continue
		}
		if !fi.IsDir() {
			return &errkind.PathError{Op: "materialize", Path: p, Err: errkind.Errorf(errkind.ErrNotDirectory, "a file is in the way of a directory")}
		}
		if err := a.commit(p); err != nil {
			return err
		}
	}
	return nil
}

// randomID returns a short random hex string.
func randomID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// bytesReader is a minimal reader over a byte slice.
func bytesReader(b []byte) io.Reader { return &sliceReader{b: b} }

type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// CleanupStaging removes staging directories an interrupted Apply left at
// the workspace's top level, and returns how many it removed.
func CleanupStaging(root string) (int, error) {
	rt, err := os.OpenRoot(root)
	if err != nil {
		return 0, err
	}
	defer rt.Close()
	d, err := rt.Open(".")
	if err != nil {
		return 0, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range names {
		if strings.HasPrefix(name, StagePrefix) {
			if err := rt.RemoveAll(name); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}
