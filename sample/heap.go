package sample

import "math/rand/v2"

// Heap picks the item with the highest (MaxHeap) or lowest (MinHeap) priority; ties
// go to the item least recently inserted or updated. It is an indexed binary heap:
// Insert, Update and Delete are O(log n), a pick O(1).
type Heap struct {
	min   bool
	heap  []int32   // heap order -> slot
	pos   []int32   // slot -> heap position, -1 when absent
	prio  []float64 // by slot
	stamp []uint64  // by slot: when inserted or last updated
	clock uint64

	cand  []int32    // scratch for Best
	dirty dirtyPages // pages of slots changed, for a DeviceSelection's mirror
}

var _ Ordered = (*Heap)(nil)

// NewMaxHeap returns an empty selector that picks the highest priority.
func NewMaxHeap() *Heap { return &Heap{} }

// NewMinHeap returns an empty selector that picks the lowest priority.
func NewMinHeap() *Heap { return &Heap{min: true} }

// Kind reports KindMaxHeap or KindMinHeap.
func (h *Heap) Kind() Kind {
	if h.min {
		return KindMinHeap
	}
	return KindMaxHeap
}

// Check refuses NaN, which has no place in an order.
func (h *Heap) Check(priority float64) error { return checkNotNaN(h.Kind(), priority) }

func (h *Heap) has(slot int) bool { return slot >= 0 && slot < len(h.pos) && h.pos[slot] >= 0 }

// before reports whether slot a is picked before slot b.
func (h *Heap) before(a, b int32) bool {
	pa, pb := h.prio[a], h.prio[b]
	if pa != pb {
		if h.min {
			return pa < pb
		}
		return pa > pb
	}
	return h.stamp[a] < h.stamp[b]
}

// Insert adds slot with priority.
func (h *Heap) Insert(slot int, priority float64) error {
	if err := h.Check(priority); err != nil {
		return err
	}
	if slot < 0 || h.has(slot) {
		return errSlot(h.Kind(), slot, h.has(slot))
	}
	if slot >= len(h.pos) {
		n := max(2*len(h.pos), slot+1, 16)
		pos, prio, stamp := make([]int32, n), make([]float64, n), make([]uint64, n)
		copy(pos, h.pos)
		copy(prio, h.prio)
		copy(stamp, h.stamp)
		for i := len(h.pos); i < n; i++ {
			pos[i] = -1
		}
		h.pos, h.prio, h.stamp = pos, prio, stamp
	}
	h.prio[slot] = priority
	h.stamp[slot] = h.clock
	h.clock++
	h.pos[slot] = int32(len(h.heap))
	h.heap = append(h.heap, int32(slot))
	h.up(len(h.heap) - 1)
	h.dirty.mark(slot)
	return nil
}

// Update sets the priority of slot; the slot becomes the most recently updated.
func (h *Heap) Update(slot int, priority float64) error {
	if err := h.Check(priority); err != nil {
		return err
	}
	if !h.has(slot) {
		return errSlot(h.Kind(), slot, false)
	}
	h.prio[slot] = priority
	h.stamp[slot] = h.clock
	h.clock++
	i := int(h.pos[slot])
	if !h.up(i) {
		h.down(i)
	}
	h.dirty.mark(slot)
	return nil
}

// Delete removes slot.
func (h *Heap) Delete(slot int) {
	if !h.has(slot) {
		return
	}
	i := int(h.pos[slot])
	last := len(h.heap) - 1
	if i != last {
		h.swap(i, last)
	}
	h.heap = h.heap[:last]
	h.pos[slot] = -1
	h.dirty.mark(slot)
	if i != last {
		if !h.up(i) {
			h.down(i)
		}
	}
}

// Sample fills dst with the first slot of the order.
func (h *Heap) Sample(_ *rand.Rand, dst []Pick) {
	if len(h.heap) == 0 {
		panic("sample: " + h.Kind().String() + " selector: Sample on an empty selector")
	}
	for i := range dst {
		dst[i] = Pick{Slot: int(h.heap[0]), Probability: 1}
	}
}

// Best appends up to k slots in selection order (O(k log k)).
func (h *Heap) Best(k int, dst []int) []int {
	if k <= 0 || len(h.heap) == 0 {
		return dst
	}
	// A best-first walk of the heap: cand is a small heap of heap positions
	// ordered like the heap itself.
	less := func(a, b int32) bool { return h.before(h.heap[a], h.heap[b]) }
	cand := append(h.cand[:0], 0)
	for len(cand) > 0 && k > 0 {
		top := cand[0]
		dst = append(dst, int(h.heap[top]))
		k--
		last := len(cand) - 1
		cand[0] = cand[last]
		cand = cand[:last]
		siftDown32(cand, 0, less)
		for _, c := range [2]int32{2*top + 1, 2*top + 2} {
			if int(c) < len(h.heap) {
				cand = append(cand, c)
				siftUp32(cand, len(cand)-1, less)
			}
		}
	}
	h.cand = cand[:0]
	return dst
}

// Len is the number of present slots.
func (h *Heap) Len() int { return len(h.heap) }

// Clear removes every slot.
func (h *Heap) Clear() {
	for _, s := range h.heap {
		h.pos[s] = -1
	}
	h.heap = h.heap[:0]
	h.dirty.markAll()
}

// Priority is the priority of a present slot.
func (h *Heap) Priority(slot int) float64 { return h.prio[slot] }

// Stamp is the order in which slot was last inserted or updated (smaller is
// earlier); it breaks ties between equal priorities.
func (h *Heap) Stamp(slot int) uint64 { return h.stamp[slot] }

func (h *Heap) swap(i, j int) {
	h.heap[i], h.heap[j] = h.heap[j], h.heap[i]
	h.pos[h.heap[i]] = int32(i)
	h.pos[h.heap[j]] = int32(j)
}

// up moves position i towards the root; it reports whether it moved.
func (h *Heap) up(i int) bool {
	moved := false
	for i > 0 {
		p := (i - 1) / 2
		if !h.before(h.heap[i], h.heap[p]) {
			break
		}
		h.swap(i, p)
		i = p
		moved = true
	}
	return moved
}

func (h *Heap) down(i int) {
	n := len(h.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && h.before(h.heap[r], h.heap[l]) {
			c = r
		}
		if !h.before(h.heap[c], h.heap[i]) {
			return
		}
		h.swap(i, c)
		i = c
	}
}

func siftUp32(a []int32, i int, less func(a, b int32) bool) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(a[i], a[p]) {
			return
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func siftDown32(a []int32, i int, less func(a, b int32) bool) {
	n := len(a)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && less(a[r], a[l]) {
			c = r
		}
		if !less(a[c], a[i]) {
			return
		}
		a[i], a[c] = a[c], a[i]
		i = c
	}
}
