// Package process is the sandbox daemon's process engine: it starts
// model-directed processes (argv or shell command, pipes or PTY) as the
// run_as user with a clean environment, keeps their output in a bounded
// per-process log addressed by absolute byte offsets, and lets clients that
// come and go read, attach, write stdin, resize, signal and wait.
//
// The package is pure Go logic with no gRPC imports; the gRPC shim in
// agentd/server translates its errors (*compute.ProcessError wrapping
// compute sentinels) to status codes.
//
// # Guarantees
//
//   - Every process runs in its own process group (a new session with a
//     controlling terminal in PTY mode). Signals and kills go to the whole
//     group; a timeout or Shutdown also kills every group of a PTY session.
//   - The environment is built from Config.BaseEnv, the run_as user's
//     HOME/USER/LOGNAME/SHELL, the sandbox environment
//     (Manager.SetEnvironment) and the request's Env, in that order (later
//     wins), never from the daemon's own environment.
//   - Output is kept in a ring of Config.OutputBufferBytes per process. A
//     reader that fell behind is told how many bytes it lost (Dropped).
//   - Flow control: while a follower is attached (Attach, and Exec, which
//     attaches), the output pumps never overwrite output the slowest live
//     follower has not consumed: they stop reading, the pipe fills and the
//     process blocks in write, as on a slow terminal. A follower that holds
//     the output back for Config.FollowerStallTimeout without consuming
//     anything stops holding it back (it later sees Dropped) until it
//     consumes again, so a stuck or vanished client never freezes a process.
//     A process without a follower (nobody attached, or only Read polling)
//     is never blocked. Memory stays bounded either way. A held-back
//     process can still be signalled, killed or timed out; Shutdown stops
//     all holding back at once.
//   - A process outlives the context and the client that started it. Its
//     exit status and output stay readable for Config.ExitRetention after it
//     exited.
//
// # Reaping
//
// Children are started with syscall.ForkExec, never waited for by os/exec.
// A single Reaper collects exit statuses (when asked by the owner of a
// child's pidfd, on SIGCHLD once it is needed, or by polling) and hands
// them to the process that registered the pid. In ReapAll mode (the daemon as PID 1 or a
// child subreaper) it waits for any child and silently reaps orphans that
// were reparented to the daemon; in that mode no other code in the process
// may wait for its own children.
//
// # Output path
//
// One pump goroutine per output (stdout and stderr, or the PTY master)
// reads the non-blocking descriptor through the runtime poller straight into
// the ring's free space (see outputLog.landing): output is copied once, from
// the kernel into the ring. Attach hands its callback slices of the ring
// itself; the follower holds the pumps back at those bytes until the
// callback returns, and if it stalls meanwhile the ring moves to new
// storage before it is written again, leaving the old one to the follower.
// Read copies.
//
// # Exit and output draining
//
// A process is reported as exited once its group leader was reaped and its
// output reached end of file, or, when something else still holds the
// output open (a background job), DrainGrace after the leader was reaped
// (time during which a follower held the output back does not count).
// Output written after that is read and discarded so that background jobs
// are not killed by a broken pipe; the exit report is final.
//
// The leader's exit is noticed through its pidfd, polled by the runtime
// poller for the goroutine that then reports the exit (the exit watcher).
// The watcher reads the outputs' last bytes and end of file itself, so a
// process whose output closes when it exits is reported without waiting
// for the pumps to be scheduled; the pumps finish whatever it leaves. The
// Reaper relays SIGCHLD only once it is needed: for kernels without
// pidfds, and in ReapAll mode once an orphan was seen (see Reaper).
package process
