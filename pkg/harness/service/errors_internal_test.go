package service

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
)

// TestEveryErrorClassHasACode: the error table has a Connect code for
// every class of pkg/errkind's registry (a new class fails here until it
// has one), every code an HTTP status, and an error of each class, however
// wrapped, gets its class's code.
func TestEveryErrorClassHasACode(t *testing.T) {
	classes := errkind.Classes()
	if len(classes) < 21 {
		t.Fatalf("the registry lists %d classes", len(classes))
	}
	for _, c := range classes {
		code, ok := errorTable[c.Name]
		if !ok {
			t.Errorf("errkind class %q has no Connect code in errors.go's codeOfClass", c.Name)
			continue
		}
		if _, ok := httpStatus[code]; !ok {
			t.Errorf("the code %v of class %q has no HTTP status", code, c.Name)
		}
		err := fmt.Errorf("doing something: %w", c.Err)
		if got := connect.CodeOf(apiError(err)); got != code {
			t.Errorf("an error of class %q answers %v, want %v", c.Name, got, code)
		}
		for _, a := range c.Aliases {
			if got := connect.CodeOf(apiError(fmt.Errorf("x: %w", a))); got != code {
				t.Errorf("%v (an alias of %q) answers %v, want %v", a, c.Name, got, code)
			}
		}
	}
	if len(codeOfClass) != len(classes) {
		t.Errorf("codeOfClass has %d rows for %d classes", len(codeOfClass), len(classes))
	}
}

// TestServiceErrorsAreClassified: the errors the manager and the store
// make have the class the API promises; one of no class is Internal.
func TestServiceErrorsAreClassified(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want connect.Code
	}{
		{fmt.Errorf("run x: %w", store.ErrNotFound), connect.CodeNotFound},
		{store.ErrExists, connect.CodeAlreadyExists},
		{fmt.Errorf("quota: %w", manager.ErrQuotaExceeded), connect.CodeResourceExhausted},
		{&manager.FieldError{Field: "path", Err: errkind.ErrPathEscape}, connect.CodeInvalidArgument},
		{errors.New("no class"), connect.CodeInternal},
		{connect.NewError(connect.CodeUnauthenticated, errors.New("who")), connect.CodeUnauthenticated},
	} {
		if got := connect.CodeOf(apiError(tc.err)); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
}
