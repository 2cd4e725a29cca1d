package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mobyclient "github.com/moby/moby/client"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/internal/testing/faultnet"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/docker"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/remote"
	bh "github.com/bulkhead-dev/bulkhead/pkg/harness"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// sandboxPlace is what a provider state says about where a sandbox's
// daemon is: the local provider's private directory, or the Docker
// provider's container and the key of its private directory.
type sandboxPlace struct {
	Dir         string `json:"dir"`          // local
	ContainerID string `json:"container_id"` // docker
	Key         string `json:"key"`          // docker
}

func placeOf(t *testing.T, s *compute.Session) sandboxPlace {
	t.Helper()
	st, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	var pl sandboxPlace
	if err := json.Unmarshal(st.ProviderState, &pl); err != nil {
		t.Fatal(err)
	}
	return pl
}

// daemonSocket returns the host path of a sandbox's daemon socket and of
// the harness-side copy of its token (both providers keep them on the
// host; the Docker one bind-mounts the socket's directory).
func daemonSocket(p provider, dir string, pl sandboxPlace) (socket, tokenFile string) {
	priv := pl.Dir
	if p.name == "docker" {
		priv = filepath.Join(dir, "docker", pl.Key)
	}
	return filepath.Join(priv, "run", "agentd.sock"), filepath.Join(priv, "token")
}

// faultClient returns a library client for p with its state under dir,
// and, for Docker, the provider (for the Engine API).
func faultClient(t *testing.T, p provider, dir string) (*compute.Client, *docker.Provider) {
	t.Helper()
	if p.name != "docker" {
		return p.client(t, dir, nil, materializer.Options{}), nil
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	dp, err := docker.New(dockerConfig(dir), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	return compute.NewClient(dp, compute.ClientOptions{Log: log}), dp
}

// processesWith lists live processes whose command line contains marker.
func processesWith(marker string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(marker)) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				continue
			}
		}
		out = append(out, pid)
	}
	return out
}

