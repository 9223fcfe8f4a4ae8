package store

import "slices"

// FIFO and LIFO order rows by insertion sequence, which is the commit log's order,
// so for them the evictor walks the log instead of keeping a heap: O(1) per
// eviction.
//
// FIFO keeps a cursor into the log: every row committed before the cursor is gone,
// or pinned, or in survivors (rows committed too long ago for the log to still
// hold, kept sorted by sequence). The oldest committed row is then the first live
// survivor or else the first live log entry from the cursor on. The cursor moves
// only over entries whose row is gone; a pinned row, or a commit still in progress,
// holds it back (later entries are still looked at).

// fifoState is the FIFO walk's position (per process, under evictor.mu).
type fifoState struct {
	valid     bool
	cursor    uint64
	survivors []survivor
	head      int // survivors before head are gone
}

type survivor struct {
	seq uint64
	idx uint32
}

// fifoWalk bounds how many pinned rows (or commits in progress) one eviction looks
// past.
const fifoWalk = 4096

// evictFIFO takes the oldest committed, unpinned row.
func (s *Shard) evictFIFO() (Pending, bool) {
	f := &s.ev.fifo
	end := s.log.end()
	half := s.log.capacity() / 2
	if !f.valid || end-f.cursor > half {
		s.rebuildFIFO(end - min(end, half))
	}
	// Survivors first: they are older than anything in the log.
	for i := f.head; i < len(f.survivors); i++ {
		sv := f.survivors[i]
		p, live, ok := s.tryEvict(sv.idx, sv.seq)
		if ok {
			return p, true
		}
		if !live && i == f.head {
			f.head++
		}
	}
	if f.head == len(f.survivors) {
		f.survivors, f.head = f.survivors[:0], 0
	}
	// Entries of gone rows move the cursor (each is passed once); live ones held back
	// by pins or commits in progress are passed again on every eviction, so at most
	// fifoWalk of them are looked at.
	advancing := true
	for p, held := f.cursor, 0; p < end && held < fifoWalk; p++ {
		i, ok := s.log.read(p)
		if !ok || i >= s.cap {
			// The log lost this entry (overwritten, or the shard was restored): make
			// every committed row a survivor and start the log walk at the end.
			s.rebuildFIFO(end)
			return Pending{}, false
		}
		v, live, ok := s.tryEvict(i, p)
		if ok {
			if advancing {
				f.cursor = p + 1
			}
			return v, true
		}
		if live {
			advancing = false
			held++
		} else if advancing {
			f.cursor = p + 1
		}
	}
	return Pending{}, false
}

// rebuildFIFO makes the committed rows with sequence below from the survivors and
// puts the cursor at from.
func (s *Shard) rebuildFIFO(from uint64) {
	f := &s.ev.fifo
	f.survivors, f.head = f.survivors[:0], 0
	for i := range s.cap {
		if st, ok := s.snapshot(i); ok && st.Seq < from {
			f.survivors = append(f.survivors, survivor{seq: st.Seq, idx: i})
		}
	}
	slices.SortFunc(f.survivors, func(a, b survivor) int {
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	f.cursor = from
	f.valid = true
}

// evictLIFO takes the newest committed, unpinned row, walking the log back from
// its end; it gives up (for the general evictor) after half a log.
func (s *Shard) evictLIFO() (Pending, bool) {
	end := s.log.end()
	half := s.log.capacity() / 2
	for p := end; p > 0 && end-p < half; {
		p--
		i, ok := s.log.read(p)
		if !ok || i >= s.cap {
			break
		}
		if v, _, ok := s.tryEvict(i, p); ok {
			return v, true
		}
	}
	return Pending{}, false
}

// tryEvict takes row i for writing if it is still the committed occupant with
// sequence seq, unreleased and unpinned. live reports whether that occupant is
// still there (pinned, or its commit still in progress) when it was not taken.
func (s *Shard) tryEvict(i uint32, seq uint64) (p Pending, live, ok bool) {
	r := s.row(i)
	for {
		x := r.state.Load()
		switch phaseOf(x) {
		case phaseCommitting:
			// Maybe this very commit, still publishing: wait for it.
			return Pending{}, true, false
		case phaseCommitted:
		default:
			return Pending{}, false, false
		}
		if x&doomedBit != 0 || r.seq.Load() != seq {
			return Pending{}, false, false
		}
		if pinsOf(x) > 0 {
			return Pending{}, true, false
		}
		w := writingWord(genOf(x)+1, s.slot)
		if r.state.CompareAndSwap(x, w) {
			s.removed.Add(1)
			return Pending{s: s, idx: i, word: w}, false, true
		}
	}
}
