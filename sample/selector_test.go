package sample

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gear-rl/gear/sample/sampletest"
)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 1)) }

// naive is the dumb reference the selectors are checked against: a map and linear
// scans.
type naive struct {
	kind  Kind
	exp   float64
	prio  map[int]float64
	stamp map[int]uint64 // insertion (FIFO/LIFO) or insertion-or-update (heaps)
	clock uint64
}

func newNaive(kind Kind, exp float64) *naive {
	return &naive{kind: kind, exp: exp, prio: map[int]float64{}, stamp: map[int]uint64{}}
}

func (n *naive) insert(slot int, p float64) {
	n.prio[slot] = p
	n.stamp[slot] = n.clock
	n.clock++
}

func (n *naive) update(slot int, p float64) {
	n.prio[slot] = p
	if n.kind == KindMaxHeap || n.kind == KindMinHeap {
		n.stamp[slot] = n.clock
		n.clock++
	}
}

func (n *naive) remove(slot int) { delete(n.prio, slot); delete(n.stamp, slot) }

func (n *naive) weight(slot int) float64 {
	p := n.prio[slot]
	if p == 0 {
		return 0
	}
	return math.Pow(p, n.exp)
}

// order lists the slots in selection order (deterministic kinds).
func (n *naive) order() []int {
	var s []int
	for k := range n.prio {
		s = append(s, k)
	}
	slices.SortFunc(s, func(a, b int) int {
		switch n.kind {
		case KindFIFO:
			return cmp.Compare(n.stamp[a], n.stamp[b])
		case KindLIFO:
			return cmp.Compare(n.stamp[b], n.stamp[a])
		case KindMaxHeap:
			if c := cmp.Compare(n.prio[b], n.prio[a]); c != 0 {
				return c
			}
		case KindMinHeap:
			if c := cmp.Compare(n.prio[a], n.prio[b]); c != 0 {
				return c
			}
		}
		return cmp.Compare(n.stamp[a], n.stamp[b])
	})
	return s
}

func newSelector(t testing.TB, kind Kind, exp float64) Selector {
	switch kind {
	case KindUniform:
		return NewUniform()
	case KindPrioritized:
		p, err := NewPrioritized(exp)
		if err != nil {
			t.Fatal(err)
		}
		return p
	case KindFIFO:
		return NewFIFO()
	case KindLIFO:
		return NewLIFO()
	case KindMaxHeap:
		return NewMaxHeap()
	case KindMinHeap:
		return NewMinHeap()
	}
	t.Fatalf("no selector %v", kind)
	return nil
}

var allKinds = []Kind{KindUniform, KindPrioritized, KindFIFO, KindLIFO, KindMaxHeap, KindMinHeap}

// TestSelectorsAgainstNaive runs random operation sequences on every selector and
// on the naive reference and compares them after every step.
func TestSelectorsAgainstNaive(t *testing.T) {
	for _, kind := range allKinds {
		t.Run(kind.String(), func(t *testing.T) {
			sel := newSelector(t, kind, 0.7)
			ref := newNaive(kind, 0.7)
			r := newRand(uint64(kind))
			rs := newRand(99)
			var present []int
			picks := make([]Pick, 8)
			for step := range 4000 {
				// Few distinct priorities so that heaps meet ties.
				prio := float64(r.IntN(6))
				switch op := r.IntN(10); {
				case op < 4 || len(present) == 0:
					slot := r.IntN(600)
					if _, ok := ref.prio[slot]; ok {
						if sel.Insert(slot, prio) == nil {
							t.Fatalf("step %d: insert of present slot %d accepted", step, slot)
						}
						continue
					}
					if err := sel.Insert(slot, prio); err != nil {
						t.Fatal(err)
					}
					ref.insert(slot, prio)
					present = append(present, slot)
				case op < 7:
					slot := present[r.IntN(len(present))]
					if err := sel.Update(slot, prio); err != nil {
						t.Fatal(err)
					}
					ref.update(slot, prio)
				default:
					i := r.IntN(len(present))
					sel.Delete(present[i])
					ref.remove(present[i])
					present[i] = present[len(present)-1]
					present = present[:len(present)-1]
				}
				if sel.Len() != len(ref.prio) {
					t.Fatalf("step %d: Len %d, want %d", step, sel.Len(), len(ref.prio))
				}
				if sel.Len() == 0 {
					continue
				}
				sel.Sample(rs, picks)
				checkPicks(t, step, sel, ref, picks)
			}
			sel.Clear()
			if sel.Len() != 0 {
				t.Fatalf("Len after Clear = %d", sel.Len())
			}
			if err := sel.Insert(present[0], 1); err != nil {
				t.Fatalf("insert after Clear: %v", err)
			}
		})
	}
}

