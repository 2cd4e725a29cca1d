package main

// Harness figures: what the agent loop adds to each tool call when the
// model answers instantly, and how sandboxes scale when many run commands
// at once.

import (
	"context"
	"fmt"
	"iter"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
)

// instantModel is a zero-latency model: it calls exec_command `true` (not
// a login shell, like the baseline) for
// calls turns, then answers.
type instantModel struct{ calls int }

func (m *instantModel) Stream(_ context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	return func(yield func(model.Event, error) bool) {
		done := 0
		for _, it := range req.Input {
			if it.Kind == model.ItemFunctionCallOutput {
				done++
			}
		}
		resp := &model.Response{Status: "completed"}
		if done < m.calls {
			resp.Output = []model.Item{{Kind: model.ItemFunctionCall, CallID: fmt.Sprintf("c%d", done), Name: "exec_command", Arguments: `{"cmd":"true","login":false}`}}
		} else {
			resp.Output = []model.Item{model.AssistantMessage("done")}
		}
		yield(model.Event{Kind: model.EventCompleted, Response: resp}, nil)
	}
}

// benchHarnessOverhead runs n exec_command tool calls through the runner
// with an instant model, beside n direct Execs of the same shell command.
func benchHarnessOverhead(ctx context.Context, agentd string, n int) ([]row, error) {
	c, done, err := localKind(agentd, local.IsolationNone).client()
	if err != nil {
		return nil, err
	}
	defer done()
	sess, err := c.Create(ctx, compute.CreateOptions{})
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Delete(context.Background(), sess) }()
	if err := sess.Start(ctx); err != nil {
		return nil, err
	}
	// Warm up both paths.
	for range 20 {
		if _, err := sess.Exec(ctx, compute.ProcessSpec{Command: "true"}, compute.ExecOptions{}, nil); err != nil {
			return nil, err
		}
	}
	t0 := time.Now()
	for range n {
		if _, err := sess.Exec(ctx, compute.ProcessSpec{Command: "true"}, compute.ExecOptions{}, nil); err != nil {
			return nil, err
		}
	}
	direct := time.Since(t0)
	r := &harness.Runner{Model: &instantModel{calls: n}, ModelName: "instant"}
	a := &harness.Agent{Name: "bench"}
	t0 = time.Now()
	res, err := r.Run(ctx, a, "go", harness.RunConfig{MaxTurns: n + 1, Sandbox: &harness.SandboxConfig{Session: sess}})
	if err != nil {
		return nil, err
	}
	through := time.Since(t0)
	if res.Turns != n+1 {
		return nil, fmt.Errorf("harness overhead: %d turns, want %d", res.Turns, n+1)
	}
	per, base := through/time.Duration(n), direct/time.Duration(n)
	return []row{{fmt.Sprintf("harness: one exec_command tool call with a zero-latency model (mean of %d)", n), us(per),
		us(base) + " (the same command by a direct daemon Exec)", ratio(per, base), fmt.Sprintf("overhead %s per call", us(per-base))}}, nil
}

// benchScaling runs 100 commands in each of k concurrent local sandboxes
// for each k, and reports throughput, latency and memory.
func benchScaling(ctx context.Context, agentd string, series []int, perSandbox int) ([]row, error) {
	var rows []row
	for _, k := range series {
		c, done, err := localKind(agentd, local.IsolationNone).client()
		if err != nil {
			return nil, err
		}
		r, err := scaleOnce(ctx, c, agentd, k, perSandbox)
		done()
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func scaleOnce(ctx context.Context, c *compute.Client, agentd string, k, perSandbox int) (row, error) {
	sessions := make([]*compute.Session, k)
	defer func() {
		for _, s := range sessions {
			if s != nil {
				_ = c.Delete(context.Background(), s)
			}
		}
	}()
	for i := range sessions {
		s, err := c.Create(ctx, compute.CreateOptions{})
		if err != nil {
			return row{}, err
		}
		sessions[i] = s
		if err := s.Start(ctx); err != nil {
			return row{}, err
		}
	}
	lat := make([][]time.Duration, k)
	errs := make(chan error, k)
	var wg sync.WaitGroup
	start := time.Now()
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perSandbox {
				t0 := time.Now()
				if _, err := s.Exec(ctx, compute.ProcessSpec{Command: "true"}, compute.ExecOptions{}, nil); err != nil {
					errs <- err
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return row{}, fmt.Errorf("%d sandboxes: %w", k, err)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	p50, p99 := percentiles(all)
	mem, err := localDaemonsMemory(agentd)(ctx, sessions)
	if err != nil {
		return row{}, err
	}
	runtime.GC()
	self, err := readRSS(os.Getpid())
	if err != nil {
		return row{}, err
	}
	total := k * perSandbox
	return row{fmt.Sprintf("scaling: %d local sandboxes x %d commands at once", k, perSandbox),
		fmt.Sprintf("%.0f commands/s, p50 %s, p99 %s", float64(total)/elapsed.Seconds(), us(p50), us(p99)),
		"", "", fmt.Sprintf("daemons %s; harness RSS %.1f MiB", mem, float64(self.total)/1024)}, nil
}

// benchHarness collects the harness figures.
func benchHarness(ctx context.Context, cfg config, agentd string) ([]row, error) {
	fmt.Fprintln(os.Stderr, "harness overhead per tool call ...")
	rows, err := benchHarnessOverhead(ctx, agentd, cfg.toolCalls)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(os.Stderr, "scaling series ...")
	r, err := benchScaling(ctx, agentd, cfg.scaling, 100)
	if err != nil {
		return nil, err
	}
	return append(rows, r...), nil
}
