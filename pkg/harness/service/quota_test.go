package service_test

import (
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service"
)

// TestQuotaSandboxDefaults: a provider without caps of its own (local)
// gets one CPU and 1 GiB by default, as docker and kubernetes apply
// themselves; caps the operator sets are kept, and only zero ones filled.
func TestQuotaSandboxDefaults(t *testing.T) {
	for _, tc := range []struct {
		in, want service.SandboxResources
	}{
		{service.SandboxResources{}, service.SandboxResources{MilliCPU: 1000, MemoryBytes: 1 << 30}},
		{service.SandboxResources{MilliCPU: 250}, service.SandboxResources{MilliCPU: 250, MemoryBytes: 1 << 30}},
		{service.SandboxResources{MemoryBytes: 64 << 20, DiskBytes: 5}, service.SandboxResources{MilliCPU: 1000, MemoryBytes: 64 << 20, DiskBytes: 5}},
		{service.SandboxResources{MilliCPU: 2000, MemoryBytes: 4 << 30}, service.SandboxResources{MilliCPU: 2000, MemoryBytes: 4 << 30}},
	} {
		if got := tc.in.OrDefaults(); got != tc.want {
			t.Errorf("%+v.OrDefaults() = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	if service.DefaultSandboxProcesses <= 0 || service.DefaultSandboxProcesses > 4096 {
		t.Errorf("DefaultSandboxProcesses = %d", service.DefaultSandboxProcesses)
	}
}
