package cli

// A progress bar for `harness sandbox cp`, drawn on stderr only when it is
// a terminal and only for transfers over progressMin bytes.

import (
	"fmt"
	"io"
	"strings"
	"time"
)

const (
	// progressMin is the size from which a transfer shows progress.
	progressMin = 1 << 20
	// progressEvery is the most often the bar is redrawn.
	progressEvery = 100 * time.Millisecond
	// progressWidth is the width of the bar itself, in cells.
	progressWidth = 24
)

// progress draws a transfer's progress: bytes done (and total, with a bar
// and a percentage, when it is known) and the rate. A nil *progress draws
// nothing, so callers need not check whether stderr is a terminal. It is
// used by one goroutine at a time.
type progress struct {
	w     io.Writer
	label string
	total int64 // -1 when unknown
	now   func() time.Time
	start time.Time
	drawn time.Time
	done  int64
	shown bool
}

// newProgress returns a progress bar on w when w is a terminal, else nil.
// total is -1 when the size is not known in advance.
func newProgress(w io.Writer, label string, total int64) *progress {
	if _, ok := fdOf(w); !ok {
		return nil
	}
	return startProgress(w, label, total, time.Now)
}

// startProgress returns a progress bar on w with the given clock.
func startProgress(w io.Writer, label string, total int64, now func() time.Time) *progress {
	return &progress{w: w, label: label, total: total, now: now, start: now()}
}

// add counts n more bytes and redraws when it is time.
func (p *progress) add(n int64) {
	if p == nil || n <= 0 {
		return
	}
	p.done += n
	if !p.large() {
		return
	}
	t := p.now()
	if p.shown && t.Sub(p.drawn) < progressEvery {
		return
	}
	p.draw(t)
}

// finish draws the final state and ends the line.
func (p *progress) finish() {
	if p == nil || !p.large() {
		return
	}
	p.draw(p.now())
	fmt.Fprint(p.w, "\n")
}

// large reports whether the transfer is big enough to show.
func (p *progress) large() bool {
	if p.total >= 0 {
		return p.total > progressMin
	}
	return p.done > progressMin
}

// draw redraws the line in place.
func (p *progress) draw(t time.Time) {
	p.shown, p.drawn = true, t
	var b strings.Builder
	b.WriteString(p.label)
	if p.total > 0 {
		frac := min(float64(p.done)/float64(p.total), 1)
		filled := int(frac * progressWidth)
		fmt.Fprintf(&b, " [%s%s] %s / %s %3d%%", strings.Repeat("#", filled), strings.Repeat(" ", progressWidth-filled),
			humanBytes(float64(p.done)), humanBytes(float64(p.total)), int(frac*100))
	} else {
		fmt.Fprintf(&b, " %s", humanBytes(float64(p.done)))
	}
	if el := t.Sub(p.start).Seconds(); el > 0 {
		fmt.Fprintf(&b, " %s/s", humanBytes(float64(p.done)/el))
	}
	// \r returns to the line's start; ESC[K clears what a longer line left.
	fmt.Fprintf(p.w, "\r%s\x1b[K", b.String())
}

// humanBytes formats a byte count with binary units.
func humanBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", n, units[i])
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// progressReader counts what is read through it.
type progressReader struct {
	r io.Reader
	p *progress
}

func (r progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.add(int64(n))
	return n, err
}

// progressWriter counts what is written through it.
type progressWriter struct {
	w io.Writer
	p *progress
}

func (w progressWriter) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	w.p.add(int64(n))
	return n, err
}
