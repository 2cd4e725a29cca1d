package errmap

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/errdefs"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// Every sentinel survives the trip server -> wire -> client, with its code.
func TestRoundTripEverySentinel(t *testing.T) {
	for _, e := range table {
		t.Run(e.sentinel.Error(), func(t *testing.T) {
			orig := &errdefs.PathError{Op: "write", Path: "dir/a.txt", Err: fmt.Errorf("%w: details here", e.sentinel)}
			wire := ToStatus(orig)
			if got := status.Code(wire); got != e.code {
				t.Fatalf("code %v, want %v", got, e.code)
			}
			back := FromStatus(wire)
			if !errors.Is(back, e.sentinel) {
				t.Fatalf("errors.Is(%v, %v) is false", back, e.sentinel)
			}
			var pe *errdefs.PathError
			if !errors.As(back, &pe) || pe.Path != "dir/a.txt" || pe.Op != "write" {
				t.Fatalf("path lost: %#v", back)
			}
			if back.Error() != orig.Error() {
				t.Fatalf("message %q, want %q", back.Error(), orig.Error())
			}
			if errdefs.Retryable(back) != (e.sentinel == errdefs.ErrUnavailable) {
				t.Fatalf("retryable=%v for %v", errdefs.Retryable(back), e.sentinel)
			}
			if st, ok := status.FromError(back); !ok || st.Code() != e.code {
				t.Fatalf("the status is not kept for diagnosis: %v", st)
			}
		})
	}
}

func TestSpecificBeforeGeneral(t *testing.T) {
	// An escape is also a permission problem; the reason must say escape.
	err := fmt.Errorf("%w: %w", errdefs.ErrPathEscape, errdefs.ErrPermissionDenied)
	back := FromStatus(ToStatus(err))
	if !errors.Is(back, errdefs.ErrPathEscape) {
		t.Fatalf("got %v", back)
	}
}

func TestProcessErrorKeepsID(t *testing.T) {
	orig := &errdefs.ProcessError{Op: "signal", ProcessID: "p-7", Err: errdefs.ErrNotFound}
	back := FromStatus(ToStatus(orig))
	var xe *errdefs.ProcessError
	if !errors.As(back, &xe) || xe.ProcessID != "p-7" || !errors.Is(back, errdefs.ErrNotFound) {
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
	if !errors.Is(FromStatus(status.Error(codes.Unavailable, "conn refused")), errdefs.ErrUnavailable) {
		t.Fatal("a bare Unavailable must map to ErrUnavailable")
	}
	if !errdefs.Retryable(FromStatus(status.Error(codes.Unavailable, "conn refused"))) {
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
	back := FromStatus(ToStatus(fmt.Errorf("%w: context not found", errdefs.ErrPatchRejected), rej))
	got := PatchRejection(back)
	if got == nil || got.GetPath() != "a.go" || got.GetClosestLine() != 3 {
		t.Fatalf("got %v", got)
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
		s := errdefs.ErrnoSentinel(errno)
		if s == errdefs.ErrInternal {
			t.Errorf("%v: classified as internal", errno)
			continue
		}
		if c := status.Code(ToStatus(fmt.Errorf("%w (%w)", s, errno))); c == codes.Internal || c == codes.Unknown {
			t.Errorf("%v -> %v -> %v", errno, s, c)
		}
	}
	if errdefs.ErrnoSentinel(syscall.EIO) != errdefs.ErrInternal {
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
		if err.Error() != want || !errors.Is(err, errdefs.ErrUnavailable) || !errdefs.Retryable(err) {
			t.Errorf("%q -> %q (unavailable %v)", raw, err.Error(), errors.Is(err, errdefs.ErrUnavailable))
		}
	}
}
