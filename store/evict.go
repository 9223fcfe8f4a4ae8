package store

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Remover is an eviction policy: when Allocate finds no free row, the committed,
// unpinned row that comes first in the Remover's order is evicted and handed to the
// writer. Each process evaluates the policy itself over the shared status table,
// so every process attached to a shard must use a Remover of the same Name (the
// shard records it).
type Remover interface {
	// Name identifies the policy, such as "fifo".
	Name() string
	// Before reports whether row a should be evicted before row b.
	Before(a, b RowStatus) bool
}

// FIFO evicts the oldest row (lowest insertion sequence) first.
type FIFO struct{}

// Name returns "fifo".
func (FIFO) Name() string { return RemoverFIFO }

// Before orders by insertion sequence, oldest first.
func (FIFO) Before(a, b RowStatus) bool { return a.Seq < b.Seq }

// LIFO evicts the newest row first.
type LIFO struct{}

// Name returns "lifo".
func (LIFO) Name() string { return RemoverLIFO }

// Before orders by insertion sequence, newest first.
func (LIFO) Before(a, b RowStatus) bool { return a.Seq > b.Seq }

// LowestPriority evicts the row of lowest priority first, the oldest among equals.
type LowestPriority struct{}

// Name returns "lowest_priority".
func (LowestPriority) Name() string { return RemoverLowestPriority }

// Before orders by priority, then by insertion sequence.
func (LowestPriority) Before(a, b RowStatus) bool {
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	return a.Seq < b.Seq
}

// builtinRemover returns the built-in policy called name; RemoverNone gives nil.
func builtinRemover(name string) (Remover, bool) {
	switch name {
	case RemoverFIFO, "":
		return FIFO{}, true
	case RemoverLIFO:
		return LIFO{}, true
	case RemoverLowestPriority:
		return LowestPriority{}, true
	case RemoverNone:
		return nil, true
	}
	return nil, false
}

func removerName(r Remover) string {
	if r == nil {
		return RemoverNone
	}
	return r.Name()
}

// pickRemover reconciles the spec's remover name with a WithRemover option.
func pickRemover(name string, given Remover) (Remover, error) {
	if given != nil {
		if given.Name() == "" || len(given.Name()) > MaxNameLen || given.Name() == RemoverNone {
			return nil, fmt.Errorf("store: remover name %q: want 1 to %d bytes, not %q", given.Name(), MaxNameLen, RemoverNone)
		}
		if name != "" && name != given.Name() {
			return nil, fmt.Errorf("store: %w: remover: shard has %q, option gives %q", ErrLayout, name, given.Name())
		}
		return given, nil
	}
	r, ok := builtinRemover(name)
	if !ok {
		return nil, fmt.Errorf("store: remover %q is not built in: pass it with WithRemover", name)
	}
	return r, nil
}

// The evictor keeps, per process, a heap of eviction candidates ordered by the
// Remover: the k best victims found by the last scan of the status table, plus every
// row committed since (read from the commit log). A candidate is checked against the
// live status word before it is taken, and put back with fresh values if its
// priority or times-sampled changed; only rows whose priority fell after the last scan
// can be evicted later than the policy says, until the next scan.
type evictor struct {
	mu     sync.Mutex
	heap   []RowStatus
	k      int
	logSeq uint64 // commits before this are in the heap (or were scanned)
	stale  bool
	// When the last scan found more than k candidates, bound is the worst one it
	// kept: rows it left out all come after bound, so a row may join the heap later
	// only if it comes before bound.
	bound    RowStatus
	hasBound bool
	pinned   []RowStatus // popVictim's scratch

	fifo      fifoState
	evictions uint64 // since the last maintenance scan

	idleUntil time.Time // no scan before this (the last one found nothing)

	// With RemoverNone, the shard's removals counter at this handle's last
	// look (seenRemoved), when it last moved (movedAt) and at the last scan
	// (scanRemoved): see evict.
	seenRemoved, scanRemoved uint64
	movedAt                  time.Time
}

func (e *evictor) init(capacity int) {
	e.k = min(max(capacity/4, min(capacity, 256)), 16384)
	e.stale = true
}

// admit reports whether st may join the heap (see bound).
func (e *evictor) admit(r Remover, st RowStatus) bool {
	return !e.hasBound || r.Before(st, e.bound)
}

