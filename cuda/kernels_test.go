package cuda_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

// mapTable maps anonymous shared memory the way a shard maps its column tables,
// fills it with seeded bytes, and registers it with dev.
func mapTable(t *testing.T, dev *cuda.Device, bytes int, seed uint64) ([]byte, cuda.DevicePtr) {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, bytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range mem {
		mem[i] = byte(r.Uint32())
	}
	dp, err := dev.RegisterHost(mem)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.UnregisterHost(mem); err != nil {
			t.Errorf("UnregisterHost: %v", err)
		}
		if err := unix.Munmap(mem); err != nil {
			t.Error(err)
		}
	})
	return mem, dp
}

func TestGatherMatchesCPU(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		ctx := context.Background()
		cases := []struct {
			name    string
			spec    cuda.GatherSpec
			rows    int
			offsets bool
		}{
			{"whole blocks", cuda.GatherSpec{BlockBytes: 4096, Capacity: 64}, 40, false},
			{"window with padding", cuda.GatherSpec{BlockBytes: 64 * 48, Capacity: 50, FrameBytes: 48, Offset: 5, Length: 20, HeadPad: 3, TailPad: 7}, 33, false},
			{"per-row offsets", cuda.GatherSpec{BlockBytes: 16 * 32, Capacity: 30, FrameBytes: 32, Length: 6, HeadPad: 1, TailPad: 2}, 25, true},
			{"4-byte elements", cuda.GatherSpec{BlockBytes: 36 * 10, Capacity: 20, FrameBytes: 36, Offset: 1, Length: 8, TailPad: 1}, 17, false},
			{"1-byte elements", cuda.GatherSpec{BlockBytes: 33 * 7, Capacity: 20, FrameBytes: 33, Offset: 2, Length: 3, HeadPad: 2}, 19, false},
			{"long rows", cuda.GatherSpec{BlockBytes: 64 << 10, Capacity: 6}, 5, false},
			{"tiny rows", cuda.GatherSpec{BlockBytes: 16, Capacity: 300}, 1000, false},
		}
		if gpu {
			cases = append(cases, struct {
				name    string
				spec    cuda.GatherSpec
				rows    int
				offsets bool
			}{"256 x 64KiB", cuda.GatherSpec{BlockBytes: 64 << 10, Capacity: 1024}, 256, false})
		}
		g, err := dev.NewGatherer()
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := g.Close(); err != nil {
				t.Error(err)
			}
		}()
		s, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer dev.DestroyStream(s)
		for ci, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				table, tdev := mapTable(t, dev, c.spec.Capacity*c.spec.BlockBytes, uint64(ci))
				r := rand.New(rand.NewPCG(uint64(ci), 2))
				idx := make([]int64, c.rows)
				for i := range idx {
					idx[i] = r.Int64N(int64(c.spec.Capacity))
				}
				var offs []int
				if c.offsets {
					frames := c.spec.BlockBytes / c.spec.FrameBytes
					offs = make([]int, c.rows)
					for i := range offs {
						offs[i] = r.IntN(frames - c.spec.Length + 1)
					}
				}
				rowBytes, err := c.spec.RowBytes()
				if err != nil {
					t.Fatal(err)
				}
				want := make([]byte, c.rows*rowBytes)
				for i := range want {
					want[i] = 0xee // GatherCPU must overwrite everything
				}
				if err := cuda.GatherCPU(want, table, idx, offs, c.spec); err != nil {
					t.Fatal(err)
				}
				// The kernel, then the copy engines (GatherCopies), each
				// into a destination of garbage.
				paths := map[string]func(dst cuda.DevicePtr) error{
					"kernel": func(dst cuda.DevicePtr) error { return g.Gather(ctx, s, dst, tdev, idx, offs, c.spec) },
					"copies": func(dst cuda.DevicePtr) error { return g.GatherCopies(s, dst, tdev, idx, offs, c.spec) },
				}
				if !dev.CanCopyBatch() {
					t.Logf("the driver (CUDA %d) has no cuMemcpyBatchAsync: the kernel only", dev.Driver().Version())
					delete(paths, "copies")
				}
				for _, path := range []string{"kernel", "copies"} {
					gather, ok := paths[path]
					if !ok {
						continue
					}
					dst := cudatest.ToDevice(t, dev, bytes.Repeat([]byte{0xee}, len(want)))
					if err := gather(dst); err != nil {
						t.Fatalf("%s: %v", path, err)
					}
					if err := dev.StreamSynchronize(ctx, s); err != nil {
						t.Fatal(err)
					}
					got := make([]byte, len(want))
					if err := dev.CopyDtoH(got, dst); err != nil {
						t.Fatal(err)
					}
					if i := firstDiff(got, want); i >= 0 {
						t.Fatalf("%s: row %d byte %d: got %#x, want %#x", path, i/rowBytes, i%rowBytes, got[i], want[i])
					}
				}
			})
		}
		// Calls back to back on two streams, with no wait between them: each
		// kernel reads its indices from a stage while the next call stages
		// its own, and must still read its own. Every other call has per-row
		// offsets (its indices staged and copied); the others carry theirs in
		// the launch's parameters.
		t.Run("back to back", func(t *testing.T) {
			spec := cuda.GatherSpec{BlockBytes: 4096, Capacity: 64, FrameBytes: 512, Length: 4}
			table, tdev := mapTable(t, dev, spec.Capacity*spec.BlockBytes, 99)
			s2, err := dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer dev.DestroyStream(s2)
			const calls, rows = 8, 48
			var wants [][]byte
			var dsts []cuda.DevicePtr
			for k := range calls {
				idx := make([]int64, rows)
				for i := range idx {
					idx[i] = int64((i*7 + k*13) % spec.Capacity)
				}
				var offs []int
				if k%4 < 2 {
					offs = make([]int, rows)
					for i := range offs {
						offs[i] = (i + k) % 5
					}
				}
				want := make([]byte, rows*4*512)
				if err := cuda.GatherCPU(want, table, idx, offs, spec); err != nil {
					t.Fatal(err)
				}
				dst := cudatest.ToDevice(t, dev, make([]byte, len(want)))
				st := []cuda.Stream{s, s2}[k%2]
				if err := g.Gather(ctx, st, dst, tdev, idx, offs, spec); err != nil {
					t.Fatal(err)
				}
				wants, dsts = append(wants, want), append(dsts, dst)
			}
			for _, st := range []cuda.Stream{s, s2} {
				if err := dev.StreamSynchronize(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			for k, want := range wants {
				got := make([]byte, len(want))
				if err := dev.CopyDtoH(got, dsts[k]); err != nil {
					t.Fatal(err)
				}
				if i := firstDiff(got, want); i >= 0 {
					t.Fatalf("call %d: row %d byte %d: got %#x, want %#x", k, i/(4*512), i%(4*512), got[i], want[i])
				}
			}
		})
	})
}

