package main

// Isolation figures: what each way of confining a sandbox costs, same run,
// same machine. Create-to-first-exec (Create, Start, Exec /bin/true) per
// isolation beside a bare os/exec of /bin/true, and the p50 of an Exec of
// /bin/true in a running sandbox per isolation beside os/exec of the same,
// interleaved one for one: plain local processes, bubblewrap, gVisor
// (runsc) and Docker, each when this machine has it.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/runsc"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

// isolationKind is a sandbox kind of the isolation figures, or why this
// machine cannot have it.
type isolationKind struct {
	kind sandboxKind
	skip string
}

// gvisorKind is the local provider with gVisor isolation.
func gvisorKind(agentd, runscBin string) sandboxKind {
	return sandboxKind{name: "local gVisor (runsc)", client: func() (*compute.Client, func(), error) {
		dir, err := os.MkdirTemp("", "bench-gvisor-")
		if err != nil {
			return nil, nil, err
		}
		if err := os.Chmod(dir, 0o711); err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
		c, err := local.NewClient(local.Config{StateDir: dir, AgentdPath: agentd, Isolation: local.IsolationGVisor, Runsc: runscBin},
			compute.ClientOptions{Log: zap.NewNop()})
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, err
		}
		return c, func() { os.RemoveAll(dir) }, nil
	}}
}

// findRunsc returns runsc from PATH, else the one the test servers'
// prebuild left in the cache (never built here: a cold build takes
// minutes), and whether it runs on this machine.
func findRunsc(ctx context.Context) (string, string) {
	bin, err := exec.LookPath("runsc")
	if err != nil {
		var ok bool
		if bin, ok = runsc.Cached(); !ok {
			return "", "skipped: no runsc on PATH or in the test servers' cache (`go run ./internal/testing/testservers/cmd/prebuild` builds it)"
		}
	}
	if err := runsc.Check(ctx, bin); err != nil {
		return "", "skipped: " + strings.SplitN(err.Error(), "\n", 2)[0]
	}
	return bin, ""
}

// isolationKinds lists the kinds of the isolation figures.
func isolationKinds(ctx context.Context, agentd string) []isolationKind {
	kinds := []isolationKind{{kind: localKind(agentd, local.IsolationNone)}}
	bw := localKind(agentd, local.IsolationBubblewrap)
	if _, err := exec.LookPath("bwrap"); err != nil {
		kinds = append(kinds, isolationKind{kind: bw, skip: "skipped: bwrap is not installed"})
	} else {
		kinds = append(kinds, isolationKind{kind: bw})
	}
	runscBin, skip := findRunsc(ctx)
	kinds = append(kinds, isolationKind{kind: gvisorKind(agentd, runscBin), skip: skip})
	// Docker with gVisor as its runtime would need runsc registered in
	// the engine's configuration and the engine restarted: not done here.
	kinds = append(kinds, isolationKind{kind: dockerKind(), skip: dockerStatus(ctx)})
	return kinds
}

// benchIsolation measures, for each isolation this machine has,
// create-to-first-exec (median of rounds) beside a bare os/exec, and the
// p50 of n Execs of /bin/true in one running sandbox beside os/exec of
// /bin/true, interleaved.
func benchIsolation(ctx context.Context, cfg config) ([]row, error) {
	agentd, err := filepath.Abs(filepath.Join(cfg.binDir, local.AgentdBinary))
	if err != nil {
		return nil, err
	}
	cmd := strings.Join(firstCommand, " ")
	bare, err := medianOf(cfg.startupRounds, func() (time.Duration, error) {
		start := time.Now()
		err := exec.Command(firstCommand[0], firstCommand[1:]...).Run()
		return time.Since(start), err
	})
	if err != nil {
		return nil, err
	}
	startup := fmt.Sprintf("create-to-first-exec (Create, Start, Exec `%s`), median of %d", cmd, cfg.startupRounds)
	execFig := fmt.Sprintf("Exec `%s` in a running sandbox, p50 of %d", cmd, cfg.isolationExecs)
	var rows []row
	for _, k := range isolationKinds(ctx, agentd) {
		name := "isolation " + k.kind.name
		if k.skip != "" {
			rows = append(rows, row{name + ": " + startup, k.skip, "", "", ""}, row{name + ": " + execFig, k.skip, "", "", ""})
			continue
		}
		fmt.Fprintf(os.Stderr, "isolation: %s ...\n", k.kind.name)
		d, err := startupOf(ctx, k.kind, cfg.startupRounds)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.kind.name, err)
		}
		rows = append(rows, row{name + ": " + startup, ms1(d), us(bare) + " (bare os/exec)", ratio(d, bare), ""})
		ours, base, err := execP50(ctx, k.kind, cfg.isolationExecs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.kind.name, err)
		}
		rows = append(rows, row{name + ": " + execFig, us(ours), us(base) + " (os/exec, interleaved)", ratio(ours, base), ""})
	}
	return rows, nil
}

// execP50 times n Execs of the first command in one sandbox of kind k,
// each right after an os/exec of the same (the baseline), after a
// warm-up of each, and returns both p50s.
func execP50(ctx context.Context, k sandboxKind, n int) (ours, base time.Duration, err error) {
	c, done, err := k.client()
	if err != nil {
		return 0, 0, err
	}
	defer done()
	s, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = c.Delete(context.Background(), s) }()
	if err := s.Start(ctx); err != nil {
		return 0, 0, err
	}
	spec := compute.ProcessSpec{Argv: firstCommand}
	bare := func() (time.Duration, error) {
		start := time.Now()
		err := exec.Command(firstCommand[0], firstCommand[1:]...).Run()
		return time.Since(start), err
	}
	inSandbox := func() (time.Duration, error) {
		start := time.Now()
		res, err := s.Exec(ctx, spec, compute.ExecOptions{}, nil)
		if err == nil && res.Exit.ExitCode != 0 {
			err = fmt.Errorf("%v exited %d", firstCommand, res.Exit.ExitCode)
		}
		return time.Since(start), err
	}
	var baseline, sb []time.Duration
	for i := 0; i <= n; i++ {
		o, b, err := timedPair(i, inSandbox, bare)
		if err != nil {
			return 0, 0, err
		}
		if i > 0 { // the first pair warms up
			baseline, sb = append(baseline, b), append(sb, o)
		}
	}
	ours, _ = percentiles(sb)
	base, _ = percentiles(baseline)
	return ours, base, nil
}
