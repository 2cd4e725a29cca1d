package errmap

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// pinned is the wire contract: the gRPC code and ErrorReason of every
// errkind class, by name. A change here changes what every client sees.
func pinned() map[string]wire {
	r := func(code codes.Code, reason agentdv1.ErrorReason) wire { return wire{code, reason} }
	return map[string]wire{
		"canceled":            r(codes.Canceled, agentdv1.ErrorReason_ERROR_REASON_CANCELED),
		"deadline_exceeded":   r(codes.DeadlineExceeded, agentdv1.ErrorReason_ERROR_REASON_DEADLINE_EXCEEDED),
		"path_escape":         r(codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_PATH_ESCAPE),
		"read_only":           r(codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_READ_ONLY),
		"patch_rejected":      r(codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED),
		"no_space":            r(codes.ResourceExhausted, agentdv1.ErrorReason_ERROR_REASON_NO_SPACE),
		"user_not_found":      r(codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_USER_NOT_FOUND),
		"not_found":           r(codes.NotFound, agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND),
		"already_exists":      r(codes.AlreadyExists, agentdv1.ErrorReason_ERROR_REASON_ALREADY_EXISTS),
		"not_directory":       r(codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_NOT_A_DIRECTORY),
		"is_directory":        r(codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_IS_A_DIRECTORY),
		"not_empty":           r(codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_DIRECTORY_NOT_EMPTY),
		"permission_denied":   r(codes.PermissionDenied, agentdv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED),
		"resource_exhausted":  r(codes.ResourceExhausted, agentdv1.ErrorReason_ERROR_REASON_LIMIT_EXCEEDED),
		"conflict":            r(codes.Aborted, agentdv1.ErrorReason_ERROR_REASON_CONFLICT),
		"failed_precondition": r(codes.FailedPrecondition, agentdv1.ErrorReason_ERROR_REASON_FAILED_PRECONDITION),
		"invalid_argument":    r(codes.InvalidArgument, agentdv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT),
		"unauthenticated":     r(codes.Unauthenticated, agentdv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED),
		"unimplemented":       r(codes.Unimplemented, agentdv1.ErrorReason_ERROR_REASON_UNIMPLEMENTED),
		"unavailable":         r(codes.Unavailable, agentdv1.ErrorReason_ERROR_REASON_UNAVAILABLE),
		"internal":            r(codes.Internal, agentdv1.ErrorReason_ERROR_REASON_INTERNAL),
	}
}

// detailOf returns the ErrorDetail of a status error.
func detailOf(t *testing.T, err error) *agentdv1.ErrorDetail {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("%v is not a status", err)
	}
	for _, d := range st.Details() {
		if x, ok := d.(*agentdv1.ErrorDetail); ok {
			return x
		}
	}
	t.Fatalf("%v has no ErrorDetail", err)
	return nil
}

// Every class of errkind has its pinned code and reason, through a real
// status, and survives the trip server -> wire -> client.
func TestEveryClassHasItsPinnedWireForm(t *testing.T) {
	pins := pinned()
	classes := errkind.Classes()
	if len(pins) != len(classes) {
		t.Errorf("%d pinned wire forms for %d classes", len(pins), len(classes))
	}
	for _, c := range classes {
		t.Run(c.Name, func(t *testing.T) {
			pin, ok := pins[c.Name]
			if !ok {
				t.Fatalf("class %s has no pinned wire form", c.Name)
			}
			if w, ok := wireOf(c.Err); !ok || w != pin {
				t.Fatalf("wireOf(%v) = %v, %v; pinned %v", c.Err, w, ok, pin)
			}
			orig := &errkind.PathError{Op: "write", Path: "dir/a.txt", Err: fmt.Errorf("%w: details here", c.Err)}
			wire := ToStatus(orig)
			if got := status.Code(wire); got != pin.code {
				t.Fatalf("code %v, want %v", got, pin.code)
			}
			if got := detailOf(t, wire).GetReason(); got != pin.reason {
				t.Fatalf("reason %v, want %v", got, pin.reason)
			}
			if got := Reason(orig); got != pin.reason {
				t.Fatalf("Reason = %v, want %v", got, pin.reason)
			}
			back := FromStatus(wire)
			if !errors.Is(back, c.Err) {
				t.Fatalf("errors.Is(%v, %v) is false", back, c.Err)
			}
			if got, _ := errkind.ClassOf(back); got.Name != c.Name {
				t.Fatalf("came back as %q", got.Name)
			}
			var pe *errkind.PathError
			if !errors.As(back, &pe) || pe.Path != "dir/a.txt" || pe.Op != "write" {
				t.Fatalf("path lost: %#v", back)
			}
			if back.Error() != orig.Error() {
				t.Fatalf("message %q, want %q", back.Error(), orig.Error())
			}
			if errkind.Retryable(back) != (c.Err == errkind.ErrUnavailable) {
				t.Fatalf("retryable=%v for %v", errkind.Retryable(back), c.Err)
			}
			if st, ok := status.FromError(back); !ok || st.Code() != pin.code {
				t.Fatalf("the status is not kept for diagnosis: %v", st)
			}
		})
	}
}

