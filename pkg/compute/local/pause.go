package local

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// Pausing a gVisor sandbox with its memory and processes (compute.Pauser):
//
//  1. Checks, before anything is touched: gVisor isolation, a root harness
//     (runsc restores only as root), the sandbox running, the runsc that
//     runs it the same as this provider's, its daemon able to prepare
//     (feature system.prepare_checkpoint), its caps recorded, room on the
//     disk for its memory.
//  2. The session persists the workspace (PauseSpec.Persist: its snapshot),
//     so that a failed checkpoint never loses the files.
//  3. The daemon is told to prepare (PrepareCheckpoint): it closes its
//     listener, its connections and its egress relay's connections, which
//     are host sockets gVisor cannot save, and removes its socket last;
//     the harness waits for the socket to go.
//  4. `runsc checkpoint` writes the image into gvisor/checkpoint.tmp, and
//     only when it succeeded is that renamed to gvisor/checkpoint: both in
//     one shell of its own session, so that a harness killed meanwhile
//     leaves either a sandbox still running (its daemon listens again by
//     itself when its lease runs out, or at once when a later harness
//     reattaches: SIGUSR1) or a complete checkpoint. runsc stops the
//     sandbox: its memory and CPU are released, and its (empty) cgroups
//     removed; the caps are recorded to be made again on restore.
//  5. A failed checkpoint: the daemon is told to come back (SIGUSR1) and
//     the client reconnects when the sandbox still runs; otherwise the
//     session resumes from its workspace (files on the host, the snapshot).
//
// Resume (Reattach) of a paused sandbox restores it: the checkpoint's
// record must name this provider's runsc (version, module version and
// sum) and the bundle's config.json digest (FailedPrecondition naming
// both otherwise); `runsc restore` of the bundle, in the sandbox's caps
// (cgroups made again), as the launched `runsc run` was, with the same
// runsc flags; then SIGUSR1 (`runsc kill`), and the client reconnects with
// the same token. A failed restore leaves the checkpoint as it was, and
// compute.DiscardMemory (`harness sandbox resume --discard-memory`)
// rebuilds the sandbox from its workspace instead. The checkpoint lives in
// the sandbox's private directory; content-addressed storage in the
// snapshot store, moving it to another machine, is for later.

// Files of a checkpoint, in the sandbox's gvisor directory.
const (
	checkpointDir     = "checkpoint"     // a complete checkpoint: the image and its record
	checkpointTmp     = "checkpoint.tmp" // one being written
	checkpointLog     = "checkpoint.log" // runsc's output
	checkpointRecord  = "bulkhead.json"  // in the image directory
	checkpointPausing = "pausing"        // a pause is under way (its daemon may be closed)
	checkpointImage   = "checkpoint.img" // runsc's state file
	checkpointVersion = 1                // of checkpointMeta
	checkpointLease   = 30 * time.Second // the daemon's PrepareCheckpoint lease
	checkpointTimeout = 10 * time.Minute // bounds runsc checkpoint
	socketGoneTimeout = 5 * time.Second  // for the daemon to close
	checkpointFeature = "system.prepare_checkpoint"
)

// checkpointMeta is a checkpoint's record: what a restore needs and
// checks.
type checkpointMeta struct {
	Version   int       `json:"version"`
	SessionID string    `json:"session_id"`
	CreatedAt time.Time `json:"created_at"`
	// Runsc is the identity of the runsc that ran the sandbox (runscIdentity).
	Runsc string `json:"runsc"`
	// RunscFlags are the global flags it ran with (--root, --network, ...).
	RunscFlags []string `json:"runsc_flags"`
	// Bundle is the SHA-256 of the bundle's config.json.
	Bundle string `json:"bundle_sha256"`
	// Caps are the sandbox's caps, made again on restore.
	Caps Resources `json:"caps"`
}

func checkpointPaths(dir string) (final, tmp string) {
	g := filepath.Join(dir, gvisorDir)
	return filepath.Join(g, checkpointDir), filepath.Join(g, checkpointTmp)
}

// pausedAt reports whether dir holds a complete checkpoint.
func pausedAt(dir string) bool {
	final, _ := checkpointPaths(dir)
	_, err := os.Stat(filepath.Join(final, checkpointRecord))
	return err == nil
}

