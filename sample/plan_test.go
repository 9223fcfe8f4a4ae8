package sample

import (
	"cmp"
	"math"
	"slices"
	"testing"

	"github.com/gear-rl/gear/sample/sampletest"
)

// shardCandidates lists every item of tb in its sampler's order as candidates of
// shard s with the given budget.
func shardCandidates(t *testing.T, tb *Table, s int, budget int64) []candidate {
	t.Helper()
	items, err := tb.Top(1<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]candidate, len(items))
	for i, it := range items {
		out[i] = candidate{Shard: int32(s), Slot: int32(i), Key: it.Key, Priority: it.Priority,
			Inserted: it.Inserted, TimesSampled: it.TimesSampled, Budget: budget}
	}
	return out
}

func TestMergeOrderedEqualsGlobalSort(t *testing.T) {
	for _, kind := range []Kind{KindMaxHeap, KindMinHeap, KindFIFO, KindLIFO} {
		clock := counterClock()
		r := newRand(uint64(kind))
		tables := make([]*Table, 4)
		for s := range tables {
			tb, err := NewTable(Config{Name: "shard", MaxSize: 1000, Sampler: newSelector(t, kind, 1),
				Remover: NewFIFO(), Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			tables[s] = tb
		}
		// Unequal shards, interleaved inserts, few distinct priorities (ties).
		for k := range uint64(300) {
			s := r.IntN(10) % 4 // shard 0..1 get more
			if s == 3 && r.IntN(3) > 0 {
				s = 0
			}
			mustInsert(t, tables[s], k, float64(r.IntN(5)))
		}
		var lists [][]candidate
		type ranked struct {
			c   candidate
			pos int
		}
		var all []ranked
		for s, tb := range tables {
			l := shardCandidates(t, tb, s, 1)
			lists = append(lists, l)
			for i, c := range l {
				all = append(all, ranked{c, i})
			}
		}
		slices.SortStableFunc(all, func(a, b ranked) int {
			var c int
			switch kind {
			case KindMaxHeap:
				c = cmp.Compare(b.c.Priority, a.c.Priority)
			case KindMinHeap:
				c = cmp.Compare(a.c.Priority, b.c.Priority)
			case KindFIFO:
				c = cmp.Compare(a.c.Inserted, b.c.Inserted)
			case KindLIFO:
				c = cmp.Compare(b.c.Inserted, a.c.Inserted)
			}
			if c != 0 {
				return c
			}
			if c = cmp.Compare(a.c.Shard, b.c.Shard); c != 0 {
				return c
			}
			return cmp.Compare(a.pos, b.pos)
		})
		lim, _ := NewRateLimiter(MinSize(1))
		lim.SetCounts(300, 0, 0)
		picks := mergeOrdered(kind, lists, 250, lim, nil)
		if len(picks) != 250 {
			t.Fatalf("%v: %d picks", kind, len(picks))
		}
		for i, p := range picks {
			got := lists[p.List][p.Index]
			if got.Key != all[i].c.Key || !p.Deleted {
				t.Fatalf("%v: pick %d is key %d, the global sort says %d", kind, i, got.Key, all[i].c.Key)
			}
		}
		if _, smp, del := lim.Counts(); smp != 250 || del != 250 {
			t.Fatalf("%v: limiter counts %d samples %d deletes", kind, smp, del)
		}
		for _, tb := range tables {
			_ = tb.Close()
		}
	}
}

func TestMergeOrderedBudgetsAndLimiter(t *testing.T) {
	lists := [][]candidate{
		{{Shard: 0, Key: 1, Priority: 5, Budget: 2}, {Shard: 0, Key: 2, Priority: 1, Budget: 2}},
		{{Shard: 1, Key: 3, Priority: 5, Budget: 1}, {Shard: 1, Key: 4, Priority: 3, Budget: math.MaxInt64}},
	}
	lim, _ := NewRateLimiter(MinSize(1))
	lim.SetCounts(4, 0, 0)
	picks := mergeOrdered(KindMaxHeap, lists, 6, lim, nil)
	var keys []uint64
	for _, p := range picks {
		keys = append(keys, lists[p.List][p.Index].Key)
	}
	if !slices.Equal(keys, []uint64{1, 1, 3, 4, 4, 4}) {
		t.Fatalf("keys %v", keys)
	}
	// A Queue limiter stops the merge after what it allows.
	q, _ := NewRateLimiter(Queue(10))
	q.SetCounts(2, 0, 0)
	if got := mergeOrdered(KindMaxHeap, lists, 6, q, nil); len(got) != 2 {
		t.Fatalf("Queue with 2 items allowed %d picks", len(got))
	}
}

func TestAssignShards(t *testing.T) {
	weights := []float64{5, 0, 1, 2.5}
	got := assignShards(newRand(4), weights, 40000, nil)
	counts := make([]int, len(weights))
	for _, s := range got {
		counts[s]++
	}
	if counts[1] != 0 {
		t.Fatal("a zero-weight shard was assigned positions")
	}
	if _, _, p, _ := sampletest.ChiSquare(counts, weights); p < 0.001 {
		t.Fatalf("counts %v against weights %v: p = %v", counts, weights, p)
	}
	if a, b := assignShards(newRand(9), weights, 100, nil), assignShards(newRand(9), weights, 100, nil); !slices.Equal(a, b) {
		t.Fatal("same seed, different assignment")
	}
}

func TestCandidateEncoding(t *testing.T) {
	c := candidate{Shard: 3, Slot: 77, Key: 1 << 60, Priority: -2.5, Inserted: -9, TimesSampled: 4, Budget: math.MaxInt64}
	var b [candidateBytes]byte
	c.encode(b[:])
	var d candidate
	d.decode(b[:])
	if d != c {
		t.Fatalf("decoded %+v, want %+v", d, c)
	}
}
