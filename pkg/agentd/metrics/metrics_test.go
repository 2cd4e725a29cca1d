package metrics

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func parse(t *testing.T, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, text)
	}
	return fams
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestWriteTextParses(t *testing.T) {
	s := New(`v1 "quoted"\n`, func() int { return 3 })
	s.KnownMethods([]string{"/bulkhead.agentd.v1.ProcessService/Exec", "/grpc.health.v1.Health/Check"})
	s.ProcessStarted()
	s.OutputBytes(Stdout, 10)
	s.OutputBytes(Stderr, 5)
	s.OutputBytes(PTY, 7)
	s.OutputBytes(Stream(9), 7) // ignored
	s.StdinBytes(4)
	s.FileReadBytes(100)
	s.FileWrittenBytes(200)
	s.AuthRejected(AuthInvalid)
	s.AuthRejected(AuthMissing)
	s.ConnOpened()
	s.ConnOpened()
	s.ConnClosed()
	s.ConnRefused(ConnLimit)
	s.ConnRefused(ConnLimit)
	s.ConnRefused(ConnHandshake)
	s.ConnRefused(ConnCalls)
	s.ConnRefused(ConnReason(5)) // ignored
	s.WorkspaceBytes(Restore, 33)
	s.WorkspaceBytes(WorkspaceOp(7), 1) // ignored
	s.ObserveRPC("/bulkhead.agentd.v1.ProcessService/Exec", 0, 2*time.Millisecond)
	s.ObserveRPC("/bulkhead.agentd.v1.ProcessService/Exec", 0, 20*time.Second)
	s.ObserveRPC("/bulkhead.agentd.v1.ProcessService/Exec", 5, time.Hour) // NotFound, beyond every bucket
	s.ObserveRPC("/some/secret/path", 16, time.Millisecond)               // unknown method: "other"
	s.ObserveRPC("/grpc.health.v1.Health/Check", 99, time.Millisecond)    // out-of-range code: Unknown
	var buf bytes.Buffer
	if err := s.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "secret") {
		t.Errorf("an unknown method name reached the exposition:\n%s", buf.String())
	}
	fams := parse(t, buf.Bytes())
	want := map[string]dto.MetricType{
		"bulkhead_agentd_processes_running":          dto.MetricType_GAUGE,
		"bulkhead_agentd_processes_started_total":    dto.MetricType_COUNTER,
		"bulkhead_agentd_process_output_bytes_total": dto.MetricType_COUNTER,
		"bulkhead_agentd_process_stdin_bytes_total":  dto.MetricType_COUNTER,
		"bulkhead_agentd_file_read_bytes_total":      dto.MetricType_COUNTER,
		"bulkhead_agentd_file_written_bytes_total":   dto.MetricType_COUNTER,
		"bulkhead_agentd_workspace_bytes_total":      dto.MetricType_COUNTER,
		"bulkhead_agentd_auth_rejected_total":        dto.MetricType_COUNTER,
		"bulkhead_agentd_connections_open":           dto.MetricType_GAUGE,
		"bulkhead_agentd_connections_refused_total":  dto.MetricType_COUNTER,
		"bulkhead_agentd_rpc_duration_seconds":       dto.MetricType_HISTOGRAM,
		"bulkhead_agentd_build_info":                 dto.MetricType_GAUGE,
		"process_resident_memory_bytes":              dto.MetricType_GAUGE,
		"go_goroutines":                              dto.MetricType_GAUGE,
	}
	for name, typ := range want {
		f := fams[name]
		if f == nil {
			t.Errorf("missing %s", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s: type %v, want %v", name, f.GetType(), typ)
		}
	}
	if len(fams) != len(want) {
		t.Errorf("%d families, want %d", len(fams), len(want))
	}
	if v := fams["bulkhead_agentd_connections_open"].GetMetric()[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("connections_open = %v, want 1", v)
	}
	refused := map[string]float64{}
	for _, m := range fams["bulkhead_agentd_connections_refused_total"].GetMetric() {
		refused[label(m, "reason")] = m.GetCounter().GetValue()
	}
	if refused["limit"] != 2 || refused["handshake"] != 1 || refused["calls"] != 1 || len(refused) != 3 {
		t.Errorf("connections refused = %v", refused)
	}
	if v := fams["bulkhead_agentd_processes_running"].GetMetric()[0].GetGauge().GetValue(); v != 3 {
		t.Errorf("processes_running = %v", v)
	}
	if v := fams["bulkhead_agentd_build_info"].GetMetric()[0]; label(v, "version") != `v1 "quoted"\n` {
		t.Errorf("build_info version label = %q", label(v, "version"))
	}
	out := map[string]float64{}
	for _, m := range fams["bulkhead_agentd_process_output_bytes_total"].GetMetric() {
		out[label(m, "stream")] = m.GetCounter().GetValue()
	}
	if out["stdout"] != 10 || out["stderr"] != 5 || out["pty"] != 7 || len(out) != 3 {
		t.Errorf("output bytes = %v", out)
	}
	ws := map[string]float64{}
	for _, m := range fams["bulkhead_agentd_workspace_bytes_total"].GetMetric() {
		ws[label(m, "op")] = m.GetCounter().GetValue()
	}
	if ws["restore"] != 33 || ws["archive"] != 0 || ws["materialize"] != 0 || len(ws) != 3 {
		t.Errorf("workspace bytes = %v", ws)
	}
	hists := map[string]*dto.Histogram{}
	for _, m := range fams["bulkhead_agentd_rpc_duration_seconds"].GetMetric() {
		hists[label(m, "method")+" "+label(m, "code")] = m.GetHistogram()
	}
	exec := hists["bulkhead.agentd.v1.ProcessService/Exec OK"]
	if exec.GetSampleCount() != 2 || exec.GetSampleSum() < 20 || len(exec.GetBucket()) != len(Buckets)+1 { // the parser keeps +Inf
		t.Errorf("Exec OK histogram: %v", exec)
	}
	for _, b := range exec.GetBucket() {
		want := uint64(0)
		switch {
		case b.GetUpperBound() >= 20:
			want = 2
		case b.GetUpperBound() >= 0.002:
			want = 1
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("Exec OK bucket le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	if h := hists["bulkhead.agentd.v1.ProcessService/Exec NotFound"]; h.GetSampleCount() != 1 || h.GetBucket()[len(Buckets)-1].GetCumulativeCount() != 0 {
		t.Errorf("Exec NotFound histogram: %v", h)
	}
	if hists["other Unauthenticated"].GetSampleCount() != 1 || hists["grpc.health.v1.Health/Check Unknown"].GetSampleCount() != 1 {
		t.Errorf("histograms: %v", hists)
	}
}

// A nil *Set (a daemon started without metrics) is a no-op: every method
// returns at once, records nothing anywhere and allocates nothing, so the
// hot paths may call it unconditionally.
func TestNilSetIsANoOp(t *testing.T) {
	var s *Set
	calls := func() {
		s.ProcessStarted()
		s.OutputBytes(Stdout, 1)
		s.StdinBytes(1)
		s.FileReadBytes(1)
		s.FileWrittenBytes(1)
		s.WorkspaceBytes(Archive, 1)
		s.AuthRejected(AuthInvalid)
		s.ObserveRPC("/x/y", 0, time.Second)
		s.KnownMethods([]string{"/x/y"})
	}
	if allocs := testing.AllocsPerRun(100, calls); allocs != 0 {
		t.Errorf("a nil Set allocates %.1f times per round", allocs)
	}
	// Nothing reached a set made afterwards (no state outside a Set).
	fresh := New("v", nil)
	calls()
	var text strings.Builder
	if err := fresh.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if got := text.String(); strings.Contains(got, `/x/y`) || strings.Contains(got, "bulkhead_agentd_processes_started_total 1") {
		t.Errorf("calls on a nil Set reached another set:\n%s", got)
	}
}

func TestServe(t *testing.T) {
	s := New("v", nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l, "/metrics") }()
	defer func() {
		l.Close()
		if err := <-done; err == nil || !strings.Contains(err.Error(), "closed") {
			t.Errorf("Serve after Close: %v", err)
		}
	}()
	base := "http://" + l.Addr().String()
	c := &http.Client{Timeout: 10 * time.Second}

	resp, err := c.Get(base + "/metrics?x=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ContentType {
		t.Fatalf("GET /metrics: %s %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	parse(t, body)

	resp, err = c.Head(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength <= 0 {
		t.Errorf("HEAD /metrics: %s, length %d", resp.Status, resp.ContentLength)
	}
	for _, tc := range []struct {
		method, path string
		code         int
	}{{"GET", "/", 404}, {"GET", "/metrics/x", 404}, {"POST", "/metrics", 405}} {
		req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader("x"))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %s, want %d", tc.method, tc.path, resp.Status, tc.code)
		}
	}

	// Garbage and oversized requests get an error, not a hang.
	for _, raw := range []string{"nonsense\r\n\r\n", "GET /metrics HTTP/1.1\r\nX: " + strings.Repeat("a", 2*maxRequestBytes) + "\r\n\r\n", "GET /metrics SPDY/3\r\n\r\n"} {
		conn, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		go func() { _, _ = io.WriteString(conn, raw) }()
		line, err := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 4") && !strings.HasPrefix(line, "HTTP/1.1 5") {
			t.Errorf("request %.20q: status line %q, %v", raw, line, err)
		}
	}
}