var (
	_ compute.Pauser          = (*Provider)(nil)
	_ compute.RestoredSandbox = (*sandbox)(nil)
)

// Pause pauses a gVisor sandbox with its memory and processes (see the
// comment at the top of this file).
func (p *Provider) Pause(ctx context.Context, csb compute.Sandbox, spec compute.PauseSpec) (*compute.PauseInfo, error) {
	s, ok := csb.(*sandbox)
	if !ok || s.p != p {
		return nil, fmt.Errorf("%w: local provider: pause a sandbox of another provider (%T)", compute.ErrInvalidArgument, csb)
	}
	if p.runsc == "" {
		return nil, fmt.Errorf("%w: local sandboxes under %s isolation cannot be paused with their memory and processes: only gVisor (--isolation gvisor) "+
			"checkpoints a sandbox (bubblewrap or plain processes would need CRIU)", compute.ErrUnimplemented, p.isolation)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: a gVisor sandbox of a non-root harness runs rootless, and runsc restores only as root: it cannot be paused", compute.ErrUnimplemented)
	}
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	dir := s.dir
	ck, err := p.checkPause(ctx, s, spec.SessionID)
	if err != nil {
		return nil, err
	}
	info := &compute.PauseInfo{}
	start := time.Now()
	if spec.Persist != nil {
		if err := spec.Persist(ctx); err != nil {
			return nil, fmt.Errorf("persist the workspace before the checkpoint (the sandbox runs on): %w", err)
		}
	}
	info.Persisted = time.Since(start)
	final, tmp := checkpointPaths(dir)
	for _, d := range []string{final, tmp} {
		if err := os.RemoveAll(d); err != nil {
			return nil, fmt.Errorf("pause: remove an old checkpoint: %w", err)
		}
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	rec, _ := json.MarshalIndent(ck, "", "  ")
	if err := writeFileAtomic(filepath.Join(tmp, checkpointRecord), rec, 0o600); err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	pausing := filepath.Join(dir, gvisorDir, checkpointPausing)
	if err := writeFileAtomic(pausing, nil, 0o600); err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	downAt := time.Now()
	if err := s.agent().PrepareCheckpoint(ctx, agentclient.PrepareCheckpointOptions{ResumeAfter: checkpointLease}); err != nil {
		_ = os.Remove(pausing)
		_ = os.RemoveAll(tmp)
		if !errors.Is(err, compute.ErrUnavailable) {
			return nil, fmt.Errorf("pause: the daemon could not prepare (the sandbox runs on): %w", err)
		}
		// No answer: it may have prepared. Bring it back to be sure.
		return nil, errors.Join(fmt.Errorf("pause: the daemon did not answer PrepareCheckpoint: %w", err), p.comeBack(ctx, s, ck.RunscFlags))
	}
	// Hang up: the daemon closes once the caller is gone.
	_ = s.agent().Close()
	socket := filepath.Join(dir, runDir, socketName)
	if err := waitGone(ctx, socket, socketGoneTimeout); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, errors.Join(fmt.Errorf("pause: the daemon did not close for the checkpoint: %w", err), p.comeBack(ctx, s, ck.RunscFlags))
	}
	if left := checkpointLease - time.Since(downAt); left < checkpointLease/2 {
		_ = os.RemoveAll(tmp)
		return nil, errors.Join(fmt.Errorf("%w: pause: preparing took %s, too close to the daemon's lease", compute.ErrDeadlineExceeded, time.Since(downAt)),
			p.comeBack(ctx, s, ck.RunscFlags))
	}
	ckStart := time.Now()
	out, cerr := p.runCheckpoint(dir, ck.RunscFlags, tmp, final)
	info.Checkpointed = time.Since(ckStart)
	if cerr != nil {
		_ = os.RemoveAll(tmp)
		if _, alive := p.running(dir); alive {
			err := fmt.Errorf("%w: pause: runsc checkpoint failed (the sandbox runs on): %v%s", compute.ErrInternal, cerr, describeOutput(out))
			return nil, errors.Join(err, p.comeBack(ctx, s, ck.RunscFlags))
		}
		_ = os.Remove(pausing)
		return nil, fmt.Errorf("%w: pause: runsc checkpoint failed and ended the sandbox (its workspace was persisted first: resuming the session rebuilds it from there): %v%s",
			compute.ErrInternal, cerr, describeOutput(out))
	}
	// The sandbox stopped with the checkpoint: release what it held.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cgroupKillTimeout)
	defer cancel()
	var errs []error
	if err := waitNoDaemons(cctx, dir, sandboxMarkers(dir)); err != nil {
		errs = append(errs, err)
	}
	if s.child != nil {
		select {
		case <-s.child.Exited():
		case <-cctx.Done():
		}
	}
	p.runscQuiet(cctx, ck.RunscFlags, "delete", "-force", gvisorContainerID(dir))
	unmountNullNetNS(gvisorPathsOf(dir).root)
	errs = append(errs, p.removeCgroup(cctx, dir))
	p.stopEgress(dir)
	if m, err := readMeta(dir); err == nil {
		m.PID = 0
		data, _ := json.Marshal(m)
		errs = append(errs, writeFileAtomic(filepath.Join(dir, metaFile), data, 0o600))
	}
	_ = os.Remove(pausing)
	info.Checkpoint, info.Bytes = final, treeSize(final)
	if err := errors.Join(errs...); err != nil {
		p.log.Warn("paused; releasing the sandbox's resources", zap.String("dir", dir), zap.Error(err))
	}
	p.log.Info("sandbox paused", zap.String("dir", dir), zap.Int64("bytes", info.Bytes), zap.Duration("checkpoint", info.Checkpointed),
		zap.Duration("down_before_checkpoint", ckStart.Sub(downAt)))
	return info, nil
}

