package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// fakeClock is a clock that moves only when the test says so.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestShardFollowsItsClock pins WithClock as the shard's one clock: commits are
// stamped with it, and the pause between the eviction scans of a waiting
// Allocate is measured on it, not on the wall clock.
func TestShardFollowsItsClock(t *testing.T) {
	c := &fakeClock{t: time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)}
	spec := storetest.Spec(4)
	spec.Remover = store.RemoverNone
	s := storetest.Create(t, spec, store.WithClock(c.now))
	ctx := context.Background()
	for i := range 4 {
		p, err := s.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		storetest.Fill(p, uint64(i))
		ref, err := p.Commit(1)
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.Status(ref)
		if err != nil {
			t.Fatal(err)
		}
		if st.InsertedAt != c.t.UnixNano() {
			t.Fatalf("row %d inserted at %v, want the shard's clock %v", ref.Index, time.Unix(0, st.InsertedAt), c.t)
		}
	}

	// The shard is full and removes nothing: a round's scan finds no row, and
	// the next scan waits ScanPause by the shard's clock.
	rows, idle := store.Evict(s, 1)
	if len(rows) != 0 {
		t.Fatalf("eviction from a full shard without a remover took rows %v", rows)
	}
	if want := c.t.Add(store.ScanPause); !idle.Equal(want) {
		t.Fatalf("after a fruitless scan the next waits until %v, want %v (the shard's clock + ScanPause)", idle, want)
	}
	// The wall clock passes the pause, the shard's clock does not: no scan.
	time.Sleep(5 * store.ScanPause)
	if _, again := store.Evict(s, 1); !again.Equal(idle) {
		t.Fatalf("a round before the pause ended by the shard's clock scanned (next scan at %v, was %v)", again, idle)
	}
	// The shard's clock passes the pause: the next round scans again.
	c.t = c.t.Add(store.ScanPause)
	if _, again := store.Evict(s, 1); !again.Equal(c.t.Add(store.ScanPause)) {
		t.Fatalf("a round after the pause by the shard's clock: next scan at %v, want %v", again, c.t.Add(store.ScanPause))
	}
}
