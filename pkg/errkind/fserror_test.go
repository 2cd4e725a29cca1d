package errkind

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestClassifyFS(t *testing.T) {
	hostPath := "/var/lib/secret-host-dir/file"
	cases := []struct {
		name string
		in   error
		want error
	}{
		{"errno with host path", &fs.PathError{Op: "open", Path: hostPath, Err: syscall.ENOENT}, ErrNotFound},
		{"link error", &os.LinkError{Op: "rename", Old: hostPath, New: hostPath + "2", Err: syscall.EXDEV}, ErrInvalidArgument},
		{"root escape", &fs.PathError{Op: "openat", Path: hostPath, Err: errors.New("path escapes from parent")}, ErrPathEscape},
		{"closed root", &fs.PathError{Op: "openat", Path: hostPath, Err: os.ErrClosed}, ErrFailedPrecondition},
		{"canceled", context.Canceled, ErrCanceled},
		{"pathless unknown", errors.New("boom"), ErrInternal},
		{"path error without errno", &fs.PathError{Op: "x", Path: hostPath, Err: errors.New("odd")}, ErrInternal},
	}
	for _, c := range cases {
		got := ClassifyFS(c.in)
		if !errors.Is(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
		if strings.Contains(got.Error(), hostPath) {
			t.Errorf("%s: host path leaked: %v", c.name, got)
		}
	}
	if got := ClassifyFS(&fs.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}); !errors.Is(got, fs.ErrNotExist) {
		t.Errorf("the errno must survive: %v", got)
	}
	already := &PathError{Op: "write", Path: "a", Err: ErrReadOnly}
	if ClassifyFS(already) != error(already) {
		t.Error("a classified error must come back unchanged")
	}
	if ClassifyFS(nil) != nil {
		t.Error("nil stays nil")
	}
}