func checkPicks(t *testing.T, step int, sel Selector, ref *naive, picks []Pick) {
	t.Helper()
	switch sel.Kind() {
	case KindUniform:
		for _, p := range picks {
			if _, ok := ref.prio[p.Slot]; !ok || p.Probability != 1/float64(len(ref.prio)) {
				t.Fatalf("step %d: uniform pick %+v among %d", step, p, len(ref.prio))
			}
		}
	case KindPrioritized:
		var total float64
		for s := range ref.prio {
			total += ref.weight(s)
		}
		pr := sel.(*Prioritized)
		if math.Abs(pr.Total()-total) > 1e-9*total {
			t.Fatalf("step %d: total %v, want %v", step, pr.Total(), total)
		}
		for _, p := range picks {
			if _, ok := ref.prio[p.Slot]; !ok {
				t.Fatalf("step %d: picked absent slot %d", step, p.Slot)
			}
			w := ref.weight(p.Slot)
			if total > 0 {
				if w == 0 {
					t.Fatalf("step %d: picked zero-priority slot %d", step, p.Slot)
				}
				if math.Abs(p.Probability-w/total) > 1e-9 {
					t.Fatalf("step %d: probability %v, want %v", step, p.Probability, w/total)
				}
			} else if p.Probability != 1/float64(len(ref.prio)) {
				t.Fatalf("step %d: all-zero fallback probability %v", step, p.Probability)
			}
		}
	default:
		order := ref.order()
		for _, p := range picks {
			if p.Slot != order[0] || p.Probability != 1 {
				t.Fatalf("step %d: %v picked %+v, want slot %d", step, sel.Kind(), p, order[0])
			}
		}
		best := sel.(Ordered).Best(len(order)+3, nil)
		if !slices.Equal(best, order) {
			t.Fatalf("step %d: Best = %v, want %v", step, best, order)
		}
		if k := len(order) / 2; !slices.Equal(sel.(Ordered).Best(k, nil), order[:k]) {
			t.Fatalf("step %d: Best(%d) differs from the order's head", step, k)
		}
	}
}

func TestPrioritizedDistribution(t *testing.T) {
	for _, exp := range []float64{0, 0.5, 1, 2} {
		p, _ := NewPrioritized(exp)
		prios := make([]float64, 40)
		r := newRand(3)
		for i := range prios {
			if i%7 != 3 { // every 7th priority is zero
				prios[i] = 0.1 + 3*r.Float64()
			}
			if err := p.Insert(i*3, prios[i]); err != nil { // sparse slots
				t.Fatal(err)
			}
		}
		want := make([]float64, len(prios))
		for i, pr := range prios {
			if pr > 0 {
				want[i] = math.Pow(pr, exp)
			}
		}
		counts := make([]int, len(prios))
		picks := make([]Pick, 1000)
		rs := newRand(11)
		for range 200 {
			p.Sample(rs, picks)
			for _, pk := range picks {
				counts[pk.Slot/3]++
			}
		}
		stat, dof, pv, err := sampletest.ChiSquare(counts, want)
		if err != nil {
			t.Fatal(err)
		}
		if pv < 0.001 {
			t.Errorf("exponent %v: chi-square %.1f on %d dof, p = %.2g < 0.001", exp, stat, dof, pv)
		}
	}
}

