package sample

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// fakeGPU is the fake CUDA driver and NCCL of package cudatest, which run gear's
// kernels on the CPU.
type fakeGPU struct {
	libs cudatest.Libs
	drv  *cuda.Driver
	cu   *cudatest.FakeCUDA
}

func openFakeGPU(t *testing.T) *fakeGPU {
	t.Helper()
	libs := cudatest.Build(t, cudatest.Options{})
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		t.Fatalf("OpenDriver(fake): %v", err)
	}
	return &fakeGPU{libs: libs, drv: drv, cu: cudatest.OpenFakeCUDA(t, libs.CUDA)}
}

// device retains a device of the fake, closed when the test ends (after the
// cleanups registered later, which close what uses it).
func (f *fakeGPU) device(t *testing.T, ordinal int) *cuda.Device {
	t.Helper()
	dev, err := f.drv.Device(ordinal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("closing device: %v", err)
		}
	})
	return dev
}

// realGPU opens device 0 of the real driver, or skips the test with the
// driver's "cuda: no CUDA driver: ..." when there is none.
func realGPU(t *testing.T) *cuda.Device {
	t.Helper()
	dev, err := OpenDevice(0)
	if errors.Is(err, cuda.ErrNoDriver) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("closing device: %v", err)
		}
	})
	return dev
}

// onGPUs runs fn on a device of the fake driver and on the real GPU (skipped
// without a driver); gpu tells fn which, for sizes the fake would take long to
// emulate.
func onGPUs(t *testing.T, fn func(t *testing.T, dev *cuda.Device, gpu bool)) {
	t.Run("fake", func(t *testing.T) { fn(t, openFakeGPU(t).device(t, 0), false) })
	t.Run("gpu", func(t *testing.T) { fn(t, realGPU(t), true) })
}

// devBuffers allocates one device buffer per size, filled with 0xAA so that
// bytes a collection forgets to write show; freed when the test ends.
func devBuffers(t *testing.T, dev *cuda.Device, sizes []int) []cuda.DevicePtr {
	t.Helper()
	out := make([]cuda.DevicePtr, len(sizes))
	for i, n := range sizes {
		p, err := dev.Alloc(max(n, 1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := dev.Free(p); err != nil {
				t.Errorf("Free: %v", err)
			}
		})
		if err := dev.CopyHtoD(p, slices.Repeat([]byte{0xAA}, max(n, 1))); err != nil {
			t.Fatal(err)
		}
		out[i] = p
	}
	// A copy from pageable memory may still be in flight when CopyHtoD returns;
	// the collections run on streams that do not wait for it.
	if err := dev.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	return out
}

func readDevice(dev *cuda.Device, p cuda.DevicePtr, n int) ([]byte, error) {
	b := make([]byte, n)
	if err := dev.CopyDtoH(b, p); err != nil {
		return nil, err
	}
	return b, nil
}

// newStream creates a stream on dev, destroyed when the test ends.
func newStream(t *testing.T, dev *cuda.Device) cuda.Stream {
	t.Helper()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.DestroyStream(s); err != nil {
			t.Errorf("DestroyStream: %v", err)
		}
	})
	return s
}

// gpuSpec has columns of several shapes: 16-byte aligned frames, 8-byte frames
// whose blocks are padded to the block alignment, and 3-byte frames, so that the
// gather kernel runs with each of its element widths.
func gpuSpec(capacity int) store.Spec {
	return store.Spec{Capacity: capacity, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{8, 8}, Length: 4},
		{Name: "act", DType: store.Int32, Shape: []int{2}, Length: 4},
		{Name: "rgb", DType: store.Uint8, Shape: []int{3}, Length: 5},
		{Name: "meta", DType: store.Int64, Shape: []int{4}, Length: 1},
	}}
}

var gpuColumns = []string{"obs", "act", "rgb", "meta"}

// windows are the windows every device collection test goes through.
var windows = []Window{
	{},
	{Offset: 1, Length: 2},
	{Offset: 2, Length: 4},
	{Offset: 2, Length: 4, Pad: PadHead},
	{Offset: 0, Length: 7, Pad: PadHead},
	{Offset: 7, Length: 2},
	{Offset: 3, Length: 1, Pad: PadHead},
}

// collectBoth collects idx on the host and on the device and compares them byte
// for byte.
func collectBoth(ctx context.Context, st *ShardTable, dev *cuda.Device, s cuda.Stream, idx []int, columns []string, w Window, dst []cuda.DevicePtr) error {
	want, err := st.Collect(ctx, idx, columns, w)
	if err != nil {
		return err
	}
	if err := st.CollectDevice(ctx, s, dst, idx, columns, w); err != nil {
		return err
	}
	return compareDevice(dev, dst, want, columns, w)
}

