package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	bh "github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// newScriptedModel starts a scripted Responses server and returns it with a
// model (the real openai-go client) talking to it.
func newScriptedModel(t *testing.T, turns ...replay.Turn) (*replay.Server, model.Model) {
	t.Helper()
	srv := replay.NewServer(turns...)
	t.Cleanup(srv.Close)
	m, err := model.NewOpenAI(model.Config{Model: "e2e-model", APIKey: "x", BaseURL: srv.URL(),
		Retry: model.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return srv, m
}

// callOutputs maps call ids to the tool outputs a request carried.
func callOutputs(r *replay.Request) map[string]string {
	out := map[string]string{}
	for _, o := range r.InputOfType("function_call_output") {
		s, _ := o["output"].(string)
		id, _ := o["call_id"].(string)
		out[id] = s
	}
	for _, o := range r.InputOfType("custom_tool_call_output") {
		s, _ := o["output"].(string)
		id, _ := o["call_id"].(string)
		out[id] = s
	}
	return out
}

// ownedSession creates and starts a session the test owns (deleted at
// cleanup), for injecting into runs.
func ownedSession(t *testing.T, ctx context.Context, c *compute.Client, opts compute.CreateOptions) *compute.Session {
	t.Helper()
	s, err := c.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Delete(ctx, s); err != nil {
			t.Errorf("delete session %s: %v", s.ID(), err)
		}
	})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// replStep is one exchange with an interactive program: the characters
// written to its terminal, and what its output must show (since the write)
// before the next step is sent.
type replStep struct {
	name  string
	chars string
	want  *regexp.Regexp
	// exits: the program ends with this step (its output says "Process
	// exited with code 0").
	exits bool
}

var (
	sessionIDRE  = regexp.MustCompile(`(?m)^Process running with session ID (\d+)$`)
	exitedCodeRE = regexp.MustCompile(`(?m)^Process exited with code (-?\d+)$`)
)

// replDriver plays the model for an interactive session: its first turn
// starts cmd with exec_command tty=true; every later turn reads the output
// of the previous call from the request, and sends the next step's
// characters with write_stdin once the current step's output showed what
// it wants, or polls (an empty write_stdin) while it has not yet. It gives
// up (a final message) after a few polls of one step.
type replDriver struct {
	cmd   string
	steps []replStep

	mu      sync.Mutex
	t       *testing.T
	step    int               // the step whose output is awaited; -1: the start
	acc     map[int]string    // output seen per step
	calls   map[string]int    // call id -> step
	session string            // the running session id
	polls   int               // polls of the current step
	done    bool              // the final message was sent
	problem string            // why it gave up
	order   []string          // call ids in order
	outputs map[string]string // call id -> output, as the model got it
}

const replMaxPolls = 4

func newReplDriver(t *testing.T, cmd string, steps []replStep) *replDriver {
	return &replDriver{t: t, cmd: cmd, steps: steps, step: -1, acc: map[int]string{}, calls: map[string]int{}, outputs: map[string]string{}}
}

// respond computes the model's next turn from the request.
func (d *replDriver) respond(req *replay.Request) replay.Turn {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.order) == 0 {
		id := "call_start"
		d.calls[id], d.order = 0, append(d.order, id)
		args, _ := json.Marshal(map[string]any{"cmd": d.cmd, "tty": true, "yield_time_ms": 1000})
		return replay.Turn{Items: []replay.Item{replay.FunctionCall(id, "exec_command", string(args))}}
	}
	last := d.order[len(d.order)-1]
	out, ok := callOutputs(req)[last]
	if !ok {
		return d.giveUp(fmt.Sprintf("the request lacks the output of %s", last))
	}
	d.outputs[last] = out
	st := d.calls[last]
	d.acc[st] += shellOutputBody(out)
	if m := sessionIDRE.FindStringSubmatch(out); m != nil {
		d.session = m[1]
	}
	exited := exitedCodeRE.FindStringSubmatch(out)
	cur := d.steps[st]
	switch {
	case cur.want != nil && !cur.want.MatchString(d.acc[st]) || cur.exits && exited == nil:
		if exited != nil {
			return d.giveUp(fmt.Sprintf("step %q: the program exited (code %s) before its output showed %v", cur.name, exited[1], cur.want))
		}
		if d.polls++; d.polls > replMaxPolls {
			return d.giveUp(fmt.Sprintf("step %q: no %v in its output after %d polls", cur.name, cur.want, replMaxPolls))
		}
		return d.write(st, "")
	case cur.exits:
		d.done = true
		return replay.Turn{Items: []replay.Item{replay.Message("the session ended")}}
	case exited != nil:
		return d.giveUp(fmt.Sprintf("step %q: the program exited early (code %s)", cur.name, exited[1]))
	}
	if st+1 >= len(d.steps) {
		return d.giveUp("the script ended without an exit step")
	}
	d.polls = 0
	return d.write(st+1, d.steps[st+1].chars)
}