// evict reserves up to want rows for this handle by eviction (committed ->
// reserved) and appends them to dst, scanning the status table first if its
// candidates ran out. The scan also reclaims the rows of dead writers and puts
// free rows missing from the free queue back; evict then returns no rows so that
// the caller pops them. A scan that found nothing at all is not repeated for
// scanPause.
func (s *Shard) evict(want int, dst []uint32) []uint32 {
	e := &s.ev
	e.mu.Lock()
	defer e.mu.Unlock()
	n0 := len(dst)
	defer func() {
		if n := len(dst) - n0; n > 0 {
			e.evictions += uint64(n)
			s.removed.Add(uint64(n))
		}
	}()
	// Once per turnover of the shard (and at most every maintenanceEvery
	// evictions), look for the rows of dead writers and for free rows the queue
	// lost: the fast paths below would never see them. The FIFO walk also starts
	// afresh, finding rows that other processes' walks held back.
	// With a remover that keeps a candidate heap, the same scan rebuilds it,
	// so that a row whose priority fell since the last one is ranked anew.
	if e.evictions >= max(uint64(s.cap), maintenanceEvery) {
		e.evictions = 0
		e.fifo.valid = false
		var cand *evictor
		if s.remover != nil {
			cand = e
		}
		if s.rescan(cand, false) > 0 {
			return dst
		}
	}
	switch s.remover.(type) {
	case FIFO:
		dst = s.evictFIFO(want, dst)
	case LIFO:
		for len(dst)-n0 < want {
			i, ok := s.evictLIFO()
			if !ok {
				break
			}
			dst = append(dst, i)
		}
	}
	if len(dst) > n0 {
		return dst
	}
	if s.remover != nil {
		s.merge()
		if !e.stale && len(e.heap) > 0 {
			if dst = s.popVictims(want, dst); len(dst) > n0 {
				return dst
			}
		}
	}
	if s.remover == nil {
		// Nothing to evict: the table over the shard releases rows, onto the
		// free queue. While it does (removals moved within scanPause of now),
		// wait for them rather than walk the whole status table, except once
		// per turnover of the shard (dead writers' rows, lost indices).
		r, now := s.removed.Load(), s.clock.Now()
		if r != e.seenRemoved {
			e.seenRemoved, e.movedAt = r, now
		}
		if r-e.scanRemoved < uint64(s.cap) && now.Sub(e.movedAt) < scanPause {
			return dst
		}
	}
	if s.clock.Now().Before(e.idleUntil) {
		return dst
	}
	e.scanRemoved = s.removed.Load()
	var cand *evictor
	if s.remover != nil {
		cand = e
	}
	if s.rescan(cand, true) > 0 {
		return dst
	}
	if s.remover != nil {
		if dst = s.popVictims(want, dst); len(dst) > n0 {
			return dst
		}
	}
	e.idleUntil = s.clock.Now().Add(scanPause)
	return dst
}

// popVictims reserves up to want of the best candidates, appending them to dst.
func (s *Shard) popVictims(want int, dst []uint32) []uint32 {
	for n := 0; n < want; n++ {
		i, ok := s.popVictim()
		if !ok {
			break
		}
		dst = append(dst, i)
	}
	return dst
}

// maintenanceEvery is the least number of evictions between maintenance scans.
const maintenanceEvery = 1024

// scanPause is how long a waiting Allocate leaves the status table alone after a
// scan that found no row to take.
const scanPause = 2 * time.Millisecond

// merge adds the rows committed since the last merge to the candidate heap.
func (s *Shard) merge() {
	e := &s.ev
	if e.stale {
		return
	}
	end := s.log.end()
	if end-e.logSeq > uint64(e.k) || end-e.logSeq > s.log.capacity() {
		e.stale = true
		return
	}
	for p := e.logSeq; p < end; p++ {
		i, ok := s.log.read(p)
		if !ok || i >= s.cap {
			e.stale = true
			return
		}
		r := s.row(i)
		x := r.state.Load()
		if phaseOf(x) == phaseCommitting {
			e.logSeq = p // not published yet: merge it next time
			return
		}
		if st, ok := s.snapshot(i); ok && st.Seq == p && e.admit(s.remover, st) {
			e.push(s.remover, st)
		}
	}
	e.logSeq = end
	if len(e.heap) > 2*e.k {
		e.stale = true
	}
}