// TestGatherIndicesInParams checks that a gather without per-row offsets
// carries its indices in the launch's parameters, 960 rows a launch (in a 1 KiB
// form for up to 256 rows), and copies none to the device: on an H100 that copy
// and the kernel's wait for it cost 3% of a 16 MiB gather.
func TestGatherIndicesInParams(t *testing.T) {
	f := openFake(t, 0)
	ctx := context.Background()
	spec := cuda.GatherSpec{BlockBytes: 64, Capacity: 4096}
	table, tdev := mapTable(t, f.dev, spec.Capacity*spec.BlockBytes, 7)
	g, err := f.dev.NewGatherer()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	s := f.stream(t)
	le := binary.LittleEndian
	for _, c := range []struct{ rows, launches int }{{256, 1}, {257, 1}, {cuda.GatherParamRows, 1}, {2000, 3}} {
		idx := make([]int64, c.rows)
		for i := range idx {
			idx[i] = int64((i*2654435761 + 17) % spec.Capacity)
		}
		want := make([]byte, c.rows*spec.BlockBytes)
		if err := cuda.GatherCPU(want, table, idx, nil, spec); err != nil {
			t.Fatal(err)
		}
		dst := cudatest.ToDevice(t, f.dev, make([]byte, len(want)))
		hostAllocs := f.cu.Live(cudatest.LiveHostAllocs)
		before := f.cu.Launches()
		if err := g.Gather(ctx, s, dst, tdev, idx, nil, spec); err != nil {
			t.Fatal(err)
		}
		if got := f.cu.Launches() - before; got != c.launches {
			t.Errorf("%d rows: %d launches, want %d", c.rows, got, c.launches)
		}
		if got := f.cu.Live(cudatest.LiveHostAllocs); got != hostAllocs {
			t.Errorf("%d rows: %d pinned host allocations, want %d (no staging)", c.rows, got, hostAllocs)
		}
		l := f.cu.LastLaunch()
		last := idx[(c.launches-1)*cuda.GatherParamRows:]
		// The 1 KiB form of the parameters where the rows fit it.
		name, size := "gear_gather_rows_v16", 4*cuda.GatherParamRows
		if len(last) <= 256 {
			name, size = "gear_gather_rows256_v16", 4*256
		}
		if l.Name != name || len(l.Params) != 9 || le.Uint64(l.Params[2]) != uint64(len(last)) {
			t.Fatalf("%d rows: last launch %s with %d parameters, want %s with 9", c.rows, l.Name, len(l.Params), name)
		}
		if p := l.Params[8]; len(p) != size {
			t.Fatalf("%d rows: row parameter of %d bytes, want %d", c.rows, len(p), size)
		}
		for i, ix := range last {
			if got := le.Uint32(l.Params[8][4*i:]); int64(got) != ix {
				t.Fatalf("%d rows: parameter row %d holds %d, want %d", c.rows, i, got, ix)
			}
		}
		if i := firstDiff(streamBytes(t, f.dev, s, dst, len(want)), want); i >= 0 {
			t.Fatalf("%d rows: row %d differs from GatherCPU's", c.rows, i/spec.BlockBytes)
		}
	}
	// LaunchGatherHost checks what the kernel would trust.
	dst := cudatest.ToDevice(t, f.dev, make([]byte, 4*spec.BlockBytes))
	if err := f.dev.LaunchGatherHost(s, dst, tdev, []int64{1, 4096}, spec); err == nil || !strings.Contains(err.Error(), "4096") {
		t.Errorf("index 4096 of 4096 blocks: %v", err)
	}
	huge := cuda.GatherSpec{BlockBytes: 1, Capacity: 1<<32 + 1}
	if err := f.dev.LaunchGatherHost(s, dst, tdev, []int64{1}, huge); err == nil || !strings.Contains(err.Error(), "2^32") {
		t.Errorf("capacity over 2^32: %v", err)
	}
}

