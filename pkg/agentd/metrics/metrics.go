// Package metrics is sandbox-agentd's metric set and its Prometheus text
// exposition, served by `sandbox-agentd --metrics-listen` (off by default).
//
// # Metrics
//
//	bulkhead_agentd_processes_running                     gauge    processes started and not yet exited
//	bulkhead_agentd_processes_started_total               counter  processes started (Start, Exec)
//	bulkhead_agentd_process_output_bytes_total{stream}    counter  output delivered to clients (ReadOutput, Attach, Exec); stream: stdout, stderr, pty
//	bulkhead_agentd_process_stdin_bytes_total             counter  stdin received (WriteStdin, Exec)
//	bulkhead_agentd_file_read_bytes_total                 counter  file bytes sent by ReadFile
//	bulkhead_agentd_file_written_bytes_total              counter  file bytes received by WriteFile
//	bulkhead_agentd_workspace_bytes_total{op}             counter  archive bytes sent (archive), received (restore), materialization bytes received (materialize)
//	bulkhead_agentd_rpc_duration_seconds{method,code}     histogram  calls by method (bulkhead.agentd.v1.ProcessService/Start) and gRPC code (OK, NotFound, ...)
//	bulkhead_agentd_auth_rejected_total{reason}           counter  calls refused for their token; reason: missing, malformed, invalid
//	bulkhead_agentd_connections_open                      gauge    connections accepted and not yet closed
//	bulkhead_agentd_connections_refused_total{reason}     counter  connections closed by the daemon unserved; reason: limit (over --max-connections), handshake (no authenticated call within --handshake-timeout), calls (too many calls before an authenticated one)
//	bulkhead_agentd_build_info{version}                   gauge    always 1
//	process_resident_memory_bytes                         gauge    the daemon's resident memory
//	go_goroutines                                         gauge    goroutines
//
// Labels have bounded values only: gRPC method names of the services the
// daemon registered (any other name is recorded as "other"), the 17 gRPC
// codes, fixed stream and reason names. No path, command line, environment,
// user or process id ever becomes a label or a value.
//
// # Why a hand-written exposition and not client_golang
//
// The daemon is baked into every sandbox and issue #17 wants its idle RSS
// under 10 MiB, so the choice was measured: `make build` flags (static,
// -trimpath, -tags grpcnotrace, -s -w), VmRSS read from /proc/PID/status
// 1.5 s after one Info call on a connected client (and, with the listener
// on, one scrape), median of 5 runs, on the same machine:
//
//	                                        binary      idle RSS, off   idle RSS, --metrics-listen
//	without metrics (before)                11,853,986  11,764 KiB      -
//	this package (text + minimal HTTP)      11,927,714  11,812 KiB      12,136 KiB
//	client_golang (registry + promhttp)     13,435,042  13,404 KiB      15,640 KiB
//
// client_golang makes the binary 1.6 MB larger and the idle RSS 1.6 MiB
// higher with metrics off (its package initialisation builds the default
// registry with the Go and process collectors whether or not anything is
// served), and 3.8 MiB higher once scraped; this package costs 74 KB, no
// RSS beyond run-to-run noise (about 100 KiB) while off, and 0.3 MiB once
// scraped. Serving through net/http's server (rather than Serve's
// minimal HTTP/1.x responder) added a further 0.7 MB and 0.25 MiB with
// metrics off, so the daemon does not link it. The format is small: a few
// counters and gauges and one histogram family in text format 0.0.4. The
// tests parse the output with prometheus/common's expfmt (test-only), so
// it stays what real scrapers read.
//
// A nil *Set records nothing: every method is a no-op, which is what the
// daemon runs with when --metrics-listen is not given.
package metrics

