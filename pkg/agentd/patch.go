package agentd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/patch"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// PatchRequest is an apply_patch call.
type PatchRequest struct {
	// Text is a full `*** Begin Patch` envelope; or Operations is set.
	Text       string
	Operations []patch.Operation
	// Cwd is the directory relative patch paths are resolved against
	// (workspace-relative or absolute inside the workspace; "" is the root).
	Cwd string
	// User is the run_as user; "" is the default.
	User string
	// DryRun plans the patch and checks it applies, changing nothing.
	DryRun bool
}

// ApplyPatch parses and plans the whole patch against the current files,
// then commits every change at once: if anything fails (a hunk that does not
// match, a path that escapes, a permission), no file is changed. It returns
// the applied changes in patch order.
//
// Errors are *patch.Error (ErrInvalidArgument for a malformed patch,
// ErrPatchRejected for one that does not apply, ErrResourceExhausted past a
// limit) or workspace errors from the commit.
func (d *Daemon) ApplyPatch(ctx context.Context, req PatchRequest) ([]patch.Change, error) {
	user, err := d.User(req.User)
	if err != nil {
		return nil, &errkind.PathError{Op: "apply_patch", Path: req.Cwd, Err: err}
	}
	opts := patch.Options{MaxPatchBytes: int(d.cfg.MaxPatchBytes)}
	var p *patch.Patch
	if req.Operations != nil {
		p, err = patch.FromOperations(req.Operations, opts)
	} else {
		p, err = patch.Parse(req.Text, opts)
	}
	if err != nil {
		return nil, err
	}
	src := &patchSource{ctx: ctx, ws: d.ws, user: user, cwd: req.Cwd, maxBytes: int64(patchMaxFileBytes(opts))}
	changes, err := patch.Plan(src, p, opts)
	if err != nil {
		return nil, err
	}
	if req.DryRun {
		return changes, nil
	}
	commit, err := d.commitPlan(ctx, user, req.Cwd, changes)
	if err != nil {
		return nil, err
	}
	if err := d.ws.Commit(ctx, user, commit); err != nil {
		return nil, err
	}
	return changes, nil
}

func patchMaxFileBytes(o patch.Options) int {
	if o.MaxFileBytes > 0 {
		return o.MaxFileBytes
	}
	return patch.DefaultMaxFileBytes
}

// joinCwd resolves a patch path against the patch's working directory;
// absolute paths stay absolute (the workspace confines both).
func joinCwd(cwd, p string) string {
	if path.IsAbs(p) || cwd == "" {
		return p
	}
	return path.Join(cwd, p)
}

