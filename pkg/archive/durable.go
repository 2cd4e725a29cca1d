package archive

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// syncWorkers is how many staged files and directories are fsynced at
// once. The extraction hands each descriptor over as it finishes with it
// and goes on; concurrent fsyncs share the filesystem's journal commits
// (ext4 and XFS commit the fsyncs waiting at a time together), so the
// staged tree is durable soon after its last member is written. Measured
// on ext4 over virtio (BenchmarkRestore, 10,000 files, 200 MB): see
// stageSyncer.
const syncWorkers = 16

// syncQueue bounds the descriptors handed over and not yet taken by a
// worker: with the workers' own, at most syncWorkers+syncQueue descriptors
// are open for the syncer at once.
const syncQueue = 64

// stageSyncer makes the staged tree durable before the journal records
// that the stage is complete (phase swap-out, after which a crash rolls
// the restore forward): every regular file is fsynced once written (its
// contents and metadata), every directory once its entries and metadata
// are final, the staging directory itself last. Without it a power loss
// (not a process crash: the kernel still holds the pages then) after the
// journal said swap-out could leave the restored tree with empty or
// truncated files, which the recovery would then move in.
//
// Each file is fsynced rather than the filesystem at once (syncfs(2)):
// syncfs also waits for every other dirty page on the filesystem, which in
// a sandbox's workspace is whatever its processes are writing, and before
// Linux 5.8 it did not report write-back errors.
//
// A stageSyncer is used by the extraction's goroutine only; its workers
// report the first failure, which the next add or wait returns.
type stageSyncer struct {
	jobs chan syncJob
	wg   sync.WaitGroup
	// hook, when set, is called before each fsync with the entry's
	// stage-relative path ("" for the stage itself); an error it returns
	// fails that fsync (RestoreOptions.hooks.sync).
	hook func(rel string) error
	// aborted makes the workers close the descriptors left without
	// syncing them: the restore failed and its stage is removed.
	aborted atomic.Bool
	failed  atomic.Bool
	mu      sync.Mutex
	err     error // the first failure, as a restore error
	stopped bool
}

// syncJob is a descriptor to fsync and close, and the path it was opened
// at.
type syncJob struct {
	fd  int
	rel string
}

func newStageSyncer(hook func(string) error) *stageSyncer {
	s := &stageSyncer{jobs: make(chan syncJob, syncQueue), hook: hook}
	s.wg.Add(syncWorkers)
	for range syncWorkers {
		go s.work()
	}
	return s
}

func (s *stageSyncer) work() {
	defer s.wg.Done()
	for j := range s.jobs {
		var err error
		if !s.aborted.Load() && !s.failed.Load() {
			if s.hook != nil {
				err = s.hook(j.rel)
			}
			if err == nil {
				err = ignoreEINTR(func() error { return unix.Fsync(j.fd) })
			}
		}
		if cerr := unix.Close(j.fd); err == nil {
			err = cerr
		}
		if err != nil {
			s.fail(pathErr(opRestore, shown(orDot(j.rel)), err))
		}
	}
}

// fail records err unless a failure is recorded already.
func (s *stageSyncer) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
		s.failed.Store(true)
	}
}

// firstErr is the first failure so far.
func (s *stageSyncer) firstErr() error {
	if !s.failed.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// add hands fd, open at the stage-relative path rel, over to be fsynced
// and closed; fd belongs to the syncer from then on, even when add fails.
// It returns the first failure of an earlier fsync.
func (s *stageSyncer) add(fd int, rel string) error {
	if err := s.firstErr(); err != nil {
		_ = unix.Close(fd)
		return err
	}
	s.jobs <- syncJob{fd: fd, rel: rel}
	return nil
}

// wait returns once every descriptor handed over is fsynced and closed,
// with the first failure. The syncer takes nothing more.
func (s *stageSyncer) wait() error {
	s.finish()
	return s.firstErr()
}

// stop abandons the fsyncs not yet begun (the restore failed) and waits
// for the workers; the descriptors are all closed when it returns. It is
// a no-op after wait.
func (s *stageSyncer) stop() {
	s.aborted.Store(true)
	s.finish()
}

func (s *stageSyncer) finish() {
	if !s.stopped {
		s.stopped = true
		close(s.jobs)
	}
	s.wg.Wait()
}
