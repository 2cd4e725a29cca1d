package harness

import (
	"context"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// TestMountPolicyInstructions: a manifest with mounts gets the remote
// mount policy, between the capability fragments and the filesystem
// section, listing each mount with its mode; one without gets none.
func TestMountPolicyInstructions(t *testing.T) {
	rw := false
	m := &manifest.Manifest{Entries: map[string]*manifest.Entry{
		"ro":    {Type: manifest.TypeS3Mount, Mount: &manifest.Mount{Bucket: "b"}},
		"rw":    {Type: manifest.TypeR2Mount, Mount: &manifest.Mount{Bucket: "b", Account: "a", ReadOnly: &rw}},
		"x.txt": {Type: manifest.TypeFile},
	}}
	ins, err := buildInstructions(context.Background(), &RunContext{Agent: &Agent{Name: "a"}, Manifest: m}, nil, capability.Env{})
	if err != nil {
		t.Fatal(err)
	}
	i, j := strings.Index(ins, "# Sandbox remote mount policy\n\n"), strings.Index(ins, "# Filesystem")
	if i < 0 || j < i {
		t.Fatalf("policy missing or out of order:\n%s", ins)
	}
	for _, want := range []string{"- /workspace/ro (mounted in read-only mode)", "- /workspace/rw (mounted in read+write mode)", "untrusted data", "Never edit, create or delete files in a read-only mount"} {
		if !strings.Contains(ins[i:j], want) {
			t.Fatalf("policy lacks %q:\n%s", want, ins[i:j])
		}
	}
	ins, err = buildInstructions(context.Background(), &RunContext{Agent: &Agent{Name: "a"}, Manifest: &manifest.Manifest{}}, nil, capability.Env{})
	if err != nil || strings.Contains(ins, "remote mount policy") {
		t.Fatalf("policy without mounts: %v\n%s", err, ins)
	}
}