// commitPlan turns the planned changes into one workspace commit. When no
// file is touched twice (the usual case), changes map one to one and a move
// stays a rename (keeping the file's mode and inode). Otherwise the final
// state of every touched file is computed, keyed by where each path really
// resolves (so two spellings of one file are one file), and committed as
// writes and deletes, with moved content keeping its source's mode.
func (d *Daemon) commitPlan(ctx context.Context, user *userdb.User, cwd string, changes []patch.Change) ([]workspace.FileChange, error) {
	type target struct {
		display string // path as the patch wrote it (joined with cwd)
		content []byte
		deleted bool
		modeOf  string // path whose mode a moved file keeps
		existed bool
		present bool // a file is at this path at this point of the patch
		fresh   bool // that file was created by this patch: it gets the default mode
	}
	resolved := map[string]string{} // joined path -> resolved absolute path
	resolve := func(p string) (string, error) {
		j := joinCwd(cwd, p)
		if r, ok := resolved[j]; ok {
			return r, nil
		}
		loc, err := d.ws.Resolve(ctx, user, j, false)
		if err != nil {
			return "", err
		}
		resolved[j] = loc.Path
		return loc.Path, nil
	}
	touched := map[string]int{}
	for _, c := range changes {
		for _, p := range []string{c.Path, c.MoveTo} {
			if p == "" {
				continue
			}
			r, err := resolve(p)
			if err != nil {
				return nil, err
			}
			touched[r]++
		}
	}
	simple := true
	for _, n := range touched {
		if n > 1 {
			simple = false
		}
	}
	if simple {
		out := make([]workspace.FileChange, 0, len(changes))
		for _, c := range changes {
			fc := workspace.FileChange{Path: joinCwd(cwd, c.Path), Content: c.Content}
			switch {
			case c.Kind == patch.OpDelete:
				fc.Kind = workspace.ChangeDelete
			case c.MoveTo != "":
				fc.Kind, fc.NewPath = workspace.ChangeMove, joinCwd(cwd, c.MoveTo)
			default:
				fc.Kind = workspace.ChangeWrite
			}
			out = append(out, fc)
		}
		return out, nil
	}

	final := map[string]*target{}
	var order []string
	get := func(p string) (*target, error) {
		r, err := resolve(p)
		if err != nil {
			return nil, err
		}
		t, ok := final[r]
		if !ok {
			_, serr := d.ws.Stat(ctx, user, joinCwd(cwd, p))
			t = &target{display: joinCwd(cwd, p), existed: serr == nil, present: serr == nil}
			final[r] = t
			order = append(order, r)
		}
		return t, nil
	}
	for _, c := range changes {
		src, err := get(c.Path)
		if err != nil {
			return nil, err
		}
		switch {
		case c.Kind == patch.OpDelete:
			src.content, src.deleted, src.modeOf, src.present, src.fresh = nil, true, "", false, false
		case c.MoveTo != "":
			dst, err := get(c.MoveTo)
			if err != nil {
				return nil, err
			}
			if dst == src {
				// A move onto the same file under another spelling is an
				// update: removing the source would remove the file.
				src.content, src.deleted, src.present = c.Content, false, true
				break
			}
			modeOf := src.modeOf
			if modeOf == "" && src.existed && !src.fresh {
				modeOf = src.display
			}
			dst.content, dst.deleted, dst.modeOf, dst.present, dst.fresh = c.Content, false, modeOf, true, src.fresh
			src.content, src.deleted, src.modeOf, src.present, src.fresh = nil, true, "", false, false
		default:
			if c.Kind == patch.OpAdd && !src.present {
				// A new file where none is now (deleted or moved away
				// earlier in the patch) does not inherit the old file's mode.
				src.modeOf, src.fresh = "", true
			}
			src.content, src.deleted, src.present = c.Content, false, true
		}
	}
	var out []workspace.FileChange
	for _, r := range order {
		t := final[r]
		switch {
		case t.deleted && t.existed:
			out = append(out, workspace.FileChange{Kind: workspace.ChangeDelete, Path: t.display})
		case !t.deleted:
			fc := workspace.FileChange{Kind: workspace.ChangeWrite, Path: t.display, Content: t.content}
			if t.fresh {
				fc.Mode = workspace.DefaultFileMode
			} else if t.modeOf != "" && t.modeOf != t.display {
				if fi, err := d.ws.Stat(ctx, user, t.modeOf); err == nil {
					fc.Mode = fi.Mode
				}
			}
			out = append(out, fc)
		}
	}
	return out, nil
}

// patchSource lets the patch planner read current files through the
// confined workspace, as the run_as user.
type patchSource struct {
	ctx      context.Context
	ws       *workspace.Workspace
	user     *userdb.User
	cwd      string
	maxBytes int64
}

func (s *patchSource) ReadFile(p string) ([]byte, error) {
	r, err := s.ws.ReadFile(s.ctx, s.user, joinCwd(s.cwd, p), 0, s.maxBytes+1)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, &errkind.PathError{Op: "read", Path: p, Err: err}
	}
	if int64(len(data)) > s.maxBytes {
		return nil, &errkind.PathError{Op: "read", Path: p, Err: errkind.Errorf(errkind.ErrResourceExhausted, "file is larger than %d bytes", s.maxBytes)}
	}
	return data, nil
}

func (s *patchSource) Exists(p string) (bool, bool, error) {
	fi, err := s.ws.Stat(s.ctx, s.user, joinCwd(s.cwd, p))
	if errors.Is(err, errkind.ErrNotFound) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	if fi.Type == workspace.TypeSymlink {
		// Described, not followed, by Stat: ask where it leads.
		loc, err := s.ws.Resolve(s.ctx, s.user, joinCwd(s.cwd, p), true)
		if err != nil {
			return false, false, err
		}
		target, err := s.ws.Stat(s.ctx, s.user, loc.Path)
		if errors.Is(err, errkind.ErrNotFound) {
			return false, false, nil
		}
		if err != nil {
			return false, false, fmt.Errorf("follow symlink: %w", err)
		}
		return true, target.IsDir(), nil
	}
	return true, fi.IsDir(), nil
}
