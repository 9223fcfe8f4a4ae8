package sample

import (
	"context"
	"fmt"
	"testing"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

func filledSelector(b *testing.B, kind Kind, n int) Selector {
	s := newSelector(b, kind, 0.6)
	r := newRand(1)
	for i := range n {
		if err := s.Insert(i, r.Float64()*10); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// BenchmarkSelectorSample draws batches of 1024 from a million items.
func BenchmarkSelectorSample(b *testing.B) {
	const n, batch = 1_000_000, 1024
	for _, kind := range []Kind{KindUniform, KindPrioritized} {
		b.Run(fmt.Sprintf("%v/n=1M/B=1024", kind), func(b *testing.B) {
			s := filledSelector(b, kind, n)
			picks := make([]Pick, batch)
			r := newRand(2)
			b.ResetTimer()
			for b.Loop() {
				s.Sample(r, picks)
			}
			b.ReportMetric(float64(b.N)*batch/b.Elapsed().Seconds(), "items/s")
		})
	}
	b.Run("maxheap-best/n=1M/B=1024", func(b *testing.B) {
		s := filledSelector(b, KindMaxHeap, n).(Ordered)
		dst := make([]int, 0, batch)
		b.ResetTimer()
		for b.Loop() {
			dst = s.Best(batch, dst[:0])
		}
		b.ReportMetric(float64(b.N)*batch/b.Elapsed().Seconds(), "items/s")
	})
}

// BenchmarkSelectorUpdate sets random priorities in a million items.
func BenchmarkSelectorUpdate(b *testing.B) {
	const n = 1_000_000
	for _, kind := range []Kind{KindPrioritized, KindMaxHeap} {
		b.Run(kind.String()+"/n=1M", func(b *testing.B) {
			s := filledSelector(b, kind, n)
			r := newRand(3)
			b.ResetTimer()
			for b.Loop() {
				_ = s.Update(r.IntN(n), r.Float64()*10)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "updates/s")
		})
	}
}

// BenchmarkTableSample samples batches of 1024 through the table (locking, rate
// limiter, bookkeeping) from a million items.
func BenchmarkTableSample(b *testing.B) {
	const n, batch = 1_000_000, 1024
	for _, kind := range []Kind{KindUniform, KindPrioritized} {
		b.Run(fmt.Sprintf("%v/n=1M/B=1024", kind), func(b *testing.B) {
			sampler := newSelector(b, kind, 0.6)
			tb, err := NewTable(Config{Name: "bench", MaxSize: n, Sampler: sampler, Remover: NewFIFO(), Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer tb.Close()
			r := newRand(1)
			ctx := context.Background()
			for k := range uint64(n) {
				if err := tb.Insert(ctx, k, r.Float64()*10, k); err != nil {
					b.Fatal(err)
				}
			}
			dst := make([]Sampled, batch)
			b.ResetTimer()
			for b.Loop() {
				if _, err := tb.SampleInto(ctx, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*batch/b.Elapsed().Seconds(), "items/s")
		})
	}
}

// BenchmarkCollectLocal collects 256 trajectories from a shard.
func BenchmarkCollectLocal(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("bytes=%dKiB", size>>10), func(b *testing.B) {
			spec := store.Spec{Capacity: 257, Remover: store.RemoverNone, Columns: []store.Column{
				{Name: "traj", DType: store.Uint8, Shape: []int{size}, Length: 1}}}
			sh := storetest.Create(b, spec)
			st, err := NewShardTable(sh, Config{Name: "bench", Sampler: NewUniform(), Remover: NewFIFO()})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			ctx := context.Background()
			idx := make([]int, 256)
			for k := range idx {
				ref, err := st.Insert(ctx, uint64(k), 1, func(store.Pending) error { return nil })
				if err != nil {
					b.Fatal(err)
				}
				idx[k] = ref.Index
			}
			var dst [][]byte
			b.SetBytes(int64(256 * size))
			b.ResetTimer()
			for b.Loop() {
				if dst, err = st.CollectInto(ctx, dst, idx, []string{"traj"}, Window{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
