//go:build linux

package collective

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/futex"
)

// The board: an area of the host segment, after the inboxes, where the ranks of
// a host run a small AllReduce, or a Barrier, in one step instead of a chain of
// messages. Every rank copies its buffer into its own slot, writes the call's
// header beside it and adds one to the arrival count; the rank that arrives
// last reduces the slots in rank order into one of two result buffers and
// publishes the call's number in the generation word, which every other rank
// waits on, and copies out. When ranks outnumber cores, that is one wake-up
// per rank per call (everyone sleeps on one word, woken by one system call),
// where recursive doubling costs log2(n) rounds of pairwise wake-ups, each
// waiting for a rank that is seldom running. The layout:
//
//	0      arrivals u64: every rank adds one per call; n per call in all
//	128    generation u32: the number of the last call reduced (the futex word)
//	256    sleepers u32: ranks sleeping on the generation
//	384    reducer u32: the local rank that arrived last at the latest call
//	512    slot headers: 64 bytes per rank (the call's header, the arrival's
//	       call number), then 2 for the results (a verdict)
//	ctl    n slots of boardSlot bytes, then 2 result buffers of boardSlot bytes
//
// where ctl is the header part rounded up to a page. Results alternate: a rank
// still copying the result of call g cannot find it overwritten, since call
// g+2 needs that rank's arrival for g+1 first. Pages are touched only by the
// calls that use them: an 8-byte call touches a page per slot.
const (
	offArrivals   = 0
	offGeneration = 128
	offSleepers   = 256
	offReducer    = 384
	offBoardHdrs  = 512
	boardHdr      = 64
)

// boardCtlBytes is the size of the board's control part for n ranks.
func boardCtlBytes(n int) int64 {
	return (offBoardHdrs + boardHdr*int64(n+2) + shmPage - 1) &^ (shmPage - 1)
}

// boardBytes is the size of the board of a host of n ranks.
func boardBytes(n int) int64 {
	return boardCtlBytes(n) + int64(n+2)*boardSlot
}

// board is this rank's view of the host's board.
type board struct {
	mem []byte
	n   int
	seq uint64 // board calls made so far
}

func (b *board) arrivals() *uint64   { return u64at(b.mem, offArrivals) }
func (b *board) generation() *uint32 { return u32at(b.mem, offGeneration) }
func (b *board) sleepers() *uint32   { return u32at(b.mem, offSleepers) }
func (b *board) reducer() *uint32    { return u32at(b.mem, offReducer) }
func (b *board) hdr(i int) []byte {
	off := offBoardHdrs + boardHdr*i
	return b.mem[off : off+boardHdr : off+boardHdr]
}

// arrived is the board call number that rank i arrived for last (plus one).
func (b *board) arrived(i int) *uint64 { return u64at(b.mem, offBoardHdrs+boardHdr*i+headerSize) }

func (b *board) slot(i, n int) []byte {
	off := int(boardCtlBytes(b.n)) + i*boardSlot
	return b.mem[off : off+n : off+n]
}

// verdict of a result: 0 the result is good, 1+i the header of local rank i
// is the first that disagrees with local rank 0's.
func (b *board) verdict(r int) *uint32 { return u32at(b.mem, offBoardHdrs+boardHdr*(b.n+r)) }

// boardCall runs a board call of this rank: an AllReduce of buf with kernel k
// (nil for a Barrier, with an empty buf), described by h. Every local rank
// must make the same board calls in the same order.
func (t *shmTransport) boardCall(ctx context.Context, h header, k kernel, buf []byte) error {
	b := t.board
	n, me := b.n, t.me
	g := b.seq
	b.seq++
	r := int(g % 2)
	h.encode(b.hdr(me))
	if len(buf) > 0 {
		copy(b.slot(me, len(buf)), buf)
	}
	atomic.StoreUint64(b.arrived(me), g+1)
	want := uint32(g + 1)
	if atomic.AddUint64(b.arrivals(), 1)%uint64(n) == 0 {
		// Last: reduce in rank order, so that the result does not depend on
		// who came last. The waiters watch this rank while it does.
		atomic.StoreUint32(b.reducer(), uint32(me))
		bad := uint32(0)
		var h0, oh header
		h0.decode(b.hdr(0))
		for i := 1; i < n; i++ {
			oh.decode(b.hdr(i))
			if !oh.sameCall(&h0) || oh.algo != h0.algo {
				bad = uint32(i + 1)
				break
			}
		}
		atomic.StoreUint32(b.verdict(r), bad)
		if bad == 0 && len(buf) > 0 {
			res := b.slot(n+r, len(buf))
			k(res, b.slot(0, len(buf)), b.slot(1, len(buf)))
			for i := 2; i < n; i++ {
				k(res, res, b.slot(i, len(buf)))
			}
		}
		atomic.StoreUint32(b.generation(), want)
		if atomic.LoadUint32(b.sleepers()) != 0 {
			futex.Wake(b.generation(), 1<<30)
		}
	} else if err := t.boardWait(ctx, want); err != nil {
		return err
	}
	if v := atomic.LoadUint32(b.verdict(r)); v != 0 {
		// Local rank v-1 is the first whose call differs from local rank 0's:
		// name whichever of the two differs from this rank's call.
		peer := int(v - 1)
		var oh header
		oh.decode(b.hdr(peer))
		if oh.sameCall(&h) && oh.algo == h.algo {
			peer = 0
			oh.decode(b.hdr(0))
		}
		return &MismatchError{Rank: t.peers[me].rank, Call: h.describe(), PeerRank: t.peers[peer].rank, PeerCall: oh.describe()}
	}
	if len(buf) > 0 {
		copy(buf, b.slot(n+r, len(buf)))
	}
	return nil
}

