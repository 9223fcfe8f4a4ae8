package cuda_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

// BenchmarkGatherWays times the ways a batch of random 64 KiB blocks of a
// registered host table can reach device memory, each against the pinned
// copy of the same bytes timed beside it in every iteration (of_pinned, the
// ratio of their event-timed medians; dev-us/op is the way's own median):
//
//   - kernel: the gather kernel with its indices already on the device;
//   - kernel/params: the kernel with its indices in the launch's parameters
//     (Device.LaunchGatherHost; for 256 rows its 1 KiB form);
//   - kernel/params960: the same with the 3840-byte form of the parameters;
//   - gather: Gatherer.Gather (for these rows: the kernel and the copy
//     engines sharing them, as split=0.50 below);
//   - copies/streams=K: the rows' copies as batched copies (cuMemcpyBatchAsync)
//     split over K streams, which the driver may give to separate copy
//     engines;
//   - split=F: the kernel gathers the first rows while one batch of copies on
//     a second stream moves the last F of them: the copy engines read host
//     memory in larger requests than the kernel's loads, so the bus may carry
//     more with both at work.
//
// It runs on a real GPU, and on the fake driver with GEAR_BENCH_FAKE=1 (where
// the figures say nothing of a GPU).
func BenchmarkGatherWays(b *testing.B) {
	dev, _ := cudatest.BenchDevice(b)
	for _, rows := range []int{256, 1024} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) { benchGatherWays(b, dev, rows, 64<<10) })
	}
}

// gatherBench is the set-up of BenchmarkGatherWays: a registered table of
// 2*rows random blocks, rows distinct random indices (on the device too), the
// destination, the same bytes in pinned memory, four streams and their events.
type gatherBench struct {
	dev      *cuda.Device
	tdev     cuda.DevicePtr
	idx      []int64
	idxDev   cuda.DevicePtr
	dst      cuda.DevicePtr
	pinned   []byte
	want     []byte
	spec     cuda.GatherSpec
	streams  []cuda.Stream
	start    cuda.Event
	ends     []cuda.Event
	batches  []*cuda.CopyBatch
	gatherer *cuda.Gatherer
}

func newGatherBench(b *testing.B, dev *cuda.Device, rows, blockBytes int) *gatherBench {
	g := &gatherBench{dev: dev, spec: cuda.GatherSpec{BlockBytes: blockBytes, Capacity: 2 * rows}}
	table, err := unix.Mmap(-1, 0, 2*rows*blockBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Munmap(table) })
	r := rand.New(rand.NewPCG(1, 2))
	for i := range table {
		table[i] = byte(r.Uint32())
	}
	if g.tdev, err = dev.RegisterHost(table); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := dev.UnregisterHost(table); err != nil {
			b.Error(err)
		}
	})
	for _, p := range r.Perm(2 * rows)[:rows] {
		g.idx = append(g.idx, int64(p))
	}
	g.idxDev = cudatest.ToDevice(b, dev, g.idx)
	g.dst = cudatest.ToDevice(b, dev, make([]byte, rows*blockBytes))
	g.want = make([]byte, rows*blockBytes)
	if err := cuda.GatherCPU(g.want, table, g.idx, nil, g.spec); err != nil {
		b.Fatal(err)
	}
	if g.pinned, err = dev.AllocHost(len(g.want)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := dev.FreeHost(g.pinned); err != nil {
			b.Error(err)
		}
	})
	copy(g.pinned, g.want)
	if g.gatherer, err = dev.NewGatherer(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.gatherer.Close() })
	if g.start, err = dev.NewEvent(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dev.DestroyEvent(g.start) })
	for range 4 {
		s, err := dev.NewStream()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dev.DestroyStream(s) })
		e, err := dev.NewEvent()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dev.DestroyEvent(e) })
		g.streams, g.ends, g.batches = append(g.streams, s), append(g.ends, e), append(g.batches, new(cuda.CopyBatch))
	}
	return g
}

