// Package storeerr holds what the harness's object-storage clients (the
// S3 snapshot store, the mount backends) share about errors without
// linking any storage SDK: which failures of a connection retrying can
// cure, and how to keep credentials out of error text. Each SDK's own
// error codes are read in the client's package (s3errs for the AWS SDK).
package storeerr

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
)

// Transient reports a failure of the connection that retrying later can
// cure: any net.Error (a timeout, a refused dial), a body cut short, a
// connection refused or reset, a broken pipe. nil is not transient.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var nerr net.Error
	return errors.As(err, &nerr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Redact replaces every secret in text with [REDACTED].
func Redact(text string, secrets []string) string {
	for _, v := range secrets {
		if v != "" {
			text = strings.ReplaceAll(text, v, "[REDACTED]")
		}
	}
	return text
}
