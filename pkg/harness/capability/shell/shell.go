// Package shell is the Shell capability: the exec_command and write_stdin
// tools, run on the sandbox daemon's process engine.
//
// exec_command starts a shell command in the sandbox and waits up to a
// yield time for it to finish. A command still running then is not killed:
// it stays in the run's process table under a session ID, and write_stdin
// sends it input (a PTY process) or polls it for output. Output is read from
// a byte cursor kept per process against the daemon's offset-addressed
// output log, so nothing is lost between calls or across a reconnect.
//
// A call is at most two round trips to the daemon whatever the output:
// Start (exec_command) or WriteStdin (write_stdin with input), then one
// Attach stream that delivers output as it comes and ends with the exit or
// is cancelled at the yield time. While it is attached the daemon holds
// the process back rather than drop output the call has not received
// (bounded by the daemon's follower stall timeout); between calls nothing
// holds it back, and output the daemon had to drop is reported.
//
// The model-facing contract (tool and parameter names, defaults, the output
// header lines, yield clamps, the process table limit, token truncation)
// follows the OpenAI Agents SDK's sandbox Shell capability, which models are
// trained on.
package shell

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Limits and defaults of the reference contract.
const (
	// DefaultMaxProcesses is how many processes the table keeps.
	DefaultMaxProcesses = 64
	// DefaultExecYield is exec_command's yield_time_ms when the model gives none.
	DefaultExecYield = 10 * time.Second
	// DefaultWriteYield is write_stdin's yield_time_ms when the model gives none.
	DefaultWriteYield = 250 * time.Millisecond
	// MinYield and MaxYield clamp every yield time.
	MinYield = 250 * time.Millisecond
	MaxYield = 30 * time.Second
	// MinPollYield is the least a write_stdin without input (a poll) waits.
	MinPollYield = 5 * time.Second
	// DefaultMaxOutputBytes bounds the output one call keeps in memory.
	DefaultMaxOutputBytes = 1 << 20

	// warnProcesses is the table size from which each new process is logged.
	warnProcesses = 60
	// protectedRecent is how many most recently used processes pruning spares.
	protectedRecent = 8
	// Session IDs are drawn from [minSessionID, maxSessionID).
	minSessionID = 1000
	maxSessionID = 100000
	// settleAfterWrite lets a process react to input before the yield starts.
	settleAfterWrite = 100 * time.Millisecond
	// closeTimeout bounds Close's kills.
	closeTimeout = 30 * time.Second
)

// TokenEstimator returns how many model tokens n bytes of command output
// are estimated to cost. It must not decrease as n grows.
type TokenEstimator func(n int) int

// ApproxTokens is the default estimate: 4 bytes per token, rounded up.
func ApproxTokens(n int) int {
	if n <= 0 {
		return 0
	}
	return (n + 3) / 4
}

// Options configure the capability. The zero value gives the reference's
// behaviour.
type Options struct {
	// MaxProcesses is how many processes the run's table keeps (running
	// ones, and exited ones nobody has read the end of). When a new one
	// would exceed it, the least recently used process outside the 8 most
	// recent is dropped and killed, preferring one that has exited.
	// Default DefaultMaxProcesses.
	MaxProcesses int
	// ExecYield and WriteYield are the yield times used when the model gives
	// none (defaults DefaultExecYield, DefaultWriteYield); they are clamped
	// like the model's and shown as the schema defaults.
	ExecYield  time.Duration
	WriteYield time.Duration
	// EstimateTokens estimates output tokens for max_output_tokens and the
	// "Original token count" line. Default ApproxTokens.
	EstimateTokens TokenEstimator
	// MaxOutputBytes bounds the output one call keeps in memory; a call that
	// reads more keeps its head and tail and truncates the middle as if
	// max_output_tokens allowed this many bytes. Default DefaultMaxOutputBytes.
	MaxOutputBytes int
}

// withDefaults fills in the zero fields.
func (o Options) withDefaults() Options {
	if o.MaxProcesses <= 0 {
		o.MaxProcesses = DefaultMaxProcesses
	}
	if o.ExecYield <= 0 {
		o.ExecYield = DefaultExecYield
	}
	if o.WriteYield <= 0 {
		o.WriteYield = DefaultWriteYield
	}
	if o.EstimateTokens == nil {
		o.EstimateTokens = ApproxTokens
	}
	if o.MaxOutputBytes <= 0 {
		o.MaxOutputBytes = DefaultMaxOutputBytes
	}
	o.MaxOutputBytes = max(o.MaxOutputBytes, 64)
	return o
}

