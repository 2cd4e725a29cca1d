package workspace

import (
	"context"
	"errors"
	"io/fs"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// CleanupTemp removes the temporary files (TempPrefix*) that writes or
// commits interrupted by a crash left in the workspace and its writable
// grants, and returns how many it removed. The daemon calls it at startup,
// before serving: it would also remove the staging files of writes in
// progress. The walk goes through os.Root and never follows symbolic links.
// Failures on single entries are logged and skipped; the first is returned.
func (w *Workspace) CleanupTemp(ctx context.Context) (int, error) {
	removed := 0
	var first error
	for _, m := range w.mounts.Load().list {
		if m.readOnly {
			continue
		}
		err := fs.WalkDir(m.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			if err != nil {
				w.log.Warn("cleanup: skip unreadable entry", zap.String("path", p), zap.Error(err))
				if first == nil {
					first = &errkind.PathError{Op: "cleanup", Path: p, Err: classify(err)}
				}
				if d != nil && d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			if !IsTempName(d.Name()) || d.IsDir() {
				return nil
			}
			if err := m.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				w.log.Warn("cleanup: remove temporary file", zap.String("path", p), zap.Error(err))
				if first == nil {
					first = &errkind.PathError{Op: "cleanup", Path: p, Err: classify(err)}
				}
				return nil
			}
			removed++
			return nil
		})
		if err != nil {
			return removed, &errkind.PathError{Op: "cleanup", Path: ".", Err: classify(err)}
		}
	}
	if removed > 0 {
		w.log.Info("removed leftover temporary files", zap.Int("count", removed))
	}
	return removed, first
}
