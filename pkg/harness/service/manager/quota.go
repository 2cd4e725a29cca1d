package manager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Quotas bound what one tenant may hold at once and fetch. A zero field
// takes its default (below); a negative one means no limit. Over a quota,
// a request fails with ResourceExhausted and a message naming the quota
// (errors.Is(err, ErrQuotaExceeded) for a library user).
//
// Counts are kept in memory and updated atomically with the decision (two
// concurrent StartRun of one tenant cannot both take its last slot); New
// recomputes them from the store's active runs, so a restart neither
// forgets the runs it recovers nor keeps slots of runs that ended. The
// git fetch budget (FetchBytes) is this process's: it starts full after a
// restart.
type Quotas struct {
	// Runs bounds a tenant's active runs: pending, running, waiting for
	// approval or checkpointed (default DefaultRuns).
	Runs int
	// Sandboxes bounds a tenant's live sandboxes: its active runs', the
	// ones kept for finished runs (Config.SandboxRetention) until they are
	// deleted, and the ones it made through the API (CreateSandbox) until
	// they are deleted (default DefaultSandboxes).
	Sandboxes int
	// Snapshots bounds a tenant's named snapshots (SnapshotSandbox) until
	// they are deleted (default DefaultSnapshots).
	Snapshots int
	// Sandbox caps every sandbox the service makes. Requests cannot ask
	// for resources (neither StartRunRequest nor an untrusted manifest has
	// a field for them): every sandbox gets these caps.
	Sandbox SandboxResources
	// FetchBytesPerSandbox bounds the bytes the git checkouts of one
	// sandbox's manifest bring in (on the harness's disk, then into the
	// sandbox) (default DefaultFetchBytesPerSandbox).
	FetchBytesPerSandbox int64
	// FetchBytes bounds the bytes a tenant's git checkouts bring in over
	// FetchWindow: a budget refilled evenly over the window (default
	// DefaultFetchBytes per DefaultFetchWindow).
	FetchBytes  int64
	FetchWindow time.Duration
}

// Default quotas: sized for a tenant running a handful of coding agents at
// once, and small enough that one tenant cannot take a shared host.
const (
	DefaultRuns                 = 8
	DefaultSandboxes            = 16
	DefaultSnapshots            = 64
	DefaultFetchBytesPerSandbox = 1 << 30  // 1 GiB
	DefaultFetchBytes           = 10 << 30 // 10 GiB
	DefaultFetchWindow          = 24 * time.Hour
)

// SandboxResources caps one sandbox. Zero fields leave the provider's
// default: docker and kubernetes cap a sandbox at one CPU and 1 GiB
// themselves; the local provider caps nothing by itself, so a service's
// local sandboxes get OrDefaults and DefaultSandboxProcesses (as `harness
// serve` gives them), which it applies through cgroups.
type SandboxResources struct {
	// MilliCPU is the CPU limit in thousandths of a CPU.
	MilliCPU int64
	// MemoryBytes is the memory limit.
	MemoryBytes int64
	// DiskBytes bounds what the service itself writes into a sandbox:
	// the bytes a snapshot restore may extract (compute.ArchiveLimits);
	// git checkouts are bounded by FetchBytesPerSandbox. It is passed to
	// Config.ProviderOptions too: `harness serve` gives local sandboxes a
	// file system of that size of their own (local.Resources.Disk), which
	// caps what their processes write; docker and kubernetes sandboxes get
	// no disk cap from it.
	DiskBytes int64
}

// IsZero reports whether r caps nothing.
func (r SandboxResources) IsZero() bool { return r == SandboxResources{} }

// Default caps of a sandbox whose provider has none of its own (local):
// those docker and kubernetes apply, and a process cap that stops a fork
// bomb well before the host's limits.
const (
	DefaultSandboxMilliCPU    = 1000    // one CPU
	DefaultSandboxMemoryBytes = 1 << 30 // 1 GiB
	DefaultSandboxProcesses   = 512     // processes and threads
)

