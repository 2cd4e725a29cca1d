package server

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// wireForm returns what the daemon put on the wire for err: the status
// code, the ErrorDetail and the PatchRejection (nil when absent).
func wireForm(t *testing.T, err error) (codes.Code, *agentdv1.ErrorDetail, *agentdv1.PatchRejection) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("no status in %v", err)
	}
	var detail *agentdv1.ErrorDetail
	for _, d := range st.Details() {
		if x, ok := d.(*agentdv1.ErrorDetail); ok {
			detail = x
		}
	}
	if detail == nil {
		t.Fatalf("no ErrorDetail in %v", st)
	}
	return st.Code(), detail, errmap.PatchRejection(err)
}

// Real failures, through a real daemon and a real client, reach the
// caller with the code and reason the contract names, and match the same
// sentinels as in the daemon.
func TestRealFailuresOnTheWire(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	mustWrite(t, filepath.Join(td.workspace, "a.txt"), "one\ntwo\n", 0o644)
	mustWrite(t, filepath.Join(td.workspace, "dir/x.txt"), "x\n", 0o644)
	const ghost = "bulkhead-no-such-user"
	start := func(spec agentclient.ProcessSpec) func() error {
		return func() error {
			_, err := td.client.Start(ctx, spec, agentclient.StartOptions{})
			return err
		}
	}
	patch := func(text string) func() error {
		return func() error { _, err := applyPatch(ctx, td.client, textPatch(text)); return err }
	}
	for _, c := range []struct {
		name      string
		call      func() error
		code      codes.Code
		reason    agentdv1.ErrorReason
		sentinels []error // all must match on the client
		path      string  // the PathError's path on the client; "" for none, "*" for any
	}{
		// DESIGN: "the answer to an escape is a clear PermissionDenied".
		{"relative escape", func() error { _, err := td.client.Stat(ctx, "../outside", agentclient.StatOptions{}); return err },
			codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_PATH_ESCAPE, []error{errkind.ErrPathEscape}, "../outside"},
		{"missing file", func() error { _, err := td.client.Stat(ctx, "nope.txt", agentclient.StatOptions{}); return err },
			codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND, []error{errkind.ErrNotFound}, "nope.txt"},
		{"unknown run_as user for a file", func() error {
			_, err := td.client.Stat(ctx, "a.txt", agentclient.StatOptions{User: ghost})
			return err
		},
			codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_USER_NOT_FOUND, []error{errkind.ErrUserNotFound, errkind.ErrNotFound}, "a.txt"},
		{"unknown run_as user for a process", start(agentclient.ProcessSpec{Argv: []string{"true"}, User: ghost}),
			codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_USER_NOT_FOUND, []error{errkind.ErrUserNotFound}, ""},
		{"missing working directory", start(agentclient.ProcessSpec{Argv: []string{"true"}, Cwd: "nodir"}),
			codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND, []error{errkind.ErrNotFound}, "nodir"},
		{"working directory is a file", start(agentclient.ProcessSpec{Argv: []string{"true"}, Cwd: "a.txt"}),
			codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_NOT_A_DIRECTORY, []error{errkind.ErrNotDirectory}, "a.txt"},
		{"missing program", start(agentclient.ProcessSpec{Argv: []string{"/bulkhead/no/such/program"}}),
			codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND, []error{errkind.ErrNotFound}, ""},
		{"existing directory", func() error {
			_, err := td.client.MakeDir(ctx, "dir", agentclient.MakeDirOptions{})
			return err
		}, codes.AlreadyExists, agentdv1.ErrorReason_ERROR_REASON_ALREADY_EXISTS, []error{errkind.ErrAlreadyExists}, "dir"},
		{"non-empty directory", func() error { err := td.client.Remove(ctx, "dir", agentclient.RemoveOptions{}); return err },
			codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_DIRECTORY_NOT_EMPTY, []error{errkind.ErrNotEmpty}, "dir"},
		{"malformed patch", patch("*** Begin Patch\n*** Frobnicate File: a.txt\n*** End Patch\n"),
			codes.InvalidArgument, agentdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, []error{errkind.ErrInvalidArgument}, "*"},
		{"patch context not found", patch(patchEnvelope("*** Update File: a.txt", "@@", " zero", "-one", "+ONE")),
			codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED, []error{errkind.ErrPatchRejected}, "*"},
		{"patch updating a directory", patch(patchEnvelope("*** Update File: dir", "@@", "-x", "+y")),
			codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED, []error{errkind.ErrPatchRejected, errkind.ErrIsDirectory}, "*"},
		{"patch escaping", patch(patchEnvelope("*** Add File: ../evil.txt", "+x")),
			codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_PATH_ESCAPE, []error{errkind.ErrPathEscape}, "*"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if err == nil {
				t.Fatal("the call succeeded")
			}
			code, detail, _ := wireForm(t, err)
			if code != c.code || detail.GetReason() != c.reason {
				t.Fatalf("wire %v/%v, want %v/%v (%v)", code, detail.GetReason(), c.code, c.reason, err)
			}
			for _, s := range c.sentinels {
				if !errors.Is(err, s) {
					t.Errorf("errors.Is(%v, %v) is false", err, s)
				}
			}
			var pe *errkind.PathError
			isPath := errors.As(err, &pe)
			switch {
			case c.path == "*":
			case c.path == "" && isPath:
				t.Errorf("a PathError on %q, but the failure concerns no path: %v", pe.Path, err)
			case c.path != "" && (!isPath || pe.Path != c.path):
				t.Errorf("want a PathError on %q, got %#v", c.path, err)
			}
		})
	}
}

