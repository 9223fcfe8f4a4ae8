package sample

import (
	"context"
	"testing"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// BenchmarkCollectBatch is the Python client's training-loop path, in Go:
// sample 256 items of a full 100,000-row table of 400-byte rows (the
// columns of python/bench.py), collect every column into the same arrays
// through a plan, release. "sample" times the sample and release alone.
func BenchmarkCollectBatch(b *testing.B) {
	spec := store.Spec{Capacity: 100000 + 4096, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{96}, Length: 1},
		{Name: "action", DType: store.Int32, Length: 1},
		{Name: "reward", DType: store.Float32, Length: 1},
		{Name: "discount", DType: store.Float32, Length: 1},
		{Name: "flags", DType: store.Int32, Length: 1},
	}}
	sh := storetest.Create(b, spec)
	st, err := NewShardTable(sh, Config{Name: "bench", Sampler: NewUniform(), Remover: NewFIFO(), MaxSize: 100000})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for k := range 100000 {
		if _, err := st.Insert(ctx, uint64(k), 1, func(store.Pending) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
	cols := []string{"obs", "action", "reward", "discount", "flags"}
	plan, err := st.PlanCollect(cols, Window{})
	if err != nil {
		b.Fatal(err)
	}
	const n = 256
	dst := make([][]byte, len(cols))
	for i := range dst {
		dst[i] = make([]byte, n*plan.ItemBytes(i))
	}
	var batch Batch
	for _, collect := range []bool{false, true} {
		name := "sample"
		if collect {
			name = "sample+collect"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if err := st.SampleInto(ctx, &batch, n); err != nil {
					b.Fatal(err)
				}
				if collect {
					if err := st.CollectBatch(ctx, plan, &batch, dst); err != nil {
						b.Fatal(err)
					}
				}
				batch.Release()
			}
			b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// CollectBatch allocates nothing, its touch pass included.
func TestCollectBatchAllocates(t *testing.T) {
	spec := store.Spec{Capacity: 1024, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{96}, Length: 1},
		{Name: "action", DType: store.Int32, Length: 1},
	}}
	sh := storetest.Create(t, spec)
	st, err := NewShardTable(sh, Config{Name: "allocs", Sampler: NewUniform(), Remover: NewFIFO()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for k := range 1000 {
		if _, err := st.Insert(ctx, uint64(k), 1, func(p store.Pending) error {
			p.Block(1)[0] = byte(k)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	plan, err := st.PlanCollect([]string{"obs", "action"}, Window{})
	if err != nil {
		t.Fatal(err)
	}
	dst := [][]byte{make([]byte, 256*plan.ItemBytes(0)), make([]byte, 256*plan.ItemBytes(1))}
	var batch Batch
	run := func() {
		if err := st.SampleInto(ctx, &batch, 256); err != nil {
			t.Fatal(err)
		}
		if err := st.CollectBatch(ctx, plan, &batch, dst); err != nil {
			t.Fatal(err)
		}
		for k, it := range batch.Items {
			if got := dst[1][4*k]; got != byte(it.Key) {
				t.Fatalf("item %d (key %d): action byte %d", k, it.Key, got)
			}
		}
		batch.Release()
	}
	run()
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Errorf("sample, collect and release: %v allocations", n)
	}
}
