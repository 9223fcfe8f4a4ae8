package sample

import (
	"context"
	"testing"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// specTable makes a shard of spec and a table over it with cfg; both are
// closed at the end of the test.
func specTable(tb testing.TB, spec store.Spec, cfg Config) *ShardTable {
	tb.Helper()
	st, err := NewShardTable(storetest.Create(tb, spec), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	return st
}

// planBuffers plans the collection of cols from st (no window) and makes
// the buffers of a batch of n items.
func planBuffers(tb testing.TB, st *ShardTable, cols []string, n int) (*CollectPlan, [][]byte) {
	tb.Helper()
	plan, err := st.PlanCollect(cols, Window{})
	if err != nil {
		tb.Fatal(err)
	}
	dst := make([][]byte, len(cols))
	for i := range dst {
		dst[i] = make([]byte, n*plan.ItemBytes(i))
	}
	return plan, dst
}

// pythonBenchTable is a table of python/bench.py's 400-byte rows: a full
// 100,000 with a FIFO remover, over a shard with 4,096 rows to spare, its
// small columns packed as bench.py's are (packed false: 64 bytes each).
func pythonBenchTable(b *testing.B, packed bool) *ShardTable {
	return specTable(b, store.Spec{Capacity: 100000 + 4096, Remover: store.RemoverNone, Packed: packed, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{96}, Length: 1},
		{Name: "action", DType: store.Int32, Length: 1},
		{Name: "reward", DType: store.Float32, Length: 1},
		{Name: "discount", DType: store.Float32, Length: 1},
		{Name: "flags", DType: store.Int32, Length: 1},
	}}, Config{Name: "bench", Sampler: NewUniform(), Remover: NewFIFO(), MaxSize: 100000})
}

// BenchmarkCollectBatch is the Python client's training-loop path, in Go:
// sample 256 items of a full 100,000-row table of 400-byte rows (the
// columns of python/bench.py), collect every column into the same arrays
// through a plan, release. "sample" times the sample and release alone;
// "sample+collect-padded" is the same over a shard that is not packed
// (every column 64 bytes a row or more, the default), its peer in the run.
func BenchmarkCollectBatch(b *testing.B) {
	ctx := context.Background()
	cols := []string{"obs", "action", "reward", "discount", "flags"}
	const n = 256
	for _, c := range []struct {
		name             string
		packed, collects bool
	}{{"sample", true, false}, {"sample+collect", true, true}, {"sample+collect-padded", false, true}} {
		st := pythonBenchTable(b, c.packed)
		for k := range 100000 {
			if _, err := st.Insert(ctx, uint64(k), 1, func(store.Pending) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
		plan, dst := planBuffers(b, st, cols, n)
		var batch Batch
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := st.SampleInto(ctx, &batch, n); err != nil {
					b.Fatal(err)
				}
				if c.collects {
					if err := st.CollectBatch(ctx, plan, &batch, dst); err != nil {
						b.Fatal(err)
					}
				}
				batch.Release()
			}
			b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "rows/s")
		})
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// CollectBatch allocates nothing, its touch pass included.
func TestCollectBatchAllocates(t *testing.T) {
	st := specTable(t, store.Spec{Capacity: 1024, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{96}, Length: 1},
		{Name: "action", DType: store.Int32, Length: 1},
	}}, Config{Name: "allocs", Sampler: NewUniform(), Remover: NewFIFO()})
	ctx := context.Background()
	for k := range 1000 {
		if _, err := st.Insert(ctx, uint64(k), 1, func(p store.Pending) error {
			p.Block(1)[0] = byte(k)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	plan, dst := planBuffers(t, st, []string{"obs", "action"}, 256)
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

// BenchmarkShardAdmit: a writer's commits of 400-byte rows into the shard
// of a full table of 100,000 (each admission evicts the oldest row), in
// batches of 256 as gear_shard_insert makes them, and the owner's
// admission of all of them: the work that caps writers into one table.
func BenchmarkShardAdmit(b *testing.B) {
	st := pythonBenchTable(b, true)
	sh := st.Shard()
	w, err := store.Attach(context.Background(), sh.Name())
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	ctx := context.Background()
	commit := func(n int) {
		for range n {
			p, err := w.Allocate(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := p.Commit(1); err != nil {
				b.Fatal(err)
			}
		}
		if err := st.WaitAdmitted(ctx, w.CommitSeq()); err != nil {
			b.Fatal(err)
		}
	}
	commit(100000)
	b.ResetTimer()
	rows := 0
	for b.Loop() {
		commit(256)
		rows += 256
	}
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
}

// A plan groups rows for the touch pass by the bytes Shard.Touch reads,
// whole blocks, not by the window it copies: a one-frame window over long
// trajectories is not touched ahead (256 rows of 64 KiB blocks would be 16
// MiB), while short rows are, and a windowed plan still collects right.
func TestCollectPlanGroupsByBlocks(t *testing.T) {
	st := specTable(t, store.Spec{Capacity: 64, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "traj", DType: store.Uint8, Shape: []int{64}, Length: 1024},
		{Name: "r", DType: store.Float32, Length: 1},
	}}, Config{Name: "groups", Sampler: NewFIFO(), Remover: NewFIFO()})
	long, err := st.PlanCollect([]string{"traj"}, Window{Offset: 1023, Length: 1})
	if err != nil {
		t.Fatal(err)
	}
	if long.per != 64 || long.group != 1 {
		t.Errorf("one 64-byte frame of 64 KiB blocks: %d bytes an item, groups of %d; want 64, 1", long.per, long.group)
	}
	short, err := st.PlanCollect([]string{"r"}, Window{})
	if err != nil {
		t.Fatal(err)
	}
	if short.group != maxTouchGroup {
		t.Errorf("4-byte rows: groups of %d, want %d", short.group, maxTouchGroup)
	}
	ctx := context.Background()
	for k := range 3 {
		if _, err := st.Insert(ctx, uint64(k), 1, func(p store.Pending) error {
			p.Block(0)[1023*64] = byte(10 + k)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var b Batch
	if err := st.SampleInto(ctx, &b, 3); err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	dst := [][]byte{make([]byte, 3*64)}
	if err := st.CollectBatch(ctx, long, &b, dst); err != nil {
		t.Fatal(err)
	}
	for k, it := range b.Items {
		if got := dst[0][64*k]; got != byte(10+it.Key) {
			t.Errorf("item %d (key %d): last frame starts with %d, want %d", k, it.Key, got, 10+it.Key)
		}
	}
}
