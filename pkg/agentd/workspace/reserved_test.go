package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// A restore's private directory (its journal, stage and backup) is the
// daemon's own: no request may create, change, move or remove an entry
// named with ReservedPrefix at the workspace root, even as the daemon's
// identity, so a forged journal cannot be planted through the file API.
// The same names below the root, and in grants, are ordinary.
func TestReservedNamesAreTheDaemons(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	private := ReservedPrefix + "private"
	must(t, os.Mkdir(e.path(private), 0o700))
	must(t, os.WriteFile(e.path(private+"/journal"), []byte("{}"), 0o600))
	e.put(t, "plain.txt", "plain\n", 0o644)
	must(t, os.Symlink(private, e.path("link")))
	refused := map[string]error{}
	write := func(p string) error {
		_, err := e.w.WriteFile(ctx, nil, WriteOptions{Path: p, CreateParents: true, ExpectedSize: UnknownSize}, strings.NewReader("forged"))
		return err
	}
	refused["write the journal"] = write(private + "/journal")
	refused["write a new journal"] = write(ReservedPrefix + "other/journal")
	refused["write through a link"] = write("link/journal")
	refused["make a reserved dir"] = e.w.MakeDir(ctx, nil, ReservedPrefix+"x", 0o700, false)
	refused["remove the journal"] = e.w.Remove(ctx, nil, private+"/journal", false)
	refused["remove the private dir"] = e.w.Remove(ctx, nil, private, true)
	refused["rename it away"] = e.w.Rename(ctx, nil, private, "moved", false)
	refused["rename a file into it"] = e.w.Rename(ctx, nil, "plain.txt", private+"/journal", true)
	refused["rename onto a reserved name"] = e.w.Rename(ctx, nil, "plain.txt", ReservedPrefix+"y", false)
	refused["commit into it"] = e.w.Commit(ctx, nil, []FileChange{{Kind: ChangeWrite, Path: private + "/journal", Content: []byte("forged")}})
	for what, err := range refused {
		if !errors.Is(err, errkind.ErrPermissionDenied) {
			t.Errorf("%s: %v, want ErrPermissionDenied", what, err)
		}
	}
	if data, err := os.ReadFile(e.path(private + "/journal")); err != nil || string(data) != "{}" {
		t.Errorf("the journal changed: %q %v", data, err)
	}
	for _, p := range []string{ReservedPrefix + "other", ReservedPrefix + "x", ReservedPrefix + "y", "moved"} {
		if _, err := os.Lstat(e.path(p)); err == nil {
			t.Errorf("%s was made", p)
		}
	}
	// Ordinary elsewhere: below the root, a near miss, in a grant.
	for _, p := range []string{"sub/" + ReservedPrefix + "x", ".bulkhead-restorex", filepath.Join(e.grantRW, ReservedPrefix+"g")} {
		if err := write(p); err != nil {
			t.Errorf("write %s: %v", p, err)
		}
	}
}
