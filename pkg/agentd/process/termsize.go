package process

import (
	"math"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// MaxTerminalDimension is the most rows, or columns, a terminal may have:
// the kernel keeps each in 16 bits (struct winsize). Start and Resize
// refuse a larger size rather than truncate it.
const MaxTerminalDimension = math.MaxUint16

// Default terminal size when StartOptions leave a dimension zero.
const (
	defaultRows = 24
	defaultCols = 80
)

// terminalSize is the one check of a terminal size a caller asked for,
// used by Start (zeroIsDefault: a zero dimension takes its default, 24
// rows or 80 columns) and by Resize (a zero dimension is refused). It
// returns the size in the kernel's 16-bit fields. A dimension out of range
// is errkind.ErrInvalidArgument naming the field (as the wire names it,
// size.rows or size.cols) and the bound; nothing is ever truncated.
func terminalSize(rows, cols uint32, zeroIsDefault bool) (r, c uint16, err error) {
	dim := func(field string, v uint32, def uint16) (uint16, error) {
		switch {
		case v == 0 && zeroIsDefault:
			return def, nil
		case v > MaxTerminalDimension && zeroIsDefault:
			return 0, errkind.Errorf(errkind.ErrInvalidArgument, "terminal %s %d is above the maximum %d (0 takes the default %d)", field, v, MaxTerminalDimension, def)
		case v == 0 || v > MaxTerminalDimension:
			return 0, errkind.Errorf(errkind.ErrInvalidArgument, "terminal %s %d is out of range 1 to %d", field, v, MaxTerminalDimension)
		}
		return uint16(v), nil
	}
	if r, err = dim("size.rows", rows, defaultRows); err != nil {
		return 0, 0, err
	}
	if c, err = dim("size.cols", cols, defaultCols); err != nil {
		return 0, 0, err
	}
	return r, c, nil
}
