package sample

import (
	"math"
	"math/rand/v2"
	"sort"
)

// This file holds the synchronous planning steps of distributed selection: given
// what every shard reported, every rank computes the same plan.

// assignShards gives each of the n positions of a batch a shard, shard s with
// probability weights[s] / sum(weights), using r (which must be in the same state
// on every rank). The counts per shard are a multinomial draw; keeping the
// positions makes the batch's order that of a centralized draw. At least one
// weight must be positive.
func assignShards(r *rand.Rand, weights []float64, n int, dst []int32) []int32 {
	cum := make([]float64, len(weights))
	var total float64
	for i, w := range weights {
		total += w
		cum[i] = total
	}
	for range n {
		u := r.Float64() * total
		s := firstAbove(cum, u)
		if s == len(cum) { // rounding at the very top
			s = len(cum) - 1
			for s > 0 && !(weights[s] > 0) {
				s--
			}
		}
		dst = append(dst, int32(s))
	}
	return dst
}

// firstAbove is the first index i with cum[i] > u (len(cum) if none) of the
// non-decreasing cum: a linear scan for the few shards of a host, a binary
// search beyond.
func firstAbove(cum []float64, u float64) int {
	if len(cum) > 16 {
		return sort.Search(len(cum), func(i int) bool { return cum[i] > u })
	}
	for i, c := range cum {
		if c > u {
			return i
		}
	}
	return len(cum)
}

// candidate is one shard's offer to a decentralized merge: one item of its local
// order, with what the merge needs to order it against other shards' items and to
// report it.
type candidate struct {
	Shard        int32
	Slot         int32
	Key          uint64
	Priority     float64
	Inserted     int64
	TimesSampled int64
	Seq          uint64
	// Budget is how many more samples the item takes before max_times_sampled
	// deletes it; math.MaxInt64 when unlimited.
	Budget int64
}

// candidateBytes is the encoded size of a candidate.
const candidateBytes = 56

func (c *candidate) encode(b []byte) {
	_ = b[candidateBytes-1]
	le.PutUint32(b[0:], uint32(c.Shard))
	le.PutUint32(b[4:], uint32(c.Slot))
	le.PutUint64(b[8:], c.Key)
	le.PutUint64(b[16:], math.Float64bits(c.Priority))
	le.PutUint64(b[24:], uint64(c.Inserted))
	le.PutUint64(b[32:], uint64(c.TimesSampled))
	le.PutUint64(b[40:], uint64(c.Budget))
	le.PutUint64(b[48:], c.Seq)
}

func (c *candidate) decode(b []byte) {
	_ = b[candidateBytes-1]
	c.Shard = int32(le.Uint32(b[0:]))
	c.Slot = int32(le.Uint32(b[4:]))
	c.Key = le.Uint64(b[8:])
	c.Priority = math.Float64frombits(le.Uint64(b[16:]))
	c.Inserted = int64(le.Uint64(b[24:]))
	c.TimesSampled = int64(le.Uint64(b[32:]))
	c.Budget = int64(le.Uint64(b[40:]))
	c.Seq = le.Uint64(b[48:])
}

// before reports whether a comes before b in the global order of kind. Items of one
// shard keep their local order (the merge never compares them); between shards,
// ties go to the lower shard.
func before(kind Kind, a, b *candidate) bool {
	switch kind {
	case KindMaxHeap:
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
	case KindMinHeap:
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
	case KindFIFO:
		if a.Inserted != b.Inserted {
			return a.Inserted < b.Inserted
		}
	case KindLIFO:
		if a.Inserted != b.Inserted {
			return a.Inserted > b.Inserted
		}
	}
	return a.Shard < b.Shard
}

// mergedPick is one pick of a decentralized merge: candidate lists[List][Index].
type mergedPick struct {
	List, Index int
	// Deleted reports that this pick used the item's last sample.
	Deleted bool
}

// mergeOrdered runs Reverb's sequential sampling over the union of the shards'
// ordered candidate lists: the first item of the global order is picked until its
// budget runs out (then it is deleted and the next item is first), for up to n
// picks, while lim allows one more sample. lim is updated as the picks are taken;
// a nil lim allows every pick.
// Every list must hold its shard's first items in its local order, enough of them
// that their budgets add up to n (or all of the shard's items).
func mergeOrdered(kind Kind, lists [][]candidate, n int, lim *RateLimiter, dst []mergedPick) []mergedPick {
	head := make([]int, len(lists))
	used := make([]int64, len(lists)) // samples taken from each list's head item
	for len(dst) < n {
		best := -1
		for l := range lists {
			if head[l] < len(lists[l]) && (best < 0 || before(kind, &lists[l][head[l]], &lists[best][head[best]])) {
				best = l
			}
		}
		if best < 0 || lim != nil && !lim.CanSample(1) {
			break
		}
		c := &lists[best][head[best]]
		if lim != nil {
			lim.Sample(1)
		}
		used[best]++
		p := mergedPick{List: best, Index: head[best]}
		if used[best] >= c.Budget {
			p.Deleted = true
			if lim != nil {
				lim.Delete(1)
			}
			head[best]++
			used[best] = 0
		}
		dst = append(dst, p)
	}
	return dst
}