func TestPrioritizedRefusesAndFallsBack(t *testing.T) {
	p, _ := NewPrioritized(1)
	for _, bad := range []float64{math.NaN(), -1, math.Inf(1), -math.SmallestNonzeroFloat64} {
		if err := p.Insert(0, bad); err == nil {
			t.Errorf("priority %v accepted", bad)
		}
	}
	if p.Len() != 0 {
		t.Fatalf("a refused insert changed the selector")
	}
	if _, err := NewPrioritized(-1); err == nil {
		t.Error("exponent -1 accepted")
	}
	if _, err := NewPrioritized(math.NaN()); err == nil {
		t.Error("exponent NaN accepted")
	}
	big, _ := NewPrioritized(3)
	if err := big.Insert(0, 1e200); err == nil {
		t.Error("priority whose weight overflows accepted")
	}
	// All zero: uniform.
	for i := range 4 {
		if err := p.Insert(i, 0); err != nil {
			t.Fatal(err)
		}
	}
	counts := make([]int, 4)
	picks := make([]Pick, 4000)
	p.Sample(newRand(5), picks)
	for _, pk := range picks {
		counts[pk.Slot]++
		if pk.Probability != 0.25 {
			t.Fatalf("all-zero probability %v", pk.Probability)
		}
	}
	if _, _, pv, _ := sampletest.ChiSquare(counts, []float64{1, 1, 1, 1}); pv < 0.001 {
		t.Fatalf("all-zero fallback not uniform: %v", counts)
	}
	// One positive priority among zeros takes every pick, with exponent 0 too.
	for _, exp := range []float64{0, 1} {
		q, _ := NewPrioritized(exp)
		for i := range 100 {
			_ = q.Insert(i, 0)
		}
		_ = q.Update(42, 1e-9)
		q.Sample(newRand(6), picks)
		for _, pk := range picks {
			if pk.Slot != 42 || pk.Probability != 1 {
				t.Fatalf("exponent %v: picked %+v, want slot 42 with probability 1", exp, pk)
			}
		}
	}
}

