package shell

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testenv"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// Fixed volatile parts of the output in tests.
const (
	testChunkID = "c0ffee"
	testHeader  = "Chunk ID: c0ffee\nWall time: 1.2345 seconds\n"
)

// harness is a Shell on an in-process daemon with deterministic output
// headers (chunk ID, wall time, and session IDs 1001, 1002, ...).
type harness struct {
	t     *testing.T
	s     *Shell
	d     *agentdtest.Daemon
	call  tool.Context
	mu    sync.Mutex
	emits []byte
}

func newHarness(t *testing.T, opts Options, mutate func(*agentd.Config)) *harness {
	t.Helper()
	d := agentdtest.Start(t, mutate)
	s := newShell(opts.withDefaults())
	s.chunkID = func() string { return testChunkID }
	s.elapsed = func(time.Time) time.Duration { return 1234500 * time.Microsecond }
	next := 1000
	s.sessionID = func() int { next++; return next } // called under s.mu
	s.pollMin = 300 * time.Millisecond               // keeps polls of running processes short
	h := &harness{t: t, s: s, d: d}
	h.call = tool.Context{Agent: d.Client, Log: zaptest.NewLogger(t), CallID: "call-1"}
	h.call.Emit = func(p tool.Progress) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.emits = append(h.emits, p.Output...)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

// exec calls exec_command with args (a JSON object).
func (h *harness) exec(args string) tool.Result {
	h.t.Helper()
	return h.callTool(execTool{h.s}, h.call, args)
}

// write calls write_stdin with args.
func (h *harness) write(args string) tool.Result {
	h.t.Helper()
	return h.callTool(writeTool{h.s}, h.call, args)
}

func (h *harness) callTool(tl tool.Tool, call tool.Context, args string) tool.Result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := tl.Call(ctx, call, args)
	if err != nil {
		h.t.Fatalf("%s(%s): %v", tl.Definition().Name, args, err)
	}
	return res
}

var responseRE = regexp.MustCompile(`^Chunk ID: c0ffee\nWall time: 1\.2345 seconds\n` +
	`(?:Process exited with code (-?\d+)\n|Process running with session ID (\d+)\n)` +
	`(?:Original token count: \d+\n)?Output:\n`)

// parsed is a formatted response taken apart.
type parsed struct {
	exited  bool
	code    string
	session string
	output  string
}

func parse(t *testing.T, res tool.Result) parsed {
	t.Helper()
	m := responseRE.FindStringSubmatchIndex(res.Output)
	if m == nil {
		t.Fatalf("response does not have the expected header:\n%s", res.Output)
	}
	sub := func(i int) string {
		if m[2*i] < 0 {
			return ""
		}
		return res.Output[m[2*i]:m[2*i+1]]
	}
	return parsed{exited: m[2] >= 0, code: sub(1), session: sub(2), output: res.Output[m[1]:]}
}

// pollUntilExit polls session until its process exits and returns all the
// output seen and the last response.
func (h *harness) pollUntilExit(session, chars string) (string, parsed) {
	h.t.Helper()
	var all strings.Builder
	quoted, _ := json.Marshal(chars)
	args := fmt.Sprintf(`{"session_id":%s,"chars":%s}`, session, quoted)
	for i := 0; i < 100; i++ {
		p := parse(h.t, h.write(args))
		all.WriteString(p.output)
		if p.exited {
			return all.String(), p
		}
		if p.session != session {
			h.t.Fatalf("session changed: %q", p.session)
		}
		args = fmt.Sprintf(`{"session_id":%s}`, session)
	}
	h.t.Fatal("the process did not exit")
	return "", parsed{}
}

