package store

import (
	"sync/atomic"
	"unsafe"

	"github.com/gear-rl/gear/internal/prefetch"
)

// freeQueue is the block allocator's free queue: a bounded multi-producer,
// multi-consumer ring of row indices in shared memory.
//
// Each operation takes effect with one compare-and-swap on a cell; moving the head
// or tail counter afterwards is only bookkeeping that any process helps finish. So a
// process that dies in the middle of a push or pop never blocks the others: at
// worst the index it was moving is lost from the queue. The queue is therefore only
// a hint: the status table says which rows are free, and a scan of it puts lost
// rows back (see rescan). A popped index may also be stale; Allocate's
// compare-and-swap on the row's status word is what hands a row out.
//
// A cell is lap<<33 | full<<32 | index, where lap is the position divided by the
// ring size (31 bits, wrapping).
type freeQueue struct {
	bell  bell // rung by every push: writers waiting for a row sleep on it
	head  *atomic.Uint64
	tail  *atomic.Uint64
	cells unsafe.Pointer
	mask  uint64
	shift uint
}

const (
	lapMask  = 1<<31 - 1
	fullBit  = 1 << 32
	lapShift = 33
)

func newFreeQueue(head, tail *atomic.Uint64, cells unsafe.Pointer, n int) freeQueue {
	shift := uint(0)
	for 1<<shift < n {
		shift++
	}
	return freeQueue{head: head, tail: tail, cells: cells, mask: uint64(n - 1), shift: shift}
}

func (q *freeQueue) cell(p uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Add(q.cells, (p&q.mask)*8))
}

func (q *freeQueue) lap(p uint64) uint64 { return (p >> q.shift) & lapMask }

func emptyCell(lap uint64) uint64          { return lap << lapShift }
func fullCell(lap uint64, v uint32) uint64 { return lap<<lapShift | fullBit | uint64(v) }

// spinLimit bounds the retries of one queue operation. Only a cell overwritten
// with garbage could make an operation retry this often; the queue is a hint, so
// the operation then gives up (push drops the index, pop reports empty) and the
// status-table scan recovers.
const spinLimit = 1 << 20

// cellsPerLine is how many 8-byte cells (of the free queue, of the commit
// log) share a cache line.
const cellsPerLine = 8

// push adds v; it returns false if the ring is full.
func (q *freeQueue) push(v uint32) bool { return q.pushN([]uint32{v}) == 1 }

// pushN adds vs in order, each into the next empty cell from the tail on,
// and then moves the tail and rings the bell once: a releaser giving back a
// run of rows would otherwise move the tail's line and read the bell's once
// a row. Until the tail moves, pushers that find the cells filled move it
// for them, as after a pusher that died. It returns how many of vs it
// added: fewer only when the ring filled (or a cell overwritten with
// garbage kept it spinning, see spinLimit).
func (q *freeQueue) pushN(vs []uint32) int {
	t := q.tail.Load()
	n := 0
	for spins := 0; n < len(vs) && spins < spinLimit; spins++ {
		c := q.cell(t)
		l := q.lap(t)
		x := c.Load()
		xl := x >> lapShift
		switch {
		case x == emptyCell(l):
			if c.CompareAndSwap(x, fullCell(l, vs[n])) {
				n++
				t++
			}
		case xl == l || xl == (l+1)&lapMask:
			t = max(t+1, q.tail.Load()) // filled by another pusher (and maybe popped since)
		case xl == (l-1)&lapMask && x&fullBit != 0:
			spins = spinLimit // the ring is full
		default:
			t = max(t, q.tail.Load()) // t is stale: a lap went by
		}
	}
	for {
		cur := q.tail.Load()
		if cur >= t || q.tail.CompareAndSwap(cur, t) {
			break
		}
	}
	if n > 0 {
		q.bell.ring()
	}
	return n
}

// empty reports whether the ring holds no index now (a hint, as the queue is).
func (q *freeQueue) empty() bool { return q.head.Load() == q.tail.Load() }

// pop removes and returns the oldest index; it returns false if the ring is empty.
func (q *freeQueue) pop() (uint32, bool) {
	for range spinLimit {
		h := q.head.Load()
		c := q.cell(h)
		l := q.lap(h)
		x := c.Load()
		switch {
		case x>>lapShift == l && x&fullBit != 0:
			if c.CompareAndSwap(x, emptyCell((l+1)&lapMask)) {
				q.head.CompareAndSwap(h, h+1)
				return uint32(x), true
			}
		case x == emptyCell((l+1)&lapMask):
			// Popped by a process that has not moved the head yet: move it for them.
			q.head.CompareAndSwap(h, h+1)
		case x == emptyCell(l):
			if q.head.Load() == h {
				return 0, false
			}
		}
	}
	return 0, false
}

