package errkind

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"testing"
)

// The registry is well formed: every class has a distinct sentinel and a
// distinct snake_case name, and a class that is a case of another (its
// sentinel matches the other's under errors.Is) comes first, or it could
// never be chosen.
func TestRegistryIsWellFormed(t *testing.T) {
	snake := regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`)
	classes := Classes()
	names := map[string]bool{}
	sentinels := map[error]bool{}
	for i, c := range classes {
		if !snake.MatchString(c.Name) || names[c.Name] {
			t.Errorf("name %q is not snake_case or not unique", c.Name)
		}
		if c.Err == nil || sentinels[c.Err] {
			t.Errorf("%s: sentinel %v is nil or not unique", c.Name, c.Err)
		}
		names[c.Name], sentinels[c.Err] = true, true
		for _, later := range classes[i+1:] {
			if errors.Is(later.Err, c.Err) {
				t.Errorf("%s is a case of %s but comes after it", later.Name, c.Name)
			}
		}
		if got, ok := ClassOf(fmt.Errorf("ctx: %w", c.Err)); !ok || got.Name != c.Name {
			t.Errorf("ClassOf(wrapped %s) = %q", c.Name, got.Name)
		}
		if !Classified(c.Err) {
			t.Errorf("%s is not Classified", c.Name)
		}
	}
	// Every exported sentinel of the package has a class.
	for _, s := range []error{
		ErrNotFound, ErrUserNotFound, ErrAlreadyExists, ErrInvalidArgument, ErrPermissionDenied, ErrPathEscape,
		ErrReadOnly, ErrNotDirectory, ErrIsDirectory, ErrNotEmpty, ErrNoSpace, ErrResourceExhausted,
		ErrFailedPrecondition, ErrConflict, ErrPatchRejected, ErrUnauthenticated, ErrUnavailable,
		ErrUnimplemented, ErrCanceled, ErrDeadlineExceeded, ErrInternal,
	} {
		if !sentinels[s] {
			t.Errorf("sentinel %q has no class", s)
		}
	}
	if len(sentinels) != 21 {
		t.Errorf("%d classes; a new sentinel needs a class here and a wire form in pkg/internal/wire/errmap", len(sentinels))
	}
}

func TestClassOfAndName(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("plain"), ""},
		{fs.ErrNotExist, "not_found"},
		{&fs.PathError{Op: "open", Path: "p", Err: fs.ErrPermission}, "permission_denied"},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), "deadline_exceeded"},
		{Errorf(ErrUserNotFound, "%q", "ghost"), "user_not_found"},
		{&PathError{Op: "read", Path: "a", Err: ErrNotFound}, "not_found"},
		// The more specific class wins whatever the wrapping order.
		{fmt.Errorf("%w: %w", ErrPermissionDenied, ErrPathEscape), "path_escape"},
		{fmt.Errorf("%w: %w", ErrNotFound, context.Canceled), "canceled"},
	} {
		if got := Name(c.err); got != c.want {
			t.Errorf("Name(%v) = %q, want %q", c.err, got, c.want)
		}
	}
	// Aliases name a class but do not make an error Classified: ClassifyFS
	// still has to turn them into sentinels.
	if Classified(fs.ErrNotExist) || Classified(context.Canceled) {
		t.Error("an alias counted as classified")
	}
}

func TestUserNotFoundIsANotFound(t *testing.T) {
	err := Errorf(ErrUserNotFound, "%q is not in /etc/passwd", "ghost")
	if !errors.Is(err, ErrNotFound) || !errors.Is(err, ErrUserNotFound) {
		t.Fatalf("%v", err)
	}
	if errors.Is(ErrNotFound, ErrUserNotFound) {
		t.Fatal("every not found became an unknown user")
	}
	if err.Error() != `user not found: "ghost" is not in /etc/passwd` {
		t.Fatalf("text %q", err.Error())
	}
}

func TestClassesIsACopy(t *testing.T) {
	a := Classes()
	a[0].Name = "changed"
	for i := range a {
		if len(a[i].Aliases) > 0 {
			a[i].Aliases[0] = nil
		}
	}
	b := Classes()
	if b[0].Name == "changed" {
		t.Fatal("Classes shares its slice")
	}
	for _, c := range b {
		for _, al := range c.Aliases {
			if al == nil {
				t.Fatal("Classes shares its aliases")
			}
		}
	}
}

// apiError stands for an error type of another library.
type apiError struct{}

func (*apiError) Error() string { return "api" }

func TestErrorType(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("x: %w", ErrCanceled), "canceled"},
		{Errorf(ErrPathEscape, "secret path"), "path_escape"},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", &fs.PathError{Op: "open", Path: "p", Err: errors.ErrUnsupported})), "*fs.PathError"},
		{errors.Join(fmt.Errorf("a: %w", &apiError{})), "*errkind.apiError"},
		{errors.New("plain"), "_OTHER"},
	} {
		if got := ErrorType(c.err); got != c.want {
			t.Errorf("ErrorType(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