// write sends chars to the session as step st.
func (d *replDriver) write(st int, chars string) replay.Turn {
	id := fmt.Sprintf("call_%d_%d", st, len(d.order))
	d.calls[id], d.order = st, append(d.order, id)
	sid, _ := strconv.Atoi(d.session)
	args, _ := json.Marshal(map[string]any{"session_id": sid, "chars": chars, "yield_time_ms": 700})
	return replay.Turn{Items: []replay.Item{replay.FunctionCall(id, "write_stdin", string(args))}}
}

func (d *replDriver) giveUp(why string) replay.Turn {
	d.problem, d.done = why, true
	return replay.Turn{Items: []replay.Item{replay.Message("giving up: " + why)}}
}

// transcript describes every call and its output, for failure messages.
func (d *replDriver) transcript() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	for _, id := range d.order {
		fmt.Fprintf(&b, "--- %s (step %q)\n%s\n", id, d.steps[d.calls[id]].name, d.outputs[id])
	}
	return b.String()
}

// shellOutputBody returns the program output of an exec_command/write_stdin
// result (what follows the "Output:" header line).
func shellOutputBody(s string) string {
	if _, after, ok := strings.Cut(s, "\nOutput:\n"); ok {
		return after
	}
	return ""
}

// runRepl drives cmd through steps in sess with the Shell capability and
// returns the driver, having checked that the run ended with every step
// done.
func runRepl(t *testing.T, ctx context.Context, sess *compute.Session, cmd string, steps []replStep) *replDriver {
	t.Helper()
	srv, m := newScriptedModel(t)
	d := newReplDriver(t, cmd, steps)
	srv.SetFallback(d.respond)
	a := &bh.Agent{Name: "repl", Instructions: "Work in the terminal."}
	res, err := (&bh.Runner{Model: m, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}).Run(ctx, a, "use the shell",
		bh.RunConfig{MaxTurns: 2 + len(steps)*(replMaxPolls+1), Sandbox: &bh.SandboxConfig{Session: sess}})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, d.transcript())
	}
	if d.problem != "" || res.FinalOutput != "the session ended" {
		t.Fatalf("the run ended with %q: %s\n%s", res.FinalOutput, d.problem, d.transcript())
	}
	if err := srv.Err(); err != nil {
		t.Fatal(err)
	}
	// What the model was sent is what the driver saw: check it against the
	// last request's conversation, call by call.
	reqs := srv.Requests()
	sent := callOutputs(reqs[len(reqs)-1])
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range d.order {
		if sent[id] != d.outputs[id] {
			t.Fatalf("the conversation's output of %s differs from what the driver saw:\n%q\n%q", id, sent[id], d.outputs[id])
		}
	}
	return d
}

// stepOutput returns everything the model got for step name.
func (d *replDriver) stepOutput(name string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, s := range d.steps {
		if s.name == name {
			return d.acc[i]
		}
	}
	return ""
}

// callsOf returns the outputs of the calls made for step name.
func (d *replDriver) callsOf(name string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, id := range d.order {
		if d.steps[d.calls[id]].name == name {
			out = append(out, d.outputs[id])
		}
	}
	return out
}