// Every ErrorReason the contract defines names exactly one class, and a
// status carrying it comes back as that class whatever its code: the
// mapping is one to one in both directions.
func TestEveryReasonNamesOneClass(t *testing.T) {
	byReason := map[agentdv1.ErrorReason]string{}
	for _, c := range errkind.Classes() {
		w, _ := wireOf(c.Err)
		if other, dup := byReason[w.reason]; dup {
			t.Errorf("%v is the reason of both %s and %s", w.reason, other, c.Name)
		}
		byReason[w.reason] = c.Name
	}
	for n := range agentdv1.ErrorReason_name {
		reason := agentdv1.ErrorReason(n)
		if reason == agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
			continue
		}
		name, ok := byReason[reason]
		if !ok {
			t.Errorf("%v names no class", reason)
			continue
		}
		st, err := status.New(codes.Unknown, "x").WithDetails(&agentdv1.ErrorDetail{Reason: reason})
		if err != nil {
			t.Fatal(err)
		}
		back := FromStatus(st.Err())
		if got, _ := errkind.ClassOf(back); got.Name != name {
			t.Errorf("%v came back as %q, want %q", reason, got.Name, name)
		}
	}
}

// A status without a detail (from gRPC itself, an interceptor or a proxy)
// or with a reason this client does not know maps by its code to the most
// general class of that code.
func TestBareCodesMapToTheGeneralClass(t *testing.T) {
	want := map[codes.Code]error{
		codes.Canceled:           errkind.ErrCanceled,
		codes.Unknown:            errkind.ErrInternal,
		codes.InvalidArgument:    errkind.ErrInvalidArgument,
		codes.DeadlineExceeded:   errkind.ErrDeadlineExceeded,
		codes.NotFound:           errkind.ErrNotFound,
		codes.AlreadyExists:      errkind.ErrAlreadyExists,
		codes.PermissionDenied:   errkind.ErrPermissionDenied,
		codes.ResourceExhausted:  errkind.ErrResourceExhausted,
		codes.FailedPrecondition: errkind.ErrFailedPrecondition,
		codes.Aborted:            errkind.ErrConflict,
		codes.OutOfRange:         errkind.ErrInternal,
		codes.Unimplemented:      errkind.ErrUnimplemented,
		codes.Internal:           errkind.ErrInternal,
		codes.Unavailable:        errkind.ErrUnavailable,
		codes.DataLoss:           errkind.ErrInternal,
		codes.Unauthenticated:    errkind.ErrUnauthenticated,
	}
	for code, sentinel := range want {
		bare := FromStatus(status.Error(code, "x"))
		if c, _ := errkind.ClassOf(bare); c.Err != sentinel {
			t.Errorf("bare %v -> %q, want %v", code, c.Name, sentinel)
		}
		st, _ := status.New(code, "x").WithDetails(&agentdv1.ErrorDetail{Reason: agentdv1.ErrorReason(9999)})
		if c, _ := errkind.ClassOf(FromStatus(st.Err())); c.Err != sentinel {
			t.Errorf("%v with an unknown reason -> %q, want %v", code, c.Name, sentinel)
		}
	}
	// A more specific class is never guessed from a code alone.
	if errors.Is(FromStatus(status.Error(codes.PermissionDenied, "x")), errkind.ErrPathEscape) ||
		errors.Is(FromStatus(status.Error(codes.NotFound, "x")), errkind.ErrUserNotFound) {
		t.Error("a bare code mapped to a specific class")
	}
}