// Shell is the capability. Its zero value is not usable; call New.
type Shell struct {
	opts Options

	// Sources of the volatile parts of the output; tests replace them.
	chunkID   func() string
	sessionID func() int
	elapsed   func(start time.Time) time.Duration
	// pollMin is MinPollYield; tests shorten it.
	pollMin time.Duration

	mu     sync.Mutex
	procs  map[int]*proc
	seq    uint64 // use counter for least-recently-used order
	closed bool
}

// New returns the Shell capability configured by opts.
func New(opts Options) capability.Capability {
	return newShell(opts.withDefaults())
}

func newShell(opts Options) *Shell {
	return &Shell{
		opts:      opts,
		chunkID:   randomChunkID,
		sessionID: randomSessionID,
		elapsed:   time.Since,
		pollMin:   MinPollYield,
		procs:     make(map[int]*proc),
	}
}

// Name returns "shell".
func (s *Shell) Name() string { return "shell" }

// Clone returns a copy with the same options and an empty process table.
func (s *Shell) Clone() capability.Capability {
	c := newShell(s.opts)
	c.chunkID, c.sessionID, c.elapsed, c.pollMin = s.chunkID, s.sessionID, s.elapsed, s.pollMin
	return c
}

// Tools returns exec_command and write_stdin; none for a run without a
// sandbox.
func (s *Shell) Tools(env capability.Env) []tool.Tool {
	if !env.HasSession {
		return nil
	}
	return []tool.Tool{execTool{s}, writeTool{s}}
}

// Instructions returns the shell's instruction fragment.
func (s *Shell) Instructions(capability.Env) string { return instructions }

// instructions tells the model how to use the tools (the reference's
// points, in our words).
const instructions = "When using the shell:\n" +
	"- Run shell commands with `exec_command`.\n" +
	"- Use `write_stdin`, when available, to send input to a session that is still running or to poll it for more output.\n" +
	"- To be able to interrupt a long-running command, start it with `tty=true`; then send Ctrl-C (`\\u0003`) with `write_stdin`.\n" +
	"- To search text or list files, prefer `rg` and `rg --files` where they are installed.\n" +
	"- Do not write Python scripts only to print large parts of files."

// ProcessManifest returns m unchanged: the shell needs nothing in it.
func (s *Shell) ProcessManifest(m *manifest.Manifest) (*manifest.Manifest, error) { return m, nil }

// Close kills the processes still in the table (the run is over) and empties
// it. Processes that already exited are skipped.
func (s *Shell) Close() error {
	s.mu.Lock()
	s.closed = true
	type victim struct {
		p   *proc
		pid string
	}
	procs := make([]victim, 0, len(s.procs))
	for id, p := range s.procs {
		p.gone = true
		procs = append(procs, victim{p, p.pid})
		delete(s.procs, id)
	}
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	var errs []error
	for _, v := range procs {
		if err := killProcess(ctx, v.p.agent, v.pid); err != nil {
			errs = append(errs, fmt.Errorf("shell: kill session %d: %w", v.p.id, err))
		}
	}
	return errors.Join(errs...)
}

// killProcess sends KILL to the process group; a process that is gone already is
// not an error.
func killProcess(ctx context.Context, agent *agentclient.Client, pid string) error {
	if pid == "" || agent == nil {
		return nil
	}
	err := agent.Signal(ctx, pid, "KILL")
	if err == nil || errors.Is(err, errkind.ErrFailedPrecondition) || errors.Is(err, errkind.ErrNotFound) {
		return nil
	}
	return err
}

// randomChunkID returns 6 random hex digits.
func randomChunkID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// randomSessionID returns a random ID in [minSessionID, maxSessionID).
func randomSessionID() int {
	n, err := rand.Int(rand.Reader, big.NewInt(maxSessionID-minSessionID))
	if err != nil {
		return minSessionID
	}
	return minSessionID + int(n.Int64())
}

// logger returns call's logger, or a no-op one.
func logger(call tool.Context) *zap.Logger {
	if call.Log == nil {
		return zap.NewNop()
	}
	return call.Log
}