// killLocalDaemon SIGKILLs the sandbox-agentd serving socket (under
// bubblewrap a child of bwrap, not the pid the provider records).
func killLocalDaemon(t *testing.T, socket string) {
	t.Helper()
	agentd := agentdtest.Binaries(t).Agentd
	for _, pid := range processesWith(socket) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if argv0, _, _ := bytes.Cut(cmdline, []byte{0}); string(argv0) == agentd {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no sandbox-agentd serves %s", socket)
}

// TestFaultDaemonKilledDuringRun is scenario 6a: the sandbox's daemon is
// SIGKILLed (a local process, or the container's init through the Engine
// API's ContainerKill) while a tool call runs `sleep 30`. The run fails
// with an error that is compute.ErrUnavailable and names the tool call
// that lost it (its wording is the transport's: see the known gap logged); the runner's cleanup still
// removes the sandbox (nothing of the session is listed afterwards, the
// container is gone).
func TestFaultDaemonKilledDuringRun(t *testing.T) {
	for _, p := range providers() {
		t.Run(p.name, func(t *testing.T) {
			p.skip(t)
			t.Parallel()
			ctx := ctxT(t)
			dir := stateDir(t)
			client, dp := faultClient(t, p, dir)
			marker := fmt.Sprintf("e2e-fault-%d", time.Now().UnixNano())
			t.Cleanup(func() {
				// A plain local sandbox's processes that print nothing
				// outlive a SIGKILLed daemon (no pid namespace); end them.
				for _, pid := range processesWith(marker) {
					t.Logf("a sandbox process outlived the daemon (pid %d): killing it", pid)
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})

			srv, m := newScriptedModel(t, replay.Turn{Items: []replay.Item{replay.FunctionCall("call_sleep", "exec_command",
				argsJSON(map[string]any{"cmd": "echo before-kill; sleep 30 # " + marker, "yield_time_ms": 30000}))}})
			var (
				mu   sync.Mutex
				sess *compute.Session
			)
			a := &bh.Agent{Name: "worker", Instructions: "Run what you are asked to.",
				DefaultManifest: &manifest.Manifest{Entries: map[string]*manifest.Entry{"notes.txt": {Type: manifest.TypeFile, Content: []byte("n\n")}}}}
			s := (&bh.Runner{Model: m, Log: zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))}).RunStreamed(ctx, a, "sleep a while",
				bh.RunConfig{Sandbox: &bh.SandboxConfig{Client: client, OnSession: func(_ context.Context, s *compute.Session) error {
					mu.Lock()
					defer mu.Unlock()
					sess = s
					return nil
				}}})
			var out bytes.Buffer
			killed := false
			for ev := range s.Events() {
				if ev.Kind != bh.EventToolOutput || killed {
					continue
				}
				out.Write(ev.Output)
				if !strings.Contains(out.String(), "before-kill\n") {
					continue
				}
				// The command runs and the tool call waits for it: kill.
				killed = true
				mu.Lock()
				pl := placeOf(t, sess)
				mu.Unlock()
				if dp != nil {
					if _, err := dp.API().ContainerKill(ctx, pl.ContainerID, mobyclient.ContainerKillOptions{Signal: "KILL"}); err != nil {
						t.Fatal(err)
					}
				} else {
					socket, _ := daemonSocket(p, dir, pl)
					killLocalDaemon(t, socket)
				}
			}
			res, err := s.Wait()
			if !killed {
				t.Fatalf("the command's output never arrived (%q); run: %v", out.String(), err)
			}
			if err == nil {
				t.Fatalf("the run succeeded after its daemon was killed: %q", res.FinalOutput)
			}
			t.Logf("run error: %v", err)
			if !errors.Is(err, compute.ErrUnavailable) || !strings.Contains(err.Error(), "tool exec_command") {
				t.Errorf("run error %v: want ErrUnavailable, naming the tool call", err)
			}
			if !strings.Contains(err.Error(), "unavailable") {
				// The sentinel is there for errors.Is, but the text is the
				// transport's own (agentclient shows the gRPC status message
				// without saying the sandbox is unavailable).
				t.Logf("known gap: the run error does not say the sandbox is unavailable: %v", err)
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				t.Errorf("the run ended by its context, not by the lost sandbox: %v", err)
			}
			if strings.Contains(err.Error(), "sandbox cleanup") {
				t.Errorf("the cleanup after the lost sandbox failed: %v", err)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Errorf("%d model requests after the sandbox was lost, want 1 (no turn after it)", n)
			}
			// Cleanup happened: nothing of the session is left.
			mu.Lock()
			id, pl := sess.ID(), placeOf(t, sess)
			mu.Unlock()
			infos, err := client.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range infos {
				if in.SessionID == id {
					t.Errorf("the sandbox of the failed run is still listed: %+v", in)
				}
			}
			if dp != nil {
				if _, err := dp.API().ContainerInspect(ctx, pl.ContainerID, mobyclient.ContainerInspectOptions{}); err == nil || !strings.Contains(strings.ToLower(err.Error()), "no such container") {
					t.Errorf("the container is still there: %v", err)
				}
			} else if _, err := os.Stat(pl.Dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the sandbox's directory is still there: %v", err)
			}
		})
	}
}

// gatedLines is a command printing line-1 ... line-<n>, stopping after each
// line in gates until the file gate-<line> exists in the workspace.
func gatedLines(n int, gates ...int) string {
	var conds []string
	for _, g := range gates {
		conds = append(conds, fmt.Sprintf("[ $i = %d ]", g))
	}
	return fmt.Sprintf("i=1; while [ $i -le %d ]; do echo line-$i; if %s; then while [ ! -e gate-$i ]; do sleep 0.05; done; fi; i=$((i+1)); done",
		n, strings.Join(conds, " || "))
}

