package shell

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// rpcLog records the daemon calls made through a client: one entry per
// unary call or stream opened, by method name ("Start", "Attach").
type rpcLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *rpcLog) add(method string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, path.Base(method))
}

// take returns the calls recorded since the last take.
func (l *rpcLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.calls
	l.calls = nil
	return c
}

// countCalls points h's tool calls at a second client of h's daemon whose
// calls are recorded.
func (h *harness) countCalls() *rpcLog {
	h.t.Helper()
	l := &rpcLog{}
	c, err := agentclient.Dial(agentclient.Options{
		Address: "unix://" + h.d.Socket, Token: agentdtest.Token,
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				l.add(method)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				l.add(method)
				return streamer(ctx, desc, cc, method, opts...)
			}),
		},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	// Closed after the Shell's Close (cleanups run last first), which
	// kills what is left through it.
	h.t.Cleanup(func() { c.Close() })
	h.call.Agent = c
	return l
}

// fiftyLines prints line1 to line50, 20 ms apart (a second in all).
const fiftyLines = `for i in $(seq 50); do echo line$i; sleep 0.02; done`

func fiftyLinesOutput() string {
	var sb strings.Builder
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&sb, "line%d\n", i)
	}
	return sb.String()
}

// A command whose output comes in 50 bursts within the yield time costs
// two round trips: Start and one Attach stream.
func TestExecIsTwoRoundTrips(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	calls := h.countCalls()
	res := h.exec(`{"cmd":"` + fiftyLines + `","yield_time_ms":20000,"login":false}`)
	want := testHeader + "Process exited with code 0\nOutput:\n" + fiftyLinesOutput()
	if res.Output != want || res.IsError {
		t.Errorf("got %q (error %v)\nwant %q", res.Output, res.IsError, want)
	}
	if got := calls.take(); !slices.Equal(got, []string{"Start", "Attach"}) {
		t.Errorf("exec_command made %d calls %v, want [Start Attach]", len(got), got)
	}
	if string(h.emits) != fiftyLinesOutput() {
		t.Errorf("progress %q", h.emits)
	}
	if n := len(h.s.procs); n != 0 {
		t.Errorf("%d processes in the table", n)
	}
}

// A command still running at the yield time returns what it printed so
// far and its session; one poll then returns exactly the rest and the
// exit, each call in one Attach stream.
func TestRunningIsTwoRoundTripsThenOne(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	calls := h.countCalls()
	first := parse(t, h.exec(`{"cmd":"`+fiftyLines+`","yield_time_ms":500,"login":false}`))
	if first.session != "1001" {
		t.Fatalf("not running after the yield time: %+v", first)
	}
	all := fiftyLinesOutput()
	if first.output == "" || first.output == all || !strings.HasPrefix(all, first.output) {
		t.Errorf("partial output %q is not a proper prefix of the whole", first.output)
	}
	if got := calls.take(); !slices.Equal(got, []string{"Start", "Attach"}) {
		t.Errorf("exec_command made %d calls %v, want [Start Attach]", len(got), got)
	}
	// The process is neither killed nor held back by the ended stream.
	if info := h.daemonState(1001); info == nil || info.Exit != nil && info.Exit.ExitCode != 0 {
		t.Fatalf("process after the yield: %+v", info)
	}

	rest := parse(t, h.write(`{"session_id":1001,"yield_time_ms":20000}`))
	if !rest.exited || rest.code != "0" {
		t.Fatalf("poll did not see the exit: %+v", rest)
	}
	if first.output+rest.output != all {
		t.Errorf("output across the calls %q, want %q", first.output+rest.output, all)
	}
	if got := calls.take(); !slices.Equal(got, []string{"Attach"}) {
		t.Errorf("the poll made %d calls %v, want [Attach]", len(got), got)
	}
	if string(h.emits) != all {
		t.Errorf("progress %q", h.emits)
	}
}

// write_stdin with input is WriteStdin plus one Attach stream.
func TestWriteIsTwoRoundTrips(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	calls := h.countCalls()
	p := parse(t, h.exec(`{"cmd":"read x; for i in 1 2 3 4 5; do echo got $x; sleep 0.02; done","tty":true,"yield_time_ms":250,"login":false}`))
	if p.session != "1001" {
		t.Fatalf("not running: %+v", p)
	}
	calls.take()
	w := parse(t, h.write(`{"session_id":1001,"chars":"hi\n","yield_time_ms":20000}`))
	if !w.exited || w.code != "0" {
		t.Fatalf("write_stdin did not see the exit: %+v", w)
	}
	if got, want := p.output+w.output, "hi\r\n"+strings.Repeat("got hi\r\n", 5); got != want {
		t.Errorf("output %q, want %q", got, want)
	}
	if got := calls.take(); !slices.Equal(got, []string{"WriteStdin", "Attach"}) {
		t.Errorf("write_stdin made %d calls %v, want [WriteStdin Attach]", len(got), got)
	}
}

// Ending the stream at the yield time lets the process run on: with a
// stall timeout far longer than the test, output past the daemon's small
// buffer would block the process for good if the ended stream still held
// it back.
func TestYieldReleasesTheProcess(t *testing.T) {
	h := newHarness(t, Options{}, func(c *agentd.Config) {
		c.OutputBufferBytes = 4096
		c.FollowerStallTimeout = time.Hour
	})
	p := parse(t, h.exec(`{"cmd":"while [ ! -f gate ]; do sleep 0.02; done; head -c 100000 /dev/zero | tr '\\0' x; echo; touch done; while [ ! -f gate2 ]; do sleep 0.02; done","yield_time_ms":250,"login":false}`))
	if p.session != "1001" || p.output != "" {
		t.Fatalf("first response %+v", p)
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(h.d.Workspace, "done")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process is held back after exec_command returned")
		}
		time.Sleep(10 * time.Millisecond)
	}
	out := parse(t, h.write(`{"session_id":1001,"yield_time_ms":0}`)).output
	if !strings.HasPrefix(out, "\n[") || !strings.Contains(out, " bytes of output were lost") || !strings.HasSuffix(out, "xxx\n") {
		t.Errorf("poll after the overflow: %.200q", out)
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate2"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.pollUntilExit("1001", "")
}
