package store

import (
	"context"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/internal/prefetch"
)

// Pending is a row allocated for writing: its blocks belong to the allocating
// goroutine until Commit or Abort. The zero Pending is not usable.
type Pending struct {
	s    *Shard
	idx  uint32
	word uint64 // the status word Allocate set
}

// Index returns the row's index.
func (p Pending) Index() int { return int(p.idx) }

// Shard returns the shard the row belongs to.
func (p Pending) Shard() *Shard { return p.s }

// Block returns column col's block of the row: BlockBytes(col) bytes to fill in
// place, valid until Commit or Abort.
func (p Pending) Block(col int) []byte { return p.s.block(col, p.idx) }

// Allocate takes a free row for writing. When no row is free it evicts one chosen
// by the shard's Remover; it waits, until ctx is done, only while every row is
// being written or pinned, or when the remover is RemoverNone and nothing is free.
//
// Rows are reserved for the handle a chunk at a time (WithChunk): one pass over
// the free queue, or over the eviction order when nothing is free, reserves up to
// a chunk's rows in the status table under this handle's writer slot, and the
// following calls take them one by one. So writer processes do not meet on the
// shared allocation state at every insert, only once a chunk. The fast path is
// one compare-and-swap on the row's own status word: no system calls, no
// allocation.
func (s *Shard) Allocate(ctx context.Context) (Pending, error) {
	if s.closed.Load() || s.state.Load() != stateReady {
		return Pending{}, ErrClosed
	}
	s.log.prefetch()
	s.chunkMu.Lock()
	p, ok := s.takeChunk()
	s.chunkMu.Unlock()
	if ok {
		return p, nil
	}
	return s.allocateSlow(ctx)
}

// takeChunk moves the next row of the handle's chunk from reserved to writing
// (the caller holds chunkMu). A row that another writer took meanwhile (see
// rescan) is skipped.
func (s *Shard) takeChunk() (Pending, bool) {
	for s.chunkHead < len(s.chunk) {
		i := s.chunk[s.chunkHead]
		s.chunkHead++
		r := s.row(i)
		x := r.state.Load()
		if !isReserved(x) || slotOf(x) != s.slot {
			continue
		}
		w := writingWord(genOf(x)+1, s.slot)
		if r.state.CompareAndSwap(x, w) {
			if s.chunkHead < len(s.chunk) {
				s.prefetchRow(s.chunk[s.chunkHead])
			}
			return Pending{s: s, idx: i, word: w}, true
		}
	}
	return Pending{}, false
}

// prefetchLines bounds the cache lines prefetchRow asks for, over all
// columns: rows larger than this stream through the hardware's own
// prefetch, which a flood of requests would only crowd out.
const prefetchLines = 32

// prefetchRow asks for the cache lines of row i's blocks and its status
// line, for writing, without waiting: the rows of a full shard were last
// written a shard's length of inserts ago, and their lines have left the
// cache; the status line the refill took can have been taken since (another
// process's walk of the table, the prefetchers behind the owner's reads of
// its neighbours). Done one insert ahead, the lines arrive while the caller
// does other work, and neither the take's compare-and-swap nor the commit's,
// a barrier, waits for them.
func (s *Shard) prefetchRow(i uint32) {
	prefetch.Write(unsafe.Pointer(s.row(i)))
	lines := 0
	for c := range s.tables {
		b := s.block(c, i)
		for off := 0; off < len(b) && lines < prefetchLines; off, lines = off+64, lines+1 {
			prefetch.Write(unsafe.Pointer(&b[off]))
		}
	}
}

// reserve moves row i from free to reserved for this handle, if it is free and
// not in a chunk.
func (s *Shard) reserve(i uint32) bool {
	r := s.row(i)
	x := r.state.Load()
	if x&(phaseMask|reservedBit) != phaseFree {
		return false
	}
	return r.state.CompareAndSwap(x, reservedWord(genOf(x), s.slot))
}

