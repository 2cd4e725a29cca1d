package manager

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/store"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Named snapshots and forks of API sandboxes. Both start from the
// sandbox's workspace snapshot (its session persists it under the
// sandbox's id, compute.Session.Stop): a named snapshot is a copy of it
// under a "snap-" id in the same snapshot store, with a store record of
// kind store.KindSnapshot (its tenant, its source, its manifest), and a
// fork is a new API sandbox whose own snapshot is seeded with a copy
// before it starts, so its Start restores the files instead of
// materializing the manifest. Snapshots hold the workspace only (memory
// forks are a later change). Each counts against its tenant's snapshot
// quota until DeleteSnapshot; a fork's sandboxes count against the
// sandbox quota, all reserved before any is made.

// errNoSnapshot: the id names no snapshot of the tenant.
var errNoSnapshot = withKind(errkind.ErrNotFound, errors.New("snapshot not found"))

// snapshotStore is the compute client's snapshot store, or an
// unimplemented error when the service keeps no snapshots.
func (m *Manager) snapshotStore() (snapshot.Store, error) {
	st := m.cfg.Compute.Snapshots()
	if _, noop := st.(snapshot.Noop); st == nil || noop {
		return nil, withKind(errkind.ErrUnimplemented, errors.New("this service keeps no snapshots (it runs without a snapshot store)"))
	}
	return st, nil
}

// copySnapshot copies the stored snapshot from to the id to.
func (m *Manager) copySnapshot(ctx context.Context, from, to string) (snapshot.Info, error) {
	st, err := m.snapshotStore()
	if err != nil {
		return snapshot.Info{}, err
	}
	r, err := st.Get(ctx, from)
	if err != nil {
		return snapshot.Info{}, fmt.Errorf("open snapshot %s: %w", from, err)
	}
	defer r.Close()
	info, err := st.Put(ctx, to, r)
	if err != nil {
		return snapshot.Info{}, fmt.Errorf("copy snapshot %s to %s: %w", from, to, err)
	}
	return info, nil
}

// checkOnIdle checks an OnIdle field and returns what the record keeps.
func checkOnIdle(o OnIdle) (string, error) {
	switch o {
	case "", OnIdleDelete:
		return "", nil
	case OnIdlePause:
		return string(OnIdlePause), nil
	}
	return "", badField("on_idle", "%q: DELETE or PAUSE", clip(string(o)))
}

// seedOf is the record of the snapshot a CreateSandbox spec starts from
// and that snapshot's manifest.
func (m *Manager) seedOf(tenant string, spec SandboxSpec) (*store.Sandbox, string, error) {
	if err := checkSnapshotID("from_snapshot", spec.FromSnapshot); err != nil {
		return nil, "", err
	}
	if spec.Manifest != "" {
		return nil, "", badField("manifest", "give either a manifest or from_snapshot (a sandbox made from a snapshot has the snapshot's manifest)")
	}
	m.mu.Lock()
	rec := m.api.snaps[spec.FromSnapshot]
	m.mu.Unlock()
	if rec == nil || rec.Tenant != tenant {
		return nil, "", errNoSnapshot
	}
	man, err := specManifest(rec.Spec)
	if err != nil {
		return nil, "", err
	}
	return rec, man, nil
}

// inheritAccount gives man, the manifest of a sandbox made from another's
// workspace (a fork, or a sandbox made from a snapshot), the account the
// provider gave its source (compute.DefaultRunAsName, with its uid, as
// srcState, the source's compute.State, records it), so the restored
// files' owner is the account its processes run as. A manifest naming
// its own run_as is left as it is.
func (m *Manager) inheritAccount(man *manifest.Manifest, srcState []byte) *manifest.Manifest {
	if man.RunAs != "" || len(srcState) == 0 {
		return man
	}
	st, err := m.cfg.Compute.DecodeState(srcState)
	if err != nil || st.Manifest == nil || st.Manifest.RunAs != compute.DefaultRunAsName {
		return man
	}
	for _, u := range st.Manifest.Users {
		if u.Name == st.Manifest.RunAs {
			out := man.Clone()
			out.RunAs = u.Name
			out.Users = append(out.Users, u)
			return out
		}
	}
	return man
}