// TestGatherSplitsLargeRows checks that Gather shares a gather of rows of 64
// KiB or more between the kernel (the first half) and one batch of copies on a
// stream of the Gatherer's own (the second half), and keeps to the kernel
// where a split would not pay: small rows, padded rows, one row, a driver
// without batches.
func TestGatherSplitsLargeRows(t *testing.T) {
	f := openFake(t, 0)
	ctx := context.Background()
	le := binary.LittleEndian
	g, err := f.dev.NewGatherer()
	if err != nil {
		t.Fatal(err)
	}
	s := f.stream(t)
	streams := f.cu.Live(cudatest.LiveStreams)
	// gather runs one Gather into fresh memory, checks the rows against
	// GatherCPU's and returns the rows the last launch's kernel gathered.
	gather := func(name string, spec cuda.GatherSpec, rows int) int {
		t.Helper()
		table, tdev := mapTable(t, f.dev, spec.Capacity*spec.BlockBytes, uint64(rows))
		idx := make([]int64, rows)
		for i := range idx {
			idx[i] = int64((i*5 + 3) % spec.Capacity)
		}
		rowBytes, err := spec.RowBytes()
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, rows*rowBytes)
		if err := cuda.GatherCPU(want, table, idx, nil, spec); err != nil {
			t.Fatal(err)
		}
		dst := cudatest.ToDevice(t, f.dev, bytes.Repeat([]byte{0xee}, len(want)))
		if err := g.Gather(ctx, s, dst, tdev, idx, nil, spec); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := streamBytes(t, f.dev, s, dst, len(want))
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("%s: row %d byte %d: got %#x, want %#x", name, i/rowBytes, i%rowBytes, got[i], want[i])
		}
		return int(le.Uint64(f.cu.LastLaunch().Params[2]))
	}
	large := cuda.GatherSpec{BlockBytes: 64 << 10, Capacity: 12}
	if k := gather("8 rows of 64 KiB", large, 8); k != 4 {
		t.Errorf("8 rows of 64 KiB: the kernel gathered %d rows, want 4", k)
	}
	if got := f.cu.Live(cudatest.LiveStreams); got != streams+1 {
		t.Errorf("%d streams after a split, want %d (the side stream)", got, streams+1)
	}
	if k := gather("7 rows of 64 KiB", large, 7); k != 4 {
		t.Errorf("7 rows of 64 KiB: the kernel gathered %d rows, want 4", k)
	}
	if got := f.cu.Live(cudatest.LiveStreams); got != streams+1 {
		t.Errorf("%d streams after a second split, want %d (the same side stream)", got, streams+1)
	}
	for _, c := range []struct {
		name string
		spec cuda.GatherSpec
		rows int
	}{
		{"rows of 32 KiB", cuda.GatherSpec{BlockBytes: 32 << 10, Capacity: 12}, 8},
		{"padded rows", cuda.GatherSpec{BlockBytes: 64 << 10, Capacity: 12, FrameBytes: 1 << 10, HeadPad: 1}, 8},
		{"one row", large, 1},
	} {
		if k := gather(c.name, c.spec, c.rows); k != c.rows {
			t.Errorf("%s: the kernel gathered %d rows, want all %d", c.name, k, c.rows)
		}
	}
	restore := cuda.HideCopyBatch(f.dev)
	if k := gather("a driver without batches", large, 8); k != 8 {
		t.Errorf("a driver without batches: the kernel gathered %d rows, want all 8", k)
	}
	restore()
	// A failed batch fails the call, naming the driver's error.
	_, tdev := mapTable(t, f.dev, large.Capacity*large.BlockBytes, 1)
	dst := cudatest.ToDevice(t, f.dev, make([]byte, 4*large.BlockBytes))
	f.cu.Fail("cuMemcpyBatchAsync", 2, 1) // CUDA_ERROR_OUT_OF_MEMORY
	if err := g.Gather(ctx, s, dst, tdev, []int64{0, 1, 2, 3}, nil, large); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("a failed batch: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if got := f.cu.Live(cudatest.LiveStreams); got != streams {
		t.Errorf("%d streams after Close, want %d", got, streams)
	}
}