func TestDefinitions(t *testing.T) {
	s := New(Options{})
	if s.Name() != "shell" {
		t.Errorf("Name = %q", s.Name())
	}
	if tools := s.Tools(capability.Env{}); tools != nil {
		t.Errorf("tools without a session: %v", tools)
	}
	tools := s.Tools(capability.Env{HasSession: true})
	if len(tools) != 2 {
		t.Fatalf("%d tools", len(tools))
	}
	exec, write := tools[0].Definition(), tools[1].Definition()
	if exec.Name != "exec_command" || write.Name != "write_stdin" || exec.Kind != "function" || write.Kind != "function" {
		t.Fatalf("tools %q %q", exec.Name, write.Name)
	}
	if exec.Strict || write.Strict {
		t.Error("schemas are strict; the reference's are not (optional parameters have defaults)")
	}
	if exec.Description != "Runs a shell command in the sandbox and returns its output, or, when it is still running after the yield time, a session ID for further interaction with write_stdin." {
		t.Errorf("exec description %q", exec.Description)
	}
	if write.Description != "Writes characters to a running exec_command session and returns the output it produced since the last call." {
		t.Errorf("write description %q", write.Description)
	}
	wantExec := `{"type":"object","properties":{` +
		`"cmd":{"type":"string","minLength":1,"description":"The shell command to run."},` +
		`"workdir":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"description":"Directory to run the command in: relative to the current working directory, or absolute inside the workspace. Defaults to the current working directory."},` +
		`"shell":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"description":"Shell program that runs the command. Defaults to the sandbox's default shell."},` +
		`"login":{"type":"boolean","default":true,"description":"Run the shell as a login shell (-l). Defaults to true."},` +
		`"tty":{"type":"boolean","default":false,"description":"Run the command in a pseudo-terminal, so that write_stdin can send it input and Ctrl-C. Defaults to false (plain pipes, no input)."},` +
		`"yield_time_ms":{"type":"integer","minimum":0,"default":10000,"description":"How long to wait, in milliseconds, for the command to finish before returning the output so far."},` +
		`"max_output_tokens":{"anyOf":[{"type":"integer","minimum":1},{"type":"null"}],"default":null,"description":"Most tokens of output to return; the middle of longer output is cut out."}` +
		`},"required":["cmd"]}`
	if string(exec.Parameters) != wantExec {
		t.Errorf("exec_command schema:\n got %s\nwant %s", exec.Parameters, wantExec)
	}
	wantWrite := `{"type":"object","properties":{` +
		`"session_id":{"type":"integer","description":"The session ID exec_command returned for the running command."},` +
		`"chars":{"type":"string","default":"","description":"Characters to write to the command's terminal; empty to only poll for new output."},` +
		`"yield_time_ms":{"type":"integer","minimum":0,"default":250,"description":"How long to wait, in milliseconds, for output before returning."},` +
		`"max_output_tokens":{"anyOf":[{"type":"integer","minimum":1},{"type":"null"}],"default":null,"description":"Most tokens of output to return; the middle of longer output is cut out."}` +
		`},"required":["session_id"]}`
	if string(write.Parameters) != wantWrite {
		t.Errorf("write_stdin schema:\n got %s\nwant %s", write.Parameters, wantWrite)
	}
	for _, def := range []json.RawMessage{exec.Parameters, write.Parameters} {
		if !json.Valid(def) {
			t.Errorf("invalid JSON: %s", def)
		}
	}
	// Configured defaults show in the schema.
	custom := New(Options{ExecYield: 2 * time.Second, WriteYield: time.Second}).Tools(capability.Env{HasSession: true})
	if !strings.Contains(string(custom[0].Definition().Parameters), `"default":2000`) ||
		!strings.Contains(string(custom[1].Definition().Parameters), `"default":1000`) {
		t.Error("configured yield defaults are not in the schemas")
	}
}

func TestInstructions(t *testing.T) {
	got := New(Options{}).Instructions(capability.Env{HasSession: true})
	want := "When using the shell:\n" +
		"- Run shell commands with `exec_command`.\n" +
		"- Use `write_stdin`, when available, to send input to a session that is still running or to poll it for more output.\n" +
		"- To be able to interrupt a long-running command, start it with `tty=true`; then send Ctrl-C (`\\u0003`) with `write_stdin`.\n" +
		"- To search text or list files, prefer `rg` and `rg --files` where they are installed.\n" +
		"- Do not write Python scripts only to print large parts of files."
	if got != want {
		t.Errorf("instructions:\n%s", got)
	}
	m := New(Options{})
	if pm, err := m.ProcessManifest(nil); pm != nil || err != nil {
		t.Errorf("ProcessManifest = %v, %v", pm, err)
	}
}

