package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

// gpuConfig is the configuration of `gearbench gpu`.
type gpuConfig struct {
	json       bool
	cpuOnly    bool
	blocks     int // gathered blocks
	blockBytes int
	capacity   int // blocks in the column table
	sizes      []int
	draws      int
	topK       int
	reps       int
	device     int
	seed       uint64
}

func parseGPUFlags(args []string, out io.Writer) (gpuConfig, error) {
	c := gpuConfig{}
	fs := flag.NewFlagSet("gearbench gpu", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&c.json, "json", false, "print one JSON object per line")
	fs.BoolVar(&c.cpuOnly, "cpu-only", false, "run only the CPU sampling paths (no driver needed)")
	fs.IntVar(&c.blocks, "blocks", 256, "blocks gathered per collection")
	blockBytes := fs.String("block-bytes", "64K", "bytes of one block")
	fs.IntVar(&c.capacity, "capacity", 1024, "blocks in the registered column table")
	sizes := fs.String("sizes", "1000000,100000000", "weight counts N for sampling")
	fs.IntVar(&c.draws, "draws", 1024, "draws B per weighted sample")
	fs.IntVar(&c.topK, "k", 1024, "k of the top-k measurement (0 skips it)")
	fs.IntVar(&c.reps, "reps", 20, "timed repetitions of each GPU measurement (CPU: fewer)")
	fs.IntVar(&c.device, "device", 0, "CUDA device ordinal")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the blocks, weights and draws")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.blockBytes, err = parseSize(*blockBytes); err != nil {
		return c, err
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return c, fmt.Errorf("bad count %q in --sizes: want decimal counts such as 1000000", s)
		}
		c.sizes = append(c.sizes, n)
	}
	if c.blocks <= 0 || c.blockBytes <= 0 || c.capacity < c.blocks || c.draws < 0 || c.reps <= 0 || c.topK < 0 {
		return c, fmt.Errorf("need 0 < blocks <= capacity, block bytes > 0, draws >= 0, k >= 0, reps > 0")
	}
	return c, nil
}

// benchGPU measures the GPU paths against their limits: the zero-copy gather of
// registered host memory against a contiguous pinned host-to-device copy of the
// same bytes, and GPU weighted sampling (and top-k) against the CPU twins. Without
// a CUDA driver it fails with "cuda: no CUDA driver: ..." unless --cpu-only.
func benchGPU(args []string, out io.Writer) error {
	c, err := parseGPUFlags(args, out)
	if err != nil {
		return err
	}
	e := emitter{w: out, json: c.json}
	// Waits under a context that ends, as a program's are: Ctrl-C stops the
	// run, and the product paths wait as they do there (cuda's poll, not the
	// driver's blocking sync).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if c.cpuOnly {
		return benchSamplingCPU(e, c)
	}
	drv, err := cuda.OpenDriver()
	if err != nil {
		return fmt.Errorf("%w (use --cpu-only for the CPU paths alone)", err)
	}
	dev, err := drv.Device(c.device)
	if err != nil {
		return err
	}
	defer dev.Close()
	name, _ := dev.Name()
	major, minor, _ := dev.ComputeCapability()
	if err := e.emit(kv{"bench", "gpu"}, kv{"op", "device"}, kv{"name", name}, kv{"sm", fmt.Sprintf("%d%d", major, minor)}, kv{"driver", drv.Version()}); err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer dev.DestroyStream(s)
	copySecs, err := benchGather(ctx, e, c, dev, s)
	if err != nil {
		return err
	}
	if err := benchCollectDevice(ctx, e, c, dev, s, copySecs); err != nil {
		return err
	}
	return benchSampling(ctx, e, c, dev, s)
}

// timeEvents runs f reps times (after warmUpGPU) between two events on s and
// returns the median seconds.
func timeEvents(ctx context.Context, dev *cuda.Device, s cuda.Stream, reps int, f func() error) (float64, error) {
	start, err := dev.NewEvent()
	if err != nil {
		return 0, err
	}
	defer dev.DestroyEvent(start)
	end, err := dev.NewEvent()
	if err != nil {
		return 0, err
	}
	defer dev.DestroyEvent(end)
	if err := warmUpGPU(f, func() error { return dev.StreamSynchronize(ctx, s) }); err != nil {
		return 0, err
	}
	var secs []float64
	for range reps {
		if err := dev.Record(start, s); err != nil {
			return 0, err
		}
		if err := f(); err != nil {
			return 0, err
		}
		if err := dev.Record(end, s); err != nil {
			return 0, err
		}
		if err := dev.EventSynchronize(ctx, end); err != nil {
			return 0, err
		}
		d, err := dev.Elapsed(start, end)
		if err != nil {
			return 0, err
		}
		secs = append(secs, d.Seconds())
	}
	return median(secs), nil
}

