package main

// Sandboxes through `harness serve` beside the same operations through
// the Go library in this process, interleaved round for round: create to
// first exec (CreateSandbox and RunCommand as plain JSON over HTTP, then
// DeleteSandbox, against Client.Create, Session.Start and Session.Exec),
// and one RunCommand round trip in a sandbox that exists (against one
// Session.Exec). Both sides make local sandboxes without isolation from
// the same sandbox-agentd binary, so the difference is the service: its
// HTTP and JSON, authentication, validation, quotas, run store and the
// per-sandbox caps it applies (cgroups, when it can).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
)

// serviceClient calls `harness serve`'s SandboxService with plain JSON, as
// a backend in any language would.
type serviceClient struct {
	hc  *http.Client
	url string
}

// call POSTs in as JSON to the method and decodes the answer into out.
func (c *serviceClient) call(ctx context.Context, method string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/bulkhead.harness.v1.SandboxService/"+method, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s", method, resp.StatusCode, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// create makes a sandbox with an empty workspace and returns its id.
func (c *serviceClient) create(ctx context.Context) (string, error) {
	var out struct {
		Sandbox struct {
			SandboxID string `json:"sandboxId"`
		} `json:"sandbox"`
	}
	if err := c.call(ctx, "CreateSandbox", map[string]any{}, &out); err != nil {
		return "", err
	}
	if out.Sandbox.SandboxID == "" {
		return "", fmt.Errorf("CreateSandbox: no sandbox id in the answer")
	}
	return out.Sandbox.SandboxID, nil
}

// run runs firstCommand in the sandbox and checks its exit code.
func (c *serviceClient) run(ctx context.Context, id string) error {
	var out struct {
		ExitCode int    `json:"exitCode"`
		Stderr   string `json:"stderr"`
	}
	if err := c.call(ctx, "RunCommand", map[string]any{"sandboxId": id, "argv": firstCommand}, &out); err != nil {
		return err
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("RunCommand %v: exit %d: %s", firstCommand, out.ExitCode, out.Stderr)
	}
	return nil
}

func (c *serviceClient) delete(ctx context.Context, id string) error {
	return c.call(ctx, "DeleteSandbox", map[string]any{"sandboxId": id}, nil)
}

// benchServeSandboxes measures the service's sandbox calls beside the
// library's: rounds creates to first exec and calls round trips a side.
func benchServeSandboxes(ctx context.Context, binDir string, rounds, calls int) ([]row, error) {
	dir, err := os.MkdirTemp("", "bench-serve-sandbox-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(benchToken+" bench\n"), 0o600); err != nil {
		return nil, err
	}
	svc, err := startServe(ctx, binDir, dir, tokens, "bolt:"+filepath.Join(dir, "runs.db"), "http://127.0.0.1:1")
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	sc := &serviceClient{hc: &http.Client{}, url: "http://" + svc.addr}
	libDir := filepath.Join(dir, "library")
	if err := os.Mkdir(libDir, 0o711); err != nil {
		return nil, err
	}
	lib, err := local.NewClient(local.Config{StateDir: libDir, AgentdPath: svc.agentd, Isolation: local.IsolationNone}, compute.ClientOptions{})
	if err != nil {
		return nil, err
	}

	// Create to first exec, interleaved; the first round of each is a
	// warm-up.
	var viaService, viaLibrary []time.Duration
	for i := 0; i <= rounds; i++ {
		start := time.Now()
		id, err := sc.create(ctx)
		if err != nil {
			return nil, err
		}
		if err := sc.run(ctx, id); err != nil {
			_ = sc.delete(context.Background(), id)
			return nil, err
		}
		d := time.Since(start)
		if err := sc.delete(ctx, id); err != nil {
			return nil, err
		}
		l, err := createToFirstExec(ctx, lib, nil)
		if err != nil {
			return nil, fmt.Errorf("library: %w", err)
		}
		if i > 0 {
			viaService, viaLibrary = append(viaService, d), append(viaLibrary, l)
		}
	}

	// Round trips in one sandbox a side, interleaved in blocks of ten.
	id, err := sc.create(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sc.delete(context.Background(), id) }()
	sess, err := lib.Create(ctx, compute.CreateOptions{})
	if err != nil {
		return nil, err
	}
	defer func() { _ = lib.Delete(context.Background(), sess) }()
	if err := sess.Start(ctx); err != nil {
		return nil, err
	}
	var rttService, rttLibrary []time.Duration
	for len(rttService) < calls {
		for range 10 {
			start := time.Now()
			if err := sc.run(ctx, id); err != nil {
				return nil, err
			}
			rttService = append(rttService, time.Since(start))
		}
		for range 10 {
			start := time.Now()
			res, err := sess.Exec(ctx, compute.ProcessSpec{Argv: firstCommand}, compute.ExecOptions{}, nil)
			if err != nil {
				return nil, err
			}
			if res.Exit.ExitCode != 0 {
				return nil, fmt.Errorf("library exec %v: exit %d", firstCommand, res.Exit.ExitCode)
			}
			rttLibrary = append(rttLibrary, time.Since(start))
		}
	}
	s50, _ := percentiles(viaService)
	l50, _ := percentiles(viaLibrary)
	r50, r99 := percentiles(rttService)
	b50, b99 := percentiles(rttLibrary)
	cmd := fmt.Sprintf("`%v`", firstCommand)
	return []row{
		{fmt.Sprintf("harness serve: create to first exec (CreateSandbox, RunCommand %s as JSON over HTTP), median of %d", cmd, rounds),
			ms1(s50), ms1(l50) + " (Go library: Create, Start, Exec in this process)", ratio(s50, l50), "within 10% of the library"},
		{fmt.Sprintf("harness serve: RunCommand %s round trip, p50 of %d", cmd, calls),
			us(r50), us(b50) + " (Go library: Session.Exec)", fmt.Sprintf("%s (%+.2f ms)", ratio(r50, b50), float64(r50-b50)/1e6), "library + 1 ms"},
		{fmt.Sprintf("harness serve: RunCommand %s round trip, p99 of %d", cmd, calls),
			us(r99), us(b99) + " (Go library: Session.Exec)", ratio(r99, b99), ""},
	}, nil
}