// OrDefaults returns r with a zero CPU or memory cap replaced by the
// default (DefaultSandboxMilliCPU, DefaultSandboxMemoryBytes): the caps a
// provider without defaults of its own (local) must be given.
func (r SandboxResources) OrDefaults() SandboxResources {
	if r.MilliCPU == 0 {
		r.MilliCPU = DefaultSandboxMilliCPU
	}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = DefaultSandboxMemoryBytes
	}
	return r
}

// withDefaults fills in the defaults and checks q.
func (q Quotas) withDefaults() (Quotas, error) {
	if q.Runs == 0 {
		q.Runs = DefaultRuns
	}
	if q.Sandboxes == 0 {
		q.Sandboxes = DefaultSandboxes
	}
	if q.Snapshots == 0 {
		q.Snapshots = DefaultSnapshots
	}
	if q.FetchBytesPerSandbox == 0 {
		q.FetchBytesPerSandbox = DefaultFetchBytesPerSandbox
	}
	if q.FetchBytes == 0 {
		q.FetchBytes = DefaultFetchBytes
	}
	if q.FetchWindow == 0 {
		q.FetchWindow = DefaultFetchWindow
	}
	r := q.Sandbox
	switch {
	case q.FetchWindow < 0:
		return q, errors.New("quotas: the fetch window must be positive")
	case r.MilliCPU < 0 || r.MemoryBytes < 0 || r.DiskBytes < 0:
		return q, errors.New("quotas: sandbox resources must not be negative")
	}
	return q, nil
}

// Quota names, as messages show them.
const (
	quotaRuns            = "runs per tenant"
	quotaSandboxes       = "sandboxes per tenant"
	quotaSnapshots       = "snapshots per tenant"
	quotaFetchPerSandbox = "git fetch bytes per sandbox"
	quotaFetchPerTenant  = "git fetch bytes per tenant"
)

// ErrQuotaExceeded: a tenant is over one of its quotas (the error's text
// names which). It is an errkind.ErrResourceExhausted: the API answers
// ResourceExhausted.
var ErrQuotaExceeded error = &kindError{kind: errkind.ErrResourceExhausted, err: errors.New("quota exceeded")}

// quotaError is ErrQuotaExceeded for one quota.
type quotaError struct {
	quota string
	msg   string
}

func (e *quotaError) Error() string {
	return fmt.Sprintf("quota %q exceeded: %s", e.quota, e.msg)
}

func (e *quotaError) Unwrap() error { return ErrQuotaExceeded }

// usage keeps every tenant's quota use. Slots are held by run id, so a
// release is idempotent and a run never holds two of a kind. Its lock is a
// leaf: it is taken under Manager.mu, never the other way round.
type usage struct {
	q   Quotas
	now func() time.Time

	mu        sync.Mutex
	runs      map[string]map[string]struct{} // tenant -> active run ids
	sandboxes map[string]map[string]struct{} // tenant -> run ids holding a sandbox, and API sandbox ids
	snapshots map[string]map[string]struct{} // tenant -> snapshot ids
	fetch     map[string]*bucket             // tenant -> git fetch budget
}

func newUsage(q Quotas, now func() time.Time) *usage {
	return &usage{q: q, now: now, runs: map[string]map[string]struct{}{}, sandboxes: map[string]map[string]struct{}{},
		snapshots: map[string]map[string]struct{}{}, fetch: map[string]*bucket{}}
}

// reserve takes a run slot for runID and, when sandbox is set, a sandbox
// slot, both or neither. A slot runID holds already is kept (not counted
// again).
func (u *usage) reserve(tenant, runID string, sandbox bool) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	runs, sbs := u.runs[tenant], u.sandboxes[tenant]
	_, hasRun := runs[runID]
	_, hasSandbox := sbs[runID]
	if !hasRun && u.q.Runs > 0 && len(runs) >= u.q.Runs {
		return &quotaError{quota: quotaRuns, msg: fmt.Sprintf(
			"the tenant has %d active runs (pending, running or waiting for approval) and the limit is %d; cancel one or wait for one to end",
			len(runs), u.q.Runs)}
	}
	if sandbox && !hasSandbox && u.q.Sandboxes > 0 && len(sbs) >= u.q.Sandboxes {
		return &quotaError{quota: quotaSandboxes, msg: fmt.Sprintf(
			"the tenant holds %d sandboxes (of its active runs, of finished runs until their retention ends, and made with CreateSandbox) and the limit is %d",
			len(sbs), u.q.Sandboxes)}
	}
	u.addLocked(tenant, runID, sandbox)
	return nil
}