// time runs enqueue (given the streams) between a start event on stream 0
// and an end event on each of the first k streams, and returns the time
// from the start to the last end.
func (g *gatherBench) time(ctx context.Context, k int, enqueue func() error) (time.Duration, error) {
	for _, s := range g.streams[:k] {
		if err := g.dev.StreamSynchronize(ctx, s); err != nil {
			return 0, err
		}
	}
	if err := g.dev.Record(g.start, g.streams[0]); err != nil {
		return 0, err
	}
	if err := enqueue(); err != nil {
		return 0, err
	}
	var last time.Duration
	for i, s := range g.streams[:k] {
		if err := g.dev.Record(g.ends[i], s); err != nil {
			return 0, err
		}
	}
	for i := range k {
		if err := g.dev.EventSynchronize(ctx, g.ends[i]); err != nil {
			return 0, err
		}
		d, err := g.dev.Elapsed(g.start, g.ends[i])
		if err != nil {
			return 0, err
		}
		last = max(last, d)
	}
	return last, nil
}

// copies enqueues the batched copies of rows [from, to) split over streams
// [s0, s0+k).
func (g *gatherBench) copies(from, to, s0, k int) error {
	per := (to - from + k - 1) / k
	for i := range k {
		lo, hi := from+i*per, min(from+(i+1)*per, to)
		if lo >= hi {
			continue
		}
		bt := g.batches[s0+i]
		bt.Reset()
		if err := bt.AddGather(g.dst.Add(lo*g.spec.BlockBytes), g.tdev, g.idx[lo:hi], nil, g.spec); err != nil {
			return err
		}
		if err := g.dev.CopyBatchAsync(g.streams[s0+i], bt); err != nil {
			return err
		}
	}
	return nil
}

func benchGatherWays(b *testing.B, dev *cuda.Device, rows, blockBytes int) {
	g := newGatherBench(b, dev, rows, blockBytes)
	ctx := context.Background()
	s0 := g.streams[0]
	type way struct {
		name    string
		streams int
		enqueue func() error
	}
	ways := []way{
		{"kernel", 1, func() error { return dev.LaunchGather(s0, g.dst, g.tdev, g.idxDev, 0, rows, g.spec) }},
		{"kernel/params", 1, func() error { return dev.LaunchGatherHost(s0, g.dst, g.tdev, g.idx, g.spec) }},
		{"kernel/params960", 1, func() error {
			defer cuda.SetGatherSmallRows(0)()
			return dev.LaunchGatherHost(s0, g.dst, g.tdev, g.idx, g.spec)
		}},
		{"gather", 1, func() error { return g.gatherer.Gather(ctx, s0, g.dst, g.tdev, g.idx, nil, g.spec) }},
	}
	if dev.CanCopyBatch() {
		for _, k := range []int{1, 2, 4} {
			ways = append(ways, way{fmt.Sprintf("copies/streams=%d", k), k, func() error { return g.copies(0, rows, 0, k) }})
		}
		for _, f := range []float64{0.25, 0.5, 0.75} {
			cut := rows - int(f*float64(rows))
			ways = append(ways, way{fmt.Sprintf("split=%.2f", f), 2, func() error {
				if err := dev.LaunchGather(s0, g.dst, g.tdev, g.idxDev, 0, cut, g.spec); err != nil {
					return err
				}
				return g.copies(cut, rows, 1, 1)
			}})
		}
	}
	pinnedCopy := func() error { return dev.CopyHtoDAsync(g.dst, g.pinned, s0) }
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			// Warm up: the first calls of an idle GPU run at a low clock.
			for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
				if _, err := g.time(ctx, w.streams, w.enqueue); err != nil {
					b.Fatal(err)
				}
			}
			var way, pinned []float64
			b.ResetTimer()
			for range b.N {
				d, err := g.time(ctx, 1, pinnedCopy)
				if err != nil {
					b.Fatal(err)
				}
				pinned = append(pinned, d.Seconds())
				if d, err = g.time(ctx, w.streams, w.enqueue); err != nil {
					b.Fatal(err)
				}
				way = append(way, d.Seconds())
			}
			b.StopTimer()
			got := make([]byte, len(g.want))
			if err := dev.CopyDtoH(got, g.dst); err != nil {
				b.Fatal(err)
			}
			if !slices.Equal(got, g.want) {
				b.Fatalf("%s: the rows differ from GatherCPU's", w.name)
			}
			if err := dev.MemsetAsync(g.dst, 0, len(g.want), s0); err != nil {
				b.Fatal(err)
			}
			slices.Sort(way)
			slices.Sort(pinned)
			b.ReportMetric(way[len(way)/2]*1e6, "dev-us/op")
			b.ReportMetric(pinned[len(pinned)/2]/way[len(way)/2], "of_pinned")
			b.SetBytes(int64(len(g.want)))
		})
	}
}