import (
	"bufio"
	"bytes"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Stream names the output stream of a process for OutputBytes.
type Stream int

// Output streams.
const (
	Stdout Stream = iota
	Stderr
	PTY
	numStreams
)

var streamNames = [numStreams]string{"stdout", "stderr", "pty"}

// WorkspaceOp names a workspace stream for WorkspaceBytes.
type WorkspaceOp int

// Workspace streams.
const (
	Archive     WorkspaceOp = iota // archive bytes sent
	Restore                        // archive bytes received
	Materialize                    // file bytes of a materialization received
	numWorkspaceOps
)

var workspaceOpNames = [numWorkspaceOps]string{"archive", "restore", "materialize"}

// AuthReason says why a call's token was refused.
type AuthReason int

// Reasons of AuthRejected.
const (
	AuthMissing   AuthReason = iota // no (or more than one) authorization header
	AuthMalformed                   // not a bearer token
	AuthInvalid                     // the wrong token
	numReasons
)

var reasonNames = [numReasons]string{"missing", "malformed", "invalid"}

// ConnReason says why a connection was closed unserved.
type ConnReason int

// Reasons of ConnRefused.
const (
	ConnLimit     ConnReason = iota // over the cap on open connections
	ConnHandshake                   // no authenticated call within the handshake timeout
	ConnCalls                       // too many calls before an authenticated one
	numConnReasons
)

var connReasonNames = [numConnReasons]string{"limit", "handshake", "calls"}

// OtherMethod is the method label of calls to methods the Set was not told
// about (see New): unknown names are never copied into labels.
const OtherMethod = "other"

// Buckets are the upper bounds, in seconds, of the RPC duration histogram.
// Streams (Attach, Exec, Forward) can last as long as their process, hence
// the long tail.
var Buckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}

// codeNames are the gRPC status codes by number (google.golang.org/grpc/codes,
// whose String gives these names); the package takes codes as numbers so it
// needs no gRPC import.
var codeNames = [...]string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
	"Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}

// Set holds the daemon's metrics. It is safe for concurrent use; a nil *Set
// records nothing.
type Set struct {
	version string
	running func() int
	// methods maps a full method name ("/pkg.Service/Method") to its label
	// ("pkg.Service/Method"); see KnownMethods.
	methods atomic.Pointer[map[string]string]

	started     atomic.Uint64
	output      [numStreams]atomic.Uint64
	stdin       atomic.Uint64
	fileRead    atomic.Uint64
	fileWritten atomic.Uint64
	workspace   [numWorkspaceOps]atomic.Uint64
	auth        [numReasons]atomic.Uint64
	connsOpen   atomic.Int64
	connRefused [numConnReasons]atomic.Uint64

	// rpc holds one histogram per method label and code, made on first use.
	rpc sync.Map // rpcKey -> *histogram
}

type rpcKey struct {
	method string
	code   uint32
}

// histogram is a fixed-bucket histogram updated with atomics.
type histogram struct {
	counts  []atomic.Uint64 // per bucket (not cumulative), then +Inf
	sumBits atomic.Uint64   // float64 bits of the sum of observations
}

// New returns a Set that reads the running-process count from running
// (nil: 0). version is the build_info label. Tell it the methods to label
// with KnownMethods.
func New(version string, running func() int) *Set {
	return &Set{version: version, running: running}
}

// KnownMethods sets the full method names ("/bulkhead.agentd.v1.ProcessService/Start",
// as grpc.Server's GetServiceInfo lists them) that ObserveRPC labels by
// name; calls to any other name are labelled OtherMethod.
func (s *Set) KnownMethods(methods []string) {
	if s == nil {
		return
	}
	m := make(map[string]string, len(methods))
	for _, name := range methods {
		m[name] = strings.TrimPrefix(name, "/")
	}
	s.methods.Store(&m)
}

// ProcessStarted counts a started process.
func (s *Set) ProcessStarted() {
	if s != nil {
		s.started.Add(1)
	}
}

// OutputBytes counts process output delivered to a client.
func (s *Set) OutputBytes(stream Stream, n int) {
	if s != nil && n > 0 && stream >= 0 && stream < numStreams {
		s.output[stream].Add(uint64(n))
	}
}

// StdinBytes counts stdin received for a process.
func (s *Set) StdinBytes(n int) {
	if s != nil && n > 0 {
		s.stdin.Add(uint64(n))
	}
}

// FileReadBytes counts file bytes sent to a client.
func (s *Set) FileReadBytes(n int) {
	if s != nil && n > 0 {
		s.fileRead.Add(uint64(n))
	}
}

