package replay

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// naiveFind is the dumb reference: a linear scan of prefix sums.
func naiveFind(w []float64, u float64) int {
	last := -1
	acc := 0.0
	for i, x := range w {
		if x > 0 {
			last = i
		}
		if u < acc+x && x > 0 {
			return i
		}
		acc += x
	}
	return last
}

func TestSumTreeMatchesLinearScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 7, 8, 100, 1000} {
		tr := NewSumTree(n)
		w := make([]float64, n)
		for round := 0; round < 5; round++ {
			for i := range w {
				w[i] = 0
				if rng.IntN(4) != 0 { // a quarter of the slots stay empty
					w[i] = rng.Float64() * 10
				}
				tr.Set(i, w[i])
			}
			sum := 0.0
			for _, x := range w {
				sum += x
			}
			if math.Abs(tr.Total()-sum) > 1e-9*sum {
				t.Fatalf("n=%d: Total = %v, want %v", n, tr.Total(), sum)
			}
			if sum == 0 {
				continue
			}
			for k := 0; k < 2000; k++ {
				u := rng.Float64() * sum
				if got, want := tr.Find(u), naiveFind(w, u); got != want {
					t.Fatalf("n=%d: Find(%v) = %d, linear scan %d", n, u, got, want)
				}
			}
			// Points at or past the total land on the last slot with weight.
			if got, want := tr.Find(sum*(1+1e-12)), naiveFind(w, math.Inf(1)); got != want {
				t.Fatalf("n=%d: Find(total) = %d, want %d", n, got, want)
			}
		}
	}
}

func transition(v float32) Transition {
	return Transition{Obs: []float32{v, v}, Action: int32(v), Reward: v, Discount: 0.99, NextObs: []float32{-v, -v}}
}

// Sampled frequencies and reported probabilities agree with p^α/Σp^α computed
// naively (fixed seed; the bound is 5 standard deviations per item).
func TestPrioritizedMatchesNaiveDistribution(t *testing.T) {
	ctx := context.Background()
	const alpha = 0.6
	tab, err := NewPrioritized(16, 2, alpha, rand.New(rand.NewPCG(3, 4)))
	if err != nil {
		t.Fatal(err)
	}
	prios := []float64{0.1, 1, 2, 5, 0.5, 3, 0, 8, 0.01, 1.5}
	keyOf := map[uint64]int{}
	for i, p := range prios {
		k, err := tab.Insert(ctx, transition(float32(i)), p)
		if err != nil {
			t.Fatal(err)
		}
		keyOf[k] = i
	}
	want := make([]float64, len(prios))
	sum := 0.0
	for i, p := range prios {
		want[i] = math.Pow(p, alpha)
		sum += want[i]
	}
	for i := range want {
		want[i] /= sum
	}
	const draws = 200000
	b := NewBatch(1000, 2)
	count := make([]int, len(prios))
	for d := 0; d < draws/b.Len(); d++ {
		if err := tab.Sample(ctx, b); err != nil {
			t.Fatal(err)
		}
		if b.TableSize != len(prios) {
			t.Fatalf("TableSize = %d", b.TableSize)
		}
		for j, k := range b.Keys {
			i := keyOf[k]
			count[i]++
			if math.Abs(b.Probabilities[j]-want[i]) > 1e-12 {
				t.Fatalf("item %d: probability %v, want %v", i, b.Probabilities[j], want[i])
			}
			if b.Priorities[j] != prios[i] || b.Obs[2*j] != float32(i) || b.NextObs[2*j+1] != -float32(i) ||
				b.Actions[j] != int32(i) || b.Rewards[j] != float32(i) || b.Discounts[j] != 0.99 {
				t.Fatalf("item %d: columns do not match what was inserted", i)
			}
		}
	}
	for i, c := range count {
		mean := want[i] * draws
		sd := math.Sqrt(draws * want[i] * (1 - want[i]))
		if math.Abs(float64(c)-mean) > 5*sd+1e-9 {
			t.Errorf("item %d (priority %v): %d draws, want %.0f ± %.0f", i, prios[i], c, mean, 5*sd)
		}
	}
	if count[6] != 0 {
		t.Errorf("zero-priority item drawn %d times", count[6])
	}
}

