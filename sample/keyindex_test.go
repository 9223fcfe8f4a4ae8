package sample

import (
	"math/rand/v2"
	"testing"
)

// TestKeyIndex checks keyIndex against a Go map through random sets, removes
// and gets, with keys drawn from a small range (long probe runs, removals in
// the middle of them) and FIFO cycling.
func TestKeyIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var x keyIndex
	want := map[uint64]int32{}
	check := func(step int) {
		if x.len() != len(want) {
			t.Fatalf("step %d: %d keys, want %d", step, x.len(), len(want))
		}
		for k, v := range want {
			if got, ok := x.get(k); !ok || got != v {
				t.Fatalf("step %d: key %d: %d %v, want %d", step, k, got, ok, v)
			}
		}
	}
	for step := range 20000 {
		k := rng.Uint64N(300)
		if step%7 == 0 {
			k = rng.Uint64() // far keys too
		}
		switch rng.IntN(3) {
		case 0, 1:
			v := int32(rng.IntN(1000))
			x.set(k, v)
			want[k] = v
		case 2:
			x.remove(k)
			delete(want, k)
		}
		if _, ok := x.get(k); ok != (want[k] != 0 || func() bool { _, ok := want[k]; return ok }()) {
			t.Fatalf("step %d: key %d present %v", step, k, ok)
		}
		if step%500 == 0 {
			check(step)
		}
	}
	check(-1)
	// FIFO: a window of 1000 keys slides by one per step.
	x.reset()
	clear(want)
	for k := range uint64(5000) {
		x.set(k, int32(k))
		want[k] = int32(k)
		if k >= 1000 {
			x.remove(k - 1000)
			delete(want, k-1000)
		}
	}
	check(-2)
	if _, ok := x.get(3999); ok {
		t.Fatal("key 3999 left the window and is still found")
	}
	// touch reads a key's home cell and changes nothing: a key at its home
	// gives its slot word (slot+1), and every key reads as before after.
	var empty keyIndex
	if got := empty.touch(7); got != 0 {
		t.Errorf("touch of an empty index: %d", got)
	}
	atHome := 0
	for k := range uint64(5000) {
		c := x.cells[x.home(k)]
		if got := x.touch(k); got != c.slot {
			t.Fatalf("touch(%d) = %d, its home cell holds %d", k, got, c.slot)
		}
		if c.key == k && c.slot != 0 {
			atHome++
			if v, _ := x.get(k); c.slot != v+1 {
				t.Fatalf("key %d at home with slot word %d, get says %d", k, c.slot, v)
			}
		}
	}
	if atHome == 0 {
		t.Fatal("no key of the window at its home cell")
	}
	check(-3)
}

// BenchmarkKeyIndexFIFO is a full table's key churn: one key in, the oldest
// out, 100,000 keys held (BenchmarkMapFIFO is Go's map doing the same).
func BenchmarkKeyIndexFIFO(b *testing.B) {
	var x keyIndex
	const n = 100000
	for k := range uint64(n) {
		x.set(k, int32(k))
	}
	k := uint64(n)
	for b.Loop() {
		if _, ok := x.get(k); ok {
			b.Fatal("new key found")
		}
		x.set(k, int32(k%n))
		x.remove(k - n)
		k++
	}
}

// BenchmarkMapFIFO is BenchmarkKeyIndexFIFO with a Go map, the peer.
func BenchmarkMapFIFO(b *testing.B) {
	m := map[uint64]int32{}
	const n = 100000
	for k := range uint64(n) {
		m[k] = int32(k)
	}
	k := uint64(n)
	for b.Loop() {
		if _, ok := m[k]; ok {
			b.Fatal("new key found")
		}
		m[k] = int32(k % n)
		delete(m, k-n)
		k++
	}
}
