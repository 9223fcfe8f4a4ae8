package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// insertKey writes and commits row key with priority.
func insertKey(t *testing.T, ctx context.Context, s *store.Shard, key uint64, priority float64) store.Ref {
	t.Helper()
	p, err := s.Allocate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	storetest.Fill(p, key)
	ref, err := p.CommitKey(key, priority)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// TestLowestPriorityEvictsAFallenRow: a row whose priority falls after the
// candidate heap was built goes at the next maintenance scan at the latest,
// which rebuilds the heap. The scan did not: the row kept its old place in
// the heap and outlived 20,000 evictions of rows of a higher priority.
func TestLowestPriorityEvictsAFallenRow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := storetest.Spec(16)
	spec.Remover = store.RemoverLowestPriority
	s := storetest.Create(t, spec, store.WithChunk(1))
	refs := make([]store.Ref, 16)
	for k := range uint64(16) {
		refs[k] = insertKey(t, ctx, s, k, float64(10+k))
	}
	insertKey(t, ctx, s, 100, 5) // full: the heap is built, key 0 goes
	if err := s.SetPriority(refs[15], 0); err != nil {
		t.Fatal(err)
	}
	// The maintenance scan comes at least every 1024 evictions.
	for n := range 2048 {
		insertKey(t, ctx, s, 1000+uint64(n), 5)
		if _, err := s.Status(refs[15]); err != nil {
			if !errors.Is(err, store.ErrStale) {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("the row whose priority fell to 0 outlived 2048 evictions of rows of priority 5")
}

// TestDetachLetsOpenTakeOver: a detached shard is nobody's, as if its
// process had died: Open takes it over at once, in this process too, with
// its rows. The owner word kept this process's identity, and Open refused
// ("this process already owns it", or ErrOwnerAlive from another process).
func TestDetachLetsOpenTakeOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := storetest.Spec(8)
	name := storetest.Name(t, "detach")
	s, err := store.Create(name, spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := insertKey(t, ctx, s, 7, 3)
	if err := s.Detach(); err != nil {
		t.Fatal(err)
	}
	again, err := store.Open(name, spec)
	if err != nil {
		_ = store.Remove(name)
		t.Fatalf("Open after Detach: %v", err)
	}
	defer again.Close()
	st, err := again.Status(ref)
	if err != nil || st.Key != 7 || st.Priority != 3 {
		t.Fatalf("row of key 7 after the take-over: %+v, %v", st, err)
	}
	if !again.Reattached() {
		t.Error("Reattached() = false after Open")
	}
}