func TestFIFORemovalAndPriorityUpdates(t *testing.T) {
	ctx := context.Background()
	tab, _ := NewPrioritized(3, 2, 1, rand.New(rand.NewPCG(5, 6)))
	var keys []uint64
	for i := 0; i < 5; i++ {
		k, err := tab.Insert(ctx, transition(float32(i)), 1)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if tab.Size() != 3 || tab.Inserts() != 5 {
		t.Fatalf("size %d, inserts %d; want 3, 5", tab.Size(), tab.Inserts())
	}
	// The first two items were removed: their updates are ignored. Only item 4 keeps weight.
	if err := tab.UpdatePriorities(ctx, []uint64{keys[0], keys[1], keys[2], keys[3]}, []float64{100, 100, 0, 0}); err != nil {
		t.Fatal(err)
	}
	b := NewBatch(200, 2)
	if err := tab.Sample(ctx, b); err != nil {
		t.Fatal(err)
	}
	for j, k := range b.Keys {
		if k != keys[4] || b.Probabilities[j] != 1 || b.Obs[2*j] != 4 {
			t.Fatalf("sampled key %d (p=%v), want only key %d", k, b.Probabilities[j], keys[4])
		}
	}
	if err := tab.UpdatePriorities(ctx, []uint64{keys[4]}, []float64{0}); err != nil {
		t.Fatal(err)
	}
	if err := tab.Sample(ctx, b); !errors.Is(err, ErrEmpty) {
		t.Fatalf("all priorities zero: err = %v, want ErrEmpty", err)
	}
}

func TestUniformExponentAndErrors(t *testing.T) {
	ctx := context.Background()
	tab, _ := NewPrioritized(4, 2, 0, rand.New(rand.NewPCG(7, 8)))
	b := NewBatch(8, 2)
	if err := tab.Sample(ctx, b); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty table: err = %v", err)
	}
	for i, p := range []float64{0.001, 1000} {
		if _, err := tab.Insert(ctx, transition(float32(i)), p); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.Sample(ctx, b); err != nil {
		t.Fatal(err)
	}
	for _, pr := range b.Probabilities {
		if pr != 0.5 {
			t.Fatalf("exponent 0: probability %v, want 0.5", pr)
		}
	}
	for _, p := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, err := tab.Insert(ctx, transition(0), p); err == nil {
			t.Errorf("priority %v accepted", p)
		}
	}
	if _, err := tab.Insert(ctx, Transition{Obs: []float32{1}, NextObs: []float32{1}}, 1); err == nil {
		t.Error("short observation accepted")
	}
	if err := tab.Sample(ctx, NewBatch(1, 3)); err == nil {
		t.Error("batch of the wrong observation size accepted")
	}
	if err := tab.UpdatePriorities(ctx, []uint64{1}, nil); err == nil {
		t.Error("mismatched keys and priorities accepted")
	}
	if _, err := NewPrioritized(0, 2, 1, nil); err == nil {
		t.Error("capacity 0 accepted")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := tab.Sample(cctx, b); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: err = %v", err)
	}
}

func BenchmarkSample(b *testing.B) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 1))
	tab, _ := NewPrioritized(50000, 4, 0.6, rng)
	tr := Transition{Obs: make([]float32, 4), NextObs: make([]float32, 4)}
	for i := 0; i < 50000; i++ {
		_, _ = tab.Insert(ctx, tr, rng.Float64())
	}
	batch := NewBatch(64, 4)
	prios := make([]float64, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = tab.Sample(ctx, batch)
		for j := range prios {
			prios[j] = rng.Float64()
		}
		_ = tab.UpdatePriorities(ctx, batch.Keys, prios)
	}
	b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "items/s")
}
