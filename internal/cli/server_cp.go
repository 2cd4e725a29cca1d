package cli

// `harness sandbox cp` against a service: a file moves with the file
// routes (PUT and GET /v1/sandboxes/{id}/files/{path}), a directory as one
// tar stream (POST and GET /v1/sandboxes/{id}/tar/{dir}), extracted on
// this side with archive.Restore's safety rules.

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/bulkhead-dev/bulkhead/pkg/archive"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// serverStat describes a sandbox path on the service (nil, nil when it
// does not exist).
func serverStat(ctx context.Context, c *serverConn, id, p string) (*harnessv1.FileEntry, error) {
	resp, err := c.sandboxes.Stat(ctx, connect.NewRequest(&harnessv1.StatRequest{SandboxId: id, Path: p}))
	if err == nil {
		return resp.Msg.GetFile(), nil
	}
	if connect.CodeOf(err) == connect.CodeNotFound {
		// The sandbox itself missing is an error; a missing path is not.
		if _, gerr := c.sandboxes.GetSandbox(ctx, connect.NewRequest(&harnessv1.GetSandboxRequest{SandboxId: id})); gerr != nil {
			return nil, c.serverErr(id, gerr)
		}
		return nil, nil
	}
	return nil, c.serverErr(id, err)
}

// serverCopyIn copies a local file or directory into sandbox dst.id.
func serverCopyIn(cmd *cobra.Command, c *serverConn, local string, dst cpPath) error {
	if err := refuseWithServer(cmd, "files copied in belong to the sandbox's own account", "user"); err != nil {
		return err
	}
	ctx := cmd.Context()
	stderr := cmd.ErrOrStderr()
	fi, err := os.Stat(local)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() && !fi.IsDir() {
		return usageErr(compute.ErrInvalidArgument, "%s is neither a regular file nor a directory", local)
	}
	target := workspacePath(dst.path)
	st, err := serverStat(ctx, c, dst.id, target)
	if err != nil {
		return err
	}
	switch {
	case st != nil && st.GetType() == harnessv1.FileType_FILE_TYPE_DIRECTORY:
		target = path.Join(target, localBase(local))
		if st, err = serverStat(ctx, c, dst.id, target); err != nil {
			return err
		}
		if st != nil && fi.IsDir() && st.GetType() != harnessv1.FileType_FILE_TYPE_DIRECTORY {
			return usageErr(compute.ErrNotDirectory, "%s exists in the sandbox and is not a directory", target)
		}
	case st != nil && fi.IsDir():
		return usageErr(compute.ErrNotDirectory, "%s exists in the sandbox and is not a directory", dst.path)
	case st == nil && strings.HasSuffix(dst.path, "/"):
		target = path.Join(target, localBase(local))
	}
	if fi.Mode().IsRegular() {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		prog := newProgress(stderr, "cp "+filepath.Base(local), fi.Size())
		q := url.Values{"mode": {strconv.FormatUint(uint64(fi.Mode().Perm()), 8)}}
		resp, err := c.do(ctx, http.MethodPut, c.routeURL(dst.id, "files", target, q), progressReader{r: f, p: prog}, "application/octet-stream", fi.Size())
		if err != nil {
			return c.serverErr(dst.id, err)
		}
		resp.Body.Close()
		prog.finish()
		return nil
	}
	tree, skipped, err := walkLocal(local)
	if err != nil {
		return err
	}
	prog := newProgress(stderr, "cp "+filepath.Base(local), treeSize(tree))
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, local, tree, prog)) }()
	resp, err := c.do(ctx, http.MethodPost, c.routeURL(dst.id, "tar", target, nil), pr, "application/x-tar", -1)
	pr.CloseWithError(errCopyStopped)
	if err != nil {
		return c.serverErr(dst.id, err)
	}
	resp.Body.Close()
	prog.finish()
	if skipped > 0 {
		fmt.Fprintf(stderr, "cp: skipped %d entries that are neither regular files nor directories (symbolic links, devices)\n", skipped)
	}
	return nil
}