// popN appends up to n of the oldest indices to dst and returns it (as it
// was if the ring is empty). It takes cells from the head on, each by its
// compare-and-swap as pop does, and moves the head once past all of them:
// writers refilling their chunks at once would otherwise pass the head's
// cache line back and forth once per index. A cell another pop took first is
// passed over. Moving the head is bookkeeping as for pop: the cells behind it
// are all taken, and a popN that dies before the move loses only the indices
// it took, which the others' moves pass.
func (q *freeQueue) popN(dst []uint32, n int) []uint32 {
	p := q.head.Load()
	for c := p &^ (cellsPerLine - 1); c < p+uint64(n); c += cellsPerLine {
		prefetch.Write(unsafe.Pointer(q.cell(c)))
	}
	for taken := 0; taken < n; {
		c, l := q.cell(p), q.lap(p)
		x := c.Load()
		if x>>lapShift == l && x&fullBit != 0 {
			if c.CompareAndSwap(x, emptyCell((l+1)&lapMask)) {
				dst = append(dst, uint32(x))
				taken++
				p++
			}
			continue // lost the cell to a pop: it is empty now, passed over next
		}
		if x != emptyCell((l+1)&lapMask) {
			break // nothing pushed here yet, or p is a lap behind: done
		}
		p++ // taken by another pop
	}
	for {
		h := q.head.Load()
		if h >= p || q.head.CompareAndSwap(h, p) {
			return dst
		}
	}
}

// reset empties the ring (only while no other process uses it: set-up, restore).
func (q *freeQueue) reset() {
	for i := 0; i <= int(q.mask); i++ {
		q.cell(uint64(i)).Store(0)
	}
	q.head.Store(0)
	q.tail.Store(0)
}

// commitLog is the ring of committed row indices in commit order. A commit takes
// its insertion sequence from its position in the log: the compare-and-swap that
// writes the cell both reserves the sequence and publishes the row, so a committer
// that dies right after it leaves a complete entry, and one that dies before it
// leaves none. Old entries are overwritten after one lap; readers that fall that
// far behind are told so (ErrMissed).
//
// A cell is tag<<32 | row, where tag is the lap plus one (0: never written).
type commitLog struct {
	tail  *atomic.Uint64
	hint  *atomic.Uint64 // this process's: the position after its last append
	cells unsafe.Pointer
	mask  uint64
	shift uint
}

func newCommitLog(tail *atomic.Uint64, cells unsafe.Pointer, n int) commitLog {
	shift := uint(0)
	for 1<<shift < n {
		shift++
	}
	return commitLog{tail: tail, hint: new(atomic.Uint64), cells: cells, mask: uint64(n - 1), shift: shift}
}

func (g *commitLog) cell(p uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Add(g.cells, (p&g.mask)*8))
}

func (g *commitLog) tag(p uint64) uint32 { return uint32(p>>g.shift) + 1 }

// append publishes row and returns its sequence: the first cell of this lap
// not yet written, from the tail on.
//
// The log's tail is a hint: an append moves it only when it fills the last
// cell of a line (and readers move it to the end they find), so that two
// writers committing in turn do not also pass the tail's line back and forth
// at every commit; it lags the end by at most a line's cells (cellsPerLine),
// and by more only after a committer died between its cell and the tail.
func (g *commitLog) append(row uint32) uint64 {
	t := g.hint.Load()
	if t == 0 {
		t = g.tail.Load()
	}
	for skipped := 0; ; {
		c := g.cell(t)
		tag := g.tag(t)
		x := c.Load()
		xt := uint32(x >> 32)
		switch {
		case xt == tag:
			t++ // written: look at the next one
			if skipped++; skipped%cellsPerLine == 0 {
				if tl := g.tail.Load(); tl > t {
					t = tl // the hint is far behind: others appended since
				} else {
					g.advance(t) // a tail far behind (a committer died): move it
				}
			}
		case x != 0 && int32(xt-tag) > 0:
			t = g.tail.Load() // the cell is from a later lap: t is stale
		default:
			if c.CompareAndSwap(x, uint64(tag)<<32|uint64(row)) {
				if (t+1)%cellsPerLine == 0 {
					g.advance(t + 1)
				}
				g.hint.Store(t + 1)
				return t
			}
		}
	}
}

// prefetch asks for the cache line of the cell this process's next append
// will likely write, for writing, without waiting: called well before the
// append, it overlaps the line's move from the writer that appended last
// with the caller's own work.
func (g *commitLog) prefetch() {
	if t := g.hint.Load(); t != 0 {
		prefetch.Write(unsafe.Pointer(g.cell(t)))
	}
}

// advance moves the tail up to t, unless it is there already.
func (g *commitLog) advance(t uint64) {
	for {
		cur := g.tail.Load()
		if cur >= t || g.tail.CompareAndSwap(cur, t) {
			return
		}
	}
}

// end returns the sequence the next commit will get (the first cell from the
// tail on not written in its lap), and moves the tail there.
func (g *commitLog) end() uint64 {
	t0 := g.tail.Load()
	t := t0
	for uint32(g.cell(t).Load()>>32) == g.tag(t) {
		t++
	}
	if t != t0 {
		g.advance(t)
	}
	return t
}

// read returns the row committed with sequence p, or false if the entry was
// overwritten (or never written, after a restore).
func (g *commitLog) read(p uint64) (uint32, bool) {
	x := g.cell(p).Load()
	if uint32(x>>32) != g.tag(p) {
		return 0, false
	}
	return uint32(x), true
}

// capacity is the number of entries the log keeps.
func (g *commitLog) capacity() uint64 { return g.mask + 1 }