func TestExecExited(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	res := h.exec(`{"cmd":"printf 'hello\\nworld\\n'; exit 3","login":false}`)
	want := testHeader + "Process exited with code 3\nOutput:\nhello\nworld\n"
	if res.Output != want || res.IsError {
		t.Errorf("got %q (error %v)\nwant %q", res.Output, res.IsError, want)
	}
	if string(h.emits) != "hello\nworld\n" {
		t.Errorf("progress = %q", h.emits)
	}
	// Standard error is part of the output.
	res = h.exec(`{"cmd":"echo oops >&2","login":false}`)
	if want := testHeader + "Process exited with code 0\nOutput:\noops\n"; res.Output != want {
		t.Errorf("got %q, want %q", res.Output, want)
	}
	// A login shell (the default) and no output.
	res = h.exec(`{"cmd":"true"}`)
	if want := testHeader + "Process exited with code 0\nOutput:\n"; res.Output != want {
		t.Errorf("got %q, want %q", res.Output, want)
	}
	// The exited process left the table.
	if n := len(h.s.procs); n != 0 {
		t.Errorf("%d processes in the table", n)
	}
}

func TestRunningThenPolls(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	res := h.exec(`{"cmd":"echo start; while [ ! -f gate ]; do sleep 0.02; done; echo done","yield_time_ms":300}`)
	if !strings.HasPrefix(res.Output, testHeader+"Process running with session ID 1001\nOutput:\n") {
		t.Fatalf("got %q", res.Output)
	}
	seen := parse(t, res).output
	// Poll until the first line is there, then open the gate.
	for !strings.Contains(seen, "start") {
		p := parse(t, h.write(`{"session_id":1001,"yield_time_ms":0}`))
		if p.exited {
			t.Fatalf("exited early: %+v", p)
		}
		seen += p.output
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, last := h.pollUntilExit("1001", "")
	if seen+rest != "start\ndone\n" {
		t.Errorf("output = %q", seen+rest)
	}
	if last.code != "0" || last.session != "" {
		t.Errorf("last response %+v", last)
	}
	// The session is gone after its exit was reported.
	res = h.write(`{"session_id":1001}`)
	if want := testHeader + "Process exited with code 1\nOutput:\nwrite_stdin failed: PTY session not found: 1001"; res.Output != want || !res.IsError {
		t.Errorf("got %q", res.Output)
	}
}

func TestPTYInput(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	p := parse(t, h.exec(`{"cmd":"read x; echo got $x","tty":true,"yield_time_ms":250,"login":false}`))
	if p.session != "1001" {
		t.Fatalf("not running: %+v", p)
	}
	out, last := h.pollUntilExit("1001", "hello\n")
	out = p.output + out
	if out != "hello\r\ngot hello\r\n" || last.code != "0" {
		t.Errorf("output %q, exit %q", out, last.code)
	}
}

func TestPTYCtrlC(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	p := parse(t, h.exec(`{"cmd":"sleep 100","tty":true,"yield_time_ms":250,"login":false}`))
	if p.session != "1001" {
		t.Fatalf("not running: %+v", p)
	}
	_, last := h.pollUntilExit("1001", "\u0003")
	if last.code != "130" { // 128 + SIGINT
		t.Errorf("exit code %q", last.code)
	}
}

func TestTruncation(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	// 30 bytes, 5 lines; 2 tokens = 8 bytes: 4 of head, 4 of tail.
	res := h.exec(`{"cmd":"printf 'line1\\nline2\\nline3\\nline4\\nline5\\n'","max_output_tokens":2,"login":false}`)
	want := testHeader + "Process exited with code 0\nOriginal token count: 8\nOutput:\n" +
		"Total output lines: 5\n\nline…6 tokens truncated…ne5\n"
	if res.Output != want {
		t.Errorf("got %q\nwant %q", res.Output, want)
	}
	// Output within the budget is untouched and has no token count.
	res = h.exec(`{"cmd":"printf 'line1\\nline2\\nline3\\nline4\\nline5\\n'","max_output_tokens":8,"login":false}`)
	if want := testHeader + "Process exited with code 0\nOutput:\nline1\nline2\nline3\nline4\nline5\n"; res.Output != want {
		t.Errorf("got %q", res.Output)
	}
}

func TestRender(t *testing.T) {
	cases := []struct {
		name      string
		in        string
		maxTokens int
		want      string
		original  int
	}{
		{"none", "abc", 0, "abc", 0},
		{"fits", "abcdefgh", 2, "abcdefgh", 0},
		{"ascii", "abcdefghij", 2, "Total output lines: 1\n\nabcd…1 tokens truncated…ghij", 3},
		// Cuts fall on character boundaries: é is 2 bytes.
		{"utf8", "ééééé", 1, "Total output lines: 1\n\né…2 tokens truncated…é", 3},
		{"utf8 odd", "aéééé", 1, "Total output lines: 1\n\na…2 tokens truncated…é", 3},
		// Lines are counted as Python's splitlines does.
		{"lines", "a\r\nb\rc\n\nd" + strings.Repeat("x", 20), 1, "Total output lines: 5\n\na\r…7 tokens truncated…xx", 8},
		{"empty", "", 1, "", 0},
	}
	for _, c := range cases {
		col := newCollector(1 << 20)
		col.add([]byte(c.in))
		got := render(col, c.maxTokens, ApproxTokens)
		if got.text != c.want || got.originalTokens != c.original {
			t.Errorf("%s: got %q (%d), want %q (%d)", c.name, got.text, got.originalTokens, c.want, c.original)
		}
	}
	// A custom estimator: 2 bytes per token.
	col := newCollector(1 << 20)
	col.add([]byte("abcdefghij"))
	got := render(col, 2, func(n int) int { return (n + 1) / 2 })
	if got.text != "Total output lines: 1\n\nab…3 tokens truncated…ij" || got.originalTokens != 5 {
		t.Errorf("custom estimator: %q %d", got.text, got.originalTokens)
	}
	// Invalid UTF-8 becomes U+FFFD.
	col = newCollector(1 << 20)
	col.add([]byte("a\xffb"))
	if got := render(col, 0, ApproxTokens); got.text != "a\uFFFDb" {
		t.Errorf("invalid UTF-8: %q", got.text)
	}
}

func TestCollectorOverflow(t *testing.T) {
	// A collector keeps head and tail of output beyond its limit and
	// renders it as the whole output truncated to the limit would be.
	var all strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&all, "line %04d\n", i)
	}
	whole := all.String() // 10000 bytes
	col := newCollector(100)
	for i := 0; i < len(whole); i += 7 {
		col.add([]byte(whole[i:min(i+7, len(whole))]))
	}
	if len(col.head)+len(col.tail) > 300 {
		t.Errorf("collector keeps %d bytes", len(col.head)+len(col.tail))
	}
	got := render(col, 0, ApproxTokens)
	ref := newCollector(1 << 20)
	ref.add([]byte(whole))
	want := render(ref, 25, ApproxTokens) // 25 tokens = the 100 byte limit
	if got != want {
		t.Errorf("overflow render:\n got %q\nwant %q", got.text, want.text)
	}
	// With a smaller max_output_tokens that one applies.
	if got, want := render(col, 5, ApproxTokens), render(ref, 5, ApproxTokens); got != want {
		t.Errorf("overflow render with max tokens:\n got %q\nwant %q", got.text, want.text)
	}
}

