package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Files of a tenant's sandbox (an API sandbox or a run's) beyond reading
// (sandbox.go): writing, stat, removing, making directories, patches. Each
// works as the sandbox's account, on a workspace-relative path checked by
// cleanPath (the daemon confines paths itself as well).

// entryOf is a file as a tenant sees it, at the workspace-relative path p.
func entryOf(p string, fi *compute.FileInfo) *FileEntry {
	name := fi.Name
	if name == "" {
		name = path.Base(p)
	}
	return &FileEntry{Name: name, Path: p, Type: fileType(fi.Type), Size: fi.Size, Mode: fi.Mode, Modified: fi.ModifiedAt}
}

// errFileTooLarge: a written file passed the policy's MaxFileBytes.
type errFileTooLarge struct{ limit int64 }

func (e *errFileTooLarge) Error() string {
	return fmt.Sprintf("file: more than %d bytes; the limit is %d (nothing was written)", e.limit, e.limit)
}

func (e *errFileTooLarge) Unwrap() error { return errkind.ErrResourceExhausted }

// limitReader fails once more than limit bytes were read.
type limitReader struct {
	r     io.Reader
	left  int64
	limit int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left < 0 {
		return 0, &errFileTooLarge{limit: l.limit}
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		return 0, &errFileTooLarge{limit: l.limit}
	}
	return n, err
}

// MaxFileBytes is the most a file written through the API may hold.
func (m *Manager) MaxFileBytes() int64 { return m.api.policy.MaxFileBytes }

// WriteFile writes r to a file of a tenant's sandbox, atomically: the file
// is replaced only once every byte arrived, so a failed or cut write
// leaves it as it was. More than the policy's MaxFileBytes is resource
// exhausted.
func (m *Manager) WriteFile(ctx context.Context, tenant, sandboxID, filePathArg string, o WriteFileOptions, r io.Reader) (*FileEntry, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	p, err := filePath(filePathArg)
	if err != nil {
		return nil, err
	}
	if err := checkMode("mode", o.Mode); err != nil {
		return nil, err
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	defer done()
	limit := m.api.policy.MaxFileBytes
	lr := &limitReader{r: r, left: limit, limit: limit}
	res, err := sess.WriteFile(ctx, p, compute.WriteFileOptions{Mode: o.Mode, User: sess.Manifest().RunAs,
		CreateParents: o.CreateParents, Overwrite: compute.OverwriteAlways}, lr)
	if lr.left < 0 {
		return nil, &errFileTooLarge{limit: limit}
	}
	if err != nil {
		return nil, err
	}
	return entryOf(p, &res.Info), nil
}

// Stat describes a path of a tenant's sandbox ("" is the workspace root);
// a final symlink is not followed.
func (m *Manager) Stat(ctx context.Context, tenant, sandboxID, filePathArg string) (*FileEntry, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	p, err := cleanPath(filePathArg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	defer done()
	fi, err := sess.Stat(ctx, p, compute.StatOptions{User: sess.Manifest().RunAs})
	if err != nil {
		return nil, err
	}
	return entryOf(p, fi), nil
}

// Remove removes a path of a tenant's sandbox (not the workspace root): a
// file, or a directory (a non-empty one only when recursive).
func (m *Manager) Remove(ctx context.Context, tenant, sandboxID, filePathArg string, recursive bool) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	p, err := filePath(filePathArg)
	if err != nil {
		return err
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return err
	}
	defer done()
	return sess.Remove(ctx, p, compute.RemoveOptions{Recursive: recursive, User: sess.Manifest().RunAs})
}

// MakeDir makes a directory of a tenant's sandbox (with its missing
// parents when parents is set; an existing directory is then no error).
func (m *Manager) MakeDir(ctx context.Context, tenant, sandboxID, filePathArg string, parents bool, mode uint32) (*FileEntry, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	p, err := filePath(filePathArg)
	if err != nil {
		return nil, err
	}
	if err := checkMode("mode", mode); err != nil {
		return nil, err
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	defer done()
	fi, err := sess.MakeDir(ctx, p, compute.MakeDirOptions{Mode: mode, Parents: parents, User: sess.Manifest().RunAs})
	if err != nil {
		return nil, err
	}
	return entryOf(p, fi), nil
}

// ApplyPatch applies a V4A patch to a tenant's sandbox, all or nothing,
// with its paths relative to cwd (workspace-relative), and returns what it
// changed; a patch that does not apply changes nothing and comes back
// with its Rejection (no error); a malformed one is invalid argument.
func (m *Manager) ApplyPatch(ctx context.Context, tenant, sandboxID, patch, cwd string, dryRun bool) (*PatchResult, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if patch == "" {
		return nil, badField("patch", "missing")
	}
	if err := checkText("patch", patch, maxPatchBytes); err != nil {
		return nil, err
	}
	if err := checkWorkdir("cwd", cwd); err != nil {
		return nil, err
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, sandboxID)
	if err != nil {
		return nil, err
	}
	defer done()
	res, err := sess.ApplyPatch(ctx, patch, compute.ApplyPatchOptions{Cwd: cwd, User: sess.Manifest().RunAs, DryRun: dryRun})
	if err != nil {
		rej := compute.PatchRejection(err)
		switch {
		case rej != nil && (errors.Is(rej.Kind, errkind.ErrPatchRejected) || (rej.Kind == nil && errors.Is(err, errkind.ErrPatchRejected))):
			return &PatchResult{Rejection: &PatchRejection{Path: rej.Path, Message: rej.Message,
				ExpectedLines: slices.Clone(rej.ExpectedLines), ClosestLine: rej.ClosestLine,
				ClosestLines: slices.Clone(rej.ClosestLines)}}, nil
		case errors.Is(err, errkind.ErrInvalidArgument):
			return nil, &FieldError{Field: "patch", Err: err}
		}
		return nil, err
	}
	out := &PatchResult{}
	for _, c := range res.Changes {
		out.Changes = append(out.Changes, PatchChange{Kind: string(c.Kind), Path: c.Path, NewPath: c.NewPath})
	}
	return out, nil
}