// specManifest is the manifest text a sandbox or snapshot record keeps.
func specManifest(data []byte) (string, error) {
	var s sandboxSpecJSON
	if len(data) == 0 {
		return "", nil
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return "", fmt.Errorf("stored sandbox spec: %w", err)
	}
	return s.Manifest, nil
}

// snapshotView is a snapshot record as its tenant sees it.
func snapshotView(r *store.Sandbox) Snapshot {
	return Snapshot{ID: r.ID, SandboxID: r.Source, Created: r.Created, Size: r.Size, Labels: maps.Clone(r.Labels)}
}

// SnapshotSandbox saves the workspace of a tenant's running API sandbox
// as a named snapshot the tenant owns (one of its snapshot slots until
// DeleteSnapshot) and returns it.
func (m *Manager) SnapshotSandbox(ctx context.Context, tenant, id string, labels map[string]string) (*Snapshot, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := checkLabels("labels", labels); err != nil {
		return nil, err
	}
	b, err := m.apiBox(ctx, tenant, id, "snapshotted")
	if err != nil {
		return nil, err
	}
	snaps, err := m.snapshotStore()
	if err != nil {
		return nil, err
	}
	ctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	defer done()
	snapID := newID("snap-")
	if err := m.usage.reserveSnapshot(tenant, snapID); err != nil {
		return nil, err
	}
	fail := func(err error) (*Snapshot, error) {
		_ = snaps.Delete(context.WithoutCancel(ctx), snapID)
		m.usage.releaseSnapshot(tenant, snapID)
		return nil, err
	}
	if err := sess.Stop(ctx); err != nil {
		return fail(fmt.Errorf("snapshot sandbox %s: persist its workspace: %w", id, err))
	}
	info, err := m.copySnapshot(ctx, b.id, snapID)
	if err != nil {
		return fail(err)
	}
	m.mu.Lock()
	src := b.rec
	m.mu.Unlock()
	now := m.now()
	rec := &store.Sandbox{ID: snapID, Tenant: tenant, Created: now, Updated: now, Kind: store.KindSnapshot, Source: id,
		Spec: src.Spec, Provider: src.Provider, Labels: maps.Clone(labels), Size: info.Size, SessionState: src.SessionState}
	if err := m.cfg.Store.CreateSandbox(ctx, rec); err != nil {
		return fail(fmt.Errorf("record snapshot %s: %w", snapID, err))
	}
	m.mu.Lock()
	m.api.snaps[snapID] = rec
	m.mu.Unlock()
	sv := snapshotView(rec)
	return &sv, nil
}

// ListSnapshots returns a tenant's snapshots, newest first; with
// sandboxID, those taken of that sandbox only.
func (m *Manager) ListSnapshots(ctx context.Context, tenant, sandboxID string) ([]Snapshot, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if sandboxID != "" {
		if err := checkSandboxID("sandbox_id", sandboxID); err != nil {
			return nil, err
		}
	}
	var out []Snapshot
	m.mu.Lock()
	for _, r := range m.api.snaps {
		if r.Tenant == tenant && (sandboxID == "" || r.Source == sandboxID) {
			out = append(out, snapshotView(r))
		}
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(x, y Snapshot) int {
		return cmp.Or(y.Created.Compare(x.Created), strings.Compare(y.ID, x.ID))
	})
	return out, nil
}