// checkLines fails unless out is exactly line-1 ... line-n, each once, in order.
func checkLines(t *testing.T, what, out string, n int) {
	t.Helper()
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range got {
		if l != "line-"+strconv.Itoa(i+1) {
			t.Fatalf("%s: line %d is %q: output lost, repeated or out of order\n%s", what, i+1, l, out)
		}
	}
	if len(got) != n {
		t.Fatalf("%s: %d lines, want %d", what, len(got), n)
	}
}

// openGate creates gate-<n> in the workspace through agent.
func openGate(t *testing.T, ctx context.Context, s *compute.Session, n int) {
	t.Helper()
	if _, err := s.WriteFile(ctx, fmt.Sprintf("gate-%d", n), compute.WriteFileOptions{}, strings.NewReader("")); err != nil {
		t.Fatalf("open gate %d: %v", n, err)
	}
}

// TestFaultConnectionCut is scenario 6b. "proxy": a run works in a
// sandbox reached through pkg/compute/remote and a unix-socket proxy in
// front of the daemon (every provider's socket is on the host); while its
// exec_command waits for a long command, the proxy cuts every connection,
// twice; the harness reconnects through it and the model gets every line
// exactly once, in order, as do the streamed tool-output events.
// "resume": a harness reads a command's output from a cursor, drops its
// connection and session mid-way (Release), resumes the session from its
// state with a new client, and reads on from the cursor: nothing lost,
// nothing repeated.
func TestFaultConnectionCut(t *testing.T) {
	const lines = 300
	for _, p := range providers() {
		t.Run(p.name, func(t *testing.T) {
			p.skip(t)
			t.Parallel()
			t.Run("proxy", func(t *testing.T) {
				ctx := ctxT(t)
				dir := stateDir(t)
				client := p.client(t, dir, nil, materializer.Options{})
				direct := ownedSession(t, ctx, client, compute.CreateOptions{})
				socket, token := daemonSocket(p, dir, placeOf(t, direct))
				proxy := faultnet.Start(t, faultnet.Unix, "unix://"+socket)
				rc, err := remote.NewClient(remote.Config{Address: proxy.Address(), TokenFile: token},
					compute.ClientOptions{Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
				if err != nil {
					t.Fatal(err)
				}
				sess := ownedSession(t, ctx, rc, compute.CreateOptions{})

				srv, m := newScriptedModel(t, replay.Turn{Items: []replay.Item{replay.FunctionCall("call_lines", "exec_command",
					argsJSON(map[string]any{"cmd": gatedLines(lines, 100, 200), "yield_time_ms": 30000}))}})
				// Polls until the command exits (it normally does within
				// the first call's yield), then a final message.
				var pollMu sync.Mutex
				polls := 0
				srv.SetFallback(func(req *replay.Request) replay.Turn {
					pollMu.Lock()
					defer pollMu.Unlock()
					outs := callOutputs(req)
					last := "call_lines"
					if polls > 0 {
						last = fmt.Sprintf("call_poll_%d", polls)
					}
					if m := sessionIDRE.FindStringSubmatch(outs[last]); m != nil && polls < 5 {
						polls++
						return replay.Turn{Items: []replay.Item{replay.FunctionCall(fmt.Sprintf("call_poll_%d", polls), "write_stdin",
							fmt.Sprintf(`{"session_id":%s,"chars":"","yield_time_ms":30000}`, m[1]))}}
					}
					return replay.Turn{Items: []replay.Item{replay.Message("all lines read")}}
				})
				s := (&bh.Runner{Model: m, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}).RunStreamed(ctx,
					&bh.Agent{Name: "reader"}, "print the lines", bh.RunConfig{Sandbox: &bh.SandboxConfig{Session: sess}})
				var streamed bytes.Buffer
				gates := []int{100, 200}
				cuts := 0
				for ev := range s.Events() {
					if ev.Kind != bh.EventToolOutput {
						continue
					}
					streamed.Write(ev.Output)
					if len(gates) > 0 && strings.Contains(streamed.String(), fmt.Sprintf("line-%d\n", gates[0])) {
						// The command waits at its gate; the harness waits for
						// its output: cut, then let the command go on
						// (through the direct connection, not the proxy).
						cuts += proxy.Cut()
						openGate(t, ctx, direct, gates[0])
						gates = gates[1:]
					}
				}
				res, err := s.Wait()
				if err != nil {
					t.Fatalf("run across the cuts: %v", err)
				}
				if res.FinalOutput != "all lines read" {
					t.Fatalf("final %q", res.FinalOutput)
				}
				if len(gates) != 0 || cuts < 2 || proxy.Accepted() < 3 {
					t.Fatalf("gates left %v, connections cut %d, connections made %d: the cuts did not happen as planned", gates, cuts, proxy.Accepted())
				}
				reqs := srv.Requests()
				outs := callOutputs(reqs[len(reqs)-1])
				var got strings.Builder
				ids := []string{"call_lines"}
				pollMu.Lock()
				n := polls
				pollMu.Unlock()
				for i := 1; i <= n; i++ {
					ids = append(ids, fmt.Sprintf("call_poll_%d", i))
				}
				for _, id := range ids {
					got.WriteString(shellOutputBody(outs[id]))
				}
				if m := exitedCodeRE.FindStringSubmatch(outs[ids[len(ids)-1]]); m == nil || m[1] != "0" {
					t.Fatalf("the command did not end with code 0:\n%s", outs[ids[len(ids)-1]])
				}
				checkLines(t, "the output the model got", got.String(), lines)
				checkLines(t, "the streamed tool output", streamed.String(), lines)
			})
			t.Run("resume", func(t *testing.T) {
				ctx := ctxT(t)
				dir := stateDir(t)
				sess := ownedSession(t, ctx, p.client(t, dir, nil, materializer.Options{}), compute.CreateOptions{})
				st, err := sess.StartProcess(ctx, compute.ProcessSpec{Command: gatedLines(lines, 150)}, compute.StartOptions{})
				if err != nil {
					t.Fatal(err)
				}
				pid := st.Process.ProcessID
				var out bytes.Buffer
				var cursor int64
				// read reads from the cursor until the output holds want
				// (or the process exits when want is "").
				read := func(s *compute.Session, want string) {
					t.Helper()
					for {
						r, err := s.ReadOutput(ctx, pid, compute.ReadOutputOptions{Cursor: cursor, YieldTime: 2 * time.Second})
						if err != nil {
							t.Fatalf("read from %d: %v", cursor, err)
						}
						if r.DroppedBytes != 0 {
							t.Fatalf("%d bytes dropped", r.DroppedBytes)
						}
						for _, c := range r.Chunks {
							out.Write(c.Data)
						}
						cursor = r.NextCursor
						if want != "" && strings.Contains(out.String(), want) {
							return
						}
						if r.Exit != nil {
							if want != "" || r.Exit.ExitCode != 0 {
								t.Fatalf("exit %v before %q:\n%s", r.Exit, want, out.String())
							}
							return
						}
					}
				}
				read(sess, "line-150\n")
				state, err := sess.State()
				if err != nil {
					t.Fatal(err)
				}
				// The harness goes away: its connection is closed, the sandbox
				// keeps running.
				if err := sess.Release(); err != nil {
					t.Fatal(err)
				}
				// A new harness (a new client over the same state directory)
				// resumes the session and reads on from the cursor.
				s2, err := p.client(t, dir, nil, materializer.Options{}).Resume(ctx, state)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s2.Release() })
				// The same daemon answers: it still knows the process.
				openGate(t, ctx, s2, 150)
				read(s2, "")
				checkLines(t, "the output read across the resume", out.String(), lines)
			})
		})
	}
}
