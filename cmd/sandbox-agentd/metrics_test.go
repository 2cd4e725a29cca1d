package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

func TestMain(m *testing.M) { os.Exit(agentdtest.Run(m)) }

// TestMetricsEndpoint runs the real daemon binary with --metrics-listen on
// a unix socket, makes real calls (one with a wrong token) and scrapes the
// endpoint over HTTP: every family is there with its type, the counts
// moved, and nothing from the calls (paths, commands, tokens, the
// workspace) appears in the exposition.
func TestMetricsEndpoint(t *testing.T) {
	testenv.Require(t, testenv.Linux)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mdir := t.TempDir()
	msock := filepath.Join(mdir, "metrics.sock")
	var stderr bytes.Buffer
	// Registered before startBinary's, so it runs once the daemon stopped.
	t.Cleanup(func() {
		if _, err := os.Stat(msock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the metrics socket is left behind: %v", err)
		}
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", stderr.String())
		}
	})
	d := startBinary(ctx, t, &stderr, "--metrics-listen", "unix://"+msock, "--log-level", "warn")
	c, token, ws, dir := d.client, d.token, d.ws, d.dir

	// Output on both streams, stdin, a file written and read back.
	const secretPath, secretWord = "secret-dir/secret-file.txt", "hunter2-metrics"
	res, err := c.Exec(ctx, compute.ProcessSpec{Command: "cat; echo " + secretWord + "-err >&2"}, compute.ExecOptions{Stdin: []byte("stdin-" + secretWord + "\n")}, nil)
	if err != nil || res.Exit.ExitCode != 0 {
		t.Fatalf("exec: %v %v", res, err)
	}
	data := bytes.Repeat([]byte("0123456789"), 1000)
	if _, err := c.WriteFile(ctx, secretPath, compute.WriteFileOptions{CreateParents: true}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx, secretPath, compute.ReadFileOptions{}, &back); err != nil || back.Len() != len(data) {
		t.Fatalf("read back %d bytes: %v", back.Len(), err)
	}
	var tarball bytes.Buffer
	if _, err := c.Archive(ctx, compute.ArchiveOptions{}, &tarball); err != nil || tarball.Len() == 0 {
		t.Fatalf("archive of %d bytes: %v", tarball.Len(), err)
	}
	if _, err := c.Stat(ctx, "no-such-"+secretWord, compute.StatOptions{}); !errors.Is(err, compute.ErrNotFound) {
		t.Fatalf("stat of a missing file: %v", err)
	}
	bad, err := agentclient.Dial(agentclient.Options{Address: d.addr, Token: "wrong-token-" + secretWord})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := bad.Info(ctx); err == nil {
		t.Fatal("a wrong token was accepted")
	}

	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", msock)
	}}}
	resp, err := hc.Get("http://agentd/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s %v", resp.Status, err)
	}
	for _, s := range []string{secretWord, "secret-dir", token, ws, dir, mdir} {
		if strings.Contains(string(body), s) {
			t.Errorf("the exposition contains %q:\n%s", s, body)
		}
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, body)
	}
	types := map[string]dto.MetricType{
		"bulkhead_agentd_processes_running":          dto.MetricType_GAUGE,
		"bulkhead_agentd_processes_started_total":    dto.MetricType_COUNTER,
		"bulkhead_agentd_process_output_bytes_total": dto.MetricType_COUNTER,
		"bulkhead_agentd_process_stdin_bytes_total":  dto.MetricType_COUNTER,
		"bulkhead_agentd_file_read_bytes_total":      dto.MetricType_COUNTER,
		"bulkhead_agentd_file_written_bytes_total":   dto.MetricType_COUNTER,
		"bulkhead_agentd_workspace_bytes_total":      dto.MetricType_COUNTER,
		"bulkhead_agentd_auth_rejected_total":        dto.MetricType_COUNTER,
		"bulkhead_agentd_rpc_duration_seconds":       dto.MetricType_HISTOGRAM,
		"bulkhead_agentd_build_info":                 dto.MetricType_GAUGE,
		"process_resident_memory_bytes":              dto.MetricType_GAUGE,
	}
	for name, typ := range types {
		if f := fams[name]; f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want type %v", name, f, typ)
		}
	}
	value := func(name string, labels ...string) float64 {
		for _, m := range fams[name].GetMetric() {
			if hasLabels(m, labels...) {
				switch {
				case m.Counter != nil:
					return m.GetCounter().GetValue()
				case m.Gauge != nil:
					return m.GetGauge().GetValue()
				case m.Histogram != nil:
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
		return -1
	}
	stdoutN := float64(len("stdin-" + secretWord + "\n"))
	stderrN := float64(len(secretWord + "-err\n"))
	checks := []struct {
		what      string
		got, want float64
	}{
		{"processes started", value("bulkhead_agentd_processes_started_total"), 1},
		{"processes running", value("bulkhead_agentd_processes_running"), 0},
		{"stdout bytes", value("bulkhead_agentd_process_output_bytes_total", "stream", "stdout"), stdoutN},
		{"stderr bytes", value("bulkhead_agentd_process_output_bytes_total", "stream", "stderr"), stderrN},
		{"stdin bytes", value("bulkhead_agentd_process_stdin_bytes_total"), stdoutN},
		{"file bytes written", value("bulkhead_agentd_file_written_bytes_total"), float64(len(data))},
		{"file bytes read", value("bulkhead_agentd_file_read_bytes_total"), float64(len(data))},
		{"archive bytes", value("bulkhead_agentd_workspace_bytes_total", "op", "archive"), float64(tarball.Len())},
		{"invalid tokens", value("bulkhead_agentd_auth_rejected_total", "reason", "invalid"), 1},
		{"Exec OK calls", value("bulkhead_agentd_rpc_duration_seconds", "method", "bulkhead.agentd.v1.ProcessService/Exec", "code", "OK"), 1},
		{"WriteFile OK calls", value("bulkhead_agentd_rpc_duration_seconds", "method", "bulkhead.agentd.v1.FileService/WriteFile", "code", "OK"), 1},
		{"Stat NotFound calls", value("bulkhead_agentd_rpc_duration_seconds", "method", "bulkhead.agentd.v1.FileService/Stat", "code", "NotFound"), 1},
		{"Info Unauthenticated calls", value("bulkhead_agentd_rpc_duration_seconds", "method", "bulkhead.agentd.v1.SystemService/Info", "code", "Unauthenticated"), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if v := value("bulkhead_agentd_rpc_duration_seconds", "method", "bulkhead.agentd.v1.SystemService/Info", "code", "OK"); v < 1 {
		t.Errorf("Info OK calls = %v", v)
	}
	if v := value("process_resident_memory_bytes"); v <= 0 {
		t.Errorf("process_resident_memory_bytes = %v", v)
	}
	if v := value("bulkhead_agentd_build_info", "version", agentdtest.Version); v != 1 {
		t.Errorf("build_info{version=%q} = %v", agentdtest.Version, v)
	}
}

func hasLabels(m *dto.Metric, kv ...string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// TestMetricsListenFlag checks the flag's parsing: off by default, and
// addresses checked before anything starts.
func TestMetricsListenFlag(t *testing.T) {
	cfg, _, err := parseFlags([]string{"--listen", "unix:///tmp/x.sock", "--insecure-no-auth"})
	if err != nil || cfg.MetricsListen != "" {
		t.Fatalf("default: %q %v", cfg.MetricsListen, err)
	}
	for _, ok := range []string{"127.0.0.1:9464", "tcp://127.0.0.1:9464", "unix:///run/agentd-metrics.sock"} {
		cfg, _, err := parseFlags([]string{"--listen", "unix:///tmp/x.sock", "--insecure-no-auth", "--metrics-listen", ok})
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil || cfg.MetricsListen != ok {
			t.Errorf("--metrics-listen %s: %q %v", ok, cfg.MetricsListen, err)
		}
	}
	for _, bad := range []string{"9464", "http://127.0.0.1:9464", "unix://"} {
		cfg, _, err := parseFlags([]string{"--listen", "unix:///tmp/x.sock", "--insecure-no-auth", "--metrics-listen", bad})
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil {
			t.Errorf("--metrics-listen %s was accepted", bad)
		}
	}
}