// streamBytes waits for stream s and returns the n bytes at dst.
func streamBytes(t *testing.T, dev *cuda.Device, s cuda.Stream, dst cuda.DevicePtr, n int) []byte {
	t.Helper()
	if err := dev.StreamSynchronize(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := dev.CopyDtoH(got, dst); err != nil {
		t.Fatal(err)
	}
	return got
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// weights returns n seeded weights with runs of zeros, whole zero tiles, and
// magnitudes over many orders, as priorities look.
func weights[W float32 | float64](n int, seed uint64) []W {
	r := rand.New(rand.NewPCG(seed, 3))
	w := make([]W, n)
	for i := range w {
		switch {
		case (i/8192)%5 == 3: // every fifth tile is empty
		case r.IntN(7) == 0: // zero runs inside tiles
		default:
			w[i] = W(math.Exp(r.NormFloat64() * 3))
		}
	}
	return w
}

func testWeightedSample[W float32 | float64](t *testing.T, dev *cuda.Device, s *cuda.Sampler, dt cuda.DType, n, b int, seed uint64) {
	t.Helper()
	ctx := context.Background()
	w := weights[W](n, seed)
	if n > 0 && n < 8192*3 {
		w[n-1] = 1 // never all zero
	}
	draws := cuda.UniformDraws(seed, b)
	draws = append(draws, 0, math.Nextafter(1, 0), 0.5)
	want := make([]int64, len(draws))
	if err := cuda.WeightedSampleCPU(w, draws, want); err != nil {
		t.Fatal(err)
	}
	got := make([]int64, len(draws))
	if err := s.WeightedSample(ctx, 0, cudatest.ToDevice(t, dev, w), n, dt, draws, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("n=%d draw %d (%v): GPU picked %d, CPU twin %d", n, i, draws[i], got[i], want[i])
		}
		if w[got[i]] <= 0 {
			t.Fatalf("n=%d draw %d picked index %d of weight %v", n, i, got[i], w[got[i]])
		}
	}
}

func TestWeightedSampleMatchesCPU(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		s, err := dev.NewSampler()
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}()
		sizes := []int{1, 5, 8191, 8192, 8193, 70001}
		draws := 300
		if gpu {
			sizes = append(sizes, 1_000_000, 10_000_000+7)
			draws = 4096
		}
		for _, n := range sizes {
			t.Run(fmt.Sprintf("float32/n=%d", n), func(t *testing.T) {
				testWeightedSample[float32](t, dev, s, cuda.Float32, n, draws, uint64(n))
			})
			t.Run(fmt.Sprintf("float64/n=%d", n), func(t *testing.T) {
				testWeightedSample[float64](t, dev, s, cuda.Float64, n, draws, uint64(n)+1)
			})
		}
	})
}