// refill reserves a new chunk (the caller holds chunkMu and has used up the
// last): free rows from the free queue, or else rows evicted by the Remover.
func (s *Shard) refill() {
	s.chunk, s.chunkHead = s.chunk[:0], 0
	for len(s.chunk) < s.chunkRows {
		s.popped = s.free.popN(s.popped[:0], s.chunkRows-len(s.chunk))
		if len(s.popped) == 0 {
			break
		}
		// The rows' status lines were last written by the table that freed
		// them, in another process: ask for all of them before the first
		// compare-and-swap, so that they move together rather than one
		// compare-and-swap's wait after another.
		for _, i := range s.popped {
			if i < s.cap {
				prefetch.Write(unsafe.Pointer(s.row(i)))
			}
		}
		for _, i := range s.popped {
			if i < s.cap && s.reserve(i) {
				s.chunk = append(s.chunk, i)
			}
		}
	}
	if len(s.chunk) == 0 {
		s.chunk = s.evict(s.chunkRows, s.chunk)
	}
}

func (s *Shard) allocateSlow(ctx context.Context) (Pending, error) {
	wait := 20 * time.Microsecond
	for {
		if s.closed.Load() || s.state.Load() != stateReady {
			return Pending{}, ErrClosed
		}
		s.chunkMu.Lock()
		p, ok := s.takeChunk()
		if !ok {
			s.refill()
			p, ok = s.takeChunk()
		}
		s.chunkMu.Unlock()
		if ok {
			return p, nil
		}
		if !s.free.empty() {
			continue // a scan or a release put rows back
		}
		if err := s.sleepFree(ctx, wait); err != nil {
			return Pending{}, fmt.Errorf("store: allocate in %q: no row free, writing or pinned all %d: %w", s.name, s.cap, err)
		}
		wait = min(2*wait, time.Millisecond)
	}
}

// sleepFree waits up to d, or until ctx is done, for a row to be freed (a push
// on the free queue rings its bell).
func (s *Shard) sleepFree(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	if d > 0 {
		s.free.bell.wait(func() bool { return !s.free.empty() || s.closed.Load() }, d)
	}
	return ctx.Err()
}

// Commit makes the row selectable with the given priority; its key is its
// insertion sequence. See CommitKey.
func (p Pending) Commit(priority float64) (Ref, error) { return p.commit(0, false, priority) }

// CommitKey makes the row selectable with the given key and priority and returns
// its Ref, whose Seq is the row's insertion sequence (commit order across the
// shard). After Commit the writer must not touch the row's blocks. It returns an
// error wrapping ErrNotPending if the row is no longer this Pending's.
func (p Pending) CommitKey(key uint64, priority float64) (Ref, error) {
	return p.commit(key, true, priority)
}

func (p Pending) commit(key uint64, haveKey bool, priority float64) (Ref, error) {
	s := p.s
	if s == nil {
		return Ref{}, fmt.Errorf("store: commit of a zero Pending: %w", ErrNotPending)
	}
	if math.IsNaN(priority) {
		return Ref{}, fmt.Errorf("store: commit row %d of %q: priority is NaN", p.idx, s.name)
	}
	r := s.row(p.idx)
	if r.state.Load() != p.word {
		return Ref{}, fmt.Errorf("store: commit row %d of %q: %w", p.idx, s.name, ErrNotPending)
	}
	// The row is ours until the compare-and-swap below: nobody reads these fields of
	// a row that is being written.
	if haveKey {
		r.key.Store(key)
	}
	r.priority.Store(math.Float64bits(priority))
	r.sampled.Store(0)
	r.inserted.Store(s.clock.Now().UnixNano())
	c := committingWord(p.word)
	if !r.state.CompareAndSwap(p.word, c) {
		return Ref{}, fmt.Errorf("store: commit row %d of %q: %w", p.idx, s.name, ErrNotPending)
	}
	seq := s.log.append(p.idx)
	if s.committing != nil {
		s.committing()
	}
	r.seq.Store(seq)
	if !haveKey {
		r.key.Store(seq)
	}
	if !r.state.CompareAndSwap(c, committedWord(genOf(p.word))) {
		return Ref{}, fmt.Errorf("store: commit row %d of %q: reclaimed while committing: %w", p.idx, s.name, ErrNotPending)
	}
	return Ref{Index: int(p.idx), Seq: seq}, nil
}

// Abort gives the row back to the free queue without making it selectable. It
// returns an error wrapping ErrNotPending if the row is no longer this Pending's.
func (p Pending) Abort() error {
	s := p.s
	if s == nil {
		return fmt.Errorf("store: abort of a zero Pending: %w", ErrNotPending)
	}
	if !s.row(p.idx).state.CompareAndSwap(p.word, freeWord(genOf(p.word))) {
		return fmt.Errorf("store: abort row %d of %q: %w", p.idx, s.name, ErrNotPending)
	}
	s.free.push(p.idx)
	return nil
}