// checkPause checks everything a pause of s needs before anything is
// touched, and returns the checkpoint's record.
func (p *Provider) checkPause(ctx context.Context, s *sandbox, sessionID string) (*checkpointMeta, error) {
	dir := s.dir
	pid, alive := p.running(dir)
	if !alive {
		return nil, fmt.Errorf("%w: pause: the sandbox in %s is not running", compute.ErrFailedPrecondition, filepath.Base(dir))
	}
	m, err := readMeta(dir)
	if err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	if m.Caps == nil {
		return nil, fmt.Errorf("%w: pause: the sandbox was launched by a harness that did not record its caps, which a restore must make again; recreate it to pause it", compute.ErrFailedPrecondition)
	}
	flags, err := runningRunscFlags(pid)
	if err != nil {
		return nil, fmt.Errorf("%w: pause: %v", compute.ErrFailedPrecondition, err)
	}
	ident, err := p.runscIdentity(p.runsc)
	if err != nil {
		return nil, fmt.Errorf("%w: pause: %v", compute.ErrFailedPrecondition, err)
	}
	exe := fmt.Sprintf("/proc/%d/exe", pid)
	if !sameFile(exe, p.runsc) {
		running, err := p.runscIdentity(exe)
		if err != nil {
			return nil, fmt.Errorf("%w: pause: %v", compute.ErrFailedPrecondition, err)
		}
		if running != ident {
			return nil, fmt.Errorf("%w: pause: the sandbox runs under runsc %q, this harness has runsc %q (%s): its checkpoint could not be restored here",
				compute.ErrFailedPrecondition, running, ident, p.runsc)
		}
	}
	bundle, err := bundleDigest(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: pause: %v", compute.ErrFailedPrecondition, err)
	}
	if err := restorableBundle(dir); err != nil {
		return nil, fmt.Errorf("%w: pause: %v", compute.ErrFailedPrecondition, err)
	}
	di, err := s.agent().Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("pause: the daemon does not answer: %w", err)
	}
	if !containsString(di.Features, checkpointFeature) {
		return nil, fmt.Errorf("%w: pause: the sandbox's daemon (sandbox-agentd %s) predates PrepareCheckpoint: it cannot close its host sockets for a checkpoint",
			compute.ErrFailedPrecondition, di.Version)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(dir, gvisorDir), &st); err == nil {
		free := int64(st.Bavail) * st.Bsize
		if need := sandboxRSS(sandboxMarkers(dir)); need > free {
			return nil, fmt.Errorf("%w: pause: the sandbox holds %d bytes of memory and %s has %d bytes free for its checkpoint",
				compute.ErrResourceExhausted, need, filepath.Join(dir, gvisorDir), free)
		}
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		return nil, fmt.Errorf("%w: pause: the checkpoint runs under /bin/sh: %v", compute.ErrFailedPrecondition, err)
	}
	return &checkpointMeta{Version: checkpointVersion, SessionID: sessionID, CreatedAt: time.Now().UTC(), Runsc: ident,
		RunscFlags: flags, Bundle: bundle, Caps: *m.Caps}, nil
}