// benchGather times the gather kernel over a registered table, the same
// gather through the copy engines (where the driver has batched copies), and
// the pinned copy of the same bytes, which it returns.
func benchGather(ctx context.Context, e emitter, c gpuConfig, dev *cuda.Device, s cuda.Stream) (float64, error) {
	// The column table: shared memory as a shard maps it, registered mapped.
	table, err := unix.Mmap(-1, 0, c.capacity*c.blockBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0, fmt.Errorf("mapping the column table: %w", err)
	}
	defer unix.Munmap(table)
	r := rand.New(rand.NewPCG(c.seed, 1))
	for i := 0; i < len(table); i += 8 {
		*(*uint64)(unsafe.Pointer(&table[i])) = r.Uint64()
	}
	tdev, err := dev.RegisterHost(table)
	if err != nil {
		return 0, err
	}
	defer dev.UnregisterHost(table)
	idx := make([]int64, c.blocks)
	for i, p := range r.Perm(c.capacity)[:c.blocks] {
		idx[i] = int64(p)
	}
	spec := cuda.GatherSpec{BlockBytes: c.blockBytes, Capacity: c.capacity}
	total := c.blocks * c.blockBytes
	dst, err := dev.Alloc(total)
	if err != nil {
		return 0, err
	}
	defer dev.Free(dst)
	g, err := dev.NewGatherer()
	if err != nil {
		return 0, err
	}
	defer g.Close()
	gatherSecs, err := timeEvents(ctx, dev, s, c.reps, func() error {
		return g.Gather(ctx, s, dst, tdev, idx, nil, spec)
	})
	if err != nil {
		return 0, err
	}
	got := make([]byte, total)
	if err := dev.CopyDtoH(got, dst); err != nil {
		return 0, err
	}
	want := make([]byte, total)
	if err := cuda.GatherCPU(want, table, idx, nil, spec); err != nil {
		return 0, err
	}
	if !slices.Equal(got, want) {
		return 0, fmt.Errorf("gather: the GPU's rows differ from the CPU twin's")
	}
	// The limit: one contiguous copy of the same bytes from pinned memory.
	pinned, err := dev.AllocHost(total)
	if err != nil {
		return 0, err
	}
	defer dev.FreeHost(pinned)
	copy(pinned, want)
	copySecs, err := timeEvents(ctx, dev, s, c.reps, func() error {
		return dev.CopyHtoDAsync(dst, pinned, s)
	})
	if err != nil {
		return 0, err
	}
	cbps := float64(total) / copySecs
	if err := e.emit(kv{"bench", "gpu"}, kv{"op", "pinned_copy"}, kv{"bytes", total}, kv{"seconds", copySecs}, kv{"bytes_per_s", cbps}); err != nil {
		return 0, err
	}
	emitGather := func(op string, secs float64) error {
		bps := float64(total) / secs
		return e.emit(kv{"bench", "gpu"}, kv{"op", op}, kv{"blocks", c.blocks}, kv{"block_bytes", c.blockBytes},
			kv{"bytes", total}, kv{"seconds", secs}, kv{"bytes_per_s", bps}, kv{"of_pinned_copy", bps / cbps})
	}
	if err := emitGather("gather", gatherSecs); err != nil {
		return 0, err
	}
	// way times another way of the same gather into a cleared dst, checks its
	// rows against the twin's and prints its line.
	way := func(op string, gather func() error) error {
		if err := dev.MemsetAsync(dst, 0, total, s); err != nil {
			return err
		}
		secs, err := timeEvents(ctx, dev, s, c.reps, gather)
		if err != nil {
			return err
		}
		if err := dev.CopyDtoH(got, dst); err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s: the GPU's rows differ from the CPU twin's", op)
		}
		return emitGather(op, secs)
	}
	// The kernel alone (Gather shares rows of 64 KiB and more with the copy
	// engines where the driver has batched copies).
	if err := way("gather_kernel", func() error { return dev.LaunchGatherHost(s, dst, tdev, idx, spec) }); err != nil {
		return 0, err
	}
	if !dev.CanCopyBatch() {
		return copySecs, nil
	}
	// The same gather through the copy engines: one batched copy.
	return copySecs, way("gather_copies", func() error { return g.GatherCopies(s, dst, tdev, idx, nil, spec) })
}

