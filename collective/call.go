package collective

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// algo names the algorithm a frame's sender runs; ranks that choose differently
// (their Tuning differs) get a mismatch instead of wrong data.
type algo uint8

const (
	algoNone algo = iota
	algoRing
	algoRecDoubling
	algoTree
	algoChain
	algoLinear
	algoPairwise
	algoHier
	algoDissemination
	algoHalving
	algoBoard
)

func (a algo) String() string {
	return [...]string{"none", "ring", "recursive doubling", "binomial tree", "pipelined chain", "linear", "pairwise", "hierarchical", "dissemination", "recursive halving", "shared-memory board"}[min(int(a), 10)]
}

// call is the state of the collective in progress on a communicator.
type call struct {
	c     *Comm
	ctx   context.Context
	h     header // the call's description, stamped on every frame it sends
	k     kernel // the reduction, for reducing kinds
	es    int    // element size
	chunk int    // frame payload, a whole number of elements
	base  uint32 // added to the step of every frame: phases of one call

	// stream: the call is large enough (Tuning.StreamBytes) to write frames
	// with streaming stores, which bypass the cache; rs: the frame reserved last
	// goes over a link where that pays (shared memory, read in place by another
	// core). ks is the streaming kernel.
	stream, rs bool
	ks         kernel
	timed      bool // the chooser learns from this call's duration
	class      int
	start      time.Time
}

// toFrame copies src into the frame reserved last; redFrame reduces into it.
func (x *call) toFrame(dst, src []byte) {
	if !x.rs || len(dst) < streamMin || !streamCopy(dst, src) {
		copy(dst, src)
	}
}

func (x *call) redFrame(out, a, b []byte) {
	if x.rs && x.ks != nil && len(out) >= streamMin {
		x.ks(out, a, b)
		return
	}
	x.k(out, a, b)
}

// streamMin: smaller frames are written through the cache.
const streamMin = 4096

// begin starts a call: it takes the communicator, checks that it can still be
// used, and numbers the call. Every begin is followed by end.
func (c *Comm) begin(ctx context.Context, h header) (*call, error) {
	if ctx == nil {
		return nil, errors.New("collective: nil context")
	}
	c.opMu.Lock()
	if c.sig.failed.Load() {
		c.opMu.Unlock()
		return nil, c.Err()
	}
	if h.kind != kindP2P {
		c.seq++
		h.seq = c.seq
	}
	x := &c.x
	*x = call{c: c, ctx: ctx, h: h, es: h.dtype.Size()}
	if h.kind.reduces() {
		x.k = kernelFor(h.dtype, h.op)
	}
	x.chunk = c.chunk / x.es * x.es
	if sb := c.cfg.tuning.StreamBytes; sb >= 0 && h.count*uint64(x.es) >= uint64(sb) && c.streaming {
		x.class = streamClassOf(h.count * uint64(x.es))
		x.stream, x.timed = c.chooser.pick(x.class)
		if x.timed {
			x.start = time.Now()
		}
		if x.stream && x.k != nil {
			x.ks = streamKernel(h.dtype, h.op)
		}
	}
	if h.kind != kindP2P {
		c.sig.idle = c.idleScan
		c.hist[h.seq%uint64(len(c.hist))] = h
	}
	return x, nil
}

// end finishes a call. An error makes the communicator fail: the error the caller
// gets names the call, and the other ranks hear of it.
func (c *Comm) end(x *call, err error) error {
	if err == nil && x.h.kind != kindP2P && c.size > 1 {
		// Frames of this call (or an earlier one) still waiting mean that a peer
		// ran another call: find them now rather than in a later call.
		err = x.scan(true)
	}
	c.sig.end()
	c.sig.idle = nil
	if x.timed && err == nil {
		c.chooser.record(x.class, x.stream, time.Since(x.start))
	}
	if err != nil {
		err = c.failCall(x, err)
	}
	c.opMu.Unlock()
	return err
}

func (c *Comm) failCall(x *call, err error) error {
	if errors.Is(err, errStopped) {
		if cause := c.Err(); cause != nil {
			return cause
		}
		return ErrClosed
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("collective: %s: %w", x.h.describe(), err)
	}
	return c.fail(err, true)
}

// argError reports a bad argument of the call in progress.
func (x *call) argError(format string, args ...any) error {
	return fmt.Errorf("collective: %s: "+format, append([]any{x.h.describe()}, args...)...)
}

// frame returns the header of a frame of this call.
func (x *call) frame(step uint32, n int) header {
	h := x.h
	h.step = x.base + step
	h.n = uint32(n)
	return h
}

// directLink is a link that sends a frame straight from the caller's memory
// (TCP: one writev of header and payload), where reserve and commit would copy
// the payload into a frame first.
type directLink interface {
	sendFrom(ctx context.Context, h header, p []byte) error
}

// send sends p (at most one chunk) to peer as one frame.
func (x *call) send(peer int, step uint32, p []byte) error {
	if d, ok := x.c.links[peer].(directLink); ok {
		return d.sendFrom(x.ctx, x.frame(step, len(p)), p)
	}
	buf, err := x.reserve(peer, len(p))
	if err != nil {
		return err
	}
	x.toFrame(buf, p)
	return x.c.links[peer].commit(x.ctx, x.frame(step, len(p)))
}

