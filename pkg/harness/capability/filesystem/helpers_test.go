package filesystem_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/bulkhead-dev/bulkhead/internal/testing/agentdtest"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability/filesystem"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// sandbox is a test daemon with the capability's tools.
type sandbox struct {
	t     *testing.T
	d     *agentdtest.Daemon
	tools map[string]tool.Tool
}

// newSandbox starts a daemon and builds the tools from opts.
func newSandbox(t *testing.T, opts filesystem.Options) *sandbox {
	t.Helper()
	s := &sandbox{t: t, d: agentdtest.Start(t, nil), tools: map[string]tool.Tool{}}
	for _, tl := range filesystem.New(opts).Clone().Tools(capability.Env{HasSession: true}) {
		s.tools[tl.Definition().Name] = tl
	}
	return s
}

// context is the tool context of a call in workdir.
func (s *sandbox) context(workdir string) tool.Context {
	return tool.Context{Agent: s.d.Client, Workdir: workdir, CallID: "call_1", Log: zaptest.NewLogger(s.t)}
}

// call runs the named tool in workdir and fails the test on a harness error.
func (s *sandbox) call(name, workdir, input string) tool.Result {
	s.t.Helper()
	res, err := s.tools[name].Call(context.Background(), s.context(workdir), input)
	if err != nil {
		s.t.Fatalf("%s: harness error: %v", name, err)
	}
	return res
}

// write creates a workspace file (and its parents) with content.
func (s *sandbox) write(rel, content string) {
	s.t.Helper()
	p := filepath.Join(s.d.Workspace, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// read returns a workspace file's content, or "<missing>".
func (s *sandbox) read(rel string) string {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.d.Workspace, filepath.FromSlash(rel)))
	if os.IsNotExist(err) {
		return "<missing>"
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return string(b)
}
