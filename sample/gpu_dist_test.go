package sample

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// deviceRank is what runDeviceDist gives each rank.
type deviceRank struct {
	r   int
	d   *DistTable
	st  *ShardTable
	dev *cuda.Device
	s   cuda.Stream
}

// runDeviceDist builds a world of len(locals) ranks over loopback, gives every
// rank a device of the fake driver (alternating between its two), a stream and
// a communicator of the fake NCCL, registers its shard table with the device,
// makes a distributed table with WithNCCL, and runs fn on every rank.
func runDeviceDist(t *testing.T, locals []*ShardTable, opts []DistOption, fn func(ctx context.Context, x deviceRank) error) {
	t.Helper()
	f := openFakeGPU(t)
	nccl, err := cuda.OpenNCCL(cuda.WithLibrary(f.libs.NCCL))
	if err != nil {
		t.Fatal(err)
	}
	runDeviceDistOn(t, nccl, func(r int) *cuda.Device { return f.device(t, r%2) }, locals, opts, fn)
}

// runDeviceDistOn is runDeviceDist with the given NCCL and rank r's device.
func runDeviceDistOn(t *testing.T, nccl *cuda.NCCL, device func(r int) *cuda.Device, locals []*ShardTable, opts []DistOption, fn func(ctx context.Context, x deviceRank) error) {
	t.Helper()
	n := len(locals)
	devs := make([]*cuda.Device, n)
	streams := make([]cuda.Stream, n)
	for r := range n {
		devs[r] = device(r)
		streams[r] = newStream(t, devs[r])
		if err := locals[r].RegisterDevice(t.Context(), devs[r]); err != nil {
			t.Fatal(err)
		}
	}
	comms, world := collectivetest.Comms(t, n, collectivetest.Config{Timeout: 120 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	errs := collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) (err error) {
		r := c.Rank()
		id, err := nccl.ShareUniqueID(ctx, world.Bootstrap(r), "sample.collect")
		if err != nil {
			return err
		}
		nc, err := nccl.NewComm(ctx, devs[r], id, n, r)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := nc.Close(ctx); cerr != nil && err == nil {
				err = cerr
			}
		}()
		d, err := NewDistTable(ctx, c, locals[r], append(slices.Clone(opts), WithNCCL(nc))...)
		if err != nil {
			return err
		}
		defer d.Close()
		return fn(ctx, deviceRank{r: r, d: d, st: locals[r], dev: devs[r], s: streams[r]})
	})
	// The tables let go of the devices before the devices close.
	for _, st := range locals {
		if err := st.UnregisterDevice(context.Background()); err != nil {
			t.Error(err)
		}
	}
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// deviceShards makes one shard table per rank over spec, with a sampler and a
// remover from mk, rank r holding 5+3r items with keys 100r+k.
func deviceShards(t *testing.T, ranks int, spec store.Spec, cfg Config, mk func() (Selector, Selector)) ([]*ShardTable, []*store.Shard) {
	t.Helper()
	tables := make([]*ShardTable, ranks)
	shards := make([]*store.Shard, ranks)
	for r := range ranks {
		shards[r] = storetest.Create(t, spec)
		c := cfg
		c.Name = "dev"
		c.Sampler, c.Remover = mk()
		st, err := NewShardTable(shards[r], c, WithPollInterval(200*time.Microsecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		for k := range uint64(5 + 3*r) {
			key := uint64(r)*100 + k
			if _, err := st.Insert(context.Background(), key, 1, fill(key)); err != nil {
				t.Fatal(err)
			}
		}
		tables[r] = st
	}
	return tables, shards
}

// collectDistBoth collects idx on the host (Collect) and on the device
// (CollectDevice), two collective calls, and compares them byte for byte.
func collectDistBoth(ctx context.Context, x deviceRank, idx []int, columns []string, w Window) error {
	want, err := x.d.Collect(ctx, idx, columns, w)
	if err != nil {
		return fmt.Errorf("host collection: %w", err)
	}
	sizes, err := x.d.ItemBytes(columns, w)
	if err != nil {
		return err
	}
	dst := make([]cuda.DevicePtr, len(sizes))
	for i, n := range sizes {
		p, err := x.dev.Alloc(max(n*len(idx), 1))
		if err != nil {
			return err
		}
		defer x.dev.Free(p)
		if err := x.dev.CopyHtoD(p, slices.Repeat([]byte{0xAA}, max(n*len(idx), 1))); err != nil {
			return err
		}
		dst[i] = p
	}
	// A copy from pageable memory may still be in flight when CopyHtoD returns.
	if err := x.dev.Synchronize(ctx); err != nil {
		return err
	}
	if err := x.d.CollectDevice(ctx, x.s, dst, idx, columns, w); err != nil {
		return fmt.Errorf("device collection: %w", err)
	}
	if err := compareDevice(x.dev, dst, want, columns, w); err != nil {
		return fmt.Errorf("rank %d, %d items: %w", x.r, len(idx), err)
	}
	return nil
}

func TestDistributedCollectDeviceMatchesCollect(t *testing.T) {
	const ranks = 3
	locals, _ := deviceShards(t, ranks, gpuSpec(16), Config{}, uniformFIFO)
	runDeviceDist(t, locals, []DistOption{WithSeed(5)}, func(ctx context.Context, x deviceRank) error {
		b, err := x.d.Sample(ctx, 60)
		if err != nil {
			return err
		}
		defer b.Release()
		// Every rank asks for its own mix: local and remote rows, repeats, in
		// an order of its own; rank 2 asks for local rows only, rank 1 for
		// none at all in one round.
		r := rand.New(rand.NewPCG(uint64(x.r), 9))
		var mixed, local []int
		for _, it := range b.Items {
			if r.IntN(3) != 0 {
				mixed = append(mixed, it.Index)
			}
			if it.Index/x.d.Capacity() == x.r {
				local = append(local, it.Index)
			}
		}
		r.Shuffle(len(mixed), func(i, j int) { mixed[i], mixed[j] = mixed[j], mixed[i] })
		for _, w := range windows {
			if err := collectDistBoth(ctx, x, mixed, gpuColumns, w); err != nil {
				return err
			}
		}
		own := mixed
		switch x.r {
		case 2:
			own = local
		case 1:
			own = nil
		}
		if err := collectDistBoth(ctx, x, own, []string{"rgb", "obs"}, Window{Offset: 1, Length: 3, Pad: PadHead}); err != nil {
			return err
		}
		return nil
	})
}

func TestDistributedCollectDeviceErrors(t *testing.T) {
	const ranks = 3
	locals, _ := deviceShards(t, ranks, gpuSpec(16), Config{}, uniformFIFO)
	runDeviceDist(t, locals, nil, func(ctx context.Context, x deviceRank) error {
		c := x.d.Capacity()
		dst := make([]cuda.DevicePtr, 1)
		var err error
		if dst[0], err = x.dev.Alloc(64 << 10); err != nil {
			return err
		}
		defer x.dev.Free(dst[0])
		good := []int{0, c + 1, 2*c + 2}
		// An index whose row holds nothing fails on the rank that asked only.
		idx := good
		if x.r == 0 {
			idx = []int{0, 2*c + 15, c}
		}
		err = x.d.CollectDevice(ctx, x.s, dst, idx, []string{"meta"}, Window{})
		if (err == nil) == (x.r == 0) || x.r == 0 && !strings.Contains(err.Error(), "index 47: rank 2 holds no item") {
			return fmt.Errorf("collect of an empty row: %v", err)
		}
		// An argument error on one rank fails every rank.
		for _, bad := range []func() error{
			func() error {
				idx := good
				if x.r == 1 {
					idx = []int{ranks * c}
				}
				return x.d.CollectDevice(ctx, x.s, dst, idx, []string{"meta"}, Window{})
			},
			func() error {
				w := Window{}
				if x.r == 2 {
					w.Length = 1
				}
				return x.d.CollectDevice(ctx, x.s, dst, good, []string{"meta"}, w)
			},
			func() error {
				cols := []string{"meta"}
				if x.r == 0 {
					cols = []string{"meta", "obs"}
				}
				return x.d.CollectDevice(ctx, x.s, dst, good, cols, Window{})
			},
			func() error {
				if x.r == 1 {
					if err := x.st.UnregisterDevice(ctx); err != nil {
						return err
					}
					defer x.st.RegisterDevice(ctx, x.dev)
				}
				return x.d.CollectDevice(ctx, x.s, dst, good, []string{"meta"}, Window{})
			},
		} {
			if err := bad(); err == nil || !strings.HasPrefix(err.Error(), "sample: ") {
				return fmt.Errorf("a bad argument on one rank: %v", err)
			}
		}
		// And the table works again afterwards.
		return collectDistBoth(ctx, x, good, gpuColumns, Window{Offset: 1, Length: 5})
	})
	for _, st := range locals {
		if p := st.Shard().Stats().Pinned; p != 0 {
			t.Errorf("%d rows still pinned", p)
		}
	}
}

// TestDistributedCollectDeviceOnGPUs runs the distributed comparison over two
// real GPUs and the real NCCL; it is skipped without a driver, with fewer than
// two devices, or without NCCL.
func TestDistributedCollectDeviceOnGPUs(t *testing.T) {
	drv := cudatest.OpenDriver(t)
	if n, err := drv.DeviceCount(); err != nil || n < 2 {
		t.Skipf("skipping: %d CUDA devices (%v), need 2", n, err)
	}
	nccl, err := cuda.OpenNCCL()
	if errors.Is(err, cuda.ErrNoNCCL) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	device := func(r int) *cuda.Device {
		dev, err := drv.Device(r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dev.Close() })
		return dev
	}
	spec := store.Spec{Capacity: 300, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "traj", DType: store.Uint8, Shape: []int{16 << 10}, Length: 4},
		{Name: "rgb", DType: store.Uint8, Shape: []int{3}, Length: 5},
	}}
	locals, _ := deviceShards(t, 2, spec, Config{}, uniformFIFO)
	runDeviceDistOn(t, nccl, device, locals, nil, func(ctx context.Context, x deviceRank) error {
		b, err := x.d.Sample(ctx, 256)
		if err != nil {
			return err
		}
		defer b.Release()
		var idx []int
		for _, it := range b.Items {
			idx = append(idx, it.Index)
		}
		for _, w := range []Window{{}, {Offset: 1, Length: 4, Pad: PadHead}} {
			if err := collectDistBoth(ctx, x, idx, []string{"traj", "rgb"}, w); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestDistributedCollectDeviceHeldRows collects 64 KiB rows that the sample
// deleted (max_times_sampled 1) and their owners hold until Release, over two
// ranks.
func TestDistributedCollectDeviceHeldRows(t *testing.T) {
	spec := store.Spec{Capacity: 12, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "traj", DType: store.Uint8, Shape: []int{16 << 10}, Length: 4},
		{Name: "meta", DType: store.Int64, Shape: []int{4}, Length: 1},
	}}
	locals, shards := deviceShards(t, 2, spec, Config{MaxTimesSampled: 1}, func() (Selector, Selector) { return NewFIFO(), NewFIFO() })
	runDeviceDist(t, locals, nil, func(ctx context.Context, x deviceRank) error {
		b, err := x.d.Sample(ctx, 9)
		if err != nil {
			return err
		}
		var idx []int
		for _, it := range b.Items {
			if !it.Deleted {
				return fmt.Errorf("pick %+v not deleted", it)
			}
			idx = append(idx, it.Index)
		}
		cols := []string{"traj", "meta"}
		if err := collectDistBoth(ctx, x, idx, cols, Window{}); err != nil {
			return err
		}
		if err := collectDistBoth(ctx, x, idx, cols, Window{Offset: 3, Length: 2}); err != nil {
			return err
		}
		b.Release()
		if held := x.st.Info().Held; held != 0 {
			return fmt.Errorf("%d rows held after Release", held)
		}
		return nil
	})
	for _, sh := range shards {
		if p := sh.Stats().Pinned; p != 0 {
			t.Errorf("%d rows still pinned", p)
		}
	}
}

// TestCollectDeviceNeedsNCCL: a distributed table of several ranks without
// WithNCCL refuses device collection on every rank; one rank needs none.
func TestCollectDeviceNeedsNCCL(t *testing.T) {
	f := openFakeGPU(t)
	locals, _ := deviceShards(t, 2, gpuSpec(8), Config{}, uniformFIFO)
	devs := []*cuda.Device{f.device(t, 0), f.device(t, 1)}
	for r, st := range locals {
		if err := st.RegisterDevice(t.Context(), devs[r]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.UnregisterDevice(context.Background()) })
	}
	streams := []cuda.Stream{newStream(t, devs[0]), newStream(t, devs[1])}
	runDist(t, []Local{locals[0], locals[1]}, nil, func(ctx context.Context, r int, d *DistTable) error {
		dst, err := devs[r].Alloc(4096)
		if err != nil {
			return err
		}
		defer devs[r].Free(dst)
		err = d.CollectDevice(ctx, streams[r], []cuda.DevicePtr{dst}, []int{0}, []string{"meta"}, Window{})
		if err == nil || !strings.Contains(err.Error(), "no NCCL communicator") && !strings.Contains(err.Error(), "arguments are bad") {
			return fmt.Errorf("got %v, want an error naming the missing NCCL communicator", err)
		}
		return nil
	})
	one, _ := deviceShards(t, 1, gpuSpec(8), Config{}, uniformFIFO)
	if err := one[0].RegisterDevice(t.Context(), devs[0]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = one[0].UnregisterDevice(context.Background()) })
	runDist(t, []Local{one[0]}, nil, func(ctx context.Context, r int, d *DistTable) error {
		x := deviceRank{r: 0, d: d, st: one[0], dev: devs[0], s: streams[0]}
		return collectDistBoth(ctx, x, []int{4, 0, 4, 2}, gpuColumns, Window{Offset: 2, Length: 3, Pad: PadHead})
	})
}

func uniformFIFO() (Selector, Selector) { return NewUniform(), NewFIFO() }