// popVictim reserves the best valid candidate for this handle. Pinned candidates
// are skipped but kept: they go back into the heap afterwards.
func (s *Shard) popVictim() (uint32, bool) {
	e := &s.ev
	defer func() {
		for _, c := range e.pinned {
			e.push(s.remover, c)
		}
		e.pinned = e.pinned[:0]
	}()
	budget := 2*len(e.heap) + 8
	for len(e.heap) > 0 && budget > 0 {
		budget--
		c := e.heap[0]
		r := s.row(uint32(c.Index))
		x := r.state.Load()
		if phaseOf(x) != phaseCommitted || x&doomedBit != 0 || r.seq.Load() != c.Seq {
			e.pop(s.remover)
			continue
		}
		cur := r.load(c.Index)
		if math.Float64bits(cur.Priority) != math.Float64bits(c.Priority) || cur.TimesSampled != c.TimesSampled {
			e.pop(s.remover)
			if s.validCommitted(c.Index, x) && e.admit(s.remover, cur) {
				e.push(s.remover, cur)
			}
			continue
		}
		if pinsOf(x) > 0 {
			e.pop(s.remover)
			e.pinned = append(e.pinned, c)
			continue
		}
		if r.state.CompareAndSwap(x, reservedWord(genOf(x), s.slot)) {
			e.pop(s.remover)
			return uint32(c.Index), true
		}
		// The word changed under us (a pin, a release): look again.
	}
	return 0, false
}

// validCommitted reports whether row i still has status word x.
func (s *Shard) validCommitted(i int, x uint64) bool {
	return s.row(uint32(i)).state.Load() == x
}

// rescan walks the status table: it reclaims the rows of writers that died (rows
// being written and the rows of their chunks), pushes free rows back onto the
// free queue (the queue may have lost them), and, with e, refills e's candidate
// heap with the k best victims. With steal, when it finds no row to push, it
// takes one row from another live writer's chunk and pushes that: a writer that
// finds nothing free is not starved by rows reserved for writers that do not use
// them yet. It returns the number of rows it pushed.
func (s *Shard) rescan(e *evictor, steal bool) int {
	var seq0 uint64
	truncated := false
	if e != nil {
		seq0 = s.log.end()
		e.heap = e.heap[:0]
	}
	dead := s.deadSlots()
	pushed := 0
	stealRow, stealWord := uint32(0), uint64(0)
	var worst func(a, b RowStatus) bool
	if e != nil {
		worst = func(a, b RowStatus) bool { return s.remover.Before(b, a) }
	}
	for i := range s.cap {
		r := s.row(i)
		x := r.state.Load()
		switch phaseOf(x) {
		case phaseFree:
			if !isReserved(x) {
				if s.free.push(i) {
					pushed++
				}
			} else if s.reclaimRow(i, x, dead) {
				if s.free.push(i) {
					pushed++
				}
			} else if steal && stealWord == 0 && slotOf(x) != s.slot {
				stealRow, stealWord = i, x
			}
		case phaseWriting, phaseCommitting:
			if s.reclaimRow(i, x, dead) && s.free.push(i) {
				pushed++
			}
		case phaseCommitted:
			if e == nil || x&doomedBit != 0 {
				continue
			}
			st, ok := s.snapshot(i)
			if !ok {
				continue
			}
			// Keep the k best victims: a max-heap (by worst) of at most k.
			if len(e.heap) < e.k {
				e.heap = append(e.heap, st)
				siftUp(e.heap, len(e.heap)-1, worst)
				continue
			}
			truncated = true
			if s.remover.Before(st, e.heap[0]) {
				e.heap[0] = st
				siftDown(e.heap, 0, worst)
			}
		}
	}
	if pushed == 0 && stealWord != 0 && s.row(stealRow).state.CompareAndSwap(stealWord, freeWord(genOf(stealWord))) && s.free.push(stealRow) {
		pushed++
	}
	s.freeSlots(dead)
	if e != nil {
		e.hasBound = truncated
		if truncated {
			e.bound = e.heap[0]
		}
		heapify(e.heap, s.remover.Before)
		e.logSeq = seq0
		e.stale = false
		s.merge()
	}
	return pushed
}