// runCheckpoint runs `runsc checkpoint` into tmp and renames tmp to final
// when it succeeded, in a shell of its own session that outlives this
// process, so that a harness killed meanwhile leaves a complete checkpoint
// or none. It returns runsc's output.
func (p *Provider) runCheckpoint(dir string, flags []string, tmp, final string) ([]byte, error) {
	logPath := filepath.Join(dir, gvisorDir, checkpointLog)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("checkpoint log: %w", err)
	}
	argv := append([]string{"/bin/sh", "-c", `"$0" "$@" && exec mv -- "$BULKHEAD_CHECKPOINT_TMP" "$BULKHEAD_CHECKPOINT_DIR"`, p.runsc}, flags...)
	argv = append(argv, "checkpoint", "--image-path", tmp, gvisorContainerID(dir))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "BULKHEAD_CHECKPOINT_TMP=" + tmp, "BULKHEAD_CHECKPOINT_DIR=" + final}
	// A file, not a pipe: the checkpoint must not die of SIGPIPE when
	// this process does.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return nil, fmt.Errorf("start runsc checkpoint: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(checkpointTimeout)
	defer timer.Stop()
	select {
	case err = <-done:
	case <-timer.C:
		err = fmt.Errorf("runsc checkpoint did not finish in %s", checkpointTimeout)
	}
	out, _ := os.ReadFile(logPath)
	if err == nil && !pausedAt(dir) {
		err = errors.New("runsc checkpoint succeeded but left no checkpoint")
	}
	if err == nil {
		_ = os.Remove(logPath)
	}
	return out, err
}

// comeBack brings the daemon of s back after a pause that did not happen
// (SIGUSR1: it listens again) and reconnects s's client.
func (p *Provider) comeBack(ctx context.Context, s *sandbox, flags []string) error {
	ctx = context.WithoutCancel(ctx)
	_ = os.Remove(filepath.Join(s.dir, gvisorDir, checkpointPausing))
	if out, err := p.runsc1(ctx, flags, "kill", gvisorContainerID(s.dir), "USR1"); err != nil {
		return fmt.Errorf("bring the daemon back (runsc kill USR1): %w%s", err, describeOutput(out))
	}
	return s.reconnect(ctx)
}