// The unknown run_as user is a not_found of its own: a client tells it
// from a missing file by the reason alone, and code that only knows
// not_found still sees one.
func TestUserNotFoundIsANotFound(t *testing.T) {
	err := &errkind.PathError{Op: "stat", Path: "a.txt", Err: fmt.Errorf("run_as: %w", errkind.Errorf(errkind.ErrUserNotFound, "%q unknown", "ghost"))}
	wire := ToStatus(err)
	if status.Code(wire) != codes.NotFound || detailOf(t, wire).GetReason() != agentdv1.ErrorReason_ERROR_REASON_USER_NOT_FOUND {
		t.Fatalf("wire %v", wire)
	}
	back := FromStatus(wire)
	if !errors.Is(back, errkind.ErrUserNotFound) || !errors.Is(back, errkind.ErrNotFound) {
		t.Fatalf("got %v", back)
	}
	if missing := FromStatus(ToStatus(errkind.Errorf(errkind.ErrNotFound, "no file"))); errors.Is(missing, errkind.ErrUserNotFound) {
		t.Fatal("a missing file came back as an unknown user")
	}
}

func TestSpecificBeforeGeneral(t *testing.T) {
	// An escape is also a permission problem; the reason must say escape.
	err := fmt.Errorf("%w: %w", errkind.ErrPathEscape, errkind.ErrPermissionDenied)
	back := FromStatus(ToStatus(err))
	if !errors.Is(back, errkind.ErrPathEscape) {
		t.Fatalf("got %v", back)
	}
}

func TestProcessErrorKeepsID(t *testing.T) {
	orig := &errkind.ProcessError{Op: "signal", ProcessID: "p-7", Err: errkind.ErrNotFound}
	back := FromStatus(ToStatus(orig))
	var xe *errkind.ProcessError
	if !errors.As(back, &xe) || xe.ProcessID != "p-7" || !errors.Is(back, errkind.ErrNotFound) {
		t.Fatalf("got %#v", back)
	}
}

func TestContextAndUnknownErrors(t *testing.T) {
	if c := status.Code(ToStatus(context.Canceled)); c != codes.Canceled {
		t.Fatalf("canceled -> %v", c)
	}
	if c := status.Code(ToStatus(fmt.Errorf("x: %w", context.DeadlineExceeded))); c != codes.DeadlineExceeded {
		t.Fatalf("deadline -> %v", c)
	}
	if c := status.Code(ToStatus(errors.New("boom"))); c != codes.Internal {
		t.Fatalf("unknown -> %v", c)
	}
	if !errors.Is(FromStatus(status.Error(codes.Unavailable, "conn refused")), errkind.ErrUnavailable) {
		t.Fatal("a bare Unavailable must map to ErrUnavailable")
	}
	if !errkind.Retryable(FromStatus(status.Error(codes.Unavailable, "conn refused"))) {
		t.Fatal("Unavailable must be retryable")
	}
	if ToStatus(nil) != nil || FromStatus(nil) != nil {
		t.Fatal("nil must stay nil")
	}
	plain := errors.New("not a status")
	if FromStatus(plain) != plain {
		t.Fatal("a non-status error passes through")
	}
}

func TestPatchRejectionDetail(t *testing.T) {
	rej := &agentdv1.PatchRejection{Path: "a.go", ExpectedLines: []string{"x"}, ClosestLine: 3, ClosestLines: []string{"y"}}
	back := FromStatus(ToStatus(fmt.Errorf("%w: context not found", errkind.ErrPatchRejected), rej))
	got := PatchRejection(back)
	if got == nil || got.GetPath() != "a.go" || got.GetClosestLine() != 3 {
		t.Fatalf("got %v", got)
	}
}

