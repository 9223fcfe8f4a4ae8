package sample

import (
	"math/rand/v2"
	"testing"
)

// keyMap is what keyIndex and its hash part, keyHash, both do.
type keyMap interface {
	get(key uint64) (int32, bool)
	set(key uint64, slot int32)
	remove(key uint64)
	touch(key uint64) int32
	reset()
}

func (x *keyHash) len() int { return x.n }

// TestKeyIndex checks keyIndex and keyHash against a Go map through random
// sets, removes and gets, with keys drawn from a small range (long probe
// runs, removals in the middle of them, dense cells taken by other keys),
// far keys among them, and FIFO cycling.
func TestKeyIndex(t *testing.T) {
	for _, tc := range []struct {
		name string
		x    interface {
			keyMap
			len() int
		}
	}{{"index", &keyIndex{}}, {"hash", &keyHash{}}} {
		t.Run(tc.name, func(t *testing.T) { checkKeyMap(t, tc.x, tc.x.len) })
	}
	// touch reads a key's home cell and changes nothing: a key at its home
	// gives its slot word (slot+1), and every key reads as before after.
	var x keyHash
	for k := range uint64(5000) {
		x.set(k, int32(k))
		if k >= 1000 {
			x.remove(k - 1000)
		}
	}
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
	for k := range uint64(5000) {
		v, ok := x.get(k)
		if ok != (k >= 4000) || (ok && v != int32(k)) {
			t.Fatalf("after the touches, key %d: %d %v", k, v, ok)
		}
	}
}

func checkKeyMap(t *testing.T, x keyMap, size func() int) {
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[uint64]int32{}
	check := func(step int) {
		if size() != len(want) {
			t.Fatalf("step %d: %d keys, want %d", step, size(), len(want))
		}
		for k, v := range want {
			if got, ok := x.get(k); !ok || got != v {
				t.Fatalf("step %d: key %d: %d %v, want %d", step, k, got, ok, v)
			}
		}
	}
	for step := range 20000 {
		k := rng.Uint64N(300)
		switch {
		case step%7 == 0:
			k = rng.Uint64() // far keys too
		case step%5 == 0:
			k += 16 << rng.IntN(4) // keys equal to others modulo the dense array's length
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
		_, present := want[k]
		if _, ok := x.get(k); ok != present {
			t.Fatalf("step %d: key %d present %v, want %v", step, k, ok, present)
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
}

// Consecutive keys live in the dense array, with no key in the hash; a near
// key whose cell an old key still holds, and far keys, go to the hash, and
// every key is found wherever it went.
func TestKeyIndexDense(t *testing.T) {
	var x keyIndex
	for k := range uint64(5000) {
		x.set(k, int32(k))
		if k >= 1000 && k-1000 != 10 { // key 10 stays while the window slides past it
			x.remove(k - 1000)
		}
	}
	d := uint64(len(x.dense))
	if x.hash.n != 1 || x.nd != 1000 {
		t.Fatalf("a sliding window of 1000 keys and key 10: %d keys dense (of %d cells), %d hashed; want 1000 and 1",
			x.nd, d, x.hash.n)
	}
	// 10+d*j met key 10's cell on the way: it is the one hashed.
	hashed := uint64(0)
	for k := uint64(11); k < 5000; k++ {
		if (k-10)%d == 0 && k >= 4000 {
			hashed = k
		}
	}
	if hashed == 0 {
		t.Fatalf("no key of the window shares key 10's cell among %d", d)
	}
	if _, ok := x.hash.get(hashed); !ok {
		t.Errorf("key %d, whose dense cell key 10 holds, is not in the hash", hashed)
	}
	for _, k := range []uint64{10, 4000, 4999, hashed} {
		if v, ok := x.get(k); !ok || v != int32(k) {
			t.Errorf("key %d: %d %v", k, v, ok)
		}
	}
	if got := x.touch(4999); got != 5000 {
		t.Errorf("touch(4999) = %d, want its slot word 5000", got)
	}
	x.remove(10)
	if _, ok := x.get(10); ok {
		t.Error("key 10 found after its removal")
	}
	far := uint64(1) << 63
	for i := range uint64(100) {
		x.set(far+i*1e9, int32(i))
	}
	if x.hash.n != 101 {
		t.Errorf("100 far keys and key %d: %d hashed", hashed, x.hash.n)
	}
	for i := range uint64(100) {
		if v, ok := x.get(far + i*1e9); !ok || v != int32(i) {
			t.Fatalf("far key %d: %d %v", i, v, ok)
		}
	}
}

// BenchmarkKeyIndexFIFO is a full table's key churn: one key in, the oldest
// out, 100,000 keys held, with consecutive keys (gear's keyless rows) and
// with random ones (Reverb's), through keyIndex and through its hash part
// alone, which was the whole index before the dense array
// (BenchmarkMapFIFO is Go's map doing the same).
func BenchmarkKeyIndexFIFO(b *testing.B) {
	for _, keys := range []string{"consecutive", "random"} {
		for _, idx := range []string{"index", "hash"} {
			b.Run(keys+"/"+idx, func(b *testing.B) {
				var x keyMap = &keyIndex{}
				if idx == "hash" {
					x = &keyHash{}
				}
				const n = 100000
				key := func(i uint64) uint64 { return i }
				if keys == "random" {
					key = func(i uint64) uint64 { return i * 0xD1B54A32D192ED03 } // odd: distinct keys, scattered
				}
				for i := range uint64(n) {
					x.set(key(i), int32(i))
				}
				i := uint64(n)
				for b.Loop() {
					k := key(i)
					if _, ok := x.get(k); ok {
						b.Fatal("new key found")
					}
					x.set(k, int32(i%n))
					x.remove(key(i - n))
					i++
				}
			})
		}
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
