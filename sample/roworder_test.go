package sample

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gear-rl/gear/store"
)

// TestRowOrder checks rowOrder against a stable sort by row, over runs
// within its bitmap's span, wider than it, and with a row twice.
func TestRowOrder(t *testing.T) {
	var o rowOrder
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name       string
		n, span    int
		duplicates bool
	}{
		{"two writers' runs", 64, 128, false},
		{"whole span", 64, rowSpan, false},
		{"wider than the span", 64, 3 * rowSpan, false},
		{"one row", 1, 1, false},
		{"a row twice", 64, 100, true},
		{"most a run holds", 256, 300, false},
		{"more than a position holds", 300, 1000, false},
	}
	for _, c := range cases {
		for range 200 {
			base := rng.IntN(1 << 20)
			refs := make([]store.Ref, c.n)
			seen := map[int]bool{}
			for i := range refs {
				idx := base + rng.IntN(c.span)
				for !c.duplicates && seen[idx] && len(seen) < c.span {
					idx = base + rng.IntN(c.span)
				}
				seen[idx] = true
				refs[i] = store.Ref{Index: idx, Seq: uint64(i)}
			}
			if c.duplicates {
				refs[c.n-1].Index = refs[0].Index
			}
			want := make([]int, len(refs))
			for i := range want {
				want[i] = i
			}
			slices.SortStableFunc(want, func(a, b int) int { return refs[a].Index - refs[b].Index })
			got := o.order(refs)
			if !slices.Equal(got, want) {
				t.Fatalf("%s: order of %v = %v, want %v", c.name, refs, got, want)
			}
			for w, b := range o.bits {
				if b != 0 {
					t.Fatalf("%s: bitmap word %d left %#x", c.name, w, b)
				}
			}
		}
	}
}
