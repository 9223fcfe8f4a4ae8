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

// Sequence keeps insertion order for FIFO and LIFO: a doubly linked list over slots,
// so Insert, Delete and a pick are O(1). Updates do not move an item.
type Sequence struct {
	lifo       bool
	prev, next []int32 // -1 ends; prev[s] == -2 marks an absent slot
	head, tail int32
	n          int
}

var _ Ordered = (*Sequence)(nil)

// NewFIFO returns an empty selector that picks the least recently inserted item.
func NewFIFO() *Sequence { return &Sequence{head: -1, tail: -1} }

// NewLIFO returns an empty selector that picks the most recently inserted item.
func NewLIFO() *Sequence { return &Sequence{lifo: true, head: -1, tail: -1} }

const absent = -2

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
	return slot >= 0 && slot < len(q.prev) && q.prev[slot] != absent
}

// Insert appends slot at the young end.
func (q *Sequence) Insert(slot int, priority float64) error {
	if err := q.Check(priority); err != nil {
		return err
	}
	if slot < 0 || q.has(slot) {
		return errSlot(q.Kind(), slot, q.has(slot))
	}
	if slot >= len(q.prev) {
		n := max(2*len(q.prev), slot+1, 16)
		p, x := make([]int32, n), make([]int32, n)
		copy(p, q.prev)
		copy(x, q.next)
		for i := len(q.prev); i < n; i++ {
			p[i] = absent
		}
		q.prev, q.next = p, x
	}
	s := int32(slot)
	q.prev[s], q.next[s] = q.tail, -1
	if q.tail >= 0 {
		q.next[q.tail] = s
	} else {
		q.head = s
	}
	q.tail = s
	q.n++
	return nil
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

// Delete unlinks slot.
func (q *Sequence) Delete(slot int) {
	if !q.has(slot) {
		return
	}
	s := int32(slot)
	p, x := q.prev[s], q.next[s]
	if p >= 0 {
		q.next[p] = x
	} else {
		q.head = x
	}
	if x >= 0 {
		q.prev[x] = p
	} else {
		q.tail = p
	}
	q.prev[s] = absent
	q.n--
}

// Sample fills dst with the oldest (FIFO) or youngest (LIFO) slot.
func (q *Sequence) Sample(_ *rand.Rand, dst []Pick) {
	if q.n == 0 {
		panic("sample: " + q.Kind().String() + " selector: Sample on an empty selector")
	}
	s := q.head
	if q.lifo {
		s = q.tail
	}
	for i := range dst {
		dst[i] = Pick{Slot: int(s), Probability: 1}
	}
}

// Best appends up to k slots in selection order.
func (q *Sequence) Best(k int, dst []int) []int {
	if q.lifo {
		for s := q.tail; s >= 0 && k > 0; s, k = q.prev[s], k-1 {
			dst = append(dst, int(s))
		}
		return dst
	}
	for s := q.head; s >= 0 && k > 0; s, k = q.next[s], k-1 {
		dst = append(dst, int(s))
	}
	return dst
}

// Len is the number of present slots.
func (q *Sequence) Len() int { return q.n }

// Clear removes every slot.
func (q *Sequence) Clear() {
	for s := q.head; s >= 0; {
		x := q.next[s]
		q.prev[s] = absent
		s = x
	}
	q.head, q.tail, q.n = -1, -1, 0
}
