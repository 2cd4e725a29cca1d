package cli

// `harness sandbox cp` copies files and directories into and out of a
// sandbox: files with WriteFile and ReadFile, directories into the sandbox
// file by file (the daemon has no "extract into a subdirectory" call), and
// directories out of it through the workspace archive, cut down to the
// subtree and extracted with the daemon's own restore rules.

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/archive"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
)

// cpPath is one side of a copy: a local path, or a path in a session's
// sandbox (ID:path).
type cpPath struct {
	id     string
	path   string
	remote bool
}

// parseCpPath reads ID:path as a sandbox path (the part before the first
// colon has no slash) and anything else as a local path.
func parseCpPath(s string) cpPath {
	if i := strings.IndexByte(s, ':'); i > 0 && !strings.Contains(s[:i], "/") {
		p := s[i+1:]
		if p == "" {
			p = "."
		}
		return cpPath{id: s[:i], path: p, remote: true}
	}
	return cpPath{path: s}
}

// newSandboxCpCmd returns `harness sandbox cp`.
func newSandboxCpCmd(g *globals) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories into or out of a sandbox",
		Long: `Copy a file or a directory (recursively) between this machine and a sandbox. One of SRC and DST
is ID:PATH, a path in the session's sandbox (relative to the workspace root, or absolute inside
it; ID: alone is the workspace root); the other is a local path (write ./a:b for a local name with
a colon). When DST is an existing directory, or ends with /, SRC is copied into it under its own
name. Missing parent directories in the sandbox are created; a directory copied out must go to a
new or empty local directory (symbolic links leading out of it are left out). Transfers over
1 MiB show their progress on stderr when it is a terminal.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseCpPath(args[0]), parseCpPath(args[1])
			switch {
			case src.remote && dst.remote:
				return usageErr(compute.ErrInvalidArgument, "both %s and %s are sandbox paths; copy through a local path", args[0], args[1])
			case !src.remote && !dst.remote:
				return usageErr(compute.ErrInvalidArgument, "neither %s nor %s is a sandbox path (ID:PATH)", args[0], args[1])
			}
			c, err := g.server()
			switch {
			case err != nil:
				return err
			case c != nil && dst.remote:
				return serverCopyIn(cmd, c, src.path, dst)
			case c != nil:
				return serverCopyOut(cmd, c, src, dst.path)
			case dst.remote:
				return copyIn(cmd, g, src.path, dst, user)
			}
			return copyOut(cmd, g, src, dst.path)
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "sandbox user the files copied in belong to (default: the manifest's run_as user)")
	return cmd
}

// localEntry is a file or directory of a local tree copied in.
type localEntry struct {
	rel  string // slash-separated, relative to the tree's root
	mode fs.FileMode
	size int64
	dir  bool
}

// copyIn copies a local file or directory into the sandbox. The local
// side is read completely before anything is sent, so a local error
// changes nothing in the sandbox.
func copyIn(cmd *cobra.Command, g *globals, local string, dst cpPath, user string) error {
	ctx := cmd.Context()
	stderr := cmd.ErrOrStderr()
	fi, err := os.Stat(local)
	if err != nil {
		return err
	}
	var tree []localEntry
	var skipped int
	switch {
	case fi.Mode().IsRegular():
		tree = []localEntry{{rel: ".", mode: fi.Mode().Perm(), size: fi.Size()}}
	case fi.IsDir():
		if tree, skipped, err = walkLocal(local); err != nil {
			return err
		}
	default:
		return usageErr(compute.ErrInvalidArgument, "%s is neither a regular file nor a directory", local)
	}
	r, err := reconnect(cmd, g, dst.id, materializer.Options{})
	if err != nil {
		return err
	}
	defer r.release()
	r.noteRebuilt(stderr)
	agent := r.sess.Agent()
	as := runAsUser(r.sess, user) // files copied in are the agent's, like its manifest's
	target, err := remoteTarget(ctx, agent, dst.path, localBase(local), fi.IsDir())
	if err != nil {
		return err
	}
	prog := newProgress(stderr, "cp "+filepath.Base(local), treeSize(tree))
	for _, e := range tree {
		p := path.Join(target, e.rel)
		if e.dir {
			if _, err := agent.MakeDir(ctx, p, compute.MakeDirOptions{Mode: uint32(e.mode), Parents: true, User: as}); err != nil {
				return err
			}
			continue
		}
		if err := writeRemote(ctx, agent, filepath.Join(local, filepath.FromSlash(e.rel)), p, as, e, prog); err != nil {
			return err
		}
	}
	prog.finish()
	if skipped > 0 {
		fmt.Fprintf(stderr, "cp: skipped %d entries that are neither regular files nor directories (symbolic links, devices)\n", skipped)
	}
	return nil
}

// walkLocal lists a local directory tree: directories first in walk order,
// so parents come before what they hold, and the entries it skips.
func walkLocal(root string) ([]localEntry, int, error) {
	var tree []localEntry
	skipped := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			tree = append(tree, localEntry{rel: filepath.ToSlash(rel), mode: info.Mode().Perm(), dir: true})
		case d.Type().IsRegular():
			tree = append(tree, localEntry{rel: filepath.ToSlash(rel), mode: info.Mode().Perm(), size: info.Size()})
		default:
			skipped++
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return tree, skipped, nil
}

// treeSize is the bytes of a tree's files.
func treeSize(tree []localEntry) int64 {
	var total int64
	for _, e := range tree {
		total += e.size
	}
	return total
}

// localBase is the name a local source is copied under.
func localBase(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	return filepath.Base(p)
}

// remoteTarget returns where a source named base lands for DST dst: inside
// dst when it is a directory (or ends with /), else dst itself.
func remoteTarget(ctx context.Context, agent *agentclient.Client, dst, base string, isDir bool) (string, error) {
	st, err := agent.Stat(ctx, dst, compute.StatOptions{})
	switch {
	case err == nil && st.Type == compute.FileDirectory:
		dst = path.Join(dst, base)
	case err == nil:
		if isDir {
			return "", usageErr(compute.ErrNotDirectory, "%s exists in the sandbox and is not a directory", dst)
		}
		return dst, nil
	case errors.Is(err, compute.ErrNotFound):
		if strings.HasSuffix(dst, "/") {
			dst = path.Join(dst, base)
		}
		return dst, nil
	default:
		return "", err
	}
	if isDir {
		switch st, err := agent.Stat(ctx, dst, compute.StatOptions{}); {
		case err == nil && st.Type != compute.FileDirectory:
			return "", usageErr(compute.ErrNotDirectory, "%s exists in the sandbox and is not a directory", dst)
		case err != nil && !errors.Is(err, compute.ErrNotFound):
			return "", err
		}
	}
	return dst, nil
}

// writeRemote streams one local file into the sandbox (atomically, its
// parents created, refused if its size changes while it is read).
func writeRemote(ctx context.Context, agent *agentclient.Client, local, remote, user string, e localEntry, prog *progress) error {
	f, err := os.Open(local)
	if err != nil {
		return err
	}
	defer f.Close()
	size := e.size
	opts := compute.WriteFileOptions{Mode: uint32(e.mode), CreateParents: true, ExpectedSize: &size, User: user}
	if _, err := agent.WriteFile(ctx, remote, opts, progressReader{r: f, p: prog}); err != nil {
		return fmt.Errorf("%s: %w", local, err)
	}
	return nil
}

// copyOut copies a sandbox file or directory to a local path.
func copyOut(cmd *cobra.Command, g *globals, src cpPath, local string) error {
	ctx := cmd.Context()
	stderr := cmd.ErrOrStderr()
	r, err := reconnect(cmd, g, src.id, materializer.Options{})
	if err != nil {
		return err
	}
	defer r.release()
	r.noteRebuilt(stderr)
	agent := r.sess.Agent()
	info, err := agent.Stat(ctx, src.path, compute.StatOptions{})
	if err != nil {
		return err
	}
	name := path.Base(path.Clean(src.path))
	if name == "." || name == "/" {
		name = src.id
	}
	target := local
	if fi, err := os.Stat(local); (err == nil && fi.IsDir()) || (err != nil && strings.HasSuffix(local, "/")) {
		target = filepath.Join(local, name)
	}
	switch info.Type {
	case compute.FileRegular:
		return readRemote(ctx, agent, src.path, target, info, newProgress(stderr, "cp "+name, info.Size))
	case compute.FileDirectory:
		return copyDirOut(ctx, agent, src.path, target, newProgress(stderr, "cp "+name, -1), stderr)
	case compute.FileSymlink:
		return usageErr(compute.ErrInvalidArgument, "%s is a symbolic link (to %s); copy what it points to", src.path, info.SymlinkTarget)
	}
	return usageErr(compute.ErrInvalidArgument, "%s is neither a regular file nor a directory", src.path)
}

// readRemote streams a sandbox file into a local file, written to a
// temporary file beside it and renamed into place when complete.
func readRemote(ctx context.Context, agent *agentclient.Client, remote, target string, info *compute.FileInfo, prog *progress) error {
	return writeLocalFile(target, fs.FileMode(info.Mode&0o777), func(w io.Writer) error {
		cw := &countingWriter{w: progressWriter{w: w, p: prog}}
		got, err := agent.ReadFile(ctx, remote, compute.ReadFileOptions{}, cw)
		if err != nil {
			return err
		}
		prog.finish()
		if want := got.Size; cw.n < want {
			return fmt.Errorf("%s: read %d of its %d bytes (the daemon's read limit?)", remote, cw.n, want)
		}
		return nil
	})
}

// writeLocalFile writes a local file through fill: into a temporary file
// beside target, given mode and renamed over target once fill succeeded
// (removed otherwise). A directory at target is refused.
func writeLocalFile(target string, mode fs.FileMode, fill func(io.Writer) error) (err error) {
	if fi, serr := os.Stat(target); serr == nil && fi.IsDir() {
		return usageErr(compute.ErrIsDirectory, "%s is a directory", target)
	}
	tmp, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".cp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fill(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), target)
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// errCopyStopped closes a pipe of copyDirOut whose other side stopped: the
// errors it causes are consequences, not the reason of a failure.
var errCopyStopped = errors.New("the copy stopped")

// copyDirOut copies a sandbox directory into a new or empty local
// directory: the workspace archive (its siblings along the way left out),
// cut down to the subtree, extracted by archive.Restore with the daemon's
// safety rules. On failure a directory it created is removed again.
func copyDirOut(ctx context.Context, agent *agentclient.Client, remote, target string, prog *progress, stderr io.Writer) (err error) {
	sys, err := agent.Info(ctx)
	if err != nil {
		return err
	}
	rel, err := workspaceRel(sys.WorkspaceRoot, remote)
	if err != nil {
		return err
	}
	created, err := emptyTarget(target)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && created {
			os.RemoveAll(target)
		}
	}()
	exclude, err := siblingExcludes(ctx, agent, rel)
	if err != nil {
		return err
	}

	pr, pw := io.Pipe()
	archived := make(chan error, 1)
	go func() {
		req := compute.ArchiveOptions{Exclude: exclude, Compression: compute.CompressionNone}
		_, err := agent.Archive(ctx, req, progressWriter{w: pw, p: prog})
		pw.CloseWithError(err)
		archived <- err
	}()
	fr, fw := io.Pipe()
	type cut struct {
		matched, skipped int
		err              error
	}
	filtered := make(chan cut, 1)
	go func() {
		matched, skipped, err := subtree(pr, fw, rel)
		fw.CloseWithError(err)
		pr.CloseWithError(errCopyStopped)
		filtered <- cut{matched, skipped, err}
	}()
	_, rerr := archive.Restore(ctx, target, fr, archive.RestoreOptions{})
	fr.CloseWithError(errCopyStopped)
	aerr, f := <-archived, <-filtered
	prog.finish()
	for _, e := range []error{aerr, f.err, rerr} {
		if e != nil && !errors.Is(e, errCopyStopped) {
			return fmt.Errorf("%s: %w", remote, e)
		}
	}
	if f.matched == 0 {
		return usageErr(compute.ErrNotFound, "the workspace archive holds nothing under %s (is one of its parents a symbolic link?)", remote)
	}
	if f.skipped > 0 {
		fmt.Fprintf(stderr, "cp: skipped %d links that point outside %s\n", f.skipped, remote)
	}
	return nil
}

// workspaceRel returns a sandbox path relative to the workspace root, or
// an error when it is outside (the archive holds the workspace only).
func workspaceRel(root, p string) (string, error) {
	c := path.Clean(p)
	if !path.IsAbs(c) {
		if c == ".." || strings.HasPrefix(c, "../") {
			return "", usageErr(compute.ErrPathEscape, "%s is outside the workspace", p)
		}
		return c, nil
	}
	root = path.Clean(root)
	switch {
	case c == root:
		return ".", nil
	case root != "" && strings.HasPrefix(c, root+"/"):
		return c[len(root)+1:], nil
	}
	return "", usageErr(compute.ErrInvalidArgument, "%s is outside the workspace (%s): only workspace directories can be copied out", p, root)
}

// emptyTarget makes sure a local directory copy target is new or empty,
// and reports whether it created it.
func emptyTarget(target string) (bool, error) {
	fi, err := os.Stat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(target, 0o755); err != nil {
			return false, err
		}
		return true, nil
	case err != nil:
		return false, err
	case !fi.IsDir():
		return false, usageErr(compute.ErrNotDirectory, "%s exists and is not a directory", target)
	}
	entries, err := os.ReadDir(target)
	if err != nil {
		return false, err
	}
	if len(entries) > 0 {
		return false, usageErr(compute.ErrNotEmpty, "%s is not empty: a directory is copied into a new or empty one", target)
	}
	return false, nil
}

// siblingExcludes lists, along the way from the workspace root to rel, the
// entries beside it, so the archive carries little more than rel. (The
// subtree filter is what guarantees that only rel is extracted.)
func siblingExcludes(ctx context.Context, agent *agentclient.Client, rel string) ([]string, error) {
	if rel == "." {
		return nil, nil
	}
	var exclude []string
	dir := "."
	for _, part := range strings.Split(rel, "/") {
		token := ""
		for {
			resp, err := agent.ListDir(ctx, dir, compute.ListDirOptions{PageToken: token})
			if err != nil {
				return nil, err
			}
			for _, e := range resp.Entries {
				if len(e.RawName) == 0 && e.Name != part {
					exclude = append(exclude, path.Join(dir, e.Name))
				}
			}
			if token = resp.NextPageToken; token == "" {
				break
			}
		}
		dir = path.Join(dir, part)
	}
	return exclude, nil
}

// subtree copies the tar stream r to w, keeping only the members under
// prefix (a clean workspace-relative path, "." for all), renamed relative
// to it. Hard links to members outside and symbolic links leading out of
// it are left out and counted. It returns how many members it kept.
func subtree(r io.Reader, w io.Writer, prefix string) (matched, skipped int, err error) {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return matched, skipped, fmt.Errorf("read the workspace archive: %w", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, ok := within(hdr.Name, prefix)
		if !ok {
			continue
		}
		matched++
		if name == "." {
			continue // the copied directory itself: the target
		}
		switch hdr.Typeflag {
		case tar.TypeLink:
			target, ok := within(hdr.Linkname, prefix)
			if !ok || target == "." {
				skipped++
				continue
			}
			hdr.Linkname = target
		case tar.TypeSymlink:
			if leaves(name, hdr.Linkname) {
				skipped++
				continue
			}
		}
		if hdr.Typeflag == tar.TypeDir {
			name += "/"
		}
		hdr.Name = name
		delete(hdr.PAXRecords, "path")
		delete(hdr.PAXRecords, "linkpath")
		if err := tw.WriteHeader(hdr); err != nil {
			return matched, skipped, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return matched, skipped, err
		}
	}
	return matched, skipped, tw.Close()
}

// within returns an archive member name relative to prefix, and whether
// it is at or below prefix.
func within(name, prefix string) (string, bool) {
	c := path.Clean(strings.TrimPrefix(name, "/"))
	switch {
	case prefix == ".":
		return c, true
	case c == prefix:
		return ".", true
	case strings.HasPrefix(c, prefix+"/"):
		return c[len(prefix)+1:], true
	}
	return "", false
}

// leaves reports whether a symbolic link at name (relative to the copied
// directory) with this target points outside it.
func leaves(name, target string) bool {
	if path.IsAbs(target) {
		return true
	}
	j := path.Join(path.Dir(name), target)
	return j == ".." || strings.HasPrefix(j, "../")
}