// TestInteractive is scenario 4: exec_command with tty=true starts an
// interactive shell; write_stdin sends it input (arithmetic answered in the
// output), starts a long sleep and interrupts it with Ctrl-C (the shell
// survives and reports the sleep was killed by SIGINT), then exits. The
// model's turns are computed from the outputs it received. Where the
// sandbox has python3 (the full Docker image, a local host with it on the
// sandbox's PATH), a Python REPL goes through the same motions.
func TestInteractive(t *testing.T) {
	for _, p := range providers() {
		t.Run(p.name, func(t *testing.T) {
			p.skip(t)
			t.Parallel()
			ctx := ctxT(t)
			client := p.client(t, stateDir(t), nil, materializer.Options{})
			sess := ownedSession(t, ctx, client, compute.CreateOptions{})
			t.Run("sh", func(t *testing.T) {
				d := runRepl(t, ctx, sess, "sh -i", []replStep{
					{name: "start"},
					{name: "arithmetic", chars: "echo $((6*7))\n", want: regexp.MustCompile(`(?m)^42\r?$`)},
					{name: "sleep", chars: "echo started-$((3*4)); sleep 100\n", want: regexp.MustCompile(`(?m)^started-12\r?$`)},
					{name: "ctrl-c", chars: "\u0003"},
					{name: "status", chars: "echo status=$?\n", want: regexp.MustCompile(`(?m)^status=130\r?$`)},
					{name: "exit", chars: "exit\n", exits: true},
				})
				// Every call before exit found the shell running, under one
				// session id; the exit ended it with code 0.
				for _, step := range []string{"start", "arithmetic", "sleep", "ctrl-c", "status"} {
					for _, out := range d.callsOf(step) {
						if m := sessionIDRE.FindStringSubmatch(out); m == nil || m[1] != d.session {
							t.Errorf("step %s: the shell is not running under session %s:\n%s", step, d.session, out)
						}
					}
				}
				exits := d.callsOf("exit")
				if m := exitedCodeRE.FindStringSubmatch(exits[len(exits)-1]); m == nil || m[1] != "0" {
					t.Errorf("exit: %q", exits[len(exits)-1])
				}
				// The sleep never finished: after Ctrl-C the next command's
				// status was 130 (killed by SIGINT), checked by the driver.
				if out := d.stepOutput("arithmetic"); !strings.Contains(out, "echo $((6*7))") {
					t.Errorf("the terminal did not echo the input: %q", out)
				}
			})
			t.Run("python", func(t *testing.T) {
				psess := sess
				if p.name == "docker" {
					// The small image has only busybox; the full one has Python.
					psess = ownedSession(t, ctx, client, compute.CreateOptions{ProviderOptions: &docker.CreateOptions{Image: "bulkhead/sandbox-full:dev"}})
				}
				res, err := psess.Exec(ctx, compute.ProcessSpec{Command: "command -v python3", Login: true}, compute.ExecOptions{}, nil)
				if err != nil {
					t.Fatal(err)
				}
				testenv.Require(t, testenv.Condition(res.Exit.ExitCode == 0, "python3 is not on this sandbox's PATH"))
				runRepl(t, ctx, psess, "python3 -q -i", []replStep{
					{name: "start", want: regexp.MustCompile(`>>> $`)},
					{name: "arithmetic", chars: "6*7\n", want: regexp.MustCompile(`(?m)^42\r?$`)},
					{name: "sleep", chars: "import time; print('sleeping', 3*4); time.sleep(100)\n", want: regexp.MustCompile(`(?m)^sleeping 12\r?$`)},
					{name: "ctrl-c", chars: "\u0003", want: regexp.MustCompile(`KeyboardInterrupt`)},
					{name: "after", chars: "print('after', 40+2)\n", want: regexp.MustCompile(`(?m)^after 42\r?$`)},
					{name: "exit", chars: "exit()\n", exits: true},
				})
			})
		})
	}
}
