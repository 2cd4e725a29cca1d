package process

import (
	"context"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
)

// attachYield is how long one Attach step waits for output before it
// waits again (nothing is delivered for an empty step).
const attachYield = 30 * time.Second

// attachBytes bounds the output delivered by one Attach callback.
const attachBytes = 256 << 10

// Read returns up to maxBytes of output from cursor (an absolute offset;
// 0 is the first byte ever written). It returns as soon as there is output
// at or after cursor, the process has exited, yield has passed (yield 0
// polls) or ctx is done (an error). maxBytes <= 0 means DefaultReadBytes.
// A cursor past the end of the output is a compute.ErrConflict.
func (m *Manager) Read(ctx context.Context, id string, cursor int64, yield time.Duration, maxBytes int) (ReadResult, error) {
	const op = "read"
	if cursor < 0 || yield < 0 {
		return ReadResult{}, procErrf(op, id, compute.ErrInvalidArgument, "negative cursor or yield")
	}
	p, err := m.lookup(op, id)
	if err != nil {
		return ReadResult{}, err
	}
	if maxBytes <= 0 {
		maxBytes = DefaultReadBytes
	}
	var timer <-chan time.Time
	for {
		p.mu.Lock()
		if cursor > p.out.end {
			end := p.out.end
			p.mu.Unlock()
			return ReadResult{}, procErrf(op, id, compute.ErrConflict, "cursor %d is past the end of the output (%d bytes so far)", cursor, end)
		}
		if cursor < p.out.end || p.exit != nil || yield == 0 {
			r := p.readLocked(cursor, maxBytes)
			p.mu.Unlock()
			return r, nil
		}
		changed := p.waitChanged()
		p.mu.Unlock()
		if timer == nil {
			t := time.NewTimer(yield)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-changed:
		case <-timer:
			yield = 0
		case <-ctx.Done():
			return ReadResult{}, procErr(op, id, ctxErr(ctx))
		}
	}
}

// readLocked builds a ReadResult from cursor; p.mu must be held.
func (p *proc) readLocked(cursor int64, maxBytes int) ReadResult {
	chunks, next, dropped := p.out.read(cursor, maxBytes)
	r := ReadResult{Chunks: chunks, NextCursor: next, Dropped: dropped, Exited: p.exit != nil}
	if p.exit != nil && next == p.out.end {
		e := *p.exit
		r.Exit = &e
	}
	return r
}

// Attach streams output from cursor to fn until the process has exited and
// all its output was delivered (the last call carries Exit), fn returns an
// error (returned as is) or ctx is done. fn is called only when there is
// something to deliver: output, dropped bytes or the exit.
func (m *Manager) Attach(ctx context.Context, id string, cursor int64, fn func(ReadResult) error) error {
	for {
		r, err := m.Read(ctx, id, cursor, attachYield, attachBytes)
		if err != nil {
			return err
		}
		if len(r.Chunks) > 0 || r.Dropped > 0 || r.Exit != nil {
			if err := fn(r); err != nil {
				return err
			}
		}
		if r.Exit != nil {
			return nil
		}
		cursor = r.NextCursor
	}
}
