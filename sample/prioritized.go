package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Prioritized selects item i with probability p_i^c / sum_k p_k^c, where p_i is its
// priority and c the exponent (Schaul et al.'s prioritized replay, as in Reverb).
// A zero priority is never selected, also when c = 0; when every priority is zero
// the selection falls back to uniform. NaN, negative and infinite priorities are
// refused, and so is a priority whose p^c overflows.
//
// The weights p^c live in a flat sum tree of fan-out 16, one leaf per slot, whose
// nodes hold prefix sums within their group of 16: Insert, Update and Delete
// recompute one path from the children (O(16 log16 n), no drift from repeated
// additions), and Sample walks a whole batch down the tree level by level with a
// branch-free search in each group, so the memory reads of independent picks
// overlap; a pick's weight comes from the prefix sums the descent already read.
type Prioritized struct {
	exponent float64
	idx      slotIndex // the present slots, for Len and the all-zero fallback
	tree     sumTree
	dirty    dirtyPages // pages of weights changed, for a DeviceSelection's mirror

	us      []float64 // scratch for Sample
	nodes   []int32
	weights []float64
}

var _ Selector = (*Prioritized)(nil)

// NewPrioritized returns an empty prioritized selector with the given exponent.
// The exponent must be finite and non-negative.
func NewPrioritized(exponent float64) (*Prioritized, error) {
	if math.IsNaN(exponent) || math.IsInf(exponent, 0) || exponent < 0 {
		return nil, fmt.Errorf("sample: prioritized selector: exponent %v: want a finite number >= 0", exponent)
	}
	return &Prioritized{exponent: exponent, tree: newSumTree(fanout)}, nil
}

// Kind reports KindPrioritized.
func (p *Prioritized) Kind() Kind { return KindPrioritized }

// Exponent is c in p^c.
func (p *Prioritized) Exponent() float64 { return p.exponent }

// Check refuses NaN, negative and infinite priorities, and those whose weight
// p^c is not finite.
func (p *Prioritized) Check(priority float64) error {
	_, err := p.weight(priority)
	return err
}

func (p *Prioritized) weight(priority float64) (float64, error) {
	switch {
	case math.IsNaN(priority):
		return 0, fmt.Errorf("sample: prioritized selector: priority NaN refused")
	case priority < 0:
		return 0, fmt.Errorf("sample: prioritized selector: priority %v refused: negative", priority)
	case math.IsInf(priority, 1):
		return 0, fmt.Errorf("sample: prioritized selector: priority +Inf refused")
	case priority == 0:
		return 0, nil
	}
	var w float64
	switch p.exponent {
	case 0:
		w = 1
	case 1:
		w = priority
	default:
		w = math.Pow(priority, p.exponent)
	}
	if math.IsInf(w, 0) {
		return 0, fmt.Errorf("sample: prioritized selector: priority %v refused: weight %v^%v overflows", priority, priority, p.exponent)
	}
	return w, nil
}

// Insert adds slot with priority.
func (p *Prioritized) Insert(slot int, priority float64) error {
	w, err := p.weight(priority)
	if err != nil {
		return err
	}
	if slot < 0 || p.idx.has(slot) {
		return errSlot(KindPrioritized, slot, p.idx.has(slot))
	}
	p.idx.add(slot)
	if slot >= len(p.tree.w) {
		p.tree.grow(max(2*len(p.tree.w), slot+1))
	}
	p.tree.set(slot, w)
	p.dirty.mark(slot)
	return nil
}

// Update sets the priority of slot.
func (p *Prioritized) Update(slot int, priority float64) error {
	w, err := p.weight(priority)
	if err != nil {
		return err
	}
	if !p.idx.has(slot) {
		return errSlot(KindPrioritized, slot, false)
	}
	p.tree.set(slot, w)
	p.dirty.mark(slot)
	return nil
}

// Delete removes slot.
func (p *Prioritized) Delete(slot int) {
	if !p.idx.has(slot) {
		return
	}
	p.idx.remove(slot)
	p.tree.set(slot, 0)
	p.dirty.mark(slot)
}

