package storeerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
)

func TestTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{syscall.EPIPE, true},
		{fmt.Errorf("body: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "dial", Err: errors.New("no route")}, true},
		{context.Canceled, false},
		{errors.New("HTTP 403 AccessDenied"), false},
	} {
		if got := Transient(c.err); got != c.want {
			t.Errorf("Transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestRedact(t *testing.T) {
	if got := Redact("key AKIA1 secret s3cr3t", []string{"AKIA1", "s3cr3t", ""}); got != "key [REDACTED] secret [REDACTED]" {
		t.Fatalf("Redact = %q", got)
	}
}
