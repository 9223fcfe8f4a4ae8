package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// TestAllocateWakesOnRelease: a writer that finds no free row sleeps on the
// free queue's bell in the segment, and the release of a row (by the owner,
// through another handle) rings it, rather than the writer polling.
func TestAllocateWakesOnRelease(t *testing.T) {
	spec := storetest.Spec(2)
	spec.Remover = store.RemoverNone
	s := storetest.Create(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var refs []store.Ref
	for k := range uint64(2) {
		p, err := s.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		storetest.Fill(p, k)
		ref, err := p.Commit(1)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	w, err := store.Attach(ctx, s.Name()) // a writer, as another process attaches
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	before := s.FreeBell()
	got := make(chan error, 1)
	go func() {
		p, err := w.Allocate(ctx)
		if err == nil {
			err = p.Abort()
		}
		got <- err
	}()
	for !s.FreeSleeping() {
		if ctx.Err() != nil {
			t.Fatal("the writer never slept on the free queue's bell")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if err := s.Release(refs[0]); err != nil {
		t.Fatal(err)
	}
	if s.FreeBell() == before {
		t.Fatal("the release did not ring the free queue's bell")
	}
	if s.FreeSleeping() {
		t.Fatal("the bell still marks a sleeper after the ring")
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
