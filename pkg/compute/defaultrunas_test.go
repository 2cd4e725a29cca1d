package compute

import (
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// accountStub is a Provider (nil embedded: only DefaultRunAs is called)
// that can make accounts.
type accountStub struct {
	Provider
	u *manifest.User
}

func (a accountStub) DefaultRunAs() *manifest.User { return a.u }

func TestWithDefaultRunAs(t *testing.T) {
	uid := uint32(123456789)
	own := &manifest.User{Name: DefaultRunAsName, UID: &uid}
	// A manifest without run_as gets the provider's account, declared.
	m := withDefaultRunAs(&manifest.Manifest{}, accountStub{u: own})
	if m.RunAs != DefaultRunAsName || len(m.Users) != 1 || m.Users[0].UID == nil || *m.Users[0].UID != uid {
		t.Fatalf("got run_as %q users %+v", m.RunAs, m.Users)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("the manifest with the default account does not validate: %v", err)
	}
	// The caller's manifest is not changed.
	orig := &manifest.Manifest{}
	_ = withDefaultRunAs(orig, accountStub{u: own})
	if orig.RunAs != "" || len(orig.Users) != 0 {
		t.Fatal("withDefaultRunAs changed its input")
	}
	// A manifest that names run_as (root included) keeps it.
	for _, name := range []string{"root", "analyst"} {
		in := &manifest.Manifest{RunAs: name}
		if name != "root" {
			in.Users = []manifest.User{{Name: name}}
		}
		if got := withDefaultRunAs(in, accountStub{u: own}); got.RunAs != name || len(got.Users) != len(in.Users) {
			t.Fatalf("run_as %q became %q (%+v)", name, got.RunAs, got.Users)
		}
	}
	// A provider that cannot make accounts, or does not say, changes nothing.
	if got := withDefaultRunAs(&manifest.Manifest{}, accountStub{}); got.RunAs != "" || len(got.Users) != 0 {
		t.Fatalf("a nil account: %+v", got)
	}
	var plain Provider
	if got := withDefaultRunAs(&manifest.Manifest{}, plain); got.RunAs != "" {
		t.Fatalf("a provider without accounts: %+v", got)
	}
}