func TestIncompleteRuneHeldBack(t *testing.T) {
	col := newCollector(1 << 20)
	col.add([]byte("ab\xe2\x82")) // "€" is e2 82 ac
	if n := col.unreadIncompleteRune(); n != 2 {
		t.Fatalf("held back %d bytes", n)
	}
	if got := render(col, 0, ApproxTokens).text; got != "ab" {
		t.Errorf("text %q", got)
	}
	for _, c := range []struct {
		in   string
		want int
	}{{"", 0}, {"a", 0}, {"\xe2\x82\xac", 0}, {"\xe2", 1}, {"\xf0\x9f\x98", 3}, {"\xff", 0}, {"\x82", 0}} {
		if got := incompleteRuneTail([]byte(c.in)); got != c.want {
			t.Errorf("incompleteRuneTail(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestSplitRuneAcrossCalls(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	// The first two bytes of "€", then the last once the gate opens.
	res := h.exec(`{"cmd":"printf 'x\\342\\202'; while [ ! -f gate ]; do sleep 0.02; done; printf '\\254y'","yield_time_ms":250,"login":false}`)
	p := parse(t, res)
	seen := p.output
	for !strings.Contains(seen, "x") {
		seen += parse(t, h.write(`{"session_id":1001,"yield_time_ms":0}`)).output
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, _ := h.pollUntilExit("1001", "")
	if seen+rest != "x€y" {
		t.Errorf("output %q", seen+rest)
	}
}

func TestYieldClamps(t *testing.T) {
	for _, c := range []struct {
		in, exec, write, poll time.Duration
	}{
		{0, 250 * time.Millisecond, 350 * time.Millisecond, 5 * time.Second},
		{100 * time.Millisecond, 250 * time.Millisecond, 350 * time.Millisecond, 5 * time.Second},
		{time.Second, time.Second, 1100 * time.Millisecond, 5 * time.Second},
		{10 * time.Second, 10 * time.Second, 10100 * time.Millisecond, 10 * time.Second},
		{time.Hour, 30 * time.Second, 30100 * time.Millisecond, 30 * time.Second},
	} {
		if got := execWait(c.in); got != c.exec {
			t.Errorf("execWait(%s) = %s, want %s", c.in, got, c.exec)
		}
		if got := writeWait(c.in, true, MinPollYield); got != c.write {
			t.Errorf("writeWait(%s, input) = %s, want %s", c.in, got, c.write)
		}
		if got := writeWait(c.in, false, MinPollYield); got != c.poll {
			t.Errorf("writeWait(%s, poll) = %s, want %s", c.in, got, c.poll)
		}
	}
	// Huge and negative values from the model.
	h := newHarness(t, Options{}, nil)
	res := h.exec(`{"cmd":"echo hi","yield_time_ms":9223372036854775807,"login":false}`)
	if want := testHeader + "Process exited with code 0\nOutput:\nhi\n"; res.Output != want {
		t.Errorf("got %q", res.Output)
	}
	res = h.exec(`{"cmd":"echo hi","yield_time_ms":-1}`)
	if res.Output != "exec_command failed: yield_time_ms must be at least 0" || !res.IsError {
		t.Errorf("got %q", res.Output)
	}
	res = h.exec(`{"cmd":"echo hi","max_output_tokens":0}`)
	if res.Output != "exec_command failed: max_output_tokens must be at least 1" || !res.IsError {
		t.Errorf("got %q", res.Output)
	}
	// Integral floats and numeric strings are accepted, as by the reference.
	res = h.exec(`{"cmd":"echo hi","yield_time_ms":"1000","max_output_tokens":100.0,"login":false}`)
	if want := testHeader + "Process exited with code 0\nOutput:\nhi\n"; res.Output != want {
		t.Errorf("got %q", res.Output)
	}
}

func TestBadArguments(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	for _, c := range []struct {
		write bool
		args  string
		want  string
	}{
		{false, `{}`, "exec_command failed: cmd must not be empty"},
		{false, `{"cmd":1}`, "exec_command failed: cmd must be of type string"},
		{false, `{"cmd":`, "exec_command failed: invalid arguments: unexpected end of JSON input"},
		{true, `{}`, "write_stdin failed: session_id is required"},
		{true, `{"session_id":1.5}`, "write_stdin failed: invalid arguments: 1.5 is not an integer"},
	} {
		var res tool.Result
		if c.write {
			res = h.write(c.args)
		} else {
			res = h.exec(c.args)
		}
		if res.Output != c.want || !res.IsError {
			t.Errorf("%s: got %q", c.args, res.Output)
		}
	}
	// No sandbox.
	res := h.callTool(execTool{h.s}, tool.Context{Log: h.call.Log}, `{"cmd":"true"}`)
	if res.Output != "exec_command failed: this run has no sandbox to run commands in" {
		t.Errorf("got %q", res.Output)
	}
}

func TestUnknownSession(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	res := h.write(`{"session_id":4242,"chars":"x"}`)
	want := testHeader + "Process exited with code 1\nOutput:\nwrite_stdin failed: PTY session not found: 4242"
	if res.Output != want || !res.IsError {
		t.Errorf("got %q\nwant %q", res.Output, want)
	}
}

func TestWriteToNonTTY(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	p := parse(t, h.exec(`{"cmd":"sleep 100","yield_time_ms":250,"login":false}`))
	if p.session != "1001" {
		t.Fatalf("not running: %+v", p)
	}
	res := h.write(`{"session_id":1001,"chars":"hello\n"}`)
	want := testHeader + "Process exited with code 1\nOutput:\n" +
		"stdin is not available for this process. Start the command with `tty=true` in `exec_command` before using `write_stdin`."
	if res.Output != want || !res.IsError {
		t.Errorf("got %q\nwant %q", res.Output, want)
	}
	// The process still runs and can be polled.
	if p := parse(t, h.write(`{"session_id":1001,"yield_time_ms":0}`)); p.session != "1001" {
		t.Errorf("after the refused write: %+v", p)
	}
}

func TestWorkdir(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	for _, dir := range []string{"sub/inner", "file-dir"} {
		if err := os.MkdirAll(filepath.Join(h.d.Workspace, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "sub", "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pwd := func(call tool.Context, workdir string) tool.Result {
		t.Helper()
		args := `{"cmd":"pwd","login":false}`
		if workdir != "" {
			args = fmt.Sprintf(`{"cmd":"pwd","login":false,"workdir":%q}`, workdir)
		}
		return h.callTool(execTool{h.s}, call, args)
	}
	ws := h.d.Workspace
	inSub := h.call
	inSub.Workdir = "sub"
	for _, c := range []struct {
		call    tool.Context
		workdir string
		want    string
	}{
		{h.call, "", ws},
		{h.call, "sub", ws + "/sub"},
		{h.call, `sub\inner`, ws + "/sub/inner"},
		{inSub, "", ws + "/sub"},
		{inSub, "inner", ws + "/sub/inner"},
		{inSub, "..", ws},
		{inSub, "../file-dir", ws + "/file-dir"},
		{h.call, ws + "/sub", ws + "/sub"},
	} {
		res := pwd(c.call, c.workdir)
		if want := testHeader + "Process exited with code 0\nOutput:\n" + c.want + "\n"; res.Output != want {
			t.Errorf("workdir %q in %q: got %q, want %q", c.workdir, c.call.Workdir, res.Output, want)
		}
	}
	for _, c := range []struct {
		call    tool.Context
		workdir string
		want    string
	}{
		{h.call, "..", `exec_command failed: workdir ".." is outside the workspace`},
		{inSub, "../../x", `exec_command failed: workdir "../../x" is outside the workspace`},
		{h.call, "/etc", `exec_command failed: workdir "/etc" is outside the workspace`},
		{h.call, "missing", `exec_command failed: workdir "missing" does not exist`},
		{h.call, "sub/file", `exec_command failed: workdir "sub/file" is not a directory`},
	} {
		res := pwd(c.call, c.workdir)
		if res.Output != c.want || !res.IsError {
			t.Errorf("workdir %q in %q: got %q, want %q", c.workdir, c.call.Workdir, res.Output, c.want)
		}
		if strings.Contains(res.Output, ws) {
			t.Errorf("the message reveals the host path: %q", res.Output)
		}
	}
	if n := len(h.s.procs); n != 0 {
		t.Errorf("%d processes left in the table by failed starts", n)
	}
	// A missing shell.
	res := h.exec(`{"cmd":"true","shell":"/no/such/shell"}`)
	if res.Output != `exec_command failed: shell "/no/such/shell" does not exist in the sandbox` || !res.IsError {
		t.Errorf("got %q", res.Output)
	}
}

// daemonState returns the daemon's view of the process behind session.
func (h *harness) daemonState(session int) *agentclient.ProcessInfo {
	h.t.Helper()
	h.s.mu.Lock()
	p := h.s.procs[session]
	h.s.mu.Unlock()
	if p == nil {
		h.t.Fatalf("session %d is not in the table", session)
	}
	return h.info(p.pid)
}

func (h *harness) info(pid string) *agentclient.ProcessInfo {
	h.t.Helper()
	infos, err := h.d.Client.List(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	for _, in := range infos {
		if in.ProcessID == pid {
			return &in
		}
	}
	h.t.Fatalf("process %s unknown to the daemon", pid)
	return nil
}

func (h *harness) wait(pid string) *agentclient.ExitStatus {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waited, err := h.d.Client.Wait(ctx, pid)
	if err != nil {
		h.t.Fatal(err)
	}
	return waited
}

func TestTableLimit(t *testing.T) {
	h := newHarness(t, Options{MaxProcesses: 10}, nil)
	pids := map[int]string{}
	for i := 1; i <= 10; i++ {
		cmd := "sleep 100"
		if i == 3 {
			cmd = "while [ ! -f gate ]; do sleep 0.02; done"
		}
		p := parse(t, h.exec(fmt.Sprintf(`{"cmd":%q,"yield_time_ms":250,"login":false}`, cmd)))
		if want := fmt.Sprint(1000 + i); p.session != want {
			t.Fatalf("session %q, want %s", p.session, want)
		}
		h.s.mu.Lock()
		pids[1000+i] = h.s.procs[1000+i].pid
		h.s.mu.Unlock()
	}
	// Session 1001 is used again: 1002 is now the least recently used.
	if p := parse(t, h.write(`{"session_id":1001,"yield_time_ms":0}`)); p.session != "1001" {
		t.Fatalf("poll: %+v", p)
	}
	// 1003 exits without anyone reading it: it stays in the table.
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.wait(pids[1003])
	if len(h.s.procs) != 10 {
		t.Fatalf("%d processes", len(h.s.procs))
	}

	// The table is full: a new process drops the least recently used
	// process that has exited (1003), not the least recently used (1002).
	p := parse(t, h.exec(`{"cmd":"sleep 100","yield_time_ms":250,"login":false}`))
	if p.session != "1011" {
		t.Fatalf("new session %+v", p)
	}
	if res := h.write(`{"session_id":1003}`); !strings.Contains(res.Output, "PTY session not found: 1003") {
		t.Errorf("1003 was not dropped: %q", res.Output)
	}
	// Next, the least recently used one (1002), which is killed.
	p = parse(t, h.exec(`{"cmd":"sleep 100","yield_time_ms":250,"login":false}`))
	if p.session != "1012" {
		t.Fatalf("new session %+v", p)
	}
	if res := h.write(`{"session_id":1002}`); !strings.Contains(res.Output, "PTY session not found: 1002") {
		t.Errorf("1002 was not dropped: %q", res.Output)
	}
	if exit := h.wait(pids[1002]); exit.Signal != "SIGKILL" {
		t.Errorf("dropped process exit %v", exit)
	}
	if len(h.s.procs) != 10 {
		t.Errorf("%d processes", len(h.s.procs))
	}
	// The most recently used ones survive.
	for _, id := range []int{1001, 1004, 1010, 1011, 1012} {
		if h.daemonState(id).State != agentclient.ProcessRunning {
			t.Errorf("session %d is not running", id)
		}
	}
}

func TestCloseKillsWhatIsLeft(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	clone := h.s.Clone().(*Shell)
	if clone == h.s || len(clone.procs) != 0 {
		t.Fatal("Clone shares the table")
	}
	parse(t, h.exec(`{"cmd":"sleep 100","yield_time_ms":250,"login":false}`))
	parse(t, h.exec(`{"cmd":"sleep 100","tty":true,"yield_time_ms":250,"login":false}`))
	parse(t, h.exec(`{"cmd":"true","login":false}`)) // exited: not in the table
	var pids []string
	for _, p := range h.s.procs {
		pids = append(pids, p.pid)
	}
	if len(pids) != 2 {
		t.Fatalf("%d processes in the table", len(pids))
	}
	if err := h.s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if exit := h.wait(pid); exit.Signal != "SIGKILL" {
			t.Errorf("process %s: exit %v", pid, exit)
		}
	}
	if res := h.write(`{"session_id":1001}`); !strings.Contains(res.Output, "PTY session not found: 1001") {
		t.Errorf("after Close: %q", res.Output)
	}
	// A closed table starts nothing.
	if _, err := (execTool{h.s}).Call(context.Background(), h.call, `{"cmd":"true"}`); err == nil {
		t.Error("exec_command after Close succeeded")
	}
	if err := h.s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestRunAs(t *testing.T) {
	testenv.Require(t, testenv.Root)
	etc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(etc, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/sh\nagent:x:65534:65534:Agent:/nonexistent:/bin/sh\n",
		"group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(etc, "etc", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := newHarness(t, Options{}, func(c *agentd.Config) { c.EtcRoot = etc })
	// The test's temporary directories are private; let the user in.
	for dir := h.d.Workspace; dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	call := h.call
	call.RunAs = "agent"
	res := h.callTool(execTool{h.s}, call, `{"cmd":"id -u","login":false}`)
	if want := testHeader + "Process exited with code 0\nOutput:\n65534\n"; res.Output != want {
		t.Errorf("got %q, want %q", res.Output, want)
	}
	call.RunAs = "nobody-here"
	res = h.callTool(execTool{h.s}, call, `{"cmd":"id -u"}`)
	if res.Output != `exec_command failed: the user "nobody-here" that commands run as does not exist in the sandbox` {
		t.Errorf("got %q", res.Output)
	}
}

func TestOutputBetweenCallsIsKept(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	p := parse(t, h.exec(`{"cmd":"while [ ! -f gate ]; do sleep 0.02; done; echo produced-while-idle; while [ ! -f gate2 ]; do sleep 0.02; done","yield_time_ms":250,"login":false}`))
	if p.session != "1001" || p.output != "" {
		t.Fatalf("first response %+v", p)
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Wait, without the shell, until the daemon holds the output.
	h.s.mu.Lock()
	pid := h.s.procs[1001].pid
	h.s.mu.Unlock()
	for {
		r, err := h.d.Client.ReadOutput(context.Background(), pid, agentclient.ReadOutputOptions{YieldTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if r.NextCursor > 0 {
			break
		}
	}
	res := h.write(`{"session_id":1001}`)
	if want := testHeader + "Process running with session ID 1001\nOutput:\nproduced-while-idle\n"; res.Output != want {
		t.Errorf("got %q, want %q", res.Output, want)
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate2"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, last := h.pollUntilExit("1001", "")
	if rest != "" || last.code != "0" {
		t.Errorf("rest %q, last %+v", rest, last)
	}
	if string(h.emits) != "produced-while-idle\n" {
		t.Errorf("progress %q", h.emits)
	}
}

func TestDroppedOutputIsReported(t *testing.T) {
	h := newHarness(t, Options{}, func(c *agentd.Config) { c.OutputBufferBytes = 4096 })
	p := parse(t, h.exec(`{"cmd":"while [ ! -f gate ]; do sleep 0.02; done; head -c 20000 /dev/zero | tr '\\0' x; echo; while [ ! -f gate2 ]; do sleep 0.02; done","yield_time_ms":250,"login":false}`))
	if p.session != "1001" {
		t.Fatalf("first response %+v", p)
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.s.mu.Lock()
	pid := h.s.procs[1001].pid
	h.s.mu.Unlock()
	for {
		r, err := h.d.Client.ReadOutput(context.Background(), pid, agentclient.ReadOutputOptions{Cursor: 20000, YieldTime: time.Second})
		if err == nil && r.NextCursor >= 20001 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	res := h.write(`{"session_id":1001,"yield_time_ms":0}`)
	out := parse(t, res).output
	if !strings.HasPrefix(out, "\n[") || !strings.Contains(out, " bytes of output were lost: the sandbox's output buffer overflowed before they were read]\n") {
		t.Errorf("no drop notice: %.200q", out)
	}
	if !strings.HasSuffix(out, "xxx\n") {
		t.Errorf("output does not end with the latest bytes: %q", out[max(0, len(out)-50):])
	}
	if err := os.WriteFile(filepath.Join(h.d.Workspace, "gate2"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.pollUntilExit("1001", "")
}

func TestRandomIDs(t *testing.T) {
	for range 100 {
		if id := randomSessionID(); id < 1000 || id >= 100000 {
			t.Fatalf("session ID %d", id)
		}
		if id := randomChunkID(); !regexp.MustCompile(`^[0-9a-f]{6}$`).MatchString(id) {
			t.Fatalf("chunk ID %q", id)
		}
	}
}

func TestStdinOffsets(t *testing.T) {
	h := newHarness(t, Options{}, nil)
	p := parse(t, h.exec(`{"cmd":"stty -echo; cat","tty":true,"yield_time_ms":250,"login":false}`))
	if p.session != "1001" {
		t.Fatalf("not running: %+v", p)
	}
	// readUntil writes chars, then polls until the output contains want.
	readUntil := func(chars, want string) {
		t.Helper()
		quoted, _ := json.Marshal(chars)
		out := ""
		args := fmt.Sprintf(`{"session_id":1001,"chars":%s}`, quoted)
		for range 20 {
			p := parse(t, h.write(args))
			if p.exited {
				t.Fatalf("cat exited: %+v", p)
			}
			if out += p.output; strings.Contains(out, want) {
				return
			}
			args = `{"session_id":1001}`
		}
		t.Fatalf("output %q never contained %q", out, want)
	}
	h.s.mu.Lock()
	proc := h.s.procs[1001]
	h.s.mu.Unlock()

	readUntil("one\n", "one\r\n")
	if proc.stdin != 4 {
		t.Errorf("stdin offset %d after 4 bytes", proc.stdin)
	}
	// After a write that failed midway the offset is read back from the
	// daemon, so the next write is applied whole (written at offset 0 it
	// would be skipped as already applied).
	proc.stdin, proc.stdinUnknown = 0, true
	readUntil("two\n", "two\r\n")
	if proc.stdin != 8 || proc.stdinUnknown {
		t.Errorf("stdin offset %d (unknown %v)", proc.stdin, proc.stdinUnknown)
	}
	// Ctrl-D ends cat.
	if _, last := h.pollUntilExit("1001", "\u0004"); last.code != "0" {
		t.Errorf("exit %q", last.code)
	}
}
