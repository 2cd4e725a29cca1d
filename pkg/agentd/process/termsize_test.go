package process

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// TestTerminalSize checks the one size check of Start and Resize: each
// dimension up to MaxTerminalDimension as given, zero as the default for
// Start and refused for Resize, and anything above the bound refused
// (never truncated) with the field and the bound named.
func TestTerminalSize(t *testing.T) {
	type size struct{ rows, cols uint32 }
	for _, c := range []struct {
		in       size
		start    size   // what Start uses; zero: refused
		resize   size   // what Resize applies; zero: refused
		badField string // the field a refusal names, when both refuse
	}{
		{size{65535, 65535}, size{65535, 65535}, size{65535, 65535}, ""},
		{size{1, 1}, size{1, 1}, size{1, 1}, ""},
		{size{0, 0}, size{24, 80}, size{}, ""},
		{size{0, 100}, size{24, 100}, size{}, ""},
		{size{30, 0}, size{30, 80}, size{}, ""},
		{size{65536, 80}, size{}, size{}, "size.rows"},
		{size{70000, 80}, size{}, size{}, "size.rows"},
		{size{24, 65536}, size{}, size{}, "size.cols"},
		{size{24, math.MaxUint32}, size{}, size{}, "size.cols"},
		{size{math.MaxUint32, math.MaxUint32}, size{}, size{}, "size.rows"},
	} {
		for _, mode := range []struct {
			name          string
			zeroIsDefault bool
			want          size
		}{{"start", true, c.start}, {"resize", false, c.resize}} {
			r, col, err := terminalSize(c.in.rows, c.in.cols, mode.zeroIsDefault)
			if mode.want == (size{}) {
				if !errors.Is(err, errkind.ErrInvalidArgument) {
					t.Errorf("%s %dx%d: got %dx%d, %v; want ErrInvalidArgument", mode.name, c.in.rows, c.in.cols, r, col, err)
					continue
				}
				if c.badField != "" && (!strings.Contains(err.Error(), c.badField) || !strings.Contains(err.Error(), "65535")) {
					t.Errorf("%s %dx%d: %q does not name %s and the bound 65535", mode.name, c.in.rows, c.in.cols, err, c.badField)
				}
				continue
			}
			if err != nil || uint32(r) != mode.want.rows || uint32(col) != mode.want.cols {
				t.Errorf("%s %dx%d: got %dx%d, %v; want %dx%d", mode.name, c.in.rows, c.in.cols, r, col, err, mode.want.rows, mode.want.cols)
			}
		}
	}
}

// TestStartAndResizeRefuseTheSameSizes runs both checks through the
// Manager: a size Start refuses starts nothing, and Resize refuses it too.
func TestStartAndResizeRefuseTheSameSizes(t *testing.T) {
	m := newTestManager(t, Config{})
	info := mustStart(t, m, StartOptions{Command: "read x", TTY: true, Rows: 65535, Cols: 65535})
	for _, bad := range [][2]uint32{{70000, 80}, {80, math.MaxUint32}, {65536, 65536}} {
		_, err := m.Start(testCtx(t), StartOptions{Argv: []string{"true"}, TTY: true, Rows: bad[0], Cols: bad[1]})
		wantErr(t, err, errkind.ErrInvalidArgument, "65535")
		wantErr(t, m.Resize(info.ID, bad[0], bad[1]), errkind.ErrInvalidArgument, "65535")
	}
	wantErr(t, m.Resize(info.ID, 0, 80), errkind.ErrInvalidArgument, "size.rows")
	if n := len(m.List()); n != 1 {
		t.Errorf("%d processes, want only the one started", n)
	}
	if err := m.Resize(info.ID, 1, 1); err != nil {
		t.Fatal(err)
	}
}
