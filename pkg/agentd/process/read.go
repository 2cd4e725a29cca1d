package process

import (
	"context"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// attachBytes bounds the output delivered by one Attach callback: 1 MiB
// less room for the message's other fields, so that a full message still
// fits the 1 MiB tier of gRPC's buffer pools (1 MiB and a few bytes would
// take, and clear, a 2 MiB buffer on both sides).
const attachBytes = 1<<20 - 4<<10

// Read returns up to maxBytes of output from cursor (an absolute offset;
// 0 is the first byte ever written). It returns as soon as there is output
// at or after cursor, the process has exited, yield has passed (yield 0
// polls) or ctx is done (an error). maxBytes <= 0 means DefaultReadBytes.
// A cursor past the end of the output is a errkind.ErrConflict.
func (m *Manager) Read(ctx context.Context, id string, cursor int64, yield time.Duration, maxBytes int) (ReadResult, error) {
	const op = "read"
	if cursor < 0 || yield < 0 {
		return ReadResult{}, procErrf(op, id, errkind.ErrInvalidArgument, "negative cursor or yield")
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
			return ReadResult{}, procErrf(op, id, errkind.ErrConflict, "cursor %d is past the end of the output (%d bytes so far)", cursor, end)
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
// something to deliver: output, dropped bytes or the exit. The chunks'
// Data is valid only until fn returns (it is the ring's own memory, not a
// copy), and two adjacent chunks may have the same stream (where the ring
// wraps around).
//
// Flow control: while Attach runs, the process's output pumps never
// overwrite output it has not consumed (delivered: fn returned), whatever
// the ring size: they stop reading, the pipe fills and the
// process blocks in write, as it would on a slow terminal. With several
// followers the slowest one sets the pace. A follower that holds the pumps
// back without consuming anything for Config.FollowerStallTimeout (fn
// blocked, a client that stopped reading) no longer holds them back: the
// process runs on and the follower later sees Dropped, until it consumes
// output again. Read (polling) never holds a process back.
func (m *Manager) Attach(ctx context.Context, id string, cursor int64, fn func(ReadResult) error) error {
	return m.AttachWith(ctx, id, cursor, AttachOptions{}, fn)
}

// AttachOptions tune AttachWith.
type AttachOptions struct {
	// FirstWithin, when positive, bounds the wait for fn's first call:
	// when there is nothing to deliver by then, fn is called once with an
	// empty result (no chunks, no drop, no exit, NextCursor = cursor).
	// Exec uses it to send the started process together with a quick
	// command's output and exit, yet promptly for a slow one.
	FirstWithin time.Duration
	// ReleaseAtExit frees the process's retained output once fn has
	// delivered the exit (returned nil for the result carrying Exit, so
	// all the output went out before it), unless at that moment another
	// follower is attached (it keeps the output, and reads it all) or a
	// HoldOutput reservation is still waiting for one. The process stays
	// known, with its exit status, until its exit retention ends; a later
	// Read or Attach from any cursor gets no bytes, the freed ones counted
	// as Dropped, and the exit. Exec uses it: its client got everything,
	// and a chatty command's ring (up to Config.OutputBufferBytes) would
	// otherwise be kept for nobody for the retention.
	ReleaseAtExit bool
}

// AttachWith is Attach with options.
func (m *Manager) AttachWith(ctx context.Context, id string, cursor int64, opts AttachOptions, fn func(ReadResult) error) error {
	const op = "read"
	if cursor < 0 {
		return procErrf(op, id, errkind.ErrInvalidArgument, "negative cursor or yield")
	}
	p, err := m.lookup(op, id)
	if err != nil {
		return err
	}
	f := p.addFollower(cursor)
	defer p.removeFollower(f)
	var chunks []Chunk
	var first <-chan time.Time
	if opts.FirstWithin > 0 {
		t := time.NewTimer(opts.FirstWithin)
		defer t.Stop()
		first = t.C
	}
	for {
		r, err := p.lend(ctx, op, f, chunks, first)
		first = nil
		if err != nil {
			return err
		}
		chunks = r.Chunks
		err = fn(r)
		p.delivered(f, r.NextCursor)
		if err != nil {
			return err
		}
		if r.Exit != nil {
			if opts.ReleaseAtExit {
				p.dropDelivered(f)
			}
			return nil
		}
	}
}

// lend waits until there is something to deliver to f (output, dropped
// bytes or the exit) and returns it with the chunks' data aliasing the
// ring, without copying. Until delivered is called, f holds the pumps back
// at the first byte lent, so the bytes stay put; if f stalls meanwhile the
// next pump read first moves the ring to new storage (see stallLocked).
// When giveUp fires first it returns an empty result.
func (p *proc) lend(ctx context.Context, op string, f *follower, chunks []Chunk, giveUp <-chan time.Time) (ReadResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		cursor := f.cursor
		if cursor > p.out.end {
			return ReadResult{}, procErrf(op, p.id, errkind.ErrConflict, "cursor %d is past the end of the output (%d bytes so far)", cursor, p.out.end)
		}
		if cursor < p.out.end || p.exit != nil {
			chunks, next, dropped := p.out.view(cursor, attachBytes, chunks)
			r := ReadResult{Chunks: chunks, NextCursor: next, Dropped: dropped, Exited: p.exit != nil}
			if p.exit != nil && next == p.out.end {
				e := *p.exit
				r.Exit = &e
			}
			p.lentLocked(f, max(cursor, p.out.start), time.Now())
			return r, nil
		}
		changed := p.waitChanged()
		p.mu.Unlock()
		select {
		case <-changed:
		case <-giveUp:
			p.mu.Lock()
			return ReadResult{NextCursor: cursor}, nil
		case <-ctx.Done():
			p.mu.Lock()
			return ReadResult{}, procErr(op, p.id, ctxErr(ctx))
		}
		p.mu.Lock()
	}
}
