package agentd

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/process"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
)

// Config is the daemon's behaviour, independent of how it is served.
type Config struct {
	// WorkspaceRoot is the absolute workspace directory (created if missing).
	WorkspaceRoot string
	// Grants are extra absolute paths outside the root (never "/").
	Grants []workspace.Grant
	// DefaultUser is the run_as user for requests that name none; "" means
	// the daemon's own identity.
	DefaultUser string
	// Shell runs command lines.
	Shell string
	// MaxProcesses bounds processes running at once.
	MaxProcesses int
	// OutputBufferBytes is the output kept per process.
	OutputBufferBytes int
	// MaxReadBytes bounds one ReadOutput reply and one Attach message.
	MaxReadBytes int
	// ExitRetention is how long an exited process is kept.
	ExitRetention time.Duration
	// FollowerStallTimeout is how long an attached reader that delivers
	// nothing may hold a process's output back (flow control) before the
	// process runs on and the reader sees dropped bytes.
	FollowerStallTimeout time.Duration
	// MaxFileBytes bounds one WriteFile (0: no limit).
	MaxFileBytes int64
	// MaxPatchBytes bounds an apply_patch input.
	MaxPatchBytes int64
	// EtcRoot is where etc/passwd and etc/group are read ("/" in a sandbox).
	EtcRoot string
	// ReapAll makes the daemon reap every child of its process (it is PID 1
	// or a subreaper), so orphaned grandchildren never become zombies.
	ReapAll bool
	// EgressRelay, when set, relays connections to a loopback port to the
	// harness's egress proxy, and processes get proxy variables pointing
	// there (see EgressRelay.ProxyEnv); nil means no relay and no proxy
	// variables.
	EgressRelay *EgressRelay
}

// DefaultConfig returns the daemon defaults.
func DefaultConfig() Config {
	return Config{
		WorkspaceRoot:        "/workspace",
		Shell:                process.DefaultShell,
		MaxProcesses:         process.DefaultMaxProcesses,
		OutputBufferBytes:    process.DefaultOutputBufferBytes,
		MaxReadBytes:         1 << 20,
		ExitRetention:        process.DefaultExitRetention,
		FollowerStallTimeout: process.DefaultFollowerStallTimeout,
		MaxPatchBytes:        8 << 20,
		EtcRoot:              "/",
		ReapAll:              true,
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if !filepath.IsAbs(c.WorkspaceRoot) {
		return fmt.Errorf("workspace root %q must be an absolute path", c.WorkspaceRoot)
	}
	if filepath.Clean(c.WorkspaceRoot) == "/" {
		return fmt.Errorf("workspace root must not be /")
	}
	for _, g := range c.Grants {
		if !filepath.IsAbs(g.Path) || filepath.Clean(g.Path) == "/" {
			return fmt.Errorf("grant %q must be an absolute path other than /", g.Path)
		}
	}
	if c.MaxProcesses <= 0 || c.OutputBufferBytes <= 0 || c.MaxReadBytes <= 0 || c.MaxPatchBytes <= 0 {
		return fmt.Errorf("limits must be positive")
	}
	if c.MaxFileBytes < 0 || c.ExitRetention < 0 || c.FollowerStallTimeout < 0 {
		return fmt.Errorf("limits must not be negative")
	}
	if c.EgressRelay != nil {
		if err := c.EgressRelay.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// ParseGrant parses "/abs/path" or "/abs/path:ro".
func ParseGrant(s string) (workspace.Grant, error) {
	g := workspace.Grant{Path: s}
	if p, ok := strings.CutSuffix(s, ":ro"); ok {
		g = workspace.Grant{Path: p, ReadOnly: true}
	}
	if !filepath.IsAbs(g.Path) || filepath.Clean(g.Path) == "/" {
		return g, fmt.Errorf("grant %q: must be an absolute path other than /", s)
	}
	g.Path = filepath.Clean(g.Path)
	return g, nil
}
