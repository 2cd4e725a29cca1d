package process

import (
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// Stream tells which output a chunk came from.
type Stream uint8

const (
	// Stdout is the process's standard output (pipe mode).
	Stdout Stream = iota + 1
	// Stderr is the process's standard error (pipe mode).
	Stderr
	// PTY is the merged output of a terminal (TTY mode).
	PTY
)

// String returns "stdout", "stderr" or "pty".
func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	case PTY:
		return "pty"
	}
	return "unknown"
}

// StartOptions describe a process to start. Exactly one of Argv and Command
// must be set.
type StartOptions struct {
	// RequestID makes Start idempotent: a retried Start with the same
	// RequestID and the same options returns the process already started;
	// the same RequestID with different options is a compute.ErrConflict.
	// The RequestID is remembered as long as the process record is.
	RequestID string
	// Argv is the program and its arguments. A program name without a slash
	// is looked up in the PATH of the child's environment.
	Argv []string
	// Command is a shell command line, run as Shell -c Command.
	Command string
	// Shell runs Command; empty means Config.DefaultShell.
	Shell string
	// Login runs the shell as a login shell (-lc instead of -c).
	Login bool
	// Dir is the absolute working directory, already confined by the
	// caller. Empty means the user's home directory when it exists, else "/".
	Dir string
	// Env is added to the base environment and overrides it.
	Env map[string]string
	// User is the run_as user (name or numeric uid); empty means
	// Config.DefaultUser.
	User string
	// RunAs, when set, is the account the caller already resolved for
	// User (or the default user): the Manager uses it instead of reading
	// the account files again, if its name is the one asked for. It takes
	// no part in recognising a retried Start.
	RunAs *userdb.User
	// TTY runs the process on a pseudo-terminal of Rows x Cols, each at
	// most MaxTerminalDimension (a zero dimension takes the default, 24
	// rows or 80 columns). Output is a single PTY stream and input is
	// always open.
	TTY        bool
	Rows, Cols uint32
	// Stdin keeps a stdin pipe open in pipe mode; otherwise stdin is
	// /dev/null.
	Stdin bool
	// HoldOutput reserves a follower at cursor 0 from the very start, for a
	// caller that attaches right after Start (Exec): output is held back for
	// it as for any attached reader, so nothing written before it attached is
	// dropped. If nobody attaches within the follower stall timeout, the
	// reservation stops holding the process back.
	HoldOutput bool
	// Timeout, when positive, kills the process group after that long and
	// marks the exit as TimedOut. There is no default timeout.
	Timeout time.Duration
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	// Code is the exit code, or 128+signal number when killed by a signal
	// (the value a shell would show as $?).
	Code int
	// Signal is the name of the killing signal ("SIGKILL"), empty otherwise.
	Signal string
	// TimedOut is set when the process was killed by its Timeout.
	TimedOut bool
	// ExitedAt is when the exit was recorded.
	ExitedAt time.Time
}

// Info describes a process.
type Info struct {
	ID        string
	RequestID string
	PID       int
	Argv      []string
	Dir       string
	User      string // the run_as user name; empty for the daemon's own identity when it has no passwd entry
	TTY       bool
	StartedAt time.Time
	Running   bool
	Exit      *ExitStatus // set once the process has exited
}

// Chunk is a contiguous piece of one output stream.
type Chunk struct {
	Stream Stream
	Offset int64 // absolute offset of Data[0] in the process's output log
	Data   []byte
}

// ReadResult is the answer to Read and each step of Attach.
type ReadResult struct {
	Chunks []Chunk
	// NextCursor is the cursor to pass to the next Read.
	NextCursor int64
	// Dropped counts bytes between the requested cursor and the oldest byte
	// still buffered: output lost because the ring wrapped.
	Dropped int64
	// Exited is set once the process has exited (its output is final).
	Exited bool
	// Exit is set when the process has exited and NextCursor reached the
	// end of its output.
	Exit *ExitStatus
}