// writeTar writes a local tree as a tar stream: directories and regular
// files, named relative to the tree's root.
func writeTar(w io.Writer, root string, tree []localEntry, prog *progress) error {
	tw := tar.NewWriter(w)
	for _, e := range tree {
		if e.rel == "." {
			continue
		}
		hdr := &tar.Header{Name: e.rel, Mode: int64(e.mode), Typeflag: tar.TypeReg, Size: e.size, Format: tar.FormatPAX}
		if e.dir {
			hdr.Name, hdr.Typeflag, hdr.Size = e.rel+"/", tar.TypeDir, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if e.dir {
			continue
		}
		if err := copyFileInto(tw, filepath.Join(root, filepath.FromSlash(e.rel)), e.size, prog); err != nil {
			return err
		}
	}
	return tw.Close()
}

// copyFileInto copies a local file of the size it was listed with.
func copyFileInto(w io.Writer, name string, size int64, prog *progress) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(progressReader{r: f, p: prog}, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s: changed size while it was copied (%d bytes, listed with %d)", name, n, size)
	}
	return err
}

// serverCopyOut copies a sandbox file or directory to a local path.
func serverCopyOut(cmd *cobra.Command, c *serverConn, src cpPath, local string) (err error) {
	ctx := cmd.Context()
	stderr := cmd.ErrOrStderr()
	p := workspacePath(src.path)
	st, err := serverStat(ctx, c, src.id, p)
	if err != nil {
		return err
	}
	if st == nil {
		return usageErr(compute.ErrNotFound, "%s: no such file or directory in sandbox %s", src.path, src.id)
	}
	name := path.Base(p)
	if p == "" {
		name = src.id
	}
	target := local
	if fi, err := os.Stat(local); (err == nil && fi.IsDir()) || (err != nil && strings.HasSuffix(local, "/")) {
		target = filepath.Join(local, name)
	}
	switch st.GetType() {
	case harnessv1.FileType_FILE_TYPE_FILE:
		return serverReadFile(ctx, c, src.id, p, target, st, newProgress(stderr, "cp "+name, st.GetSize()))
	case harnessv1.FileType_FILE_TYPE_DIRECTORY:
	default:
		return usageErr(compute.ErrInvalidArgument, "%s is neither a regular file nor a directory", src.path)
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
	resp, err := c.do(ctx, http.MethodGet, c.routeURL(src.id, "tar", p, nil), nil, "", 0)
	if err != nil {
		return c.serverErr(src.id, err)
	}
	defer resp.Body.Close()
	prog := newProgress(stderr, "cp "+name, -1)
	if _, err := archive.Restore(ctx, target, progressReader{r: resp.Body, p: prog}, archive.RestoreOptions{}); err != nil {
		return fmt.Errorf("%s: %w", src.path, err)
	}
	prog.finish()
	return nil
}

// serverReadFile downloads a sandbox file into a temporary file beside
// target, renamed into place once complete.
func serverReadFile(ctx context.Context, c *serverConn, id, p, target string, st *harnessv1.FileEntry, prog *progress) error {
	if fi, err := os.Stat(target); err == nil && fi.IsDir() {
		return usageErr(compute.ErrIsDirectory, "%s is a directory", target)
	}
	resp, err := c.do(ctx, http.MethodGet, c.routeURL(id, "files", p, nil), nil, "", 0)
	if err != nil {
		return c.serverErr(id, err)
	}
	defer resp.Body.Close()
	return writeLocalFile(target, fs.FileMode(st.GetMode()&0o777), func(w io.Writer) error {
		n, err := io.Copy(progressWriter{w: w, p: prog}, resp.Body)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if resp.ContentLength >= 0 && n != resp.ContentLength {
			return fmt.Errorf("%s: read %d of its %d bytes", p, n, resp.ContentLength)
		}
		prog.finish()
		return nil
	})
}