// reserveSandbox takes a sandbox slot for a sandbox made through the API
// (by its id, which no run id equals).
func (u *usage) reserveSandbox(tenant, id string) error {
	return u.reserveSandboxes(tenant, id)
}

// reserveSandboxes takes a sandbox slot for each of ids (API sandboxes
// about to be made: a fork's), all or none.
func (u *usage) reserveSandboxes(tenant string, ids ...string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	sbs := u.sandboxes[tenant]
	n := 0
	for _, id := range ids {
		if _, has := sbs[id]; !has {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if u.q.Sandboxes > 0 && len(sbs)+n > u.q.Sandboxes {
		return &quotaError{quota: quotaSandboxes, msg: fmt.Sprintf(
			"the tenant holds %d sandboxes (of its active runs, of finished runs until their retention ends, and made with CreateSandbox or ForkSandbox), asks for %d more, and the limit is %d; delete some",
			len(sbs), n, u.q.Sandboxes)}
	}
	for _, id := range ids {
		add(u.sandboxes, tenant, id)
	}
	return nil
}

// reserveSnapshot takes a snapshot slot for a named snapshot.
func (u *usage) reserveSnapshot(tenant, id string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	snaps := u.snapshots[tenant]
	if _, has := snaps[id]; has {
		return nil
	}
	if u.q.Snapshots > 0 && len(snaps) >= u.q.Snapshots {
		return &quotaError{quota: quotaSnapshots, msg: fmt.Sprintf(
			"the tenant holds %d snapshots and the limit is %d; delete one (DeleteSnapshot)", len(snaps), u.q.Snapshots)}
	}
	add(u.snapshots, tenant, id)
	return nil
}

// holdSnapshot takes a snapshot slot unchecked (a snapshot an earlier
// service took).
func (u *usage) holdSnapshot(tenant, id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	add(u.snapshots, tenant, id)
}

// releaseSnapshot gives a snapshot slot back.
func (u *usage) releaseSnapshot(tenant, id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	remove(u.snapshots, tenant, id)
}

// hold takes the slots without checking the quotas: runs an earlier
// service left active hold theirs whatever the quotas are now.
func (u *usage) hold(tenant, runID string, sandbox bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.addLocked(tenant, runID, sandbox)
}

// holdSandbox takes only a sandbox slot, unchecked (a sandbox being
// reaped).
func (u *usage) holdSandbox(tenant, runID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	add(u.sandboxes, tenant, runID)
}

func (u *usage) addLocked(tenant, runID string, sandbox bool) {
	add(u.runs, tenant, runID)
	if sandbox {
		add(u.sandboxes, tenant, runID)
	}
}

func add(m map[string]map[string]struct{}, tenant, id string) {
	set := m[tenant]
	if set == nil {
		set = map[string]struct{}{}
		m[tenant] = set
	}
	set[id] = struct{}{}
}

func remove(m map[string]map[string]struct{}, tenant, id string) {
	if set := m[tenant]; set != nil {
		delete(set, id)
		if len(set) == 0 {
			delete(m, tenant)
		}
	}
}

// releaseRun gives back runID's run slot (the run ended).
func (u *usage) releaseRun(tenant, runID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	remove(u.runs, tenant, runID)
}

// releaseSandbox gives back runID's sandbox slot (its sandbox was
// deleted, or it never got one).
func (u *usage) releaseSandbox(tenant, runID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	remove(u.sandboxes, tenant, runID)
}

// bucket is a tenant's git fetch budget: up to Quotas.FetchBytes,
// refilled at FetchBytes per FetchWindow.
type bucket struct {
	bytes float64
	at    time.Time
}

// bucketLocked returns the tenant's budget, refilled to now.
func (u *usage) bucketLocked(tenant string) *bucket {
	now := u.now()
	b := u.fetch[tenant]
	if b == nil {
		if len(u.fetch) >= 4096 {
			u.pruneLocked(now)
		}
		b = &bucket{bytes: float64(u.q.FetchBytes), at: now}
		u.fetch[tenant] = b
		return b
	}
	if d := now.Sub(b.at); d > 0 {
		b.bytes = math.Min(float64(u.q.FetchBytes), b.bytes+float64(u.q.FetchBytes)*d.Seconds()/u.q.FetchWindow.Seconds())
		b.at = now
	}
	return b
}

// pruneLocked drops budgets that are full again (a full one is the same
// as none), so the map stays as large as the tenants fetching lately.
func (u *usage) pruneLocked(now time.Time) {
	for t, b := range u.fetch {
		if b.bytes+float64(u.q.FetchBytes)*now.Sub(b.at).Seconds()/u.q.FetchWindow.Seconds() >= float64(u.q.FetchBytes) {
			delete(u.fetch, t)
		}
	}
}

// fetchLeft is what the tenant may still fetch now (math.MaxInt64 when
// unlimited).
func (u *usage) fetchLeft(tenant string) int64 {
	if u.q.FetchBytes < 0 {
		return math.MaxInt64
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return int64(u.bucketLocked(tenant).bytes)
}

// errFetchBudget is the error of a tenant whose fetch budget is spent.
func (u *usage) errFetchBudget() error {
	return &quotaError{quota: quotaFetchPerTenant, msg: fmt.Sprintf(
		"the tenant's git checkouts used its budget of %d bytes per %s; it refills over that time", u.q.FetchBytes, u.q.FetchWindow)}
}

// fetchAccount charges the git checkouts of one sandbox's
// materialization to its tenant.
type fetchAccount struct {
	u      *usage
	tenant string
	// Under u.mu: the bytes of this sandbox's checkouts, and the first
	// quota they exceeded (kept because the materializer may word a cut
	// fetch its own way).
	used     int64
	exceeded error
}

func (u *usage) fetchAccount(tenant string) *fetchAccount {
	return &fetchAccount{u: u, tenant: tenant}
}

// charge adds n bytes (negative: files went away) to the sandbox and the
// tenant, and fails once either is over its quota.
func (a *fetchAccount) charge(n int64) error {
	u := a.u
	u.mu.Lock()
	defer u.mu.Unlock()
	a.used += n
	var err error
	if u.q.FetchBytes >= 0 {
		b := u.bucketLocked(a.tenant)
		b.bytes -= float64(n)
		if b.bytes < 0 || (n == 0 && b.bytes < 1) {
			err = u.errFetchBudget()
		}
	}
	if err == nil && u.q.FetchBytesPerSandbox >= 0 && (a.used > u.q.FetchBytesPerSandbox || (n == 0 && a.used == u.q.FetchBytesPerSandbox)) {
		err = &quotaError{quota: quotaFetchPerSandbox, msg: fmt.Sprintf(
			"the sandbox's git checkouts reached %d bytes and the limit is %d", a.used, u.q.FetchBytesPerSandbox)}
	}
	if err != nil && a.exceeded == nil {
		a.exceeded = err
	}
	return err
}

// err is the first quota the sandbox's checkouts exceeded (nil: none).
func (a *fetchAccount) err() error {
	a.u.mu.Lock()
	defer a.u.mu.Unlock()
	return a.exceeded
}

// check fails when nothing more may be fetched.
func (a *fetchAccount) check() error { return a.charge(0) }

// quotaCause returns err with the quota the git checkouts under ctx
// exceeded, if any, in front: a cut fetch may come back worded as a
// failed one.
func quotaCause(ctx context.Context, err error) error {
	if a := fetchAccountFrom(ctx); err != nil && a != nil && !errors.Is(err, ErrQuotaExceeded) {
		if qerr := a.err(); qerr != nil {
			return fmt.Errorf("%w (%v)", qerr, err)
		}
	}
	return err
}

type fetchAccountKey struct{}

// withFetchAccount binds the git checkouts made under ctx to a.
func withFetchAccount(ctx context.Context, a *fetchAccount) context.Context {
	return context.WithValue(ctx, fetchAccountKey{}, a)
}

func fetchAccountFrom(ctx context.Context) *fetchAccount {
	a, _ := ctx.Value(fetchAccountKey{}).(*fetchAccount)
	return a
}

// hasGit reports whether a manifest has git_repo entries.
func hasGit(m *manifest.Manifest) bool {
	found := false
	_ = m.Walk(func(_ string, e *manifest.Entry) error {
		found = found || e.Type == manifest.TypeGitRepo
		return nil
	})
	return found
}

// MeteredGit wraps the git fetcher of the compute client the service uses
// (materializer.Options.Git; nil: the git command line) so that the
// checkouts of the service's sandboxes are charged to their tenants'
// quotas (Quotas.FetchBytesPerSandbox and FetchBytes): the checkout's
// directory is measured while git writes it, and the fetch is cut as soon
// as a quota is exceeded, so a huge repository fills neither the harness's
// disk nor the sandbox. Checkouts made outside the service (no tenant on
// the context) pass through unmetered. Without it, the fetch quotas are
// checked before a run starts only. The wrapper fetches at pinned
// addresses (FetchPinned) when inner can.
func MeteredGit(inner materializer.GitFetcher) materializer.GitFetcher {
	if inner == nil {
		inner = materializer.GitCLI{}
	}
	return &meteredGit{inner: inner, poll: 100 * time.Millisecond}
}

type meteredGit struct {
	inner materializer.GitFetcher
	poll  time.Duration // the shortest pause between two measures
}

// pinnedFetcher is a git fetcher that connects to checked addresses only
// (the materializer's fetches for untrusted manifests need one).
type pinnedFetcher interface {
	FetchPinned(ctx context.Context, repo *manifest.GitRepo, dir string, addrs []netip.Addr) error
}

// Fetch implements materializer.GitFetcher.
func (g *meteredGit) Fetch(ctx context.Context, repo *manifest.GitRepo, dir string) error {
	return g.meter(ctx, dir, func(ctx context.Context) error { return g.inner.Fetch(ctx, repo, dir) })
}

// FetchPinned is Fetch at the checked addresses addrs, when the wrapped
// fetcher can.
func (g *meteredGit) FetchPinned(ctx context.Context, repo *manifest.GitRepo, dir string, addrs []netip.Addr) error {
	p, ok := g.inner.(pinnedFetcher)
	if !ok {
		return fmt.Errorf("the git fetcher %T cannot fetch at checked addresses", g.inner)
	}
	return g.meter(ctx, dir, func(ctx context.Context) error { return p.FetchPinned(ctx, repo, dir, addrs) })
}

// meter runs fetch, which checks out into dir, charging what it writes to
// the fetch account of ctx and cutting it once a quota is exceeded.
func (g *meteredGit) meter(ctx context.Context, dir string, fetch func(context.Context) error) error {
	a := fetchAccountFrom(ctx)
	if a == nil {
		return fetch(ctx)
	}
	if err := a.check(); err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var last int64
	measure := func() (time.Duration, error) {
		start := time.Now()
		n := dirSize(dir)
		d := n - last
		last = n
		return time.Since(start), a.charge(d)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		wait := g.poll
		for {
			t := time.NewTimer(wait)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
			took, err := measure()
			if err != nil {
				cancel(err)
				return
			}
			// Walking a large checkout costs: measure at most a tenth of
			// the time.
			wait = max(g.poll, 10*took)
		}
	}()
	err := fetch(fctx)
	close(stop)
	<-done
	if cause := context.Cause(fctx); errors.Is(cause, ErrQuotaExceeded) {
		return cause
	}
	if _, merr := measure(); merr != nil {
		return merr
	}
	return err
}

// dirSize is the bytes of the regular files below dir (files that vanish
// while it walks are skipped).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Size()
		}
		return nil
	})
	return n
}