// DeleteSnapshot deletes a tenant's snapshot: its stored archive, then its
// record. Sandboxes made from it keep their files.
func (m *Manager) DeleteSnapshot(ctx context.Context, tenant, id string) error {
	if err := m.enter(tenant); err != nil {
		return err
	}
	defer m.leave()
	if err := checkSnapshotID("snapshot_id", id); err != nil {
		return err
	}
	m.mu.Lock()
	rec := m.api.snaps[id]
	if rec == nil || rec.Tenant != tenant {
		m.mu.Unlock()
		return errNoSnapshot
	}
	delete(m.api.snaps, id) // claimed: a concurrent delete finds nothing
	m.mu.Unlock()
	putBack := func(err error) error {
		m.mu.Lock()
		m.api.snaps[id] = rec
		m.mu.Unlock()
		return err
	}
	ctx = context.WithoutCancel(ctx)
	if snaps := m.cfg.Compute.Snapshots(); snaps != nil {
		if err := snaps.Delete(ctx, id); err != nil {
			return putBack(fmt.Errorf("delete snapshot %s: %w", id, err))
		}
	}
	gone := *rec
	gone.Gone, gone.Updated = true, m.now()
	if err := m.cfg.Store.UpdateSandbox(ctx, &gone); err != nil {
		return putBack(fmt.Errorf("delete snapshot %s: %w", id, err))
	}
	m.usage.releaseSnapshot(tenant, id)
	return nil
}

// ForkSandbox makes count new API sandboxes of a tenant from its running
// API sandbox's current workspace, all or none: their sandbox slots are
// reserved first, and a failure deletes the ones made. Each has the
// source's manifest, labels, idle timeout and idle policy, and the
// policy's default ttl.
func (m *Manager) ForkSandbox(ctx context.Context, tenant, id string, count int) ([]Sandbox, error) {
	if err := m.enter(tenant); err != nil {
		return nil, err
	}
	defer m.leave()
	if err := checkSandboxID("sandbox_id", id); err != nil {
		return nil, err
	}
	if most := m.api.policy.MaxForks; count < 1 || count > most {
		return nil, badField("count", "%d; give 1 to %d", count, most)
	}
	b, err := m.apiBox(ctx, tenant, id, "forked")
	if err != nil {
		return nil, err
	}
	if _, err := m.snapshotStore(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	closing := m.closing
	m.mu.Unlock()
	if closing {
		return nil, errShuttingDown
	}
	ids := make([]string, count)
	for i := range ids {
		ids[i] = newID("sbx-")
	}
	if err := m.usage.reserveSandboxes(tenant, ids...); err != nil {
		return nil, err
	}
	var made []Sandbox
	fail := func(from int, err error) ([]Sandbox, error) {
		for _, left := range ids[from:] {
			m.usage.releaseSandbox(tenant, left)
		}
		for _, sb := range made {
			if fb := m.tenantBox(tenant, sb.ID); fb != nil {
				if derr := m.dropBox(fb, "its fork failed"); derr != nil {
					m.log.Warn("deleting a fork", zap.String("sandbox", sb.ID), zap.Error(derr))
				}
			}
		}
		return nil, err
	}
	bctx, cancel := m.bound(ctx)
	defer cancel()
	sess, done, err := m.open(bctx, tenant, id)
	if err != nil {
		return fail(0, err)
	}
	err = sess.Stop(bctx)
	done()
	if err != nil {
		return fail(0, fmt.Errorf("fork sandbox %s: persist its workspace: %w", id, err))
	}
	m.mu.Lock()
	src := b.rec
	m.mu.Unlock()
	manText, err := specManifest(src.Spec)
	if err != nil {
		return fail(0, err)
	}
	man, err := parseManifest(manText)
	if err != nil {
		return fail(0, err)
	}
	man = m.inheritAccount(man, src.SessionState)
	for i, nid := range ids {
		now := m.now()
		rec := &store.Sandbox{ID: nid, Tenant: tenant, Created: now, Updated: now, Spec: src.Spec, Labels: maps.Clone(src.Labels),
			Expires: now.Add(m.api.policy.DefaultTTL), IdleTimeout: src.IdleTimeout, OnIdle: src.OnIdle}
		sb, err := m.newBox(bctx, rec, man, id)
		if err != nil {
			// newBox gave this one's slot back.
			return fail(i+1, fmt.Errorf("fork sandbox %s: %w", id, err))
		}
		made = append(made, *sb)
	}
	return made, nil
}
