package server

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
)

// BenchmarkStreamOutput streams a process's output through the daemon to a
// client over a real unix socket.
func BenchmarkStreamOutput(b *testing.B) {
	const size = 256 << 20
	td := newTestDaemon(b, nil)
	ctx := b.Context()
	b.SetBytes(size)
	for b.Loop() {
		st, err := td.client.Start(ctx, sh("head -c 268435456 /dev/zero"), agentclient.StartOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var got, dropped int64
		if _, err := td.client.Follow(ctx, st.Process.ProcessID, agentclient.FollowOptions{}, func(m *agentclient.Output) error {
			for _, c := range m.Chunks {
				got += int64(len(c.Data))
			}
			dropped += m.DroppedBytes
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(dropped)/float64(size)*100, "%dropped")
	}
}

// BenchmarkExecTrue is the full round trip of a one-shot command through the
// daemon: Exec /bin/true over a real unix socket until its exit arrives.
func BenchmarkExecTrue(b *testing.B) {
	td := newTestDaemon(b, nil)
	ctx := b.Context()
	for b.Loop() {
		res, err := td.client.Exec(ctx, agentclient.ProcessSpec{Argv: []string{"/bin/true"}}, agentclient.ExecOptions{}, nil)
		if err != nil || res.Exit.ExitCode != 0 {
			b.Fatal(err, res.Exit)
		}
	}
}

// BenchmarkDirectExecTrue is the baseline: os/exec of /bin/true.
func BenchmarkDirectExecTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteFile streams 256 MiB from a file on disk into the workspace.
func BenchmarkWriteFile(b *testing.B) {
	const size = 256 << 20
	td := newTestDaemon(b, nil)
	src := filepath.Join(b.TempDir(), "src")
	if err := os.WriteFile(src, bytes.Repeat([]byte("0123456789abcdef"), size/16), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	for b.Loop() {
		f, err := os.Open(src)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := td.client.WriteFile(b.Context(), "big", agentclient.WriteFileOptions{}, f); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkReadFile streams 256 MiB out of the workspace into a file on disk.
func BenchmarkReadFile(b *testing.B) {
	const size = 256 << 20
	td := newTestDaemon(b, nil)
	if err := os.WriteFile(filepath.Join(td.workspace, "big"), bytes.Repeat([]byte("0123456789abcdef"), size/16), 0o644); err != nil {
		b.Fatal(err)
	}
	dst := filepath.Join(b.TempDir(), "dst")
	b.SetBytes(size)
	for b.Loop() {
		f, err := os.Create(dst)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := td.client.ReadFile(b.Context(), "big", agentclient.ReadFileOptions{}, f); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkCopyFile is the baseline: io.Copy between two files on the same disk.
func BenchmarkCopyFile(b *testing.B) {
	const size = 256 << 20
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, bytes.Repeat([]byte("0123456789abcdef"), size/16), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	for b.Loop() {
		in, _ := os.Open(src)
		out, _ := os.Create(filepath.Join(dir, "dst"))
		if _, err := io.Copy(out, in); err != nil {
			b.Fatal(err)
		}
		in.Close()
		out.Close()
	}
}