// FileWrittenBytes counts file bytes received from a client.
func (s *Set) FileWrittenBytes(n int) {
	if s != nil && n > 0 {
		s.fileWritten.Add(uint64(n))
	}
}

// WorkspaceBytes counts the bytes of an archive sent, or of a restore or
// materialization received.
func (s *Set) WorkspaceBytes(op WorkspaceOp, n int) {
	if s != nil && n > 0 && op >= 0 && op < numWorkspaceOps {
		s.workspace[op].Add(uint64(n))
	}
}

// AuthRejected counts a call refused for its token.
func (s *Set) AuthRejected(r AuthReason) {
	if s != nil && r >= 0 && r < numReasons {
		s.auth[r].Add(1)
	}
}

// ConnOpened counts a connection accepted; ConnClosed one that ended.
func (s *Set) ConnOpened() {
	if s != nil {
		s.connsOpen.Add(1)
	}
}

// ConnClosed counts a connection that ConnOpened counted and that ended.
func (s *Set) ConnClosed() {
	if s != nil {
		s.connsOpen.Add(-1)
	}
}

// ConnRefused counts a connection the daemon closed unserved.
func (s *Set) ConnRefused(r ConnReason) {
	if s != nil && r >= 0 && r < numConnReasons {
		s.connRefused[r].Add(1)
	}
}

// ObserveRPC records one finished call: its full method name, its gRPC
// status code (as a number) and how long it took.
func (s *Set) ObserveRPC(fullMethod string, code uint32, d time.Duration) {
	if s == nil {
		return
	}
	var label string
	ok := false
	if m := s.methods.Load(); m != nil {
		label, ok = (*m)[fullMethod]
	}
	if !ok {
		label = OtherMethod
	}
	if int(code) >= len(codeNames) {
		code = 2 // Unknown
	}
	k := rpcKey{label, code}
	v, ok := s.rpc.Load(k)
	if !ok {
		v, _ = s.rpc.LoadOrStore(k, &histogram{counts: make([]atomic.Uint64, len(Buckets)+1)})
	}
	v.(*histogram).observe(d.Seconds())
}

