package service

import (
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/manager"
)

// The quotas are the run manager's (pkg/harness/service/manager/quota.go,
// where they are defined and enforced); these names keep the service's
// Config and `harness serve` as they were.

// Quotas bound what one tenant may hold at once and fetch (see
// manager.Quotas).
type Quotas = manager.Quotas

// SandboxResources caps one sandbox (see manager.SandboxResources).
type SandboxResources = manager.SandboxResources

// Default quotas and sandbox caps (see package manager).
const (
	DefaultRuns                 = manager.DefaultRuns
	DefaultSandboxes            = manager.DefaultSandboxes
	DefaultFetchBytesPerSandbox = manager.DefaultFetchBytesPerSandbox
	DefaultFetchBytes           = manager.DefaultFetchBytes
	DefaultFetchWindow          = manager.DefaultFetchWindow
	DefaultSandboxMilliCPU      = manager.DefaultSandboxMilliCPU
	DefaultSandboxMemoryBytes   = manager.DefaultSandboxMemoryBytes
	DefaultSandboxProcesses     = manager.DefaultSandboxProcesses
)

// ErrQuotaExceeded: a tenant is over one of its quotas (the error's text
// names which). The API answers ResourceExhausted.
var ErrQuotaExceeded = manager.ErrQuotaExceeded

// MeteredGit wraps the git fetcher of the compute client the service uses
// so that the checkouts of the service's sandboxes are charged to their
// tenants' quotas (see manager.MeteredGit).
func MeteredGit(inner materializer.GitFetcher) materializer.GitFetcher {
	return manager.MeteredGit(inner)
}