// Every failure of the patch engine carries a PatchRejection with its
// kind, its cause and the engine's own one-line message, so the harness
// needs no text of the error to tell them apart.
func TestPatchRejectionReasons(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	mustWrite(t, filepath.Join(td.workspace, "a.txt"), "one\ntwo\n", 0o644)
	mustWrite(t, filepath.Join(td.workspace, "dir/x.txt"), "x\n", 0o644)
	for _, c := range []struct {
		name          string
		patch         string
		kind, cause   agentdv1.ErrorReason
		path, message string // message: the start of PatchRejection.message
	}{
		{"malformed", "*** Begin Patch\n*** End Patch\n",
			agentdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED, "", "invalid patch: "},
		{"context not found", patchEnvelope("*** Update File: a.txt", "@@", " zero", "-one", "+ONE"),
			agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED, agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED, "a.txt", "patch rejected: line 3 (update a.txt): "},
		{"file missing", patchEnvelope("*** Update File: missing.txt", "@@", "-one", "+ONE"),
			agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED, agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND, "missing.txt", "patch rejected: update missing.txt: "},
		{"directory in the way", patchEnvelope("*** Update File: dir", "@@", "-x", "+y"),
			agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED, agentdv1.ErrorReason_ERROR_REASON_IS_A_DIRECTORY, "dir", "patch rejected: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := applyPatch(ctx, td.client, textPatch(c.patch))
			if err == nil {
				t.Fatal("the patch applied")
			}
			_, _, rej := wireForm(t, err)
			if rej == nil {
				t.Fatalf("no PatchRejection: %v", err)
			}
			if rej.Kind != c.kind || rej.GetCause() != c.cause || rej.Path != c.path {
				t.Errorf("kind %v cause %v path %q, want %v %v %q", rej.Kind, rej.GetCause(), rej.Path, c.kind, c.cause, c.path)
			}
			if !strings.HasPrefix(rej.Message, c.message) || strings.Contains(rej.Message, "\n") {
				t.Errorf("message %q, want one line starting %q", rej.Message, c.message)
			}
			if strings.Contains(rej.Message, td.workspace) {
				t.Errorf("message names the host path: %q", rej.Message)
			}
		})
	}
	// A failure that is not the engine's (an unknown user) has none.
	_, err := td.client.ApplyPatch(ctx, patchEnvelope("*** Add File: b.txt", "+b"), agentclient.ApplyPatchOptions{
		User: "bulkhead-no-such-user",
	})
	if !errors.Is(err, errkind.ErrUserNotFound) || agentclient.PatchRejection(err) != nil {
		t.Fatalf("unknown user: %v (rejection %v)", err, agentclient.PatchRejection(err))
	}
}
