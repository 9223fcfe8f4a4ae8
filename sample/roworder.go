package sample

import (
	"math/bits"
	"slices"

	"github.com/gear-rl/gear/store"
)

// rowSpan is the widest stretch of rows rowOrder puts in order with its
// bitmap; a run of freed rows that spans more is sorted.
const rowSpan = 4096

// rowOrder puts a run of freed rows in the order of their indices (see
// ShardTable.freed). Two writers' rows, evicted in commit order, interleave
// two ascending runs over one stretch of rows, the worst input for a
// comparison sort (it took 15 ns a row of the owner's time beside two
// writers); a bitmap over the stretch orders them in one pass over the rows
// and one over the stretch's words.
type rowOrder struct {
	bits [rowSpan / 64]uint64
	pos  [rowSpan]uint8 // the position in the run of each row set in bits
	keys []uint64       // the sort's scratch
	out  []int
}

// order returns the positions of refs (at most 256) by ascending row index,
// valid until the next call.
func (o *rowOrder) order(refs []store.Ref) []int {
	o.out = o.out[:0]
	if len(refs) == 0 {
		return o.out
	}
	lo, hi := refs[0].Index, refs[0].Index
	for _, r := range refs[1:] {
		lo, hi = min(lo, r.Index), max(hi, r.Index)
	}
	if hi-lo >= rowSpan || len(refs) > 256 || !o.mark(refs, lo) {
		return o.sort(refs)
	}
	for w := range (hi-lo)>>6 + 1 {
		b := o.bits[w]
		o.bits[w] = 0
		for b != 0 {
			o.out = append(o.out, int(o.pos[w<<6+bits.TrailingZeros64(b)]))
			b &= b - 1
		}
	}
	return o.out
}

// mark sets the bit of each ref's row, from lo. It clears them again and
// returns false if a row comes twice (which a run of freed rows never
// holds: a freed row is not reused before its run goes back).
func (o *rowOrder) mark(refs []store.Ref, lo int) bool {
	for i, r := range refs {
		d := r.Index - lo
		if o.bits[d>>6]&(1<<(d&63)) != 0 {
			for _, r := range refs[:i] {
				d := r.Index - lo
				o.bits[d>>6] = 0
			}
			return false
		}
		o.bits[d>>6] |= 1 << (d & 63)
		o.pos[d] = uint8(i)
	}
	return true
}

// sort is order by a comparison sort, for any refs.
func (o *rowOrder) sort(refs []store.Ref) []int {
	keys := o.keys[:0]
	for i, r := range refs {
		keys = append(keys, uint64(uint32(r.Index))<<32|uint64(i))
	}
	slices.Sort(keys)
	for _, k := range keys {
		o.out = append(o.out, int(uint32(k)))
	}
	o.keys = keys[:0]
	return o.out
}