// restore brings a paused sandbox in dir back from its checkpoint.
func (p *Provider) restore(ctx context.Context, dir string) (*sandbox, error) {
	begun := time.Now()
	final, _ := checkpointPaths(dir)
	keep := fmt.Sprintf("the checkpoint in %s is kept; resuming with compute.DiscardMemory (`harness sandbox resume --discard-memory`) rebuilds the sandbox from its workspace instead", final)
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: restore the paused sandbox: %s; %s", compute.ErrFailedPrecondition, fmt.Sprintf(format, args...), keep)
	}
	if p.runsc == "" {
		return nil, refuse("it was paused under gVisor and this provider's isolation is %s", p.isolation)
	}
	if os.Geteuid() != 0 {
		return nil, refuse("runsc restores only as root")
	}
	var ck checkpointMeta
	data, err := os.ReadFile(filepath.Join(final, checkpointRecord))
	if err == nil {
		err = json.Unmarshal(data, &ck)
	}
	if err != nil || ck.Version != checkpointVersion || len(ck.RunscFlags) == 0 {
		return nil, refuse("its record is unreadable (%v, version %d)", err, ck.Version)
	}
	if fi, err := os.Stat(filepath.Join(final, checkpointImage)); err != nil || fi.Size() == 0 {
		return nil, refuse("its image %s is missing or empty", filepath.Join(final, checkpointImage))
	}
	ident, err := p.runscIdentity(p.runsc)
	if err != nil {
		return nil, refuse("%v", err)
	}
	if ident != ck.Runsc {
		return nil, refuse("it was made by runsc %q and this harness has runsc %q (%s)", ck.Runsc, ident, p.runsc)
	}
	if bundle, err := bundleDigest(dir); err != nil || bundle != ck.Bundle {
		return nil, refuse("its bundle's config.json has changed (sha256 %s, checkpointed with %s; %v)", bundle, ck.Bundle, err)
	}
	token, err := os.ReadFile(filepath.Join(dir, tokenFile))
	if err != nil {
		return nil, refuse("sandbox token: %v", err)
	}
	g := gvisorPathsOf(dir)
	cid := gvisorContainerID(dir)
	// What the checkpoint's runsc left of the container.
	p.runscQuiet(ctx, ck.RunscFlags, "delete", "-force", cid)
	unmountNullNetNS(g.root)
	if err := os.RemoveAll(g.root); err != nil {
		return nil, fmt.Errorf("restore: drop stale runsc state: %w", err)
	}
	if err := os.MkdirAll(g.root, 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := p.removeCgroup(ctx, dir); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	// The proxy serves before the daemon's relay connects again.
	if err := p.resumeEgress(dir); err != nil {
		p.log.Warn("the sandbox's egress proxy could not be served; its network requests will fail", zap.String("dir", dir), zap.Error(err))
	}
	cgs, note, err := makeSandboxCgroups(dir, p.hostResources(ck.Caps))
	if err != nil {
		return nil, refuse("its caps: %v", err)
	}
	if note != nil {
		p.withoutCgroup(note)
	}
	argv := append(append([]string{p.runsc}, ck.RunscFlags...), "restore", "--bundle", g.bundle, "--image-path", final, cid)
	run, ws := filepath.Join(dir, runDir), filepath.Join(dir, "workspace")
	opts := Options{AgentdPath: p.cfg.AgentdPath, Dir: run, Workspace: ws, Token: string(token), Stderr: p.cfg.Stderr, ReadyTimeout: p.cfg.ReadyTimeout,
		Wrap:   func([]string) []string { return argv },
		Cgroup: cgs.v2, CgroupRequired: cgs.v2Caps, CgroupV1: cgs.v1}
	started := time.Now()
	var signalled time.Time
	opts.Restored = func(ctx context.Context, exited <-chan struct{}) error {
		err := p.signalRestored(ctx, dir, ck.RunscFlags, cid, exited)
		signalled = time.Now()
		return err
	}
	sb, err := Start(ctx, opts, p.log)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cgroupKillTimeout)
		defer cancel()
		_ = waitNoDaemons(cctx, dir, sandboxMarkers(dir))
		p.runscQuiet(cctx, ck.RunscFlags, "delete", "-force", cid)
		unmountNullNetNS(g.root)
		_ = p.removeCgroup(cctx, dir)
		p.stopEgress(dir)
		return nil, fmt.Errorf("%w: restore the paused sandbox: %v; %s", compute.ErrFailedPrecondition, err, keep)
	}
	if opts.Cgroup != "" && sb.Cgroup == "" {
		p.withoutCgroup(sb.CgroupErr())
		_ = p.removeCgroupV2(ctx, dir)
	}
	m, err := readMeta(dir)
	if err != nil {
		m = meta{SessionID: ck.SessionID}
	}
	m.PID = sb.PID()
	data, _ = json.Marshal(m)
	if err := writeFileAtomic(filepath.Join(dir, metaFile), data, 0o600); err != nil {
		_ = sb.Close(ctx)
		return nil, err
	}
	// Restored: the image is stale from now on.
	p.dropCheckpoint(dir)
	p.log.Info("sandbox restored", zap.String("dir", dir), zap.Duration("prepare", started.Sub(begun)),
		zap.Duration("restore", signalled.Sub(started)), zap.Duration("ready", time.Since(signalled)))
	s := &sandbox{p: p, dir: dir, client: sb.Client, child: sb, kept: true, restored: true}
	_ = s.Touch(ctx)
	return s, nil
}

