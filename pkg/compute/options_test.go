package compute_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

type testOptions struct{ Image string }

func TestOptionsAs(t *testing.T) {
	if o, err := compute.OptionsAs[testOptions]("p", "*p.Options", nil); o != nil || err != nil {
		t.Fatalf("nil: %v, %v; want the defaults (nil, nil)", o, err)
	}
	ptr := &testOptions{Image: "a"}
	if o, err := compute.OptionsAs[testOptions]("p", "*p.Options", ptr); o != ptr || err != nil {
		t.Fatalf("*T: %v, %v; want the same pointer", o, err)
	}
	if o, err := compute.OptionsAs[testOptions]("p", "*p.Options", testOptions{Image: "b"}); err != nil || o == nil || o.Image != "b" {
		t.Fatalf("T: %v, %v; want its value", o, err)
	}
	o, err := compute.OptionsAs[testOptions]("p", "*p.Options", "image=c")
	if o != nil || !errors.Is(err, compute.ErrInvalidArgument) {
		t.Fatalf("another type: %v, %v; want ErrInvalidArgument", o, err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "p: ") || !strings.Contains(msg, "is string, want *p.Options") {
		t.Fatalf("error %q does not name the provider, the type given and the type wanted", msg)
	}
}