// boardWait returns once the generation word reads want. It polls first, as
// wait does (spinning, then yielding, for t.boardSpin), then sleeps on the word.
// Sleeping, it looks now and then at the ranks that have not arrived: a rank
// that closed or whose process ended fails the call.
func (t *shmTransport) boardWait(ctx context.Context, want uint32) error {
	b := t.board
	gen := b.generation()
	var start time.Time
	spin := t.boardSpin
	pure := spin > 0 && !t.yield
	for i := 1; spin > 0; i++ {
		if atomic.LoadUint32(gen) == want {
			return nil
		}
		if !pure {
			if t.gosched {
				runtime.Gosched()
			} else {
				unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
		}
		if i&255 == 0 || !pure && i&7 == 0 {
			if t.sig.failed.Load() {
				return errStopped
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if start.IsZero() {
				start = time.Now()
				continue
			}
			waited := time.Since(start)
			if waited > spin {
				break
			}
			if pure && waited > pureSpin && !boundAlone() {
				pure = false
			}
		}
	}
	t.sig.arm(ctx)
	for round := 0; ; round++ {
		cur := atomic.LoadUint32(gen)
		if cur == want {
			return nil
		}
		if t.sig.failed.Load() {
			return errStopped
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if round > 0 {
			// Slept once already: are the ranks that did not arrive still there?
			// When all arrived, the last is reducing: is it still there? (A
			// rank that closed cannot be reducing: Close waits for its call.)
			all := atomic.LoadUint64(b.arrivals()) >= uint64(b.n)*b.seq
			if all {
				if i := int(atomic.LoadUint32(b.reducer())); i != t.me && i < b.n && t.peerExited(i) {
					return t.lost(t.peers[i].rank, fmt.Sprintf("process %d exited", t.peers[i].pid))
				}
			}
			for i := range b.n {
				if all || i == t.me || atomic.LoadUint64(b.arrived(i)) == b.seq {
					continue
				}
				if atomic.LoadUint32(t.segs[i].closed()) != 0 {
					return t.closedErr(i)
				}
				if t.peerExited(i) {
					return t.lost(t.peers[i].rank, fmt.Sprintf("process %d exited", t.peers[i].pid))
				}
			}
		}
		t.drain(nil)
		if err := t.sig.onIdle(); err != nil {
			return err
		}
		atomic.AddUint32(b.sleepers(), 1)
		if atomic.LoadUint32(gen) == cur && !t.sig.failed.Load() {
			futex.Wait(gen, cur, sleepSlice)
		}
		atomic.AddUint32(b.sleepers(), ^uint32(0))
	}
}

// wakeBoard wakes the ranks sleeping on the board, so that they look at the
// signals and their peers again.
func (t *shmTransport) wakeBoard() {
	if t.board != nil {
		futex.Wake(t.board.generation(), 1<<30)
	}
}

// boardAhead returns, by local index, the headers of the board calls that
// peers arrived at and this rank has not made yet. A rank that runs a call on
// frames while its peers wait on the board looks at them: the peers send it
// nothing, so only their headers can show that they run another call.
func (t *shmTransport) boardAhead() map[int]header {
	b := t.board
	if b == nil {
		return nil
	}
	var out map[int]header
	for i := range b.n {
		if i == t.me || atomic.LoadUint64(b.arrived(i)) <= b.seq {
			continue
		}
		var h header
		h.decode(b.hdr(i))
		if out == nil {
			out = map[int]header{}
		}
		out[i] = h
	}
	return out
}
