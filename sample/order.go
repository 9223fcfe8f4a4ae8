package sample

import "math/rand/v2"

// Ordered is implemented by the deterministic selectors (FIFO, LIFO, MaxHeap,
// MinHeap): their choice is the first item of a total order, and Best lists the
// order's head. The decentralized distributed sample merges the heads of every
// shard.
type Ordered interface {
	Selector
	// Best appends to dst up to k present slots in selection order: the slot
	// Sample would pick, then the one it would pick were that one deleted, and
	// so on.
	Best(k int, dst []int) []int
}

// Sequence keeps insertion order for FIFO and LIFO: a ring of slots in
// insertion order, where a delete away from the picked end only marks its
// entry dead (the slot's recorded position no longer names it), so Insert,
// Delete and a pick are O(1) amortized. When the ring fills, or holds more
// than eight dead entries for each live one, its live entries move to a new
// ring of twice their number. A FIFO's next victims are ring entries in a
// row (Ahead), not a chain of links, so a table can load their cells
// together before it deletes them. Updates do not move an item.
type Sequence struct {
	lifo bool
	ring []int32 // the entry at position p lies at ring[p&(len(ring)-1)]
	// lo and hi bound the positions in use; when n > 0 the entries at lo
	// and hi-1 are live.
	lo, hi int64
	pos    []int64 // slot -> the position of its live entry; -1: absent
	n      int
}

var _ Ordered = (*Sequence)(nil)

// NewFIFO returns an empty selector that picks the least recently inserted item.
func NewFIFO() *Sequence { return &Sequence{} }

// NewLIFO returns an empty selector that picks the most recently inserted item.
func NewLIFO() *Sequence { return &Sequence{lifo: true} }

// Kind reports KindFIFO or KindLIFO.
func (q *Sequence) Kind() Kind {
	if q.lifo {
		return KindLIFO
	}
	return KindFIFO
}

// Check refuses only NaN.
func (q *Sequence) Check(priority float64) error { return checkNotNaN(q.Kind(), priority) }

func (q *Sequence) has(slot int) bool {
	return slot >= 0 && slot < len(q.pos) && q.pos[slot] >= 0
}

// at is the slot of the entry at position p.
func (q *Sequence) at(p int64) int32 { return q.ring[p&int64(len(q.ring)-1)] }

// live reports whether the entry at position p is its slot's live one.
func (q *Sequence) live(p int64) bool { return q.pos[q.at(p)] == p }

// Insert appends slot at the young end.
func (q *Sequence) Insert(slot int, priority float64) error {
	if err := q.Check(priority); err != nil {
		return err
	}
	if slot < 0 || q.has(slot) {
		return errSlot(q.Kind(), slot, q.has(slot))
	}
	q.pos = growPositions(q.pos, slot)
	if q.hi-q.lo == int64(len(q.ring)) {
		// Full of entries: room for as many again as are live, so that
		// rebuilds come at most once every n inserts.
		q.rebuild()
	}
	q.ring[q.hi&int64(len(q.ring)-1)] = int32(slot)
	q.pos[slot] = q.hi
	q.hi++
	q.n++
	return nil
}

// rebuild moves the live entries, in order, to the positions from 0 of a
// new ring with room for as many entries again.
func (q *Sequence) rebuild() {
	size := 16
	for size < 2*(q.n+1) {
		size *= 2
	}
	ring := make([]int32, size)
	k := int64(0)
	for p := q.lo; p < q.hi; p++ {
		if s := q.at(p); q.pos[s] == p {
			ring[k] = s
			q.pos[s] = k
			k++
		}
	}
	q.ring, q.lo, q.hi = ring, 0, k
}

// Update checks the priority; the order does not depend on it.
func (q *Sequence) Update(slot int, priority float64) error {
	if err := q.Check(priority); err != nil {
		return err
	}
	if !q.has(slot) {
		return errSlot(q.Kind(), slot, false)
	}
	return nil
}

// Delete removes slot: its entry dies, and the ends move past dead entries.
func (q *Sequence) Delete(slot int) {
	if !q.has(slot) {
		return
	}
	q.pos[slot] = -1
	q.n--
	if q.n == 0 {
		q.lo, q.hi = 0, 0
		return
	}
	for !q.live(q.lo) {
		q.lo++
	}
	for !q.live(q.hi - 1) {
		q.hi--
	}
	if q.hi-q.lo > 8*int64(q.n)+64 {
		// Mostly dead entries between the ends (deletes from the middle
		// with few inserts): Best would walk them.
		q.rebuild()
	}
}

// Sample fills dst with the oldest (FIFO) or youngest (LIFO) slot.
func (q *Sequence) Sample(_ *rand.Rand, dst []Pick) {
	if q.n == 0 {
		panic("sample: " + q.Kind().String() + " selector: Sample on an empty selector")
	}
	s := q.at(q.lo)
	if q.lifo {
		s = q.at(q.hi - 1)
	}
	for i := range dst {
		dst[i] = Pick{Slot: int(s), Probability: 1}
	}
}

// Best appends up to k slots in selection order.
func (q *Sequence) Best(k int, dst []int) []int {
	if q.lifo {
		for p := q.hi - 1; p >= q.lo && k > 0; p-- {
			if q.live(p) {
				dst = append(dst, int(q.at(p)))
				k--
			}
		}
		return dst
	}
	for p := q.lo; p < q.hi && k > 0; p++ {
		if q.live(p) {
			dst = append(dst, int(q.at(p)))
			k--
		}
	}
	return dst
}

// Ahead appends to dst the slots of the entries from the i-th to the
// (i+k-1)-th in selection order, dead ones included (a dead entry's slot may
// be absent or live elsewhere): the slots a caller deleting picks one after
// another will likely delete after its next i, cheap to list because they lie
// side by side in the ring.
func (q *Sequence) Ahead(i, k int, dst []int) []int {
	if q.lifo {
		for p := q.hi - 1 - int64(i); p >= q.lo && k > 0; p, k = p-1, k-1 {
			dst = append(dst, int(q.at(p)))
		}
		return dst
	}
	for p := q.lo + int64(i); p < q.hi && k > 0; p, k = p+1, k-1 {
		dst = append(dst, int(q.at(p)))
	}
	return dst
}

// Len is the number of present slots.
func (q *Sequence) Len() int { return q.n }

// Clear removes every slot.
func (q *Sequence) Clear() {
	for p := q.lo; p < q.hi; p++ {
		if s := q.at(p); q.pos[s] == p {
			q.pos[s] = -1
		}
	}
	q.lo, q.hi, q.n = 0, 0, 0
}
