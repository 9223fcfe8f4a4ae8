package store

import (
	"fmt"
	"iter"
	"math"
	"unsafe"

	"github.com/gear-rl/gear/internal/prefetch"
)

// View is a pinned committed row: while the View is held the row is not evicted or
// reused, and its blocks may be read. Done unpins it and must be called exactly
// once; the blocks must not be touched after it.
type View struct {
	s     *Shard
	idx   uint32
	seq   uint64
	entry int32 // the pin's journal entry + 1; 0: not in the journal
}

// Index returns the row's index.
func (v View) Index() int { return int(v.idx) }

// Ref returns the row's reference.
func (v View) Ref() Ref { return Ref{Index: int(v.idx), Seq: v.seq} }

// Shard returns the shard the row belongs to.
func (v View) Shard() *Shard { return v.s }

// Block returns column col's block of the row, read-only, valid until Done.
func (v View) Block(col int) []byte { return v.s.block(col, v.idx) }

// Status returns the row's current status.
func (v View) Status() RowStatus { return v.s.row(v.idx).load(int(v.idx)) }

// Done unpins the row; if it was released meanwhile and this was its last View, the
// row goes back to the free queue.
func (v View) Done() {
	v.s.pins.forget(v.s.slot, v.entry)
	v.s.unpin(v.idx)
}

func (s *Shard) checkRef(ref Ref) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if ref.Index < 0 || ref.Index >= int(s.cap) {
		return fmt.Errorf("store: %v: index out of range [0, %d) of %q", ref, s.cap, s.name)
	}
	return nil
}

// Read pins the committed row ref and returns a View of it. It returns an error
// wrapping ErrStale if ref's occupant was released or evicted.
func (s *Shard) Read(ref Ref) (View, error) {
	if err := s.checkRef(ref); err != nil {
		return View{}, err
	}
	if err := s.pin(uint32(ref.Index), ref.Seq, false); err != nil {
		return View{}, fmt.Errorf("store: read %v of %q: %w", ref, s.name, err)
	}
	return View{s: s, idx: uint32(ref.Index), seq: ref.Seq, entry: s.pins.record(s.slot, uint32(ref.Index))}, nil
}

// ReadHeld is Read that also pins a row released while another View (of any
// process) holds it: the row then goes back to the free queue when its last
// View, this one included, is done. It lets a process read a row that another
// one selected and holds, under a pin of its own (given back by Reclaim if this
// process dies). It returns an error wrapping ErrStale if ref's occupant is gone.
func (s *Shard) ReadHeld(ref Ref) (View, error) {
	if err := s.checkRef(ref); err != nil {
		return View{}, err
	}
	if err := s.pin(uint32(ref.Index), ref.Seq, true); err != nil {
		return View{}, fmt.Errorf("store: read %v of %q: %w", ref, s.name, err)
	}
	return View{s: s, idx: uint32(ref.Index), seq: ref.Seq, entry: s.pins.record(s.slot, uint32(ref.Index))}, nil
}

// pin adds a pin to row i if it is committed with seq and selectable, or, with
// held, released but still pinned (a released row with no pin is free already).
func (s *Shard) pin(i uint32, seq uint64, held bool) error {
	r := s.row(i)
	for {
		x := r.state.Load()
		if phaseOf(x) != phaseCommitted || x&doomedBit != 0 && (!held || pinsOf(x) == 0) || r.seq.Load() != seq {
			return ErrStale
		}
		if pinsOf(x) == maxPins {
			return fmt.Errorf("store: %d views of one row", maxPins)
		}
		if r.state.CompareAndSwap(x, x+pinOne) {
			return nil
		}
	}
}

// dropPin removes one pin of row i, freeing the row when it was released
// meanwhile and this was its last pin; ok is false when the row shows no pin.
func (s *Shard) dropPin(i uint32) (freed, ok bool) {
	r := s.row(i)
	for {
		x := r.state.Load()
		n := pinsOf(x)
		if phaseOf(x) != phaseCommitted || n == 0 {
			return false, false
		}
		nx := x - pinOne
		freed := n == 1 && x&doomedBit != 0
		if freed {
			nx = freeWord(genOf(x))
		}
		if r.state.CompareAndSwap(x, nx) {
			if freed {
				s.freeRows(i)
			}
			return freed, true
		}
	}
}

func (s *Shard) unpin(i uint32) {
	if _, ok := s.dropPin(i); !ok {
		panic(fmt.Sprintf("store: View.Done of row %d of %q, which has no views (Done called twice?)", i, s.name))
	}
}

