package sample

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
	"github.com/gear-rl/gear/store"
)

// BenchmarkCollectDeviceRuns times ShardTable.CollectDevice of 256 random
// 64 KiB rows (gearbench gpu's collect_device) with the rows sent in runs
// three ways, each against the pinned copy of the same bytes timed beside it
// in every iteration (of_pinned: event-timed medians, as gearbench's; also
// wall-us/op, the call's own time):
//
//   - first+rest: a first run of 1 MiB (at least 32 rows), then every row
//     left (the default);
//   - doubling: the same first run, each next one twice the last;
//   - one: every row in one run, pinned before the first launch.
//
// It runs on a real GPU, and on the fake driver with GEAR_BENCH_FAKE=1.
func BenchmarkCollectDeviceRuns(b *testing.B) {
	dev, _ := cudatest.BenchDevice(b)
	const rowBytes, rows, capacity = 64 << 10, 256, 1024
	ctx := context.Background()
	st := specTable(b, store.Spec{Capacity: capacity, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "traj", DType: store.Uint8, Shape: []int{rowBytes}, Length: 1},
	}}, Config{Name: "bench", Sampler: NewUniform(), Remover: NewFIFO()})
	r := rand.New(rand.NewPCG(1, 3))
	var idx []int
	for k := range capacity - 1 {
		ref, err := st.Insert(ctx, uint64(k), 1, func(p store.Pending) error {
			blk := p.Block(0)
			for i := range blk {
				blk[i] = byte(r.Uint32())
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		idx = append(idx, ref.Index)
	}
	r.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	idx = idx[:rows]
	cols := []string{"traj"}
	want, err := st.Collect(ctx, idx, cols, Window{})
	if err != nil {
		b.Fatal(err)
	}
	if err := st.RegisterDevice(ctx, dev); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.UnregisterDevice(ctx) })
	dst := cudatest.ToDevice(b, dev, make([]byte, len(want[0])))
	pinned, err := dev.AllocHost(len(want[0]))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dev.FreeHost(pinned) })
	s, err := dev.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dev.DestroyStream(s) })
	var ev [2]cuda.Event
	for i := range ev {
		if ev[i], err = dev.NewEvent(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dev.DestroyEvent(ev[i]) })
	}
	timed := func(f func() error) (float64, float64, error) {
		t0 := time.Now()
		if err := dev.Record(ev[0], s); err != nil {
			return 0, 0, err
		}
		if err := f(); err != nil {
			return 0, 0, err
		}
		if err := dev.Record(ev[1], s); err != nil {
			return 0, 0, err
		}
		if err := dev.EventSynchronize(ctx, ev[1]); err != nil {
			return 0, 0, err
		}
		wall := time.Since(t0).Seconds()
		d, err := dev.Elapsed(ev[0], ev[1])
		return d.Seconds(), wall, err
	}
	pinnedCopy := func() error { return dev.CopyHtoDAsync(dst, pinned, s) }
	collect := func() error { return st.CollectDevice(ctx, s, []cuda.DevicePtr{dst}, idx, cols, Window{}) }
	defer func(run, growth int) { collectRun, collectRunGrowth = run, growth }(collectRun, collectRunGrowth)
	for _, w := range []struct {
		name        string
		run, growth int
	}{{"first+rest", 1 << 20, 0}, {"doubling", 1 << 20, 2}, {"one", 1 << 40, 0}} {
		b.Run(w.name, func(b *testing.B) {
			collectRun, collectRunGrowth = w.run, w.growth
			for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
				if _, _, err := timed(collect); err != nil {
					b.Fatal(err)
				}
			}
			var ev, wall, pin []float64
			b.ResetTimer()
			for range b.N {
				p, _, err := timed(pinnedCopy)
				if err != nil {
					b.Fatal(err)
				}
				e, w, err := timed(collect)
				if err != nil {
					b.Fatal(err)
				}
				pin, ev, wall = append(pin, p), append(ev, e), append(wall, w)
			}
			b.StopTimer()
			got := make([]byte, len(want[0]))
			if err := dev.CopyDtoH(got, dst); err != nil {
				b.Fatal(err)
			}
			if !slices.Equal(got, want[0]) {
				b.Fatalf("%s: the rows differ from Collect's", w.name)
			}
			med := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
			p, e, wl := med(pin), med(ev), med(wall)
			b.ReportMetric(e*1e6, "dev-us/op")
			b.ReportMetric(wl*1e6, "wall-us/op")
			b.ReportMetric(p/e, "of_pinned")
			b.SetBytes(int64(len(want[0])))
		})
	}
}