func (h *histogram) observe(v float64) {
	i, _ := slices.BinarySearch(Buckets, v) // first bound >= v: le is inclusive
	h.counts[i].Add(1)
	for {
		old := h.sumBits.Load()
		if h.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// ContentType is the media type of WriteText's output (the Prometheus text
// format, version 0.0.4).
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// WriteText writes every metric in the Prometheus text format.
func (s *Set) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	e := &encoder{w: bw}
	running := 0
	if s.running != nil {
		running = s.running()
	}
	e.family("bulkhead_agentd_processes_running", "gauge", "Processes started and not yet exited.")
	e.sample("bulkhead_agentd_processes_running", nil, float64(running))
	e.family("bulkhead_agentd_processes_started_total", "counter", "Processes started (Start and Exec).")
	e.sample("bulkhead_agentd_processes_started_total", nil, float64(s.started.Load()))
	e.family("bulkhead_agentd_process_output_bytes_total", "counter", "Process output delivered to clients (ReadOutput, Attach, Exec), by stream.")
	for i, name := range streamNames {
		e.sample("bulkhead_agentd_process_output_bytes_total", []string{"stream", name}, float64(s.output[i].Load()))
	}
	e.family("bulkhead_agentd_process_stdin_bytes_total", "counter", "Process stdin received (WriteStdin, Exec).")
	e.sample("bulkhead_agentd_process_stdin_bytes_total", nil, float64(s.stdin.Load()))
	e.family("bulkhead_agentd_file_read_bytes_total", "counter", "File bytes sent by ReadFile.")
	e.sample("bulkhead_agentd_file_read_bytes_total", nil, float64(s.fileRead.Load()))
	e.family("bulkhead_agentd_file_written_bytes_total", "counter", "File bytes received by WriteFile.")
	e.sample("bulkhead_agentd_file_written_bytes_total", nil, float64(s.fileWritten.Load()))
	e.family("bulkhead_agentd_workspace_bytes_total", "counter", "Workspace stream bytes: archives sent, restores and materializations received, by op.")
	for i, name := range workspaceOpNames {
		e.sample("bulkhead_agentd_workspace_bytes_total", []string{"op", name}, float64(s.workspace[i].Load()))
	}
	e.family("bulkhead_agentd_auth_rejected_total", "counter", "Calls refused for their bearer token, by reason.")
	for i, name := range reasonNames {
		e.sample("bulkhead_agentd_auth_rejected_total", []string{"reason", name}, float64(s.auth[i].Load()))
	}
	e.family("bulkhead_agentd_connections_open", "gauge", "Connections accepted and not yet closed.")
	e.sample("bulkhead_agentd_connections_open", nil, float64(s.connsOpen.Load()))
	e.family("bulkhead_agentd_connections_refused_total", "counter", "Connections the daemon closed unserved, by reason.")
	for i, name := range connReasonNames {
		e.sample("bulkhead_agentd_connections_refused_total", []string{"reason", name}, float64(s.connRefused[i].Load()))
	}
	s.writeRPC(e)
	e.family("bulkhead_agentd_build_info", "gauge", "The daemon's version; always 1.")
	e.sample("bulkhead_agentd_build_info", []string{"version", s.version}, 1)
	e.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
	e.sample("process_resident_memory_bytes", nil, float64(residentBytes()))
	e.family("go_goroutines", "gauge", "Number of goroutines that currently exist.")
	e.sample("go_goroutines", nil, float64(runtime.NumGoroutine()))
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

func (s *Set) writeRPC(e *encoder) {
	const name = "bulkhead_agentd_rpc_duration_seconds"
	type entry struct {
		k rpcKey
		h *histogram
	}
	var all []entry
	s.rpc.Range(func(k, v any) bool {
		all = append(all, entry{k.(rpcKey), v.(*histogram)})
		return true
	})
	slices.SortFunc(all, func(a, b entry) int {
		if c := strings.Compare(a.k.method, b.k.method); c != 0 {
			return c
		}
		return int(a.k.code) - int(b.k.code)
	})
	e.family(name, "histogram", "Duration of finished gRPC calls, by method and status code.")
	for _, en := range all {
		method, code := en.k.method, codeNames[en.k.code]
		// Read the buckets once; the count is their sum, so the
		// exposition is consistent even while calls are recorded.
		var cum uint64
		for i, b := range Buckets {
			cum += en.h.counts[i].Load()
			e.sample(name+"_bucket", []string{"method", method, "code", code, "le", formatFloat(b)}, float64(cum))
		}
		cum += en.h.counts[len(Buckets)].Load()
		e.sample(name+"_bucket", []string{"method", method, "code", code, "le", "+Inf"}, float64(cum))
		e.sample(name+"_sum", []string{"method", method, "code", code}, math.Float64frombits(en.h.sumBits.Load()))
		e.sample(name+"_count", []string{"method", method, "code", code}, float64(cum))
	}
}

// encoder writes the text format, remembering the first write error.
type encoder struct {
	w   *bufio.Writer
	err error
}

func (e *encoder) family(name, typ, help string) {
	e.write("# HELP ", name, " ", help, "\n# TYPE ", name, " ", typ, "\n")
}

// sample writes one line; labels are name, value pairs.
func (e *encoder) sample(name string, labels []string, v float64) {
	e.write(name)
	for i := 0; i+1 < len(labels); i += 2 {
		sep := ","
		if i == 0 {
			sep = "{"
		}
		e.write(sep, labels[i], `="`, escapeLabel(labels[i+1]), `"`)
	}
	if len(labels) > 0 {
		e.write("}")
	}
	e.write(" ", formatFloat(v), "\n")
}

func (e *encoder) write(parts ...string) {
	for _, p := range parts {
		if e.err != nil {
			return
		}
		_, e.err = e.w.WriteString(p)
	}
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(v string) string { return labelEscaper.Replace(v) }

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// residentBytes reads the process's resident set size from /proc (0 where
// there is none).
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}