// Release removes the committed row ref: it stops being selectable at once, and
// goes back to the free queue now, or when its last View is done. It returns an
// error wrapping ErrStale if ref's occupant is already gone.
func (s *Shard) Release(ref Ref) error {
	if err := s.checkRef(ref); err != nil {
		return err
	}
	i := uint32(ref.Index)
	freed, ok := s.release(i, ref.Seq)
	if !ok {
		return fmt.Errorf("store: release %v of %q: %w", ref, s.name, ErrStale)
	}
	if freed {
		s.freeRows(i)
	}
	return nil
}

// ReleaseAll is Release of each of refs, in order, for a caller giving back
// a run of rows at once: the rows that go back to the free queue go in one
// push (see freeQueue.pushN), with one count of the removals. A ref whose
// occupant is already gone, or out of range, is passed over. It returns how
// many of refs it released.
func (s *Shard) ReleaseAll(refs []Ref) int {
	var run [64]uint32
	released := 0
	for len(refs) > 0 {
		k := min(len(refs), len(run))
		n := 0
		for _, ref := range refs[:k] {
			if s.checkRef(ref) != nil {
				continue
			}
			freed, ok := s.release(uint32(ref.Index), ref.Seq)
			if ok {
				released++
			}
			if freed {
				run[n] = uint32(ref.Index)
				n++
			}
		}
		if n > 0 {
			s.freeRows(run[:n]...)
		}
		refs = refs[k:]
	}
	return released
}

// freeRows counts rows just freed as removals and puts them on the free
// queue, in one push.
func (s *Shard) freeRows(rows ...uint32) {
	s.removed.Add(uint64(len(rows)))
	s.free.pushN(rows)
}

// release makes row i, committed with seq, unselectable: freed reports
// whether it is free now (no view held it), for the caller to count and
// push; ok is false if the occupant is gone already.
func (s *Shard) release(i uint32, seq uint64) (freed, ok bool) {
	r := s.row(i)
	for {
		x := r.state.Load()
		if phaseOf(x) != phaseCommitted || x&doomedBit != 0 || r.seq.Load() != seq {
			return false, false
		}
		nx := freeWord(genOf(x))
		if pinsOf(x) > 0 {
			nx = x | doomedBit
		}
		if r.state.CompareAndSwap(x, nx) {
			return pinsOf(x) == 0, true
		}
	}
}

// SetPriority changes the priority of the committed row ref.
func (s *Shard) SetPriority(ref Ref, priority float64) error {
	if math.IsNaN(priority) {
		return fmt.Errorf("store: set priority of %v of %q: priority is NaN", ref, s.name)
	}
	v, err := s.Read(ref)
	if err != nil {
		return err
	}
	s.row(v.idx).priority.Store(math.Float64bits(priority))
	v.Done()
	return nil
}

// SetTimesSampled sets the times-sampled count of the committed row ref (a
// table that counts samples itself writes them back before a checkpoint).
func (s *Shard) SetTimesSampled(ref Ref, n uint32) error {
	v, err := s.Read(ref)
	if err != nil {
		return err
	}
	s.row(v.idx).sampled.Store(n)
	v.Done()
	return nil
}

// MarkSampled adds one to the row's times-sampled count and returns the new count.
func (s *Shard) MarkSampled(ref Ref) (uint32, error) {
	v, err := s.Read(ref)
	if err != nil {
		return 0, err
	}
	n := s.row(v.idx).sampled.Add(1)
	v.Done()
	return n, nil
}

// Status returns the status of the committed row ref.
func (s *Shard) Status(ref Ref) (RowStatus, error) {
	if err := s.checkRef(ref); err != nil {
		return RowStatus{}, err
	}
	st, ok := s.snapshot(uint32(ref.Index))
	if !ok || st.Seq != ref.Seq {
		return RowStatus{}, fmt.Errorf("store: status of %v of %q: %w", ref, s.name, ErrStale)
	}
	return st, nil
}

// snapshot reads row i's status if it is committed and not released, checking that
// the row did not change while its fields were read.
func (s *Shard) snapshot(i uint32) (RowStatus, bool) {
	r := s.row(i)
	x := r.state.Load()
	if phaseOf(x) != phaseCommitted || x&doomedBit != 0 {
		return RowStatus{}, false
	}
	st := r.load(int(i))
	y := r.state.Load()
	if phaseOf(y) != phaseCommitted || y&doomedBit != 0 || genOf(y) != genOf(x) {
		return RowStatus{}, false
	}
	return st, true
}