// signalRestored waits until `runsc restore` has brought the container
// back (runsc kill succeeds only on a running container) and tells its
// daemon to listen again (SIGUSR1).
//
// runsc's state file says when the container runs (read every few
// milliseconds: a runsc process per try would compete with the restore
// for the CPUs); runsc kill is tried when it says so, and every 250 ms
// whatever it says (a runsc whose state file reads otherwise).
func (p *Provider) signalRestored(ctx context.Context, dir string, flags []string, cid string, exited <-chan struct{}) error {
	deadline := time.Now().Add(p.cfg.ReadyTimeout)
	states := filepath.Join(gvisorPathsOf(dir).root, cid+"_sandbox:*.state")
	var lastTry time.Time
	for {
		if running(states) || time.Since(lastTry) > 250*time.Millisecond {
			lastTry = time.Now()
			out, err := p.runsc1(ctx, flags, "kill", cid, "USR1")
			if err == nil {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: the restored container did not run within %s: %v%s", compute.ErrUnavailable, p.cfg.ReadyTimeout, err, describeOutput(out))
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("%w: runsc restore exited", compute.ErrUnavailable)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(3 * time.Millisecond):
		}
	}
}

// running reports whether a runsc state file matching pattern says its
// container runs.
func running(pattern string) bool {
	files, _ := filepath.Glob(pattern)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var st struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(data, &st) == nil && st.Status == "running" {
			return true
		}
	}
	return false
}

// dropCheckpoint removes dir's checkpoint and pause records.
func (p *Provider) dropCheckpoint(dir string) {
	final, tmp := checkpointPaths(dir)
	for _, d := range []string{final, tmp, filepath.Join(dir, gvisorDir, checkpointPausing), filepath.Join(dir, gvisorDir, checkpointLog)} {
		if err := os.RemoveAll(d); err != nil {
			p.log.Warn("cannot remove a stale checkpoint", zap.String("path", d), zap.Error(err))
		}
	}
}

// awaitCheckpoint waits while a checkpoint of dir is being written (by
// this harness or one that died meanwhile), so that nothing acts on a
// sandbox that is half saved.
func awaitCheckpoint(ctx context.Context, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, gvisorDir, checkpointPausing)); err != nil {
		return nil // no pause under way: no checkpoint either
	}
	markers := sandboxMarkers(dir)
	deadline := time.Now().Add(checkpointTimeout)
	for {
		busy := false
		for _, pr := range sandboxProcesses(markers) {
			if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pr.pid)); err == nil && bytes.Contains(cmdline, []byte("\x00checkpoint\x00")) {
				busy = true
			}
		}
		if !busy {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: a checkpoint of the sandbox in %s is being written", compute.ErrUnavailable, filepath.Base(dir))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// nudge tells the daemon of the running gVisor sandbox in dir (whose
// runsc process is pid) to listen again, in case a pause left it closed.
func (p *Provider) nudge(ctx context.Context, dir string, pid int) {
	flags, err := runningRunscFlags(pid)
	if err != nil {
		p.log.Warn("cannot bring back a sandbox a pause left closed", zap.String("dir", dir), zap.Error(err))
		return
	}
	if out, err := p.runsc1(ctx, flags, "kill", gvisorContainerID(dir), "USR1"); err != nil {
		p.log.Warn("cannot bring back a sandbox a pause left closed", zap.String("dir", dir), zap.Error(err), zap.ByteString("output", out))
	}
}

// containerRunning asks runsc whether the container of the sandbox in
// dir (whose runsc process is pid) runs.
func (p *Provider) containerRunning(ctx context.Context, dir string, pid int) bool {
	flags, err := runningRunscFlags(pid)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.runsc, append(append([]string{}, flags...), "state", gvisorContainerID(dir))...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		return false
	}
	var st struct {
		Status string `json:"status"`
	}
	return json.Unmarshal(out, &st) == nil && st.Status == "running"
}

// hostResources are the host caps of a sandbox with caps r: under gVisor,
// room for runsc's own processes and threads besides the sandbox's
// (capped inside: see caps.go).
func (p *Provider) hostResources(r Resources) Resources {
	if p.runsc != "" && r.MaxProcesses > 0 {
		r.MaxProcesses = gvisorHostProcesses(r.MaxProcesses)
	}
	return r
}