// benchCollectDevice times the product path of the same collection: a store
// shard of --capacity rows of one --block-bytes column, a sample.ShardTable over
// it registered with the device, and ShardTable.CollectDevice of --blocks random
// rows into device memory (pinning the rows, the gather kernel with the indices
// in its parameters, waiting for it), then the same with sample.GatherByCopies (the copy
// engines instead of the kernel) where the driver has batched copies. seconds
// is event-timed, as the gather's is; wall_seconds includes the host's part.
func benchCollectDevice(ctx context.Context, e emitter, c gpuConfig, dev *cuda.Device, s cuda.Stream, copySecs float64) error {
	spec := store.Spec{Capacity: c.capacity, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "traj", DType: store.Uint8, Shape: []int{c.blockBytes}, Length: 1},
	}}
	sh, err := store.Create(rank.SegmentName(rank.LocalJobID(), fmt.Sprintf("bench-gpu-collect.%d", os.Getpid())), spec)
	if err != nil {
		return err
	}
	defer sh.Close()
	st, err := sample.NewShardTable(sh, sample.Config{Name: "bench-gpu", Sampler: sample.NewUniform(), Remover: sample.NewFIFO()})
	if err != nil {
		return err
	}
	defer st.Close()
	r := rand.New(rand.NewPCG(c.seed, 3))
	var rows []int
	for k := range c.capacity - 1 {
		ref, err := st.Insert(ctx, uint64(k), 1, func(p store.Pending) error {
			b := p.Block(0)
			for i := 0; i+8 <= len(b); i += 8 {
				*(*uint64)(unsafe.Pointer(&b[i])) = r.Uint64()
			}
			return nil
		})
		if err != nil {
			return err
		}
		rows = append(rows, ref.Index)
	}
	r.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	idx := rows[:min(c.blocks, len(rows))]
	total := len(idx) * c.blockBytes
	dst, err := dev.Alloc(total)
	if err != nil {
		return err
	}
	defer dev.Free(dst)
	cols := []string{"traj"}
	want, err := st.Collect(ctx, idx, cols, sample.Window{})
	if err != nil {
		return err
	}
	// The gather kernel (the default), then the copy engines (GatherByCopies)
	// where the driver has batched copies.
	ways := []struct {
		op   string
		opts []sample.DeviceOption
	}{{"collect_device", nil}, {"collect_device_copies", []sample.DeviceOption{sample.GatherByCopies()}}}
	if !dev.CanCopyBatch() {
		ways = ways[:1]
	}
	for _, way := range ways {
		if err := st.RegisterDevice(ctx, dev, way.opts...); err != nil {
			return err
		}
		if err := dev.MemsetAsync(dst, 0, total, s); err != nil {
			return err
		}
		collect := func() error {
			return st.CollectDevice(ctx, s, []cuda.DevicePtr{dst}, idx, cols, sample.Window{})
		}
		secs, err := timeEvents(ctx, dev, s, c.reps, collect)
		if err != nil {
			return err
		}
		wall, err := timeWall(c.reps, collect)
		if err != nil {
			return err
		}
		got := make([]byte, total)
		if err := dev.CopyDtoH(got, dst); err != nil {
			return err
		}
		if !slices.Equal(got, want[0]) {
			return fmt.Errorf("%s: the GPU's rows differ from sample.Collect's", way.op)
		}
		bps, cbps := float64(total)/secs, float64(total)/copySecs
		if err := e.emit(kv{"bench", "gpu"}, kv{"op", way.op}, kv{"blocks", len(idx)}, kv{"block_bytes", c.blockBytes},
			kv{"bytes", total}, kv{"seconds", secs}, kv{"bytes_per_s", bps}, kv{"of_pinned_copy", bps / cbps},
			kv{"wall_seconds", wall}, kv{"wall_of_pinned_copy", float64(total) / wall / cbps}); err != nil {
			return err
		}
	}
	return nil
}

// sampleWeights returns n seeded float32 weights, one in ten of them zero.
func sampleWeights(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 2))
	w := make([]float32, n)
	for i := range w {
		if r.IntN(10) != 0 {
			w[i] = float32(math.Exp(r.NormFloat64()))
		}
	}
	return w
}

// timeWall runs f reps times (after warmUpGPU) and returns the median seconds.
func timeWall(reps int, f func() error) (float64, error) {
	if err := warmUpGPU(f, nil); err != nil {
		return 0, err
	}
	var secs []float64
	for range reps {
		t0 := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		secs = append(secs, time.Since(t0).Seconds())
	}
	return median(secs), nil
}

