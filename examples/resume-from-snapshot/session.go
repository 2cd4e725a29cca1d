package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// The files part 1 writes, and checks after the resume.
var sessionFiles = map[string]string{
	"notes/todo.md":     "- [x] load the data\n- [ ] plot it\n",
	"data/readings.csv": "t,celsius\n0,19.5\n1,20.1\n2,20.7\n",
}

// sessionPart creates a session, writes files, persists it (Close),
// deletes the sandbox, then resumes the saved State into a fresh sandbox
// and shows the files came back.
func sessionPart(ctx context.Context, client *compute.Client, store snapshot.Store, dir string, out io.Writer) error {
	step(out, "Part 1: a session persisted to a snapshot, deleted, and resumed")
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"README.md": {Type: manifest.TypeFile, Content: []byte("A workspace that outlives its sandbox.\n")},
	}}
	sess, err := client.Create(ctx, compute.CreateOptions{Manifest: m})
	if err != nil {
		return err
	}
	// Whatever happens below, leave no sandbox behind.
	defer func() { _ = client.Delete(context.WithoutCancel(ctx), sess) }()
	if err := sess.Start(ctx); err != nil { // materializes the manifest
		return err
	}
	fmt.Fprintf(out, "created session %s (%s provider)\n", sess.ID(), sess.Provider())

	for _, p := range slices.Sorted(maps.Keys(sessionFiles)) {
		if _, err := sess.WriteFile(ctx, p, compute.WriteFileOptions{CreateParents: true}, strings.NewReader(sessionFiles[p])); err != nil {
			return err
		}
		fmt.Fprintf(out, "wrote %s\n", p)
	}
	// A command's output is part of the workspace too.
	if err := shell(ctx, sess, "mkdir -p build && echo 'build 42: ok' > build/status && find . -type f | sort", out); err != nil {
		return err
	}

	// Close runs the pre-stop hooks, archives the workspace into the
	// snapshot store, and shuts the sandbox down. The State says where
	// everything is. Save it anywhere: it has no token and no secret.
	if err := sess.Close(ctx); err != nil {
		return err
	}
	st, err := sess.State()
	if err != nil {
		return err
	}
	data, err := st.Encode()
	if err != nil {
		return err
	}
	statePath := filepath.Join(dir, "session-state.json")
	if err := os.WriteFile(statePath, data, 0o600); err != nil {
		return err
	}
	ok, err := store.Exists(ctx, st.SnapshotID)
	if err != nil || !ok {
		return fmt.Errorf("snapshot %s not in the store (%v)", st.SnapshotID, err)
	}
	fmt.Fprintf(out, "closed: workspace persisted to snapshot %s; state saved to %s (%d bytes of JSON)\n", st.SnapshotID, filepath.Base(statePath), len(data))

	// Delete removes the sandbox and its workspace directory. The snapshot
	// stays in the store.
	if err := client.Delete(ctx, sess); err != nil {
		return err
	}
	n, err := sandboxCount(ctx, client)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "deleted the sandbox: %d sandboxes left\n", n)

	// Later, possibly in another process: read the state back and resume.
	// The sandbox is gone, so Resume launches a replacement, and Start
	// restores the workspace from the snapshot.
	data, err = os.ReadFile(statePath)
	if err != nil {
		return err
	}
	saved, err := client.DecodeState(data)
	if err != nil {
		return err
	}
	resumed, err := client.Resume(ctx, saved)
	if err != nil {
		return err
	}
	defer func() { _ = client.Delete(context.WithoutCancel(ctx), resumed) }()
	if err := resumed.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "resumed session %s into a fresh sandbox, restored from snapshot %s\n", resumed.ID(), saved.SnapshotID)
	for _, p := range slices.Sorted(maps.Keys(sessionFiles)) {
		var b bytes.Buffer
		if _, err := resumed.ReadFile(ctx, p, compute.ReadFileOptions{}, &b); err != nil {
			return err
		}
		if b.String() != sessionFiles[p] {
			return fmt.Errorf("%s came back as %q", p, b.String())
		}
		fmt.Fprintf(out, "%s is back (%d bytes, unchanged)\n", p, b.Len())
	}
	if err := shell(ctx, resumed, "cat build/status", out); err != nil {
		return err
	}
	if err := client.Delete(ctx, resumed); err != nil {
		return err
	}
	// The snapshot outlives every sandbox; drop it when the work is done.
	if err := store.Delete(ctx, saved.SnapshotID); err != nil {
		return err
	}
	fmt.Fprintln(out, "deleted the resumed sandbox and its snapshot")
	return nil
}

// shell runs a shell command in the session and prints its output.
func shell(ctx context.Context, sess *compute.Session, command string, out io.Writer) error {
	fmt.Fprintf(out, "$ %s\n", command)
	res, err := sess.Exec(ctx, compute.ProcessSpec{Command: command}, compute.ExecOptions{}, nil)
	if err != nil {
		return err
	}
	_, _ = out.Write(res.Stdout)
	_, _ = out.Write(res.Stderr)
	if code := res.Exit.ExitCode; code != 0 {
		return fmt.Errorf("%q exited with code %d", command, code)
	}
	return nil
}
