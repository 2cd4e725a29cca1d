package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// badSize is a terminal size to refuse and the field the error names.
type badSize struct {
	rows, cols uint32
	field      string
}

// badTerminalSizes are sizes Start and Resize must both refuse, with the
// field they must name. 65535 (the kernel's 16 bits) is the largest
// dimension; nothing may be truncated to fit.
var badTerminalSizes = []badSize{
	{65536, 80, "size.rows"},
	{24, 65536, "size.cols"},
	{70000, 80, "size.rows"},
	{math.MaxUint32, 80, "size.rows"},
	{24, math.MaxUint32, "size.cols"},
	{math.MaxUint32, math.MaxUint32, "size.rows"},
}

// wantSizeRefused checks that err is InvalidArgument naming field and the
// bound, 65535.
func wantSizeRefused(t *testing.T, what string, err error, field string) {
	t.Helper()
	if !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Errorf("%s: want ErrInvalidArgument, got %v", what, err)
		return
	}
	if msg := err.Error(); !strings.Contains(msg, field) || !strings.Contains(msg, "65535") {
		t.Errorf("%s: error %q does not name %s and the bound 65535", what, msg, field)
	}
}

// ttyOutput starts command on a terminal of rows x cols through Start,
// lets it run to its end, and returns its output without carriage returns.
func ttyOutput(t *testing.T, c *agentclient.Client, command string, rows, cols uint32) string {
	t.Helper()
	ctx := ctxT(t)
	st, err := c.Start(ctx, agentclient.ProcessSpec{Command: command, Tty: true, Size: agentclient.TerminalSize{Rows: rows, Cols: cols}}, agentclient.StartOptions{})
	if err != nil {
		t.Fatalf("start %dx%d: %v", rows, cols, err)
	}
	id := st.Process.ProcessID
	if _, err := c.Wait(ctx, id); err != nil {
		t.Fatal(err)
	}
	out, err := c.ReadOutput(ctx, id, agentclient.ReadOutputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, ch := range out.Chunks {
		b.Write(ch.Data)
	}
	return strings.ReplaceAll(b.String(), "\r", "")
}

// TestStartTerminalSize checks Start's and Exec's terminal size over the
// API: each dimension up to 65535 is used as given, zero takes the
// default (24 rows, 80 columns), and 65536, 70000 or 2^32-1 is refused as
// InvalidArgument naming the field and the bound, with nothing started
// (before, 70000 rows became 65535 and 2^32-1 columns 65535).
func TestStartTerminalSize(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	for _, c := range []struct {
		rows, cols uint32
		want       string
	}{
		{65535, 65535, "65535 65535\n"},
		{1, 1, "1 1\n"},
		{0, 0, "24 80\n"},
		{0, 100, "24 100\n"},
		{30, 0, "30 80\n"},
	} {
		if got := ttyOutput(t, td.client, "stty size", c.rows, c.cols); got != c.want {
			t.Errorf("Start %dx%d: stty size says %q, want %q", c.rows, c.cols, got, c.want)
		}
	}
	for _, c := range badTerminalSizes {
		spec := agentclient.ProcessSpec{Command: "touch started", Tty: true, Size: agentclient.TerminalSize{Rows: c.rows, Cols: c.cols}}
		_, err := td.client.Start(ctx, spec, agentclient.StartOptions{})
		wantSizeRefused(t, "Start "+sizeString(c.rows, c.cols), err, c.field)
		_, err = td.client.Exec(ctx, spec, agentclient.ExecOptions{}, nil)
		wantSizeRefused(t, "Exec "+sizeString(c.rows, c.cols), err, c.field)
	}
	list, err := td.client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		if strings.Contains(strings.Join(p.Argv, " "), "touch started") {
			t.Errorf("a refused size started a process: %v", p)
		}
	}
}

// TestResizeTerminalSize checks Resize over the API with the same sizes
// as TestStartTerminalSize: 65535 and 1 are applied as given; 0 (which has
// no default here), 65536, 70000 and 2^32-1 are refused as InvalidArgument
// naming the field and the bound, and leave the terminal as it was.
func TestResizeTerminalSize(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	st, err := td.client.Start(ctx, agentclient.ProcessSpec{Command: "while read line; do stty size; done", Tty: true, Size: agentclient.TerminalSize{Rows: 30, Cols: 100}}, agentclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.Process.ProcessID
	t.Cleanup(func() {
		_ = td.client.Signal(context.Background(), id, "KILL")
	})
	resize := func(rows, cols uint32) error {
		err := td.client.Resize(ctx, id, agentclient.TerminalSize{Rows: rows, Cols: cols})
		return err
	}
	var stdin, cursor int64
	var out string // output not yet looked at, carriage returns removed
	// size asks the shell for the terminal's size and returns stty's
	// answer, "rows cols".
	size := func() string {
		t.Helper()
		res, err := td.client.WriteStdin(ctx, id, stdin, []byte("\n"))
		if err != nil {
			t.Fatal(err)
		}
		stdin = res
		for {
			if m := sttySize.FindStringSubmatchIndex(out); m != nil {
				line := out[m[2]:m[3]]
				out = out[m[1]:]
				return line
			}
			r, err := td.client.ReadOutput(ctx, id, agentclient.ReadOutputOptions{Cursor: cursor, YieldTime: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range r.Chunks {
				out += strings.ReplaceAll(string(ch.Data), "\r", "")
			}
			cursor = r.NextCursor
		}
	}
	refused := func() {
		t.Helper()
		zero := []badSize{{0, 80, "size.rows"}, {24, 0, "size.cols"}, {0, 0, "size.rows"}}
		for _, c := range slices.Concat(badTerminalSizes, zero) {
			wantSizeRefused(t, "Resize "+sizeString(c.rows, c.cols), resize(c.rows, c.cols), c.field)
		}
	}

	if got := size(); got != "30 100" {
		t.Fatalf("size at start: %q, want 30 100", got)
	}
	if err := resize(65535, 65535); err != nil {
		t.Fatalf("Resize 65535x65535: %v", err)
	}
	refused()
	if got := size(); got != "65535 65535" {
		t.Errorf("size after Resize 65535x65535 and the refused ones: %q", got)
	}
	if err := resize(1, 1); err != nil {
		t.Fatalf("Resize 1x1: %v", err)
	}
	refused()
	if got := size(); got != "1 1" {
		t.Errorf("size after Resize 1x1 and the refused ones: %q", got)
	}
}

// sttySize matches a line of stty size's output.
var sttySize = regexp.MustCompile(`(?m)^([0-9]+ [0-9]+)\n`)

func sizeString(rows, cols uint32) string { return fmt.Sprintf("%dx%d", rows, cols) }