// Reclaim returns to the free queue the rows whose writer died between Allocate and
// Commit or that were reserved in a dead writer's chunk, gives back the Views that dead processes held (a row released while
// they held it is freed; the others become evictable again), and frees those
// processes' slots. It returns how many rows went back to the free queue.
// The owner calls it now and then; Allocate does the same when the shard is full.
func (s *Shard) Reclaim(ctx context.Context) (int, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return s.reclaim(), nil
}

func (s *Shard) reclaim() int {
	s.ev.mu.Lock()
	defer s.ev.mu.Unlock()
	dead := s.deadSlots()
	if dead.empty() {
		return 0
	}
	n := 0
	for i := range s.cap {
		r := s.row(i)
		x := r.state.Load()
		if p := phaseOf(x); (p == phaseWriting || p == phaseCommitting || isReserved(x)) && s.reclaimRow(i, x, dead) {
			s.free.push(i)
			n++
		}
	}
	// The Views the dead processes held.
	var rows []uint32
	for slot, id := range dead.ids {
		rows = s.pins.takeDead(slot, id, rows)
	}
	for _, i := range rows {
		if freed, _ := s.dropPin(i); freed {
			n++
		}
	}
	s.freeSlots(dead)
	return n
}

// reclaimRow frees row i, whose status word was x (reserved, writing or
// committing), if its
// writer's slot is in dead and still holds the dead identity. The slot is read after
// x: a process that took the slot over registered before it allocated, so a row it
// wrote shows its identity there, not the dead one.
func (s *Shard) reclaimRow(i uint32, x uint64, dead slotSet) bool {
	slot := slotOf(x)
	id, ok := dead.ids[slot]
	if !ok || s.slotWord(slot).Load() != id {
		return false
	}
	return s.row(i).state.CompareAndSwap(x, freeWord(genOf(x)))
}

// slotSet is a set of writer slots with the identities they held.
type slotSet struct {
	ids map[int]uint64
}

func (d slotSet) empty() bool { return len(d.ids) == 0 }

// deadSlots returns the writer slots whose process is gone. It is computed before a
// scan, so that a process that dies during the scan is left for the next one (its
// slot is freed only after a scan that saw all its rows).
func (s *Shard) deadSlots() slotSet {
	d := slotSet{}
	for i := 1; i < maxSlots; i++ {
		id := s.slotWord(i).Load()
		if id != 0 && s.dead.isDead(id) {
			if d.ids == nil {
				d.ids = make(map[int]uint64)
			}
			d.ids[i] = id
		}
	}
	return d
}

// freeSlots gives back the slots of dead processes (after a scan reclaimed their rows).
func (s *Shard) freeSlots(d slotSet) {
	for slot, id := range d.ids {
		s.slotWord(slot).CompareAndSwap(id, 0)
	}
}

// deadSet remembers identities found dead (a dead process stays dead).
type deadSet struct {
	mu   sync.Mutex
	dead map[uint64]bool
}

func (d *deadSet) isDead(id uint64) bool {
	d.mu.Lock()
	known := d.dead[id]
	d.mu.Unlock()
	if known {
		return true
	}
	if identAlive(id) {
		return false
	}
	d.mu.Lock()
	if d.dead == nil {
		d.dead = make(map[uint64]bool)
	}
	d.dead[id] = true
	d.mu.Unlock()
	return true
}

// The candidate heap: a binary heap ordered by a "before" function.

func (e *evictor) push(r Remover, st RowStatus) {
	e.heap = append(e.heap, st)
	siftUp(e.heap, len(e.heap)-1, r.Before)
}

func (e *evictor) pop(r Remover) {
	n := len(e.heap) - 1
	e.heap[0] = e.heap[n]
	e.heap = e.heap[:n]
	if n > 0 {
		siftDown(e.heap, 0, r.Before)
	}
}

func siftUp(h []RowStatus, i int, less func(a, b RowStatus) bool) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(h[i], h[p]) {
			return
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func siftDown(h []RowStatus, i int, less func(a, b RowStatus) bool) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && less(h[r], h[l]) {
			m = r
		}
		if !less(h[m], h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func heapify(h []RowStatus, less func(a, b RowStatus) bool) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i, less)
	}
}