// Sample draws len(dst) slots with replacement, each with probability
// p^c / sum p^c (uniform when every weight is zero).
func (p *Prioritized) Sample(r *rand.Rand, dst []Pick) {
	n := len(p.idx.slots)
	if n == 0 {
		panic("sample: prioritized selector: Sample on an empty selector")
	}
	total := p.tree.total()
	if total <= 0 {
		q := 1 / float64(n)
		for i := range dst {
			dst[i] = Pick{Slot: int(p.idx.slots[r.IntN(n)]), Probability: q}
		}
		return
	}
	k := len(dst)
	if cap(p.us) < k {
		p.us = make([]float64, k)
		p.nodes = make([]int32, k)
		p.weights = make([]float64, k)
	}
	us, nodes, ws := p.us[:k], p.nodes[:k], p.weights[:k]
	for i := range us {
		us[i] = r.Float64() * total
	}
	p.tree.findBatch(us, nodes, ws)
	for i, slot := range nodes {
		dst[i] = Pick{Slot: int(slot), Probability: ws[i] / total}
	}
}

// Len is the number of present slots.
func (p *Prioritized) Len() int { return len(p.idx.slots) }

// Clear removes every slot.
func (p *Prioritized) Clear() {
	p.idx.clear()
	p.tree.clear()
	p.dirty.markAll()
}

// Total is the sum of the weights p^c of the present slots.
func (p *Prioritized) Total() float64 { return p.tree.total() }

// Weight is the weight p^c of slot (0 when absent).
func (p *Prioritized) Weight(slot int) float64 {
	if !p.idx.has(slot) {
		return 0
	}
	return p.tree.w[slot]
}

// Slots appends the present slots to dst, in the selector's internal order.
func (p *Prioritized) Slots(dst []int) []int {
	for _, s := range p.idx.slots {
		dst = append(dst, int(s))
	}
	return dst
}

// fanout is the number of children of a sum-tree node: 16 float64 sums are two
// cache lines, and a tree of a million leaves is five levels deep.
const fanout = 16

// sumTree is a flat sum tree over weights w. levels[0] groups the leaves by 16 and
// holds inclusive prefix sums within each group: levels[0][16g+j] = w[16g] + ... +
// w[16g+j]. A group's total is therefore its last entry, and levels[l] holds the
// prefix sums, by groups of 16, of the totals of the groups of levels[l-1]. The
// last level is a single group, and the tree's total is its last entry. Every
// level's length is a multiple of 16. raw[l] holds the values level l sums (raw[0]
// is w), so that recomputing a group reads one contiguous run.
type sumTree struct {
	w      []float64
	levels [][]float64
	raw    [][]float64
	xs     []float64 // scratch for findBatch
}

