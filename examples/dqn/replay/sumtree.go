package replay

import "fmt"

// SumTree holds non-negative weights for n slots and finds the slot in which a
// point of [0, Total()) falls, both in O(log n). Internal sums are recomputed
// from their children on every Set, so they do not drift.
type SumTree struct {
	n      int
	leaves int       // a power of two >= n
	t      []float64 // t[1] is the root; leaves at t[leaves:leaves+n]
}

// NewSumTree returns a tree of n slots, all of weight zero.
func NewSumTree(n int) *SumTree {
	if n < 1 {
		panic(fmt.Sprintf("replay: NewSumTree(%d): need at least one slot", n))
	}
	leaves := 1
	for leaves < n {
		leaves *= 2
	}
	return &SumTree{n: n, leaves: leaves, t: make([]float64, 2*leaves)}
}

// Len returns the number of slots.
func (s *SumTree) Len() int { return s.n }

// Total returns the sum of all weights.
func (s *SumTree) Total() float64 { return s.t[1] }

// Get returns slot i's weight.
func (s *SumTree) Get(i int) float64 { return s.t[s.leaves+i] }

// Set sets slot i's weight to w, which must be finite and non-negative.
func (s *SumTree) Set(i int, w float64) {
	if i < 0 || i >= s.n {
		panic(fmt.Sprintf("replay: SumTree.Set(%d) out of %d slots", i, s.n))
	}
	j := s.leaves + i
	s.t[j] = w
	for j > 1 {
		j /= 2
		s.t[j] = s.t[2*j] + s.t[2*j+1]
	}
}

// Find returns the slot i with prefix(i) <= u < prefix(i)+Get(i), where prefix(i)
// is the sum of the weights of slots before i. Points at or past Total(), which
// rounding can produce, map to the last slot of positive weight. A slot of zero
// weight is never returned while Total() > 0.
func (s *SumTree) Find(u float64) int {
	j := 1
	for j < s.leaves {
		l := s.t[2*j]
		if u < l || s.t[2*j+1] <= 0 {
			j = 2 * j
		} else {
			u -= l
			j = 2*j + 1
		}
	}
	return j - s.leaves
}