// warmUpGPU runs f (then sync, when not nil) for warmUpTime, at most warmUpReps
// times, at least once: an idle GPU runs its first work at a fraction of its
// clock (an H100 idles at 345 MHz of 1980), and a gather timed then measured
// 0.77 of the pinned copy against 0.89 a second later.
func warmUpGPU(f, sync func() error) error {
	const (
		warmUpTime = 200 * time.Millisecond
		warmUpReps = 1000
	)
	start := time.Now()
	for i := 0; i < warmUpReps && (i == 0 || time.Since(start) < warmUpTime); i++ {
		if err := f(); err != nil {
			return err
		}
		if sync != nil {
			if err := sync(); err != nil {
				return err
			}
		}
	}
	return nil
}

// cpuReps is the repetitions of a CPU measurement over n weights.
func cpuReps(c gpuConfig, n int) int {
	return max(1, min(c.reps, int(3e8/float64(n))))
}

func benchSampling(ctx context.Context, e emitter, c gpuConfig, dev *cuda.Device, s cuda.Stream) error {
	sampler, err := dev.NewSampler()
	if err != nil {
		return err
	}
	defer sampler.Close()
	for _, n := range c.sizes {
		w := sampleWeights(n, c.seed+uint64(n))
		wdev, err := dev.Alloc(4 * n)
		if err != nil {
			return err
		}
		err = func() error {
			defer dev.Free(wdev)
			if err := dev.CopyHtoD(wdev, unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*n)); err != nil {
				return err
			}
			draws := cuda.UniformDraws(c.seed, c.draws)
			gpuOut, cpuOut := make([]int64, c.draws), make([]int64, c.draws)
			gpuSecs, err := timeWall(c.reps, func() error {
				return sampler.WeightedSample(ctx, s, wdev, n, cuda.Float32, draws, gpuOut)
			})
			if err != nil {
				return err
			}
			cpuSecs, err := timeWall(cpuReps(c, n), func() error { return cuda.WeightedSampleCPU(w, draws, cpuOut) })
			if err != nil {
				return err
			}
			if !slices.Equal(gpuOut, cpuOut) {
				return fmt.Errorf("weighted sample n=%d: GPU and CPU twin chose different indices", n)
			}
			if err := e.emit(kv{"bench", "gpu"}, kv{"op", "weighted_sample"}, kv{"n", n}, kv{"draws", c.draws},
				kv{"gpu_seconds", gpuSecs}, kv{"cpu_seconds", cpuSecs}, kv{"speedup", cpuSecs / gpuSecs}); err != nil {
				return err
			}
			if c.topK == 0 || c.topK > n {
				return nil
			}
			gk, ck := make([]int64, c.topK), make([]int64, c.topK)
			gpuSecs, err = timeWall(c.reps, func() error { return sampler.TopK(ctx, s, wdev, n, cuda.Float32, gk) })
			if err != nil {
				return err
			}
			cpuSecs, err = timeWall(cpuReps(c, n), func() error { return cuda.TopKCPU(w, c.topK, ck) })
			if err != nil {
				return err
			}
			if !slices.Equal(gk, ck) {
				return fmt.Errorf("top-k n=%d: GPU and CPU twin chose different indices", n)
			}
			return e.emit(kv{"bench", "gpu"}, kv{"op", "topk"}, kv{"n", n}, kv{"k", c.topK},
				kv{"gpu_seconds", gpuSecs}, kv{"cpu_seconds", cpuSecs}, kv{"speedup", cpuSecs / gpuSecs})
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

// benchSamplingCPU measures the CPU twins alone.
func benchSamplingCPU(e emitter, c gpuConfig) error {
	for _, n := range c.sizes {
		w := sampleWeights(n, c.seed+uint64(n))
		draws := cuda.UniformDraws(c.seed, c.draws)
		out := make([]int64, c.draws)
		secs, err := timeWall(cpuReps(c, n), func() error { return cuda.WeightedSampleCPU(w, draws, out) })
		if err != nil {
			return err
		}
		if err := e.emit(kv{"bench", "gpu"}, kv{"op", "weighted_sample_cpu"}, kv{"n", n}, kv{"draws", c.draws}, kv{"cpu_seconds", secs}); err != nil {
			return err
		}
		if c.topK == 0 || c.topK > n {
			continue
		}
		k := make([]int64, c.topK)
		secs, err = timeWall(cpuReps(c, n), func() error { return cuda.TopKCPU(w, c.topK, k) })
		if err != nil {
			return err
		}
		if err := e.emit(kv{"bench", "gpu"}, kv{"op", "topk_cpu"}, kv{"n", n}, kv{"k", c.topK}, kv{"cpu_seconds", secs}); err != nil {
			return err
		}
	}
	return nil
}