func TestWeightedSampleErrors(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		ctx := context.Background()
		s, err := dev.NewSampler()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for _, c := range []struct {
			name  string
			w     []float32
			draws []float64
			want  error
		}{
			{"negative weight", []float32{1, -1, 2}, []float64{0.5}, cuda.ErrBadWeight},
			{"NaN weight", []float32{1, float32(math.NaN())}, []float64{0.5}, cuda.ErrBadWeight},
			{"infinite weight", []float32{float32(math.Inf(1)), 1}, []float64{0.5}, cuda.ErrBadWeight},
			{"all zero", make([]float32, 9000), []float64{0.5}, cuda.ErrZeroTotal},
			{"draw of one", []float32{1, 2}, []float64{0.2, 1}, cuda.ErrBadDraw},
			{"negative draw", []float32{1, 2}, []float64{-0.1}, cuda.ErrBadDraw},
		} {
			t.Run(c.name, func(t *testing.T) {
				out := make([]int64, len(c.draws))
				if err := cuda.WeightedSampleCPU(c.w, c.draws, out); !errors.Is(err, c.want) {
					t.Errorf("CPU: got %v, want %v", err, c.want)
				}
				err := s.WeightedSample(ctx, 0, cudatest.ToDevice(t, dev, c.w), len(c.w), cuda.Float32, c.draws, out)
				if !errors.Is(err, c.want) {
					t.Errorf("GPU: got %v, want %v", err, c.want)
				}
			})
		}
		// The sampler still works after errors.
		testWeightedSample[float32](t, dev, s, cuda.Float32, 1000, 50, 9)
	})
}

func priorities[W float32 | float64](n int, seed uint64) []W {
	r := rand.New(rand.NewPCG(seed, 4))
	p := make([]W, n)
	for i := range p {
		switch r.IntN(10) {
		case 0:
			p[i] = 1 // many ties
		case 1:
			p[i] = 0
		case 2:
			p[i] = W(math.Copysign(0, -1))
		case 3:
			p[i] = -W(r.Float64())
		default:
			p[i] = W(r.Float64() * 100)
		}
	}
	return p
}

func testTopK[W float32 | float64](t *testing.T, dev *cuda.Device, s *cuda.Sampler, dt cuda.DType, p []W, k int) {
	t.Helper()
	want := make([]int64, k)
	if err := cuda.TopKCPU(p, k, want); err != nil {
		t.Fatal(err)
	}
	got := make([]int64, k)
	if err := s.TopK(context.Background(), 0, cudatest.ToDevice(t, dev, p), len(p), dt, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("n=%d k=%d: position %d: GPU %d (%v), CPU twin %d (%v)", len(p), k, i, got[i], p[got[i]], want[i], p[want[i]])
		}
	}
}

func TestTopKMatchesCPU(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		s, err := dev.NewSampler()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		cases := []struct{ n, k int }{{1, 1}, {10, 3}, {10, 10}, {5000, 1}, {5000, 64}, {20000, 700}}
		if gpu {
			cases = append(cases, struct{ n, k int }{10_000_000, 1024})
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("float32/n=%d/k=%d", c.n, c.k), func(t *testing.T) {
				testTopK(t, dev, s, cuda.Float32, priorities[float32](c.n, uint64(c.n)), c.k)
			})
			t.Run(fmt.Sprintf("float64/n=%d/k=%d", c.n, c.k), func(t *testing.T) {
				testTopK(t, dev, s, cuda.Float64, priorities[float64](c.n, uint64(c.k)), c.k)
			})
		}
		t.Run("all equal", func(t *testing.T) {
			p := make([]float32, 3000)
			for i := range p {
				p[i] = 2.5
			}
			testTopK(t, dev, s, cuda.Float32, p, 100)
		})
		t.Run("k out of range", func(t *testing.T) {
			err := s.TopK(context.Background(), 0, cudatest.ToDevice(t, dev, []float32{1, 2}), 2, cuda.Float32, make([]int64, 3))
			if err == nil {
				t.Fatal("TopK with k > n succeeded")
			}
		})
	})
}

func TestSamplerAbandonedCall(t *testing.T) {
	f := openFake(t, 0)
	dev := f.dev
	s, err := dev.NewSampler()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer dev.DestroyStream(st)
	w := cudatest.ToDevice(t, dev, []float32{1, 2, 3})
	out := make([]int64, 1)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.WeightedSample(ctx, st, w, 3, cuda.Float32, []float64{0.5}, out); !errors.Is(err, context.Canceled) {
		t.Fatalf("WeightedSample with a cancelled context: got %v", err)
	}

	// The stream stays busy: the call gives up when its context ends.
	f.cu.Hold(uintptr(st), 1)
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.WeightedSample(ctx, st, w, 3, cuda.Float32, []float64{0.5}, out); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WeightedSample on a busy stream: got %v", err)
	}
	// The next call waits for the abandoned work, then succeeds.
	done := make(chan error, 1)
	go func() { done <- s.WeightedSample(context.Background(), st, w, 3, cuda.Float32, []float64{0.99}, out) }()
	select {
	case err := <-done:
		t.Fatalf("WeightedSample returned (%v) while the abandoned work was in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	f.cu.Hold(uintptr(st), -1)
	if err := <-done; err != nil || out[0] != 2 {
		t.Fatalf("WeightedSample after an abandoned call: %v, %v", out, err)
	}
}