// A rejected patch matches its kind and its cause on the client as it
// does in the daemon, while the status's reason stays the most specific.
func TestPatchRejectionKindAndCauseMatch(t *testing.T) {
	rej := &agentdv1.PatchRejection{
		Path:    "dir",
		Kind:    agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED,
		Cause:   agentdv1.ErrorReason_ERROR_REASON_IS_A_DIRECTORY,
		Message: "patch rejected: update dir: is a directory",
	}
	back := FromStatus(ToStatus(fmt.Errorf("%w: %w", errkind.ErrPatchRejected, errkind.ErrIsDirectory), rej))
	for _, s := range []error{errkind.ErrPatchRejected, errkind.ErrIsDirectory} {
		if !errors.Is(back, s) {
			t.Errorf("errors.Is(%v, %v) is false", back, s)
		}
	}
	if errors.Is(back, errkind.ErrNotFound) {
		t.Error("matches a sentinel it does not carry")
	}
	if c, _ := errkind.ClassOf(back); c.Name != "patch_rejected" {
		t.Errorf("class %q", c.Name)
	}
	// Unknown reasons (a newer daemon) add nothing.
	rej = &agentdv1.PatchRejection{Kind: agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED, Cause: agentdv1.ErrorReason(9999)}
	back = FromStatus(ToStatus(errkind.ErrPatchRejected, rej))
	if !errors.Is(back, errkind.ErrPatchRejected) || errors.Is(back, errkind.ErrInternal) {
		t.Errorf("got %v", back)
	}
	if Reason(nil) != agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED || Reason(errors.New("x")) != agentdv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		t.Error("Reason of nil or of no class must be UNSPECIFIED")
	}
}

// Every errno the filesystem layers classify maps to a sentinel with a wire
// form, so no classified error degrades to Internal on the way to a client.
func TestErrnoSentinelsHaveWireForms(t *testing.T) {
	for _, errno := range []syscall.Errno{
		syscall.ENOENT, syscall.ENOTDIR, syscall.EISDIR, syscall.EACCES, syscall.EPERM, syscall.EROFS,
		syscall.ENOSPC, syscall.EDQUOT, syscall.EEXIST, syscall.ENOTEMPTY, syscall.ELOOP, syscall.ENAMETOOLONG,
		syscall.EINVAL, syscall.EXDEV, syscall.EFBIG, syscall.EMFILE, syscall.EBUSY, syscall.EAGAIN,
	} {
		s := errkind.ErrnoSentinel(errno)
		if s == errkind.ErrInternal {
			t.Errorf("%v: classified as internal", errno)
			continue
		}
		if c := status.Code(ToStatus(fmt.Errorf("%w (%w)", s, errno))); c == codes.Internal || c == codes.Unknown {
			t.Errorf("%v -> %v -> %v", errno, s, c)
		}
	}
	if errkind.ErrnoSentinel(syscall.EIO) != errkind.ErrInternal {
		t.Error("EIO should stay internal")
	}
}

func TestTransportErrorsNameNoHostPaths(t *testing.T) {
	for raw, want := range map[string]string{
		`connection error: desc = "transport: Error while dialing: dial unix /tmp/x/run/agentd.sock: connect: connection refused"`: "the sandbox is unavailable: its daemon cannot be reached (connection refused)",
		"error reading from server: EOF": "the sandbox is unavailable: its daemon cannot be reached (EOF)",
		"dial unix /tmp/a/b.sock":        "the sandbox is unavailable: its daemon cannot be reached",
	} {
		err := FromStatus(status.Error(codes.Unavailable, raw))
		if err.Error() != want || !errors.Is(err, errkind.ErrUnavailable) || !errkind.Retryable(err) {
			t.Errorf("%q -> %q (unavailable %v)", raw, err.Error(), errors.Is(err, errkind.ErrUnavailable))
		}
	}
}