func compareDevice(dev *cuda.Device, dst []cuda.DevicePtr, want [][]byte, columns []string, w Window) error {
	for c := range want {
		got, err := readDevice(dev, dst[c], len(want[c]))
		if err != nil {
			return err
		}
		if !slices.Equal(got, want[c]) {
			i := 0
			for i < len(got) && got[i] == want[c][i] {
				i++
			}
			return fmt.Errorf("window %+v, column %q: device bytes differ from Collect's at byte %d of %d", w, columns[c], i, len(got))
		}
	}
	return nil
}

// collectTable makes a table of 40 items over a shard of gpuSpec(48),
// registered with dev (opts), and 300 of its rows to collect, with repeats.
func collectTable(t *testing.T, dev *cuda.Device, opts ...DeviceOption) (*store.Shard, *ShardTable, []int) {
	t.Helper()
	ctx := context.Background()
	sh := storetest.Create(t, gpuSpec(48))
	st, err := NewShardTable(sh, Config{Name: "gpu", Sampler: NewUniform(), Remover: NewFIFO()}, WithPollInterval(200*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := st.RegisterDevice(ctx, dev, opts...); err != nil {
		t.Fatal(err)
	}
	var rows []int
	for k := range uint64(40) {
		ref, err := st.Insert(ctx, k, 1, fill(k))
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, ref.Index)
	}
	r := rand.New(rand.NewPCG(7, 7))
	idx := make([]int, 300) // many rows, with repeats
	for i := range idx {
		idx[i] = rows[r.IntN(len(rows))]
	}
	return sh, st, idx
}

// collectWindows checks CollectDevice against Collect through every window.
func collectWindows(t *testing.T, st *ShardTable, dev *cuda.Device, s cuda.Stream, idx []int) {
	t.Helper()
	for _, w := range windows {
		sizes, err := st.ItemBytes(gpuColumns, w)
		if err != nil {
			t.Fatal(err)
		}
		for i := range sizes {
			sizes[i] *= len(idx)
		}
		if err := collectBoth(context.Background(), st, dev, s, idx, gpuColumns, w, devBuffers(t, dev, sizes)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCollectDeviceByCopies: with GatherByCopies the copy engines move the
// rows (no kernel runs), with the items laid out as Collect lays them out; on
// the legacy stream, which the driver refuses for batches, the kernel does
// (the fake counts the launches).
func TestCollectDeviceByCopies(t *testing.T) {
	check := func(t *testing.T, dev *cuda.Device, launches func() int) {
		counted := launches != nil
		if !counted { // a real device counts no launches: the rows still must match
			launches = func() int { return 0 }
		}
		sh, st, idx := collectTable(t, dev, GatherByCopies())
		s := newStream(t, dev)
		before := launches()
		collectWindows(t, st, dev, s, idx)
		if n := launches() - before; n != 0 {
			t.Fatalf("%d kernel launches while gathering by copies", n)
		}
		sizes, _ := st.ItemBytes(gpuColumns, Window{})
		for i := range sizes {
			sizes[i] *= len(idx)
		}
		if err := collectBoth(context.Background(), st, dev, 0, idx, gpuColumns, Window{}, devBuffers(t, dev, sizes)); err != nil {
			t.Fatalf("on the legacy stream: %v", err)
		}
		if counted && launches() == before {
			t.Fatal("no kernel on the legacy stream")
		}
		if p := sh.Stats().Pinned; p != 0 {
			t.Fatalf("%d rows still pinned", p)
		}
	}
	t.Run("fake", func(t *testing.T) {
		f := openFakeGPU(t)
		check(t, f.device(t, 0), f.cu.Launches)
	})
	t.Run("gpu", func(t *testing.T) {
		dev := realGPU(t)
		if !dev.CanCopyBatch() {
			t.Skipf("the driver (CUDA %d) has no cuMemcpyBatchAsync", dev.Driver().Version())
		}
		check(t, dev, nil)
	})
}

func TestCollectDeviceMatchesCollect(t *testing.T) {
	onGPUs(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		ctx := context.Background()
		sh, st, idx := collectTable(t, dev)
		s := newStream(t, dev)
		collectWindows(t, st, dev, s, idx)
		// Columns in another order, and one of them twice.
		cols := []string{"meta", "rgb", "obs", "rgb"}
		w := Window{Offset: 1, Length: 3}
		sizes, _ := st.ItemBytes(cols, w)
		for i := range sizes {
			sizes[i] *= len(idx)
		}
		if err := collectBoth(ctx, st, dev, s, idx, cols, w, devBuffers(t, dev, sizes)); err != nil {
			t.Fatal(err)
		}
		// The rows were pinned for the kernel only.
		if p := sh.Stats().Pinned; p != 0 {
			t.Fatalf("%d rows still pinned", p)
		}
	})
}

// TestCollectDeviceLargeRows collects 64 KiB blocks, the size of the issue's
// measurement, the rows of a batch that deleted them among them.
func TestCollectDeviceLargeRows(t *testing.T) {
	onGPUs(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		ctx := context.Background()
		spec := store.Spec{Capacity: 40, Remover: store.RemoverNone, Columns: []store.Column{
			{Name: "traj", DType: store.Uint8, Shape: []int{16 << 10}, Length: 4},
			{Name: "meta", DType: store.Int64, Shape: []int{4}, Length: 1},
		}}
		sh := storetest.Create(t, spec)
		st, err := NewShardTable(sh, Config{Name: "big", Sampler: NewUniform(), Remover: NewFIFO(), MaxTimesSampled: 1},
			WithPollInterval(200*time.Microsecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		if err := st.RegisterDevice(ctx, dev); err != nil {
			t.Fatal(err)
		}
		items := 32
		for k := range uint64(items) {
			if _, err := st.Insert(ctx, k, 1, fill(k)); err != nil {
				t.Fatal(err)
			}
		}
		b, err := st.Sample(ctx, 16)
		if err != nil {
			t.Fatal(err)
		}
		var idx []int
		for _, x := range b.Items {
			idx = append(idx, x.Index)
		}
		for _, it := range st.Items(nil) { // and rows still in the table
			idx = append(idx, it.Index)
		}
		s := newStream(t, dev)
		cols := []string{"traj", "meta"}
		for _, w := range []Window{{}, {Offset: 1, Length: 2, Pad: PadHead}} {
			sizes, _ := st.ItemBytes(cols, w)
			for i := range sizes {
				sizes[i] *= len(idx)
			}
			dst := devBuffers(t, dev, sizes)
			if err := collectBoth(ctx, st, dev, s, idx, cols, w, dst); err != nil {
				t.Fatal(err)
			}
			if w == (Window{}) {
				meta, _ := readDevice(dev, dst[1], sizes[1])
				traj, _ := readDevice(dev, dst[0], sizes[0])
				for k := range idx {
					n := sh.BlockBytes(0)
					id, err := storetest.Check([][]byte{traj[k*n : (k+1)*n], meta[k*32 : (k+1)*32]})
					if err != nil {
						t.Fatalf("item %d: %v", k, err)
					}
					if k < len(b.Items) && id != b.Items[k].Key {
						t.Fatalf("item %d holds %d, want %d", k, id, b.Items[k].Key)
					}
				}
			}
		}
		b.Release()
		if held := st.Info().Held; held != 0 {
			t.Fatalf("%d rows held after Release", held)
		}
		// The rows go to the device in runs; an index of a later run that
		// holds no item fails the collection after earlier runs were
		// launched, and leaves no row pinned.
		live := st.Items(nil)
		bad := make([]int, 0, 40)
		for len(bad) < 39 {
			bad = append(bad, live[len(bad)%len(live)].Index)
		}
		free := -1
		for i := range sh.Capacity() {
			if !slices.ContainsFunc(live, func(it Item) bool { return it.Index == i }) {
				free = i
				break
			}
		}
		bad = append(bad, free)
		sizes, _ := st.ItemBytes(cols, Window{})
		dst := devBuffers(t, dev, []int{sizes[0] * len(bad), sizes[1] * len(bad)})
		if err := st.CollectDevice(ctx, s, dst, bad, cols, Window{}); err == nil || !strings.Contains(err.Error(), "holds no item") {
			t.Fatalf("collecting a free row after %d others: %v", len(bad)-1, err)
		}
		if p := sh.Stats().Pinned; p != 0 {
			t.Fatalf("%d rows pinned after a failed collection", p)
		}
		if err := st.CollectDevice(ctx, s, dst, bad[:len(bad)-1], cols, Window{}); err != nil {
			t.Fatalf("collecting after a failed collection: %v", err)
		}
	})
}

func TestCollectRuns(t *testing.T) {
	for _, c := range []struct {
		n, rowBytes int
		want        [][2]int
	}{
		{0, 64 << 10, nil},
		{10, 64 << 10, [][2]int{{0, 10}}},
		{256, 64 << 10, [][2]int{{0, 32}, {32, 224}}},
		{256, 400, [][2]int{{0, 256}}},
		{5000, 400, [][2]int{{0, 2621}, {2621, 2379}}},
		{3, 0, [][2]int{{0, 3}}},
	} {
		var got [][2]int
		for start, k := range collectRuns(c.n, c.rowBytes) {
			got = append(got, [2]int{start, k})
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("collectRuns(%d, %d) = %v, want %v", c.n, c.rowBytes, got, c.want)
		}
	}
}

func TestCollectDeviceErrors(t *testing.T) {
	f := openFakeGPU(t)
	dev := f.device(t, 0)
	ctx := context.Background()
	st, sh := shardTable(t, 8, Config{})
	ref, err := st.Insert(ctx, 1, 1, fill(1))
	if err != nil {
		t.Fatal(err)
	}
	s := newStream(t, dev)
	dst := devBuffers(t, dev, []int{4096})
	if err := st.CollectDevice(ctx, s, dst, []int{ref.Index}, []string{"obs"}, Window{}); err == nil || !strings.Contains(err.Error(), "no device registered") {
		t.Fatalf("collect without a device: %v", err)
	}
	if err := st.RegisterDevice(ctx, nil); err == nil {
		t.Fatal("a nil device registered")
	}
	regs := f.cu.Live(cudatest.LiveRegistrations)
	if err := st.RegisterDevice(ctx, dev); err != nil {
		t.Fatal(err)
	}
	if err := st.RegisterDevice(ctx, dev); err != nil {
		t.Fatalf("registering again with the same device: %v", err)
	}
	if got := f.cu.Live(cudatest.LiveRegistrations) - regs; got != len(testColumns) {
		t.Fatalf("%d registrations for %d column tables", got, len(testColumns))
	}
	if err := st.RegisterDevice(ctx, f.device(t, 1)); err == nil {
		t.Fatal("a second device registered")
	}
	for _, c := range []struct {
		dst  []cuda.DevicePtr
		idx  []int
		cols []string
		w    Window
		want string
	}{
		{dst, []int{ref.Index}, []string{"obs", "act"}, Window{}, "2 columns"},
		{dst, []int{ref.Index}, []string{"nope"}, Window{}, "no column"},
		{dst, []int{ref.Index}, []string{"obs"}, Window{Length: -1}, "window length"},
		{dst, []int{5}, []string{"obs"}, Window{}, "holds no item"},
		{dst, []int{ref.Index, 99}, []string{"obs"}, Window{}, "out of range"},
	} {
		err := st.CollectDevice(ctx, s, c.dst, c.idx, c.cols, c.w)
		if err == nil || !strings.HasPrefix(err.Error(), "sample: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CollectDevice(%v, %v, %+v) = %v, want an error saying %q", c.idx, c.cols, c.w, err, c.want)
		}
	}
	// A context that has ended fails the call before any work, as Collect's
	// does.
	done, cancel := context.WithCancel(ctx)
	cancel()
	launches := f.cu.Launches()
	if err := st.CollectDevice(done, s, dst, []int{ref.Index}, []string{"obs"}, Window{}); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "sample: ") {
		t.Errorf("CollectDevice under an ended context: %v, want context.Canceled", err)
	}
	if got := f.cu.Launches() - launches; got != 0 {
		t.Errorf("CollectDevice under an ended context launched %d kernels", got)
	}
	if p := sh.Stats().Pinned; p != 0 {
		t.Fatalf("failed collections left %d rows pinned", p)
	}
	if err := st.UnregisterDevice(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.cu.Live(cudatest.LiveRegistrations); got != regs {
		t.Fatalf("%d registrations after UnregisterDevice, want %d", got, regs)
	}
	if err := st.CollectDevice(ctx, s, dst, []int{ref.Index}, []string{"obs"}, Window{}); err == nil {
		t.Fatal("collected after UnregisterDevice")
	}
}

// TestCollectDeviceAbandoned: a collection whose device work outlives its
// context returns the context's error and keeps its rows pinned until the work
// is done; the next collection waits for it and unpins them.
func TestCollectDeviceAbandoned(t *testing.T) {
	f := openFakeGPU(t)
	dev := f.device(t, 0)
	st, sh := shardTable(t, 8, Config{})
	ref, err := st.Insert(context.Background(), 1, 1, fill(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RegisterDevice(t.Context(), dev); err != nil {
		t.Fatal(err)
	}
	s := newStream(t, dev)
	dst := devBuffers(t, dev, []int{4096})
	f.cu.Hold(uintptr(s), +1) // as if a kernel ran on s
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err = st.CollectDevice(ctx, s, dst, []int{ref.Index, ref.Index}, []string{"obs"}, Window{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the deadline", err)
	}
	if p := sh.Stats().Pinned; p != 1 {
		t.Fatalf("%d rows pinned while the device works, want 1", p)
	}
	// The next collection waits for it (here, until its own context ends).
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	if err := st.CollectDevice(ctx2, s, dst, []int{ref.Index}, []string{"obs"}, Window{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the deadline", err)
	}
	f.cu.Hold(uintptr(s), -1)
	ctx3, cancel3 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel3()
	if err := st.CollectDevice(ctx3, s, dst, []int{ref.Index}, []string{"obs"}, Window{}); err != nil {
		t.Fatal(err)
	}
	if p := sh.Stats().Pinned; p != 0 {
		t.Fatalf("%d rows pinned after the work ended", p)
	}
}

// TestShardTableCloseUnregisters: Close undoes the registration and frees the
// collection buffers.
func TestShardTableCloseUnregisters(t *testing.T) {
	f := openFakeGPU(t)
	dev := f.device(t, 0)
	regs := f.cu.Live(cudatest.LiveRegistrations)
	allocs := f.cu.Live(cudatest.LiveDeviceAllocs)
	hosts := f.cu.Live(cudatest.LiveHostAllocs)
	events := f.cu.Live(cudatest.LiveEvents)
	spec := storetest.Spec(8)
	spec.Remover = store.RemoverNone
	sh := storetest.Create(t, spec)
	st, err := NewShardTable(sh, Config{Name: "close", Sampler: NewUniform(), Remover: NewFIFO()})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := st.Insert(context.Background(), 3, 1, fill(3))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RegisterDevice(t.Context(), dev); err != nil {
		t.Fatal(err)
	}
	s := newStream(t, dev)
	dst := devBuffers(t, dev, []int{4096})
	allocs++ // dst
	if err := st.CollectDevice(context.Background(), s, dst, []int{ref.Index}, []string{"obs"}, Window{}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		kind, was int
	}{
		{"registrations", cudatest.LiveRegistrations, regs},
		{"device allocations", cudatest.LiveDeviceAllocs, allocs},
		{"host allocations", cudatest.LiveHostAllocs, hosts},
		{"events", cudatest.LiveEvents, events},
	} {
		if got := f.cu.Live(c.kind); got != c.was {
			t.Errorf("%d live %s after Close, want %d", got, c.what, c.was)
		}
	}
	if err := st.RegisterDevice(t.Context(), dev); !errors.Is(err, ErrClosed) {
		t.Fatalf("RegisterDevice after Close: %v", err)
	}
}

// TestDeviceWithoutDriver: without a CUDA driver the device entry points fail
// with the driver's "cuda: no CUDA driver", and the host paths still work.
func TestDeviceWithoutDriver(t *testing.T) {
	t.Setenv("GEAR_CUDA_LIB", filepath.Join(t.TempDir(), "libcuda.so.1"))
	for _, c := range []struct {
		name string
		open func() error
	}{
		{"GEAR_CUDA_LIB", func() error { _, err := OpenDevice(0); return err }},
		{"WithLibrary", func() error {
			_, err := OpenDevice(0, cuda.WithLibrary(filepath.Join(t.TempDir(), "none.so")))
			return err
		}},
		{"no device", func() error {
			libs := cudatest.Build(t, cudatest.Options{InitError: 100})
			_, err := OpenDevice(0, cuda.WithLibrary(libs.CUDA))
			return err
		}},
	} {
		err := c.open()
		if !errors.Is(err, cuda.ErrNoDriver) || !strings.HasPrefix(err.Error(), "sample: opening GPU 0: cuda: no CUDA driver: ") {
			t.Errorf("%s: got %v, want sample: opening GPU 0: cuda: no CUDA driver: ...", c.name, err)
		}
	}
	if _, err := NewDeviceSelection(nil); err == nil {
		t.Error("a selection without a device")
	}
	st, _ := shardTable(t, 4, Config{})
	ref, err := st.Insert(context.Background(), 1, 1, fill(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collect(context.Background(), []int{ref.Index}, testColumns, Window{}); err != nil {
		t.Fatalf("host collection without a driver: %v", err)
	}
}