// Rows iterates over the selectable rows (committed, not released) in index
// order, with their status. Rows committed or removed during the walk may or may
// not be seen.
func (s *Shard) Rows() iter.Seq[RowStatus] {
	return func(yield func(RowStatus) bool) {
		if s.closed.Load() {
			return
		}
		for i := range s.cap {
			if st, ok := s.snapshot(i); ok && !yield(st) {
				return
			}
		}
	}
}

// CommitSeq returns the insertion sequence the next commit will get: the number of
// commits so far. Comparing it with a remembered value is the cheap way to learn
// that rows were committed.
func (s *Shard) CommitSeq() uint64 {
	if s.closed.Load() {
		return 0
	}
	return s.log.end()
}

// ReadCommits appends to dst, in commit order, up to max rows committed with
// insertion sequence from onwards that are still selectable, and returns them with
// the sequence to pass next time. It stops early at a commit still in progress. It
// returns an error wrapping ErrMissed if the commit log no longer holds sequence
// from (the caller fell a log's length behind, or the shard was restored from a
// checkpoint): then take seq := CommitSeq(), walk Rows(), and continue from seq.
func (s *Shard) ReadCommits(from uint64, dst []RowStatus, max int) ([]RowStatus, uint64, error) {
	if s.closed.Load() {
		return dst, from, ErrClosed
	}
	end := s.log.end()
	if from > end {
		return dst, from, fmt.Errorf("store: read commits of %q from %d: only %d commits so far", s.name, from, end)
	}
	if end-from > s.log.capacity() {
		return dst, from, fmt.Errorf("store: read commits of %q from %d (now at %d): %w", s.name, from, end, ErrMissed)
	}
	// The rows' status lines were last written by their writers, on other
	// CPUs: ask for all of them first, so that they move together rather
	// than each snapshot below waiting for its own (a row still committing
	// stops the pass, and its line goes back to its writer at the writer's
	// next store; the other lines are not written again until the row is
	// freed).
	for q, n := from, 0; q < end && n < max; q, n = q+1, n+1 {
		if i, ok := s.log.read(q); ok && i < s.cap {
			prefetch.Write(unsafe.Pointer(s.row(i)))
		}
	}
	p := from
	for n := 0; p < end && n < max; p++ {
		i, ok := s.log.read(p)
		if !ok || i >= s.cap {
			return dst, p, fmt.Errorf("store: read commits of %q at %d: %w", s.name, p, ErrMissed)
		}
		r := s.row(i)
		x := r.state.Load()
		if phaseOf(x) == phaseCommitting {
			if s.reclaimCommitting(i, x) {
				continue
			}
			break // published but not yet committed: come back for it
		}
		if st, ok := s.snapshot(i); ok && st.Seq == p {
			dst = append(dst, st)
			n++
		}
	}
	return dst, p, nil
}

// reclaimCommitting frees row i (status word x, committing) if its writer is dead.
func (s *Shard) reclaimCommitting(i uint32, x uint64) bool {
	slot := slotOf(x)
	id := s.slotWord(slot).Load()
	if id == 0 || !s.dead.isDead(id) {
		return false
	}
	if !s.row(i).state.CompareAndSwap(x, freeWord(genOf(x))) {
		return false
	}
	s.free.push(i)
	return true
}

// CopyBlock copies column col's block of the committed row ref into dst (which must
// hold BlockBytes(col) bytes) without pinning the row, and then checks that the row
// was not replaced during the copy; if it was, it returns an error wrapping
// ErrStale and dst holds garbage.
func (s *Shard) CopyBlock(ref Ref, col int, dst []byte) error {
	if err := s.checkRef(ref); err != nil {
		return err
	}
	if col < 0 || col >= len(s.tables) {
		return fmt.Errorf("store: column %d out of range [0, %d) of %q", col, len(s.tables), s.name)
	}
	c := s.l.spec.Columns[col]
	if len(dst) < s.l.cols[col].blockBytes {
		return fmt.Errorf("store: column %q: want %d bytes (%s), got a buffer of %d", c.Name, s.l.cols[col].blockBytes, c.Describe(), len(dst))
	}
	i := uint32(ref.Index)
	r := s.row(i)
	x := r.state.Load()
	if phaseOf(x) != phaseCommitted || x&doomedBit != 0 || r.seq.Load() != ref.Seq {
		return fmt.Errorf("store: copy %v of %q: %w", ref, s.name, ErrStale)
	}
	copy(dst, s.block(col, i))
	y := r.state.Load()
	if phaseOf(y) != phaseCommitted || genOf(y) != genOf(x) {
		return fmt.Errorf("store: copy %v of %q: replaced during the copy: %w", ref, s.name, ErrStale)
	}
	return nil
}
