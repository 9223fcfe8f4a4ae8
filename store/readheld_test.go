package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// TestReadHeld: a second handle pins a row that the first holds after releasing
// it; the row is freed by the last of the two Views, and a row released with no
// View left cannot be read.
func TestReadHeld(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(2))
	other, err := store.Attach(context.Background(), s.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ref := insert(t, s, 7, 1)
	v, err := s.Read(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ref); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Read(ref); !errors.Is(err, store.ErrStale) {
		t.Fatalf("Read of a released row: %v", err)
	}
	h, err := other.ReadHeld(ref)
	if err != nil {
		t.Fatal(err)
	}
	v.Done()
	if st := s.Stats(); st.Doomed != 1 {
		t.Fatalf("stats %+v: want the row doomed while the second View holds it", st)
	}
	if id, err := storetest.Check(storetest.Blocks(h)); err != nil || id != 7 {
		t.Fatalf("held row: %d %v", id, err)
	}
	h.Done()
	if st := s.Stats(); st.Free != 2 || st.Doomed != 0 {
		t.Fatalf("stats %+v: want both rows free", st)
	}
	if _, err := other.ReadHeld(ref); !errors.Is(err, store.ErrStale) {
		t.Fatalf("ReadHeld of a freed row: %v", err)
	}
	// A selectable row reads as with Read; another occupant's reference is stale.
	ref2 := insert(t, s, 8, 1)
	h, err = other.ReadHeld(ref2)
	if err != nil {
		t.Fatal(err)
	}
	h.Done()
	if _, err := other.ReadHeld(store.Ref{Index: ref2.Index, Seq: ref2.Seq + 1}); !errors.Is(err, store.ErrStale) {
		t.Fatalf("ReadHeld of another occupant: %v", err)
	}
}

// TestTouch: Touch reads rows and changes nothing: no pin, the same
// statuses and stats; indices out of range are skipped, and a closed shard
// is not read.
func TestTouch(t *testing.T) {
	s := storetest.Create(t, storetest.Spec(4))
	ref := insert(t, s, 7, 1)
	before := s.Stats()
	status, err := s.Status(ref)
	if err != nil {
		t.Fatal(err)
	}
	cols := make([]int, len(s.Spec().Columns))
	for i := range cols {
		cols[i] = i
	}
	if x := s.Touch([]int{ref.Index, -1, s.Capacity(), 3}, cols); x == 0 {
		t.Errorf("Touch of a committed row read 0 (its status word alone is not 0)")
	}
	if got := s.Stats(); got != before {
		t.Errorf("stats after Touch %+v, before %+v", got, before)
	}
	if got, err := s.Status(ref); got != status || err != nil {
		t.Errorf("status after Touch %v (%v), before %v", got, err, status)
	}
	if err := s.Release(ref); err != nil { // no pin left by Touch: freed at once
		t.Fatal(err)
	}
	if st := s.Stats(); st.Doomed != 0 {
		t.Errorf("stats %+v: a row released after Touch is doomed (pinned)", st)
	}
	other, err := store.Attach(context.Background(), s.Name())
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	if x := other.Touch([]int{0}, cols); x != 0 {
		t.Errorf("Touch of a closed handle read %d", x)
	}
}
