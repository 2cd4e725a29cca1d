package manager

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Sandboxes as a service: the sandboxes a tenant makes through the API
// (CreateSandbox), which belong to no run. Each is a store record of its
// own (store.Sandbox: its manifest, labels, deadlines and sandbox state),
// written before the sandbox is made and updated once it runs, so a
// manager started after a crash or a shutdown finds every one again (New,
// recoverAPISandboxes): those past their ttl are deleted at once, the
// others wait, unattached, until a call reattaches them or a deadline
// deletes them. Each holds one of its tenant's sandbox slots (the quota
// runs' sandboxes count against too) until it is deleted, and gets the
// operator's caps (Config.ProviderOptions) like a run's.
//
// Deadlines. A sandbox is deleted at its ttl (from its creation, or from
// the last SetTimeout), or once it was idle for its idle timeout,
// whichever comes first; a call in progress (a command, a terminal, a
// file transfer) is use until it ends. When the idle deadline comes, the
// sandbox's daemon is asked for its own last activity (pause.go): a
// sandbox busy on its own (a build left running) is not idle. A sandbox
// whose OnIdle is OnIdlePause is paused then rather than deleted, and its
// next call resumes it. A paused sandbox has no idle clock; its ttl
// stands. The ttl deadline is stored; the idle clock is this process's:
// after a restart it starts again.
//
// Snapshots (snapshots.go): SnapshotSandbox keeps a sandbox's workspace
// under a name the tenant owns, ForkSandbox makes sandboxes from a
// sandbox's current workspace, and CreateSandbox can start from a
// snapshot.
//
// Every call of the sandbox API (commands, files, terminals; sandbox.go,
// commands.go) works on these and on runs' sandboxes alike, through
// open.

// SandboxPolicy bounds the sandboxes, commands and files of the sandbox
// API. Zero fields take their defaults (below).
type SandboxPolicy struct {
	// DefaultTTL and MaxTTL: a sandbox made through the API is deleted
	// this long after it was made (CreateSandbox's ttl, at most MaxTTL).
	DefaultTTL, MaxTTL time.Duration
	// DefaultIdleTimeout and MaxIdleTimeout: it is deleted once no call
	// used it this long.
	DefaultIdleTimeout, MaxIdleTimeout time.Duration
	// DefaultCommandTimeout and MaxCommandTimeout bound a command's run
	// (RunCommand, Exec, StartProcess).
	DefaultCommandTimeout, MaxCommandTimeout time.Duration
	// MaxOutputBytes caps each output stream RunCommand returns (the rest
	// is counted, not kept).
	MaxOutputBytes int64
	// MaxFileBytes caps a file written through the API (WriteFile, PUT).
	MaxFileBytes int64
	// MaxTarBytes and MaxTarEntries bound a directory uploaded or
	// downloaded as one tar stream (UploadTar, DownloadTar): the bytes of
	// its files together, and its members (each file also within
	// MaxFileBytes).
	MaxTarBytes   int64
	MaxTarEntries int
	// MaxForks bounds ForkSandbox's count.
	MaxForks int
}

// Defaults of SandboxPolicy.
const (
	DefaultSandboxTTL         = time.Hour
	DefaultMaxSandboxTTL      = 24 * time.Hour
	DefaultSandboxIdleTimeout = 15 * time.Minute
	DefaultCommandTimeout     = 10 * time.Minute
	DefaultMaxCommandTimeout  = time.Hour
	DefaultMaxOutputBytes     = 1 << 20   // 1 MiB per stream
	DefaultMaxFileBytes       = 256 << 20 // 256 MiB
	DefaultMaxTarBytes        = 1 << 30   // 1 GiB
	DefaultMaxTarEntries      = 10000
	DefaultMaxForks           = 16
	// minSandboxTimeout is the shortest ttl or idle timeout.
	minSandboxTimeout = time.Second
)

