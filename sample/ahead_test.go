package sample

import (
	"context"
	"slices"
	"testing"
)

// A FIFO table's touch pass loads the items its next evictions but
// victimsAhead will delete: every list it hands to touchRows is exactly the
// slots deleted from victimsAhead evictions later on, in order.
func TestTouchVictimsLoadsTheNextVictims(t *testing.T) {
	const size = 32
	var deleted []int
	tb, err := NewTable(Config{Name: "ahead", MaxSize: size, Sampler: NewUniform(), Remover: NewFIFO(), Seed: 1,
		OnDelete: func(it Item) { deleted = append(deleted, it.Index) }})
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	type touch struct {
		after int // evictions before the pass
		slots []int
	}
	var touches []touch
	tb.touchRows = func(slots []int) {
		touches = append(touches, touch{len(deleted), slices.Clone(slots)})
	}
	ctx := context.Background()
	for k := range uint64(size + 20*victimsAhead) {
		if err := tb.Insert(ctx, k, 1, k); err != nil {
			t.Fatal(err)
		}
	}
	if len(touches) < 10 {
		t.Fatalf("%d touch passes over %d evictions, want one every %d", len(touches), len(deleted), victimsAhead)
	}
	for _, tc := range touches {
		from := tc.after + victimsAhead
		if from+victimsAhead > len(deleted) {
			break
		}
		if want := deleted[from : from+victimsAhead]; !slices.Equal(tc.slots, want) {
			t.Fatalf("after %d evictions the pass loaded slots %v; evictions %d to %d deleted %v",
				tc.after, tc.slots, from, from+victimsAhead-1, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		k := uint64(len(deleted)) + 1e6
		_ = tb.Insert(ctx, k, 1, k)
	}); n != 0 {
		t.Errorf("an insert into a full FIFO table made %v allocations", n)
	}
}

// A FIFO whose items leave from the middle (max_times_sampled, priority
// deletes) keeps its order, and its ring stays within a small multiple of the
// most items it held: dead entries are compacted away, not kept.
func TestSequenceRingDeletesInTheMiddle(t *testing.T) {
	for _, lifo := range []bool{false, true} {
		q := NewFIFO()
		if lifo {
			q = NewLIFO()
		}
		r := newRand(7)
		var model []int // insertion order
		next, most := 0, 0
		for step := range 20000 {
			switch op := r.IntN(10); {
			case op < 5 || len(model) == 0:
				if err := q.Insert(next, 1); err != nil {
					t.Fatal(err)
				}
				model = append(model, next)
				next++
			case op < 8: // from the middle
				i := r.IntN(len(model))
				q.Delete(model[i])
				model = slices.Delete(model, i, i+1)
			default: // the pick
				var pick [1]Pick
				q.Sample(nil, pick[:])
				want := model[0]
				if lifo {
					want = model[len(model)-1]
				}
				if pick[0].Slot != want {
					t.Fatalf("lifo %v, step %d: picked %d, want %d", lifo, step, pick[0].Slot, want)
				}
				q.Delete(want)
				model = slices.DeleteFunc(model, func(s int) bool { return s == want })
			}
			if q.Len() != len(model) {
				t.Fatalf("lifo %v, step %d: Len %d, want %d", lifo, step, q.Len(), len(model))
			}
			most = max(most, len(model))
			if limit := 4 * max(most, 16); len(q.ring) > limit {
				t.Fatalf("lifo %v, step %d: ring of %d entries, at most %d items so far", lifo, step, len(q.ring), most)
			}
		}
		want := slices.Clone(model)
		if lifo {
			slices.Reverse(want)
		}
		if got := q.Best(len(model)+1, nil); !slices.Equal(got, want) {
			t.Fatalf("lifo %v: Best %v, want %v", lifo, got, want)
		}
		// Deletes from the middle that leave few items shrink the ring,
		// so that Best does not walk the dead entries.
		q.Clear()
		for s := range 10000 {
			_ = q.Insert(s, 1)
		}
		for s := 1; s < 9999; s++ {
			if s%1000 != 0 {
				q.Delete(s)
			}
		}
		if w := q.hi - q.lo; w > 8*11+64 || len(q.ring) >= 16384 {
			t.Fatalf("lifo %v: 11 items left of 10000 span %d entries of a ring of %d", lifo, w, len(q.ring))
		}
		wantLeft := []int{0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 9999}
		if lifo {
			slices.Reverse(wantLeft)
		}
		if got := q.Best(20, nil); !slices.Equal(got, wantLeft) {
			t.Fatalf("lifo %v: Best after the deletes %v, want %v", lifo, got, wantLeft)
		}
		// With no dead entries (after a clear and fresh inserts), Ahead lists
		// the order itself.
		q.Clear()
		for s := range 20 {
			_ = q.Insert(s, 1)
		}
		got := q.Ahead(3, 4, nil)
		wantAhead := []int{3, 4, 5, 6}
		if lifo {
			wantAhead = []int{16, 15, 14, 13}
		}
		if !slices.Equal(got, wantAhead) {
			t.Fatalf("lifo %v: Ahead(3, 4) = %v, want %v", lifo, got, wantAhead)
		}
	}
}