// runsc1 runs one runsc command with flags and returns its output.
func (p *Provider) runsc1(ctx context.Context, flags []string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.runsc, append(append([]string{}, flags...), args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	return cmd.CombinedOutput()
}

// runscQuiet runs a runsc command whose failure does not matter.
func (p *Provider) runscQuiet(ctx context.Context, flags []string, args ...string) {
	if out, err := p.runsc1(ctx, flags, args...); err != nil {
		p.log.Debug("runsc", zap.Strings("args", args), zap.Error(err), zap.ByteString("output", out))
	}
}

// runningRunscFlags returns the global flags of the runsc process pid
// (`runsc FLAGS run|restore --bundle ...`, as this provider starts it).
func runningRunscFlags(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, fmt.Errorf("the sandbox's runsc process: %w", err)
	}
	args := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
	for i := 1; i+1 < len(args); i++ {
		if (args[i] == "run" || args[i] == "restore") && args[i+1] == "--bundle" {
			return args[1:i], nil
		}
	}
	return nil, fmt.Errorf("the sandbox's runsc process (pid %d) is not `runsc ... run|restore --bundle`: %q", pid, args)
}

// runscIdentities caches runscIdentity by file (path, size, time).
var runscIdentities sync.Map

// runscIdentity names the runsc binary at path as precisely as it says:
// its version line, the module version and sum it was built from (a `go
// install` build says VERSION_MISSING in its version line) and, when
// neither names a version, its SHA-256.
func (p *Provider) runscIdentity(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("runsc: %w", err)
	}
	key := fmt.Sprintf("%s\x00%d\x00%d", path, fi.Size(), fi.ModTime().UnixNano())
	if v, ok := runscIdentities.Load(key); ok {
		return v.(string), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("runsc --version: %w", err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	ident := strings.TrimSpace(line)
	known := !strings.Contains(ident, "VERSION_MISSING")
	if bi, err := buildinfo.ReadFile(path); err == nil && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		ident += fmt.Sprintf("; %s@%s %s", bi.Main.Path, bi.Main.Version, bi.Main.Sum)
		known = true
	}
	if !known {
		data, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("runsc: %w", err)
		}
		sum := sha256.Sum256(data)
		ident += "; sha256 " + hex.EncodeToString(sum[:])
	}
	runscIdentities.Store(key, ident)
	return ident, nil
}

// bundleDigest is the SHA-256 of the sandbox's OCI config.json.
func bundleDigest(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(gvisorPathsOf(dir).bundle, "config.json"))
	if err != nil {
		return "", fmt.Errorf("the sandbox's OCI bundle: %w", err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// restorableBundle checks that runsc can restore the sandbox's bundle:
// its restore compares mounts by destination and refuses two that differ
// at one (bundles written before dropShadowedMounts have such).
func restorableBundle(dir string) error {
	data, err := os.ReadFile(filepath.Join(gvisorPathsOf(dir).bundle, "config.json"))
	if err != nil {
		return fmt.Errorf("the sandbox's OCI bundle: %w", err)
	}
	var spec ociSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("the sandbox's OCI bundle: %w", err)
	}
	seen := map[string]bool{}
	for _, m := range spec.Mounts {
		if seen[m.Destination] {
			return fmt.Errorf("the sandbox's OCI bundle mounts %s twice, which runsc cannot restore (a sandbox made by an older harness): recreate it to pause it", m.Destination)
		}
		seen[m.Destination] = true
	}
	return nil
}

// sameFile reports whether a and b are the same file.
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// sandboxRSS is the resident memory of the processes carrying markers.
func sandboxRSS(markers [][]byte) int64 {
	var total int64
	for _, pr := range sandboxProcesses(markers) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pr.pid))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64); err == nil {
					total += kb << 10
				}
			}
		}
	}
	return total
}

// treeSize is the size of the regular files below dir.
func treeSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// waitGone waits until path does not exist, at most max.
func waitGone(ctx context.Context, path string, max time.Duration) error {
	deadline := time.Now().Add(max)
	for {
		if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s still exists after %s", compute.ErrDeadlineExceeded, path, max)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// describeOutput quotes a command's output for an error, briefly.
func describeOutput(out []byte) string {
	s := strings.TrimSpace(string(out))
	if s == "" {
		return ""
	}
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return ": " + s
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