// withDefaults fills in the defaults and checks p.
func (p SandboxPolicy) withDefaults() (SandboxPolicy, error) {
	if p.MaxTTL == 0 {
		p.MaxTTL = max(DefaultMaxSandboxTTL, p.DefaultTTL)
	}
	if p.DefaultTTL == 0 {
		p.DefaultTTL = min(DefaultSandboxTTL, p.MaxTTL)
	}
	if p.MaxIdleTimeout == 0 {
		p.MaxIdleTimeout = max(p.MaxTTL, p.DefaultIdleTimeout)
	}
	if p.DefaultIdleTimeout == 0 {
		p.DefaultIdleTimeout = min(DefaultSandboxIdleTimeout, p.MaxIdleTimeout)
	}
	if p.MaxCommandTimeout == 0 {
		p.MaxCommandTimeout = max(DefaultMaxCommandTimeout, p.DefaultCommandTimeout)
	}
	if p.DefaultCommandTimeout == 0 {
		p.DefaultCommandTimeout = min(DefaultCommandTimeout, p.MaxCommandTimeout)
	}
	if p.MaxOutputBytes == 0 {
		p.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if p.MaxFileBytes == 0 {
		p.MaxFileBytes = DefaultMaxFileBytes
	}
	if p.MaxTarBytes == 0 {
		p.MaxTarBytes = DefaultMaxTarBytes
	}
	if p.MaxTarEntries == 0 {
		p.MaxTarEntries = DefaultMaxTarEntries
	}
	if p.MaxForks == 0 {
		p.MaxForks = DefaultMaxForks
	}
	switch {
	case p.DefaultTTL < minSandboxTimeout || p.DefaultTTL > p.MaxTTL:
		return p, fmt.Errorf("sandbox policy: the default ttl %s is not between %s and the maximum %s", p.DefaultTTL, minSandboxTimeout, p.MaxTTL)
	case p.DefaultIdleTimeout < minSandboxTimeout || p.DefaultIdleTimeout > p.MaxIdleTimeout:
		return p, fmt.Errorf("sandbox policy: the default idle timeout %s is not between %s and the maximum %s", p.DefaultIdleTimeout, minSandboxTimeout, p.MaxIdleTimeout)
	case p.DefaultCommandTimeout <= 0 || p.DefaultCommandTimeout > p.MaxCommandTimeout:
		return p, fmt.Errorf("sandbox policy: the default command timeout %s is not between 0 and the maximum %s", p.DefaultCommandTimeout, p.MaxCommandTimeout)
	case p.MaxOutputBytes < 0 || p.MaxFileBytes < 0 || p.MaxTarBytes < 0 || p.MaxTarEntries < 0 || p.MaxForks < 0:
		return p, errors.New("sandbox policy: byte caps must be positive")
	}
	return p, nil
}

// apiSandboxes are the manager's sandboxes made through the API.
type apiSandboxes struct {
	policy SandboxPolicy
	// boxes are the live ones, by id (under Manager.mu).
	boxes map[string]*box
	// snaps are the named snapshots' records, by id (under Manager.mu;
	// replaced, never changed in place).
	snaps map[string]*store.Sandbox
}

// box is a live sandbox made through the API. Its fields but id and
// tenant are under Manager.mu.
type box struct {
	id, tenant string
	rec        *store.Sandbox // replaced, never changed in place
	// sess is nil while the sandbox is not attached (after a restart).
	sess *compute.Session
	// busy counts the calls using it; lastUsed is when the last one
	// started or ended (the idle clock); activity is the daemon's last
	// activity as last reported (pause.go).
	busy     int
	lastUsed time.Time
	activity time.Time
	timer    *time.Timer
	// run is the active run working in it ("": none; callerbox.go).
	run string
	// gone is set once its deletion started.
	gone bool
	// attach serializes attaching and deleting; save serializes record
	// updates.
	attach, save sync.Mutex
}

// deadline is when b goes (or pauses), as of now: its ttl, or its idle
// deadline (counted from now while a call uses it; none while it is
// paused).
func (b *box) deadline(now time.Time) time.Time {
	d := b.rec.Expires
	if idle := b.rec.IdleTimeout; idle > 0 && !b.rec.Paused {
		last := b.lastUsed
		if b.activity.After(last) {
			last = b.activity
		}
		if b.busy > 0 {
			last = now
		}
		if i := last.Add(idle); i.Before(d) {
			d = i
		}
	}
	return d
}

// view is b as a tenant sees it (m.mu held).
func (b *box) view() Sandbox {
	sb := Sandbox{ID: b.id, Provider: b.rec.Provider, Created: b.rec.Created, Expires: b.rec.Expires,
		Labels: maps.Clone(b.rec.Labels), IdleTimeout: b.rec.IdleTimeout, Status: SandboxStopped, OnIdle: OnIdleDelete}
	if b.rec.OnIdle == string(OnIdlePause) {
		sb.OnIdle = OnIdlePause
	}
	switch {
	case b.rec.Paused:
		sb.Status, sb.KeepMemory = SandboxPaused, b.rec.KeepMemory
	case b.sess != nil:
		sb.Status = SandboxRunning
	}
	return sb
}

// sandboxSpecJSON is what a sandbox's record keeps of its spec.
type sandboxSpecJSON struct {
	Manifest string `json:"manifest,omitempty"`
}

// CreateSandbox makes a sandbox of tenant from spec and returns it
// running. It holds one of the tenant's sandbox slots (resource exhausted
// when the quota is full) until it is deleted: at its ttl, once idle for
// its idle timeout, or by DeleteSandbox.
func (m *Manager) CreateSandbox(ctx context.Context, tenant string, spec SandboxSpec) (*Sandbox, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	pol := m.api.policy
	ttl, err := bounded("ttl", spec.TTL, pol.DefaultTTL, minSandboxTimeout, pol.MaxTTL)
	if err != nil {
		return nil, err
	}
	idle, err := bounded("idle_timeout", spec.IdleTimeout, pol.DefaultIdleTimeout, minSandboxTimeout, pol.MaxIdleTimeout)
	if err != nil {
		return nil, err
	}
	if err := checkLabels("labels", spec.Labels); err != nil {
		return nil, err
	}
	onIdle, err := checkOnIdle(spec.OnIdle)
	if err != nil {
		return nil, err
	}
	var seed *store.Sandbox
	manText := spec.Manifest
	if spec.FromSnapshot != "" {
		if seed, manText, err = m.seedOf(tenant, spec); err != nil {
			return nil, err
		}
	}
	man, err := parseManifest(manText)
	if err != nil {
		return nil, err
	}
	if m.cfg.CheckManifest != nil {
		if err := m.cfg.CheckManifest(man); err != nil {
			return nil, manifestErr(err)
		}
	}
	seedID := ""
	if seed != nil {
		seedID, man = seed.ID, m.inheritAccount(man, seed.SessionState)
	}
	m.mu.Lock()
	closing := m.closing
	m.mu.Unlock()
	if closing {
		return nil, errShuttingDown
	}
	if hasGit(man) && m.usage.fetchLeft(tenant) <= 0 {
		return nil, m.usage.errFetchBudget()
	}
	specData, err := json.Marshal(sandboxSpecJSON{Manifest: manText})
	if err != nil {
		return nil, err
	}
	id := newID("sbx-")
	if err := m.usage.reserveSandbox(tenant, id); err != nil {
		return nil, err
	}
	now := m.now()
	rec := &store.Sandbox{ID: id, Tenant: tenant, Created: now, Updated: now, Spec: specData, Labels: maps.Clone(spec.Labels),
		Expires: now.Add(ttl), IdleTimeout: idle, OnIdle: onIdle}
	return m.newBox(ctx, rec, man, seedID)
}

// newBox stores rec, a new API sandbox's record whose sandbox slot is
// taken, and makes its sandbox from man, its workspace seeded from the
// snapshot seed when it is not "". On failure the slot is given back.
func (m *Manager) newBox(ctx context.Context, rec *store.Sandbox, man *manifest.Manifest, seed string) (*Sandbox, error) {
	id, tenant, now := rec.ID, rec.Tenant, rec.Created
	if err := m.cfg.Store.CreateSandbox(ctx, rec); err != nil {
		m.usage.releaseSandbox(tenant, id)
		return nil, err
	}
	// Tracked (and busy) from here: a shutdown or a deadline meanwhile
	// finds it.
	b := &box{id: id, tenant: tenant, rec: rec, busy: 1, lastUsed: now}
	m.mu.Lock()
	m.api.boxes[id] = b
	m.armBoxLocked(b)
	m.mu.Unlock()
	bctx, cancel := m.bound(ctx)
	defer cancel()
	if seed != "" {
		if _, err := m.copySnapshot(bctx, seed, id); err != nil {
			_ = m.dropBox(b, "its creation failed")
			return nil, err
		}
	}
	if err := m.makeBox(bctx, b, man); err != nil {
		_ = m.dropBox(b, "its creation failed")
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.doneLocked(b)
	if b.gone {
		return nil, errNoSandbox // deleted meanwhile
	}
	sb := b.view()
	return &sb, nil
}

// makeBox makes b's sandbox from man, records its state and attaches it
// (b.attach held: a deletion meanwhile waits for it, then deletes it).
func (m *Manager) makeBox(ctx context.Context, b *box, man *manifest.Manifest) (err error) {
	b.attach.Lock()
	defer b.attach.Unlock()
	ctx = withFetchAccount(ctx, m.usage.fetchAccount(b.tenant))
	defer func() { err = quotaCause(ctx, err) }()
	sess, err := m.cfg.Compute.Create(ctx, compute.CreateOptions{Manifest: man, SessionID: b.id,
		Labels: map[string]string{"bulkhead.sandbox": b.id}, ProviderOptions: m.providerOpts, Limits: m.limits})
	if err != nil {
		return err
	}
	fail := func(err error) error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return errors.Join(err, m.cfg.Compute.Delete(cctx, sess))
	}
	if err := sess.Start(ctx); err != nil {
		return fail(err)
	}
	if err := m.saveBoxState(ctx, b, sess); err != nil {
		return fail(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.released {
		// Shutdown released the sandboxes meanwhile: the next manager
		// finds this one in the store.
		_ = sess.Release()
		return errShuttingDown
	}
	b.sess = sess
	return nil
}

// saveBoxState records sess's state in b's record.
func (m *Manager) saveBoxState(ctx context.Context, b *box, sess *compute.Session) error {
	st, err := sess.State()
	if err != nil {
		return err
	}
	data, err := st.Encode()
	if err != nil {
		return err
	}
	return m.updateBox(ctx, b, func(r *store.Sandbox) {
		r.SessionState, r.Provider = data, sess.Provider()
		r.Paused, r.KeepMemory, r.ResumeOnCall = false, false, false // running
	})
}

// updateBox applies fn to b's record and saves it.
func (m *Manager) updateBox(ctx context.Context, b *box, fn func(*store.Sandbox)) error {
	b.save.Lock()
	defer b.save.Unlock()
	m.mu.Lock()
	next := *b.rec
	m.mu.Unlock()
	fn(&next)
	next.Updated = m.now()
	if err := m.cfg.Store.UpdateSandbox(context.WithoutCancel(ctx), &next); err != nil {
		return fmt.Errorf("save sandbox %s: %w", b.id, err)
	}
	m.mu.Lock()
	b.rec = &next
	m.mu.Unlock()
	return nil
}

// armBoxLocked (re)arms b's deadline (m.mu held). A timer that fires
// while the manager drains does nothing: the next manager goes by the
// stored ttl.
func (m *Manager) armBoxLocked(b *box) {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if m.closing || b.gone {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(max(b.deadline(m.now()).Sub(m.now()), 0), func() {
		m.mu.Lock()
		if m.closing || b.timer != t || b.gone {
			m.mu.Unlock()
			return
		}
		now := m.now()
		if b.deadline(now).After(now) {
			m.armBoxLocked(b) // used meanwhile
			m.mu.Unlock()
			return
		}
		if b.rec.Expires.After(now) {
			m.mu.Unlock()
			m.tasks.goTracked(func() { m.idleBox(b) })
			return
		}
		m.mu.Unlock()
		m.tasks.goTracked(func() { _ = m.dropBox(b, "its ttl passed") })
	})
	b.timer = t
}

// doneLocked ends a call's use of b (m.mu held).
func (m *Manager) doneLocked(b *box) {
	b.busy--
	b.lastUsed = m.now()
}

// dropBox deletes b's sandbox (unless its deletion started already),
// gives its slot back and records it gone. A sandbox that cannot be
// deleted keeps its record, for the next manager to try again.
func (m *Manager) dropBox(b *box, reason string) error {
	m.mu.Lock()
	first := m.markGoneLocked(b)
	m.mu.Unlock()
	if !first {
		return nil
	}
	return m.deleteBox(b, reason)
}

// markGoneLocked starts b's deletion (m.mu held): it is no longer
// listed, timed or counted. False when its deletion started already.
func (m *Manager) markGoneLocked(b *box) bool {
	if b.gone {
		return false
	}
	b.gone = true
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if m.api.boxes[b.id] == b {
		delete(m.api.boxes, b.id)
	}
	m.usage.releaseSandbox(b.tenant, b.id)
	return true
}

// deleteBox deletes the sandbox of b, marked gone (markGoneLocked), and
// records it gone (see dropBox).
func (m *Manager) deleteBox(b *box, reason string) error {
	m.ports.dropSandbox(b.id)
	// An attach in progress ends first; none starts any more (gone).
	b.attach.Lock()
	defer b.attach.Unlock()
	m.mu.Lock()
	sess, rec := b.sess, b.rec
	b.sess = nil
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.base), 2*time.Minute)
	defer cancel()
	var err error
	switch {
	case sess != nil:
		err = m.cfg.Compute.Delete(ctx, sess)
	case len(rec.SessionState) > 0 && rec.Paused:
		// Not restored only to be deleted (its checkpoint goes with it).
		var st *compute.State
		if st, err = m.cfg.Compute.DecodeState(rec.SessionState); err == nil {
			err = m.cfg.Compute.DeleteState(ctx, st)
		}
	case len(rec.SessionState) > 0:
		err = m.destroyState(ctx, rec.SessionState)
	}
	if err == nil {
		// Its workspace snapshot (a pause's, a fork's or a snapshot's
		// source) is nobody's any more.
		if snaps := m.cfg.Compute.Snapshots(); snaps != nil {
			if derr := snaps.Delete(ctx, b.id); derr != nil {
				m.log.Warn("deleting an API sandbox's workspace snapshot", zap.String("sandbox", b.id), zap.Error(derr))
			}
		}
	}
	if err != nil && !errors.Is(err, errkind.ErrInvalidArgument) {
		m.log.Warn("deleting an API sandbox", zap.String("sandbox", b.id), zap.String("why", reason), zap.Error(err))
		return err
	}
	if err != nil {
		m.log.Error("an API sandbox cannot be found from its stored state; forgetting it", zap.String("sandbox", b.id), zap.Error(err))
	}
	m.log.Debug("API sandbox deleted", zap.String("sandbox", b.id), zap.String("why", reason))
	return m.updateBox(ctx, b, func(r *store.Sandbox) { r.Gone = true })
}

// destroyState deletes the sandbox a stored state names (reattaching to
// it: a session is what compute deletes).
func (m *Manager) destroyState(ctx context.Context, data []byte) error {
	st, err := m.cfg.Compute.DecodeState(data)
	if err != nil {
		return err
	}
	sess, err := m.cfg.Compute.Resume(ctx, st)
	if err != nil {
		return err
	}
	return m.cfg.Compute.Delete(ctx, sess)
}

// open returns the live session of a tenant's sandbox (an API sandbox,
// reattached if need be, or a run's) and a func the caller calls once its
// use ended (the idle clock starts again then). Another tenant's sandbox
// and a deleted one answer not found.
func (m *Manager) open(ctx context.Context, tenant, id string) (*compute.Session, func(), error) {
	if err := checkSandboxID("sandbox_id", id); err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	b := m.api.boxes[id]
	if b == nil {
		m.mu.Unlock()
		sess, err := m.sandbox(ctx, tenant, id)
		return sess, func() {}, err
	}
	if b.tenant != tenant || b.gone {
		m.mu.Unlock()
		return nil, nil, errNoSandbox
	}
	if b.rec.Paused && !b.rec.ResumeOnCall {
		m.mu.Unlock()
		return nil, nil, errPaused(id)
	}
	b.busy++
	b.lastUsed = m.now()
	sess := b.sess
	m.mu.Unlock()
	done := func() {
		m.mu.Lock()
		m.doneLocked(b)
		m.mu.Unlock()
	}
	if sess != nil {
		return sess, done, nil
	}
	sess, err := m.attachBox(ctx, b)
	if err != nil {
		done()
		return nil, nil, err
	}
	return sess, done, nil
}

// attachBox reattaches an API sandbox an earlier manager made (rebuilt
// from its snapshot when its sandbox is gone).
func (m *Manager) attachBox(ctx context.Context, b *box) (*compute.Session, error) {
	b.attach.Lock()
	defer b.attach.Unlock()
	return m.attachHeld(ctx, b)
}

// attachHeld is attachBox with b.attach held. A paused sandbox is resumed
// (with its memory when its pause kept it; from its workspace when that
// restore fails).
func (m *Manager) attachHeld(ctx context.Context, b *box) (*compute.Session, error) {
	m.mu.Lock()
	gone, sess, rec := b.gone, b.sess, b.rec
	m.mu.Unlock()
	switch {
	case gone:
		return nil, errNoSandbox
	case sess != nil:
		return sess, nil
	case len(rec.SessionState) == 0:
		return nil, failedPrecondition("sandbox %s is being made", b.id)
	}
	st, err := m.cfg.Compute.DecodeState(rec.SessionState)
	if err != nil {
		return nil, fmt.Errorf("sandbox state of %s: %w", b.id, err)
	}
	actx := withFetchAccount(ctx, m.usage.fetchAccount(b.tenant))
	opts := []compute.ResumeOption{compute.WithLimits(m.limits), compute.WithProviderOptions(m.providerOpts)}
	sess, err = m.cfg.Compute.Resume(actx, st, opts...)
	if err != nil && st.Paused && ctx.Err() == nil {
		m.log.Warn("restoring a paused sandbox's memory failed; resuming it from its workspace", zap.String("sandbox", b.id), zap.Error(err))
		sess, err = m.cfg.Compute.Resume(actx, st, append(opts, compute.DiscardMemory())...)
	}
	if err != nil {
		return nil, quotaCause(actx, err)
	}
	if err := sess.Start(actx); err != nil {
		_ = sess.Release()
		return nil, quotaCause(actx, err)
	}
	if err := m.saveBoxState(ctx, b, sess); err != nil {
		_ = sess.Release()
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.released {
		_ = sess.Release()
		return nil, errShuttingDown
	}
	b.sess = sess
	m.armBoxLocked(b) // its idle clock runs again
	return sess, nil
}

// busyBox marks a call using sandbox id, if it is an API sandbox, and
// returns the func that ends the use.
func (m *Manager) busyBox(id string) func() {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.api.boxes[id]
	if b == nil {
		return func() {}
	}
	b.busy++
	b.lastUsed = m.now()
	return func() {
		m.mu.Lock()
		m.doneLocked(b)
		m.mu.Unlock()
	}
}

// tenantBox returns a tenant's live API sandbox, or nil.
func (m *Manager) tenantBox(tenant, id string) *box {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b := m.api.boxes[id]; b != nil && b.tenant == tenant && !b.gone {
		return b
	}
	return nil
}

// GetSandbox returns a tenant's sandbox (an API sandbox or a run's).
func (m *Manager) GetSandbox(ctx context.Context, tenant, id string) (*Sandbox, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := checkSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	if b := m.tenantBox(tenant, id); b != nil {
		m.mu.Lock()
		sb := b.view()
		m.mu.Unlock()
		return &sb, nil
	}
	runID := runIDOf(id)
	if runID == "" {
		return nil, errNoSandbox
	}
	r, err := m.cfg.Store.GetRun(ctx, tenant, runID)
	if err != nil || r.SandboxID != id {
		return nil, errNoSandbox
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.runSandboxLocked(r)
	if !ok {
		return nil, errNoSandbox
	}
	return &sb, nil
}

// DeleteSandbox deletes a tenant's sandbox: one made through the API, or
// the one kept for a finished run (failed precondition while its run is
// active, or while a run started in the API sandbox uses it: cancel the
// run).
func (m *Manager) DeleteSandbox(ctx context.Context, tenant, id string) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	if err := checkSandboxID("sandbox_id", id); err != nil {
		return err
	}
	if b := m.tenantBox(tenant, id); b != nil {
		// Refused while a run uses it (callerbox.go), atomically with
		// the start of its deletion.
		m.mu.Lock()
		if run := b.run; run != "" {
			m.mu.Unlock()
			return errUsedByRun(id, run, "deleted")
		}
		first := m.markGoneLocked(b)
		m.mu.Unlock()
		if !first {
			return nil
		}
		return m.deleteBox(b, "DeleteSandbox")
	}
	runID := runIDOf(id)
	if runID == "" {
		return errNoSandbox
	}
	r, err := m.cfg.Store.GetRun(ctx, tenant, runID)
	if err != nil || r.SandboxID != id || r.SandboxGone {
		return errNoSandbox
	}
	m.mu.Lock()
	_, active := m.runs[runID]
	_, held := m.sessions[runID]
	_, kept := m.retained[runID]
	m.mu.Unlock()
	switch {
	case active:
		return failedPrecondition("sandbox %s is run %s's, which is active; cancel the run first", id, runID)
	case !held && !kept:
		return errNoSandbox
	}
	m.deleteSandbox(tenant, runID)
	return nil
}

// SetTimeout moves the deadlines of a tenant's API sandbox: ttl (non-zero)
// counts from now, idle (non-zero) replaces its idle timeout; each is
// bounded by the policy. A run's sandbox follows its run: failed
// precondition.
func (m *Manager) SetTimeout(ctx context.Context, tenant, id string, ttl, idle time.Duration) (*Sandbox, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := checkSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	pol := m.api.policy
	var err error
	if ttl != 0 {
		if ttl, err = bounded("ttl", ttl, 0, minSandboxTimeout, pol.MaxTTL); err != nil {
			return nil, err
		}
	}
	if idle != 0 {
		if idle, err = bounded("idle_timeout", idle, 0, minSandboxTimeout, pol.MaxIdleTimeout); err != nil {
			return nil, err
		}
	}
	b := m.tenantBox(tenant, id)
	if b == nil {
		if _, err := m.GetSandbox(ctx, tenant, id); err != nil {
			return nil, err
		}
		return nil, failedPrecondition("sandbox %s is a run's: it lives as long as its run (and its retention)", id)
	}
	now := m.now()
	err = m.updateBox(ctx, b, func(r *store.Sandbox) {
		if ttl > 0 {
			r.Expires = now.Add(ttl)
		}
		if idle > 0 {
			r.IdleTimeout = idle
		}
	})
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if b.gone {
		return nil, errNoSandbox
	}
	b.lastUsed = now
	m.armBoxLocked(b)
	sb := b.view()
	return &sb, nil
}

// runSandboxLocked is the sandbox of a stored run as a tenant sees it,
// if the manager holds or keeps it (m.mu held).
func (m *Manager) runSandboxLocked(r *store.Run) (Sandbox, bool) {
	if r.SandboxID == "" || r.SandboxGone {
		return Sandbox{}, false
	}
	_, live := m.sessions[r.ID]
	_, active := m.runs[r.ID]
	_, kept := m.retained[r.ID]
	if !live && !active && !kept {
		return Sandbox{}, false
	}
	sb := Sandbox{ID: r.SandboxID, RunID: r.ID, Provider: r.Provider, Created: r.Created, Status: SandboxStopped}
	if live {
		sb.Status = SandboxRunning
	}
	if !r.SandboxExpires.IsZero() && terminal(r.Status) {
		sb.Expires = r.SandboxExpires
	}
	return sb, true
}

// ListSandboxes returns a tenant's sandboxes, newest first: those of its
// active runs, those kept for its finished runs, and those it made through
// the API; with runID, that run's only (not found when the tenant has no
// such run). ListSandboxesPage filters and pages.
func (m *Manager) ListSandboxes(ctx context.Context, tenant, runID string) ([]Sandbox, error) {
	sbs, _, err := m.listSandboxes(ctx, tenant, ListSandboxesOptions{RunID: runID}, true)
	return sbs, err
}

// ListSandboxesPage returns a page of a tenant's sandboxes, newest first,
// as ListSandboxes does, filtered by o. The token of the next page is ""
// on the last.
func (m *Manager) ListSandboxesPage(ctx context.Context, tenant string, o ListSandboxesOptions) ([]Sandbox, string, error) {
	return m.listSandboxes(ctx, tenant, o, false)
}

// listSandboxes is ListSandboxesPage, or every sandbox on one page (all).
func (m *Manager) listSandboxes(ctx context.Context, tenant string, o ListSandboxesOptions, all bool) ([]Sandbox, string, error) {
	if err := m.enter(tenant); err != nil {
		return nil, "", err
	}
	defer m.leave()
	if err := checkSandboxListOptions(o); err != nil {
		return nil, "", err
	}
	var runs []*store.Run
	if o.RunID != "" {
		r, err := m.cfg.Store.GetRun(ctx, tenant, o.RunID)
		if err != nil {
			return nil, "", err
		}
		runs = []*store.Run{r}
	} else {
		// Only the runs holding a sandbox, through the store's index.
		var err error
		if runs, err = m.cfg.Store.SandboxRuns(ctx, tenant); err != nil {
			return nil, "", err
		}
	}
	var list []Sandbox
	m.mu.Lock()
	if len(o.Labels) == 0 {
		for _, r := range runs {
			if sb, ok := m.runSandboxLocked(r); ok {
				list = append(list, sb)
			}
		}
	}
	if o.RunID == "" {
		for _, b := range m.api.boxes {
			if b.tenant != tenant || b.gone {
				continue
			}
			match := true
			for k, v := range o.Labels {
				if got, ok := b.rec.Labels[k]; !ok || got != v {
					match = false
				}
			}
			if match {
				list = append(list, b.view())
			}
		}
	}
	m.mu.Unlock()
	list = slices.DeleteFunc(list, func(sb Sandbox) bool { return o.Status != "" && sb.Status != o.Status })
	slices.SortFunc(list, func(x, y Sandbox) int {
		return cmp.Or(y.Created.Compare(x.Created), strings.Compare(y.ID, x.ID))
	})
	if o.PageToken != "" {
		micros, id, _ := strings.Cut(o.PageToken, ".")
		n, _ := strconv.ParseInt(micros, 10, 64)
		at := time.UnixMicro(n).UTC()
		// The first one after the token's position (older, or as old with
		// a smaller id).
		i := slices.IndexFunc(list, func(sb Sandbox) bool {
			c := sb.Created.Compare(at)
			return c < 0 || (c == 0 && sb.ID < id)
		})
		if i < 0 {
			i = len(list)
		}
		list = list[i:]
	}
	size := o.PageSize
	if size == 0 {
		size = store.DefaultLimit
	}
	next := ""
	if len(list) > size && !all {
		list = list[:size]
		last := list[size-1]
		next = strconv.FormatInt(last.Created.UnixMicro(), 10) + "." + last.ID
	}
	return list, next, nil
}

// recoverAPISandboxes takes back the API sandboxes an earlier manager made
// (New): those past their ttl (or lost while being made) are deleted at
// once, the others wait, unattached, for a call or a deadline (the idle
// clock starts now). Each holds its tenant's sandbox slot until it is
// deleted, whatever the quotas are now.
func (m *Manager) recoverAPISandboxes(ctx context.Context) error {
	recs, err := m.cfg.Store.LiveSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("recover API sandboxes: %w", err)
	}
	now := m.now()
	var kept, reaped int
	for _, rec := range recs {
		if rec.Kind == store.KindSnapshot {
			m.mu.Lock()
			m.usage.holdSnapshot(rec.Tenant, rec.ID)
			m.api.snaps[rec.ID] = rec
			m.mu.Unlock()
			continue
		}
		b := &box{id: rec.ID, tenant: rec.Tenant, rec: rec, lastUsed: now}
		m.mu.Lock()
		m.usage.holdSandbox(rec.Tenant, rec.ID)
		m.api.boxes[rec.ID] = b
		// One without a state was lost while it was made: nothing can
		// reattach it.
		if rec.Expires.After(now) && len(rec.SessionState) > 0 {
			m.armBoxLocked(b)
			m.mu.Unlock()
			kept++
			continue
		}
		m.mu.Unlock()
		reaped++
		if !m.tasks.goTracked(func() { _ = m.dropBox(b, "its ttl passed while no service ran, or it was lost being made") }) {
			m.mu.Lock()
			delete(m.api.boxes, rec.ID)
			m.usage.releaseSandbox(rec.Tenant, rec.ID)
			m.mu.Unlock()
		}
	}
	if kept+reaped > 0 {
		m.log.Info("API sandboxes of an earlier service", zap.Int("deleted_now", reaped), zap.Int("kept", kept))
	}
	return nil
}

// releaseAPISandboxes lets the API sandboxes go at Shutdown (after it set
// released): each attached one is released, not deleted; its record keeps
// its state and ttl for the next manager.
func (m *Manager) releaseAPISandboxes() []error {
	m.mu.Lock()
	var sessions []*compute.Session
	for _, b := range m.api.boxes {
		if b.timer != nil {
			b.timer.Stop()
			b.timer = nil
		}
		if b.sess != nil {
			sessions = append(sessions, b.sess)
			b.sess = nil
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, sess := range sessions {
		if err := sess.Release(); err != nil {
			errs = append(errs, fmt.Errorf("release API sandbox %s: %w", sess.ID(), err))
		}
	}
	return errs
}