// reserve and commit send a frame produced in place.
func (x *call) reserve(peer int, n int) ([]byte, error) {
	l := x.c.links[peer]
	x.rs = x.stream && l.streams()
	return l.reserve(x.ctx, n)
}

func (x *call) commit(peer int, step uint32, n int) error {
	return x.c.links[peer].commit(x.ctx, x.frame(step, n))
}

// recv waits for this call's frame at step from peer, which must have n payload
// bytes. The payload is valid until release(peer).
func (x *call) recv(peer int, step uint32, n int) ([]byte, error) {
	in := &x.c.in[peer]
	step += x.base
	for i := range in.stash {
		f := &in.stash[i]
		if f.h.kind == kindP2P {
			continue
		}
		if err := x.check(peer, &f.h, step, n); err != nil {
			return nil, err
		}
		in.held, in.stashIndex = heldStash, i
		return f.buf, nil
	}
	for {
		h, p, err := in.l.next(x.ctx)
		if err != nil {
			return nil, err
		}
		if h.kind == kindP2P {
			in.keep(x.c.pool, h, p)
			in.l.release()
			continue
		}
		if err := x.check(peer, &h, step, n); err != nil {
			in.l.release()
			return nil, err
		}
		in.held = heldLink
		return p, nil
	}
}

// release gives back the frame recv returned.
func (x *call) release(peer int) { x.c.in[peer].release(x.c.pool) }

const (
	heldNone = iota
	heldLink
	heldStash
)

func (in *inbox) release(pool *bufPool) {
	switch in.held {
	case heldLink:
		in.l.release()
	case heldStash:
		pool.put(in.stash[in.stashIndex].own)
		in.stash = append(in.stash[:in.stashIndex], in.stash[in.stashIndex+1:]...)
	}
	in.held = heldNone
}

// keep copies a frame that arrived ahead of its turn into the stash.
func (in *inbox) keep(pool *bufPool, h header, p []byte) {
	b := pool.get(len(p))
	copy(*b, p)
	in.stash = append(in.stash, qframe{h: h, buf: *b, own: b})
}

// check compares a received frame with the call in progress.
func (x *call) check(peer int, h *header, step uint32, n int) error {
	if !h.sameCall(&x.h) {
		return x.mismatch(peer, h)
	}
	if h.algo != x.h.algo {
		return &MismatchError{Rank: x.c.rank, Call: x.h.describe(), PeerRank: peer, PeerCall: h.describe(),
			Detail: fmt.Sprintf("rank %d runs %v, rank %d runs %v: their Tuning differs", x.c.rank, x.h.algo, peer, h.algo)}
	}
	if h.step != step || int(h.n) != n {
		return &MismatchError{Rank: x.c.rank, Call: x.h.describe(), PeerRank: peer, PeerCall: h.describe(),
			Detail: fmt.Sprintf("got frame %d of %d bytes, want frame %d of %d bytes", h.step, h.n, step, n)}
	}
	return nil
}

// mismatch names this rank's call of the frame's sequence number (the call in
// progress, or an earlier one) and the peer's.
func (x *call) mismatch(peer int, h *header) error {
	own := x.h.describe()
	if h.seq < x.h.seq && h.seq > 0 && x.h.seq-h.seq < uint64(len(x.c.hist)) {
		if old := x.c.hist[h.seq%uint64(len(x.c.hist))]; old.seq == h.seq {
			own = old.describe()
		}
	}
	return &MismatchError{Rank: x.c.rank, Call: own, PeerRank: peer, PeerCall: h.describe()}
}

// scan looks at the frames waiting from every peer. A frame of an earlier call,
// or of this call but describing another, means a peer called something else;
// final (at the end of the call) also counts frames of this call as a mismatch,
// as the call consumed all it expected.
func (x *call) scan(final bool) error {
	for peer := range x.c.in {
		in := &x.c.in[peer]
		if in.l == nil || in.held != heldNone {
			continue
		}
		for i := range in.stash {
			if err := x.judge(peer, &in.stash[i].h, final); err != nil {
				return err
			}
		}
		if h, ok := in.l.peek(); ok {
			if err := x.judge(peer, &h, final); err != nil {
				return err
			}
		}
	}
	if x.c.board != nil {
		// Peers waiting on the board send nothing: their headers there say
		// which call they are in.
		for i, h := range x.c.board.boardAhead() {
			if err := x.judge(x.c.board.peers[i].rank, &h, final); err != nil {
				return err
			}
		}
	}
	return nil
}

func (x *call) judge(peer int, h *header, final bool) error {
	switch {
	case h.kind == kindP2P || h.seq > x.h.seq:
		return nil
	case h.seq == x.h.seq && h.sameCall(&x.h) && (h.algo == x.h.algo || x.h.algo == algoNone) && !final:
		return nil
	}
	return x.mismatch(peer, h)
}
