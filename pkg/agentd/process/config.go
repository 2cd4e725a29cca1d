package process

import (
	"fmt"
	"maps"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/activity"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Defaults applied by NewManager to zero Config fields.
const (
	DefaultMaxProcesses      = 64
	DefaultMaxExited         = 64
	DefaultOutputBufferBytes = 4 << 20
	DefaultExitRetention     = 10 * time.Minute
	DefaultDrainGrace        = 500 * time.Millisecond
	// DefaultFollowerStallTimeout is Config.FollowerStallTimeout's default.
	DefaultFollowerStallTimeout = 2 * time.Second
	DefaultShell                = "/bin/sh"
	// DefaultPath is the PATH of BaseEnv when the caller gives none.
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// DefaultReadBytes bounds a Read whose maxBytes is not positive.
	DefaultReadBytes = 1 << 20
)

// Config configures a Manager. Zero fields take the defaults above.
type Config struct {
	// MaxProcesses bounds the processes running at once (started and not
	// yet reported exited); Start beyond it is errkind.ErrResourceExhausted.
	MaxProcesses int
	// MaxExited bounds the exited processes kept for their status and
	// output; beyond it the oldest exited ones are forgotten early.
	MaxExited int
	// OutputBufferBytes is the output kept per process: the newest this
	// many bytes. The ring grows on demand up to this size plus one pipe
	// read (at most 256 KiB, where the next read lands) and shrinks to its
	// content at exit.
	OutputBufferBytes int
	// ExitRetention is how long an exited process (status and output) is
	// kept after its exit, whether or not anyone read it. Reads do not
	// shorten it, so a retried Wait or Read still finds the process.
	ExitRetention time.Duration
	// DrainGrace is how long after the group leader was reaped the exit
	// report waits for the output to reach end of file (a background job
	// may hold it open forever). Time during which an attached follower
	// holds the output back (see FollowerStallTimeout) does not count.
	DrainGrace time.Duration
	// FollowerStallTimeout bounds flow control. While a follower is
	// attached (Attach, and so Exec), a process's output is not read
	// faster than the slowest live follower consumes it: the ring never
	// overwrites output such a follower has not consumed, and the process
	// blocks writing to its full pipe. A follower that holds the output
	// back this long without consuming anything stops holding it back
	// (it later sees Dropped) until it consumes output again, so a stuck
	// or vanished client cannot freeze a process. Processes without a
	// follower never wait.
	FollowerStallTimeout time.Duration
	// DefaultShell runs StartOptions.Command when no Shell is given.
	DefaultShell string
	// BaseEnv is the environment every process starts from. Nil means
	// PATH=DefaultPath and LANG=C.UTF-8; a non-nil map replaces those.
	// HOME, USER, LOGNAME and SHELL come from the run_as user, then the
	// sandbox environment (Manager.SetEnvironment, the manifest's) and
	// last the request's Env, which overrides everything.
	BaseEnv map[string]string
	// DefaultUser is the run_as user when a request names none; "" means
	// the daemon's own identity.
	DefaultUser string
	// Users resolves run_as users; nil reads the real /etc.
	Users *userdb.DB
	// Reaper collects child exit statuses. Nil makes the Manager create and
	// own a Reaper that waits only for its own children (safe next to other
	// code that uses os/exec). The daemon passes a shared ReapAll reaper,
	// which must outlive every Manager using it (close it after Shutdown).
	Reaper *Reaper
	// Activity, when set, is touched when a process starts, when output
	// of a process is read (whichever process of its group or tree wrote
	// it) and when a process's exit is reported (see package activity).
	Activity *activity.Clock
}

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	switch {
	case c.MaxProcesses < 0, c.MaxExited < 0, c.OutputBufferBytes < 0,
		c.ExitRetention < 0, c.DrainGrace < 0, c.FollowerStallTimeout < 0:
		return c, errkind.Errorf(errkind.ErrInvalidArgument, "process config: negative limit")
	}
	if c.MaxProcesses == 0 {
		c.MaxProcesses = DefaultMaxProcesses
	}
	if c.MaxExited == 0 {
		c.MaxExited = DefaultMaxExited
	}
	if c.OutputBufferBytes == 0 {
		c.OutputBufferBytes = DefaultOutputBufferBytes
	}
	if c.ExitRetention == 0 {
		c.ExitRetention = DefaultExitRetention
	}
	if c.DrainGrace == 0 {
		c.DrainGrace = DefaultDrainGrace
	}
	if c.FollowerStallTimeout == 0 {
		c.FollowerStallTimeout = DefaultFollowerStallTimeout
	}
	if c.DefaultShell == "" {
		c.DefaultShell = DefaultShell
	}
	if c.BaseEnv == nil {
		c.BaseEnv = map[string]string{"PATH": DefaultPath, "LANG": "C.UTF-8"}
	} else {
		c.BaseEnv = maps.Clone(c.BaseEnv)
	}
	for k, v := range c.BaseEnv {
		if err := checkEnvVar(k, v); err != nil {
			return c, fmt.Errorf("process config: base environment: %w", err)
		}
	}
	if c.Users == nil {
		c.Users = userdb.New("/")
	}
	return c, nil
}
