package store

import "slices"

// FIFO and LIFO order rows by insertion sequence, which is the commit log's order,
// so for them the evictor walks the log instead of keeping a heap: O(1) per
// eviction.
//
// FIFO: the writers of a shard share one claim in the header, the log position
// up to which rows have been claimed for eviction. A process claims the next
// positions for a chunk with one compare-and-swap, so that writers evicting at
// the same time do not look at the same rows. A row it claims but cannot evict
// (pinned, or its commit still in progress) becomes one of its survivors:
// rows committed before the claim that are still there, kept sorted by
// sequence and tried first. The oldest committed row is thus the first live
// survivor or else the row at the claim. Rows another process held back are
// found again when the walk starts afresh, once per turnover of the shard (see
// evict): its survivors are then rebuilt from a scan of the status table.

// fifoState is the FIFO walk's state (per process, under evictor.mu).
type fifoState struct {
	valid     bool
	survivors []survivor
	head      int // survivors before head are gone
}

type survivor struct {
	seq uint64
	idx uint32
}

// fifoWalk bounds how many survivors (pinned rows, commits in progress) one
// eviction looks at.
const fifoWalk = 4096

// evictFIFO reserves up to want of the oldest committed, unpinned rows for this
// handle, appending them to dst.
func (s *Shard) evictFIFO(want int, dst []uint32) []uint32 {
	f := &s.ev.fifo
	n0 := len(dst)
	end := s.log.end()
	half := s.log.capacity() / 2
	if claim := s.claim.Load(); !f.valid || end-min(end, claim) > half {
		s.rebuildFIFO(max(claim, end-min(end, half)))
	}
	// Survivors first: they are older than anything not yet claimed.
	for i, looked := f.head, 0; i < len(f.survivors) && len(dst)-n0 < want && looked < fifoWalk; i, looked = i+1, looked+1 {
		sv := f.survivors[i]
		live, ok := s.tryEvict(sv.idx, sv.seq)
		if ok {
			dst = append(dst, sv.idx)
		}
		if !live && i == f.head {
			f.head++
		}
	}
	if f.head == len(f.survivors) {
		f.survivors, f.head = f.survivors[:0], 0
	}
	for len(dst)-n0 < want {
		c := s.claim.Load()
		if c >= end {
			if end = s.log.end(); c >= end {
				break
			}
		}
		if end-c > half {
			s.rebuildFIFO(end - half)
			continue
		}
		n := min(uint64(want-(len(dst)-n0)), end-c)
		if !s.claim.CompareAndSwap(c, c+n) {
			continue
		}
		for p := c; p < c+n; p++ {
			i, ok := s.log.read(p)
			if !ok || i >= s.cap {
				// The log lost this entry (overwritten, or the shard was restored):
				// make every committed row before the log's end a survivor.
				s.rebuildFIFO(s.log.end())
				return dst
			}
			if live, ok := s.tryEvict(i, p); ok {
				dst = append(dst, i)
			} else if live {
				f.survivors = append(f.survivors, survivor{seq: p, idx: i})
			}
		}
	}
	return dst
}

// rebuildFIFO makes the committed rows with sequence below from the survivors
// and moves the shared claim to from, if it is behind.
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
	for {
		c := s.claim.Load()
		if c >= from || s.claim.CompareAndSwap(c, from) {
			break
		}
	}
	f.valid = true
}

// evictLIFO reserves the newest committed, unpinned row for this handle, walking
// the log back from its end; it gives up (for the general evictor) after half a
// log.
func (s *Shard) evictLIFO() (uint32, bool) {
	end := s.log.end()
	half := s.log.capacity() / 2
	for p := end; p > 0 && end-p < half; {
		p--
		i, ok := s.log.read(p)
		if !ok || i >= s.cap {
			break
		}
		if _, ok := s.tryEvict(i, p); ok {
			return i, true
		}
	}
	return 0, false
}

// tryEvict reserves row i for this handle if it is still the committed occupant
// with sequence seq, unreleased and unpinned. live reports whether that occupant
// is still there (pinned, or its commit still in progress) when it was not taken.
func (s *Shard) tryEvict(i uint32, seq uint64) (live, ok bool) {
	r := s.row(i)
	for {
		x := r.state.Load()
		switch phaseOf(x) {
		case phaseCommitting:
			// Maybe this very commit, still publishing: wait for it.
			return true, false
		case phaseCommitted:
		default:
			return false, false
		}
		if x&doomedBit != 0 || r.seq.Load() != seq {
			return false, false
		}
		if pinsOf(x) > 0 {
			return true, false
		}
		if r.state.CompareAndSwap(x, reservedWord(genOf(x), s.slot)) {
			return false, true
		}
	}
}