func newSumTree(leaves int) sumTree {
	var t sumTree
	t.build(roundUp(max(leaves, fanout), fanout))
	return t
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// build allocates empty levels for the given (multiple of fanout) leaf count.
func (t *sumTree) build(leaves int) {
	t.levels, t.raw = t.levels[:0], t.raw[:0]
	for size := leaves; ; size = roundUp(size/fanout, fanout) {
		t.levels = append(t.levels, make([]float64, size))
		t.raw = append(t.raw, make([]float64, size))
		if size == fanout {
			break
		}
	}
	t.w = t.raw[0]
}

// grow rebuilds the tree with room for the given number of leaves, keeping them.
func (t *sumTree) grow(leaves int) {
	old := t.w
	t.levels, t.raw = nil, nil
	t.build(roundUp(leaves, fanout))
	copy(t.w, old)
	for l := range t.levels {
		for g := 0; g < len(t.levels[l]); g += fanout {
			t.fixGroup(l, g)
		}
	}
}

func (t *sumTree) clear() {
	for l := range t.levels {
		clear(t.levels[l])
		clear(t.raw[l])
	}
}

func (t *sumTree) total() float64 { return t.levels[len(t.levels)-1][fanout-1] }

// child is the j-th value summed by level l: a weight, or a total of the level
// below.
func (t *sumTree) child(l, j int) float64 { return t.raw[l][j] }

// fixGroup recomputes the prefix sums of the group starting at g on level l, and
// passes the group's total up.
func (t *sumTree) fixGroup(l, g int) {
	c := t.levels[l][g : g+fanout : g+fanout]
	r := t.raw[l][g : g+fanout : g+fanout]
	var s float64
	for j := range c {
		s += r[j]
		c[j] = s
	}
	if l+1 < len(t.raw) {
		t.raw[l+1][g/fanout] = s
	}
}

// set writes weight i and recomputes the prefix sums on its path to the root.
func (t *sumTree) set(i int, w float64) {
	t.w[i] = w
	for l := range t.levels {
		t.fixGroup(l, i/fanout*fanout)
		i /= fanout
	}
}

// findBatch maps each target us[i] in [0, total) to the leaf whose prefix-sum
// interval holds it, writing the leaf to nodes[i] and its weight to ws[i]. It walks
// all targets one level at a time, with a branch-free binary search in each group,
// so the cache misses of different targets overlap. A zero-weight leaf is never
// returned.
func (t *sumTree) findBatch(us []float64, nodes []int32, ws []float64) {
	nodes, ws = nodes[:len(us)], ws[:len(us)]
	clear(nodes)
	if cap(t.xs) < len(us) {
		t.xs = make([]float64, len(us))
	}
	xs := t.xs[:len(us)]
	copy(xs, us)
	for l := len(t.levels) - 1; l >= 0; l-- {
		lv := t.levels[l]
		// Levels are padded to whole groups; rounding must not lead a target
		// into a group the level below does not have.
		last := len(lv) - 1
		if l > 0 {
			last = len(t.levels[l-1])/fanout - 1
		}
		for i, x := range xs {
			b := int(nodes[i]) * fanout
			c := (*[fanout]float64)(lv[b : b+fanout])
			// k = the number of prefix sums c[0..14] that are <= x, by a
			// branch-free binary search. Sums and targets are never negative
			// (nor -0), so their bits order like the floats, and the sign of
			// an unsigned difference of bits is a comparison.
			xb := math.Float64bits(x)
			k := 8 * geBits(xb, c[7])
			k += 4 * geBits(xb, c[(k+3)&15])
			k += 2 * geBits(xb, c[(k+1)&15])
			k += geBits(xb, c[k&15])
			k = min(k, last-b)
			// lo = c[k-1], or 0 when k = 0.
			lo := math.Float64frombits(math.Float64bits(c[(k-1)&15]) & -uint64((k+fanout-1)/fanout))
			xs[i] = x - lo
			nodes[i] = int32(b + k)
			if l == 0 {
				// The leaf's weight, from the sums at hand; 0 when rounding
				// left the target outside the leaf's interval.
				ws[i] = (c[k&15] - lo) * float64(1-geBits(xb, c[k&15]))
			}
		}
	}
	// Rounding can leave a target at the very end of a group whose last
	// members weigh nothing; walk those few again, carefully.
	for i := range nodes {
		if !(ws[i] > 0) {
			n := t.findClamped(us[i])
			nodes[i], ws[i] = int32(n), t.w[n]
		}
	}
}

// findClamped is the careful single descent: it never enters a member of zero
// weight, and keeps the target inside the member it enters.
func (t *sumTree) findClamped(x float64) int {
	node := 0
	for l := len(t.levels) - 1; l >= 0; l-- {
		b := node * fanout
		c := t.levels[l][b : b+fanout : b+fanout]
		k := 0
		for k < fanout-1 && c[k] <= x {
			k++
		}
		for k > 0 && !(t.child(l, b+k) > 0) {
			k--
		}
		if k > 0 {
			x -= c[k-1]
		}
		if tot := t.child(l, b+k); x >= tot {
			x = math.Nextafter(tot, 0)
		}
		x = max(x, 0)
		node = b + k
	}
	return node
}

// geBits is 1 when x >= c and 0 otherwise, for non-negative c and x given x's bits.
func geBits(xb uint64, c float64) int {
	return int(1 ^ (xb-math.Float64bits(c))>>63)
}