// TestSumTreeFind checks the batched descent against a linear prefix scan on a tree
// of several levels that has grown and shrunk.
func TestSumTreeFind(t *testing.T) {
	p, _ := NewPrioritized(1)
	r := newRand(8)
	const n = 70000 // five levels of fan-out 16
	for i := range n {
		w := r.Float64()
		if i%5 == 0 {
			w = 0
		}
		if err := p.Insert(i, w); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i += 3 {
		p.Delete(i)
	}
	leaves := p.tree.w
	prefix := make([]float64, len(leaves)+1)
	for i, w := range leaves {
		prefix[i+1] = prefix[i] + w
	}
	total := p.Total()
	if math.Abs(total-prefix[len(leaves)]) > 1e-9*total {
		t.Fatalf("root %v, linear sum %v", total, prefix[len(leaves)])
	}
	us := make([]float64, 5000)
	want := make([]float64, len(us))
	for i := range us {
		us[i] = r.Float64() * total
		want[i] = us[i]
	}
	us[0], want[0] = 0, 0
	us[1], want[1] = math.Nextafter(total, 0), math.Nextafter(total, 0)
	nodes := make([]int32, len(us))
	ws := make([]float64, len(us))
	p.tree.findBatch(us, nodes, ws)
	for i, leaf := range nodes {
		if leaves[leaf] <= 0 {
			t.Fatalf("target %v: zero-weight leaf %d", want[i], leaf)
		}
		if math.Abs(ws[i]-leaves[leaf]) > 1e-12*total {
			t.Fatalf("target %v: weight %v, leaf has %v", want[i], ws[i], leaves[leaf])
		}
		lo, hi := prefix[leaf], prefix[leaf+1]
		if want[i] < lo-1e-9*total || want[i] >= hi+1e-9*total {
			t.Fatalf("target %v: leaf %d covers [%v, %v)", want[i], leaf, lo, hi)
		}
	}
}

func TestSelectorsDeterministicForSeed(t *testing.T) {
	for _, kind := range []Kind{KindUniform, KindPrioritized} {
		run := func() []Pick {
			s := newSelector(t, kind, 1)
			for i := range 1000 {
				_ = s.Insert(i, float64(i%13))
			}
			out := make([]Pick, 256)
			s.Sample(newRand(77), out)
			return out
		}
		if a, b := run(), run(); !slices.Equal(a, b) {
			t.Errorf("%v: two runs with one seed differ", kind)
		}
	}
}

func TestHeapTiesGoToLeastRecent(t *testing.T) {
	h := NewMaxHeap()
	for s := range 4 {
		_ = h.Insert(s, 5)
	}
	pick := func() int {
		var p [1]Pick
		h.Sample(nil, p[:])
		return p[0].Slot
	}
	if got := pick(); got != 0 {
		t.Fatalf("equal priorities: picked %d, want the first inserted 0", got)
	}
	_ = h.Update(0, 5) // 0 is now the most recently updated
	if got := pick(); got != 1 {
		t.Fatalf("after updating 0: picked %d, want 1", got)
	}
	if got := h.Best(4, nil); !slices.Equal(got, []int{1, 2, 3, 0}) {
		t.Fatalf("Best = %v", got)
	}
	m := NewMinHeap()
	_ = m.Insert(7, 2)
	_ = m.Insert(8, 1)
	_ = m.Insert(9, 1)
	if got := m.Best(3, nil); !slices.Equal(got, []int{8, 9, 7}) {
		t.Fatalf("min heap Best = %v", got)
	}
	if err := m.Insert(10, math.NaN()); err == nil {
		t.Fatal("NaN accepted by a heap")
	}
}

func TestSequenceOrder(t *testing.T) {
	f, l := NewFIFO(), NewLIFO()
	for _, s := range []int{5, 3, 9, 1} {
		_ = f.Insert(s, float64(s))
		_ = l.Insert(s, float64(s))
	}
	_ = f.Update(5, 100) // updates do not move an item
	if got := f.Best(10, nil); !slices.Equal(got, []int{5, 3, 9, 1}) {
		t.Fatalf("FIFO order %v", got)
	}
	l.Delete(1)
	if got := l.Best(10, nil); !slices.Equal(got, []int{9, 3, 5}) {
		t.Fatalf("LIFO order %v", got)
	}
	if err := f.Insert(3, 0); err == nil {
		t.Fatal("present slot inserted twice")
	}
	if err := f.Update(4, 0); err == nil {
		t.Fatal("absent slot updated")
	}
	if err := f.Insert(-1, 0); err == nil {
		t.Fatal("negative slot accepted")
	}
}

// TestSumTreeRounding drives targets to the top of trees whose sums round, with
// zero weights at the ends of groups, and checks that no zero-weight leaf comes
// back; it also checks the careful descent against a linear scan.
func TestSumTreeRounding(t *testing.T) {
	r := newRand(12)
	for trial := range 200 {
		n := 17 + r.IntN(600)
		tree := newSumTree(n)
		for i := range n {
			var w float64
			switch r.IntN(4) {
			case 0: // zero
			case 1:
				w = math.Pow(10, float64(r.IntN(40)-20))
			default:
				w = r.Float64()
			}
			if i%16 >= 12 {
				w = 0 // zero tails in every group
			}
			tree.set(i, w)
		}
		total := tree.total()
		if total == 0 {
			continue
		}
		us := []float64{0, math.Nextafter(total, 0), total * (1 - 1e-16), total * (1 - 1e-12), r.Float64() * total}
		nodes := make([]int32, len(us))
		ws := make([]float64, len(us))
		tree.findBatch(us, nodes, ws)
		for i, leaf := range nodes {
			if !(tree.w[leaf] > 0) || !(ws[i] > 0) {
				t.Fatalf("trial %d: target %v of %v: zero-weight leaf %d", trial, us[i], total, leaf)
			}
		}
		// The careful descent lands in the leaf whose prefix interval holds
		// the target, up to rounding.
		var prefix float64
		for i := range n {
			w := tree.w[i]
			if w > 0 && r.IntN(3) == 0 {
				u := prefix + w/2
				if leaf := tree.findClamped(u); leaf != i && math.Abs(u-prefix) > 1e-9*total {
					t.Fatalf("trial %d: findClamped(%v) = %d, want %d", trial, u, leaf, i)
				}
			}
			prefix += w
		}
		if leaf := tree.findClamped(total * 2); !(tree.w[leaf] > 0) {
			t.Fatalf("trial %d: findClamped past the end gave zero-weight leaf %d", trial, leaf)
		}
	}
}
