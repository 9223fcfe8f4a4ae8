package nccl_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/collective/nccl"
	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
	"github.com/gear-rl/gear/gmi"
)

// The device path of collective.Layout with ForLayout: against the fake CUDA
// and NCCL of cuda/cudatest, and on device 0 of a real driver where there is
// one. The host path and the layouts' failures are tested in package
// collective.

// The device path against the fake CUDA and NCCL: NCCL carries the "nccl"
// groups on the fake's device memory, the host path the others through a host
// copy; with WithHostLinks (or a rank without NCCL) every step goes through the
// host.
func TestLayoutDevice(t *testing.T) {
	f := openFakeGPU(t)
	for _, mc := range []struct {
		name string
		m    gmi.Mapping
	}{
		{"2x3", gmi.Mapping{{0, 1, 2}, {3, 4, 5}}},
		{"3x2", gmi.Mapping{{0, 1}, {2, 3}, {4, 5}}},
		{"uneven-3-2", gmi.Mapping{{0, 1, 2}, {3, 4}}},
		{"one-per-gpu", gmi.Mapping{{0}, {1}, {2}}},
	} {
		for _, s := range []gmi.Strategy{gmi.MultiProcess, gmi.MultiRing, gmi.Hierarchical} {
			for _, mode := range []string{"nccl", "host", "mixed"} {
				if s == gmi.MultiRing && !collectivetest.EvenRows(mc.m) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", mc.name, s, mode), func(t *testing.T) {
					n := mc.m.GMIs()
					comms, _ := collectivetest.Comms(t, n, collectivetest.Config{})
					gpus := make([]int, n)
					for r := range gpus {
						gpus[r], _, _ = mc.m.Locate(r)
					}
					devs := f.devices(t, gpus)
					live := f.nc.Count(cudatest.CountLiveComms)
					ls, errs := collectivetest.BuildLayouts(t, comms, func(int) gmi.Mapping { return mc.m }, func(r int) []collective.LayoutOption {
						opts := []collective.LayoutOption{collective.WithStrategy(s), collective.WithDevice(nccl.ForLayout(devs[r], nccl.WithLibrary(f.nccl)))}
						if mode == "host" || mode == "mixed" && r == n-1 {
							opts = append(opts, collective.WithHostLinks())
						}
						return opts
					})
					for r, err := range errs {
						if err != nil {
							t.Fatalf("rank %d: %v", r, err)
						}
					}
					sched, _ := gmi.ReductionSchedule(mc.m, s)
					wantNCCL := mode == "nccl" && hasNCCLLink(sched)
					for r, l := range ls {
						if l.NCCL() != wantNCCL {
							t.Fatalf("rank %d: NCCL %v, want %v", r, l.NCCL(), wantNCCL)
						}
					}
					if made := f.nc.Count(cudatest.CountLiveComms) - live; wantNCCL != (made > 0) {
						t.Fatalf("%d NCCL communicators made", made)
					}
					for _, count := range []int{0, 1, 1000} {
						collectivetest.EachLayout(t, ls, func(ctx context.Context, l *collective.Layout, r int) error {
							in := make([]float32, count)
							collectivetest.Fill(in, r, 0)
							p := cudatest.ToDevice(t, devs[r], in)
							if err := l.AllReduceDevice(ctx, collective.DevicePtr(p), count, collective.Float32, collective.Sum); err != nil {
								return err
							}
							got, err := cudatest.FromDevice[float32](devs[r], p, count)
							if err != nil {
								return err
							}
							return collectivetest.Compare(fmt.Sprintf("float32 count %d", count), got, collectivetest.References[float32](n, collective.Sum))
						})
					}
					collectivetest.EachLayout(t, ls, func(ctx context.Context, l *collective.Layout, r int) error {
						in := make([]int64, 33)
						collectivetest.Fill(in, r, 0)
						p := cudatest.ToDevice(t, devs[r], in)
						if err := l.AllReduceDevice(ctx, collective.DevicePtr(p), 33, collective.Int64, collective.Max); err != nil {
							return err
						}
						got, err := cudatest.FromDevice[int64](devs[r], p, 33)
						if err != nil {
							return err
						}
						return collectivetest.Compare("int64 max", got, collectivetest.References[int64](n, collective.Max))
					})
					// Host buffers take the host path, with or without NCCL.
					collectivetest.EachLayout(t, ls, collectivetest.LayoutCase[float64](100, collective.Sum))
				})
			}
		}
	}
	if m := f.nc.Count(cudatest.CountMisuse); m != 0 {
		t.Errorf("%d calls on dead NCCL communicators", m)
	}
}

func hasNCCLLink(s gmi.Schedule) bool {
	for _, st := range s.Steps {
		for _, g := range st.Groups {
			if g.Link == gmi.LinkNCCL {
				return true
			}
		}
	}
	return false
}

// A lost rank aborts the NCCL steps too.
func TestLayoutDeviceLostRank(t *testing.T) {
	f := openFakeGPU(t)
	m := gmi.Mapping{{0, 1}, {2, 3}, {4, 5}} // multi-ring: rings {0,2,4} and {1,3,5} over NCCL
	comms, w := collectivetest.Comms(t, 6, collectivetest.Config{})
	devs := f.devices(t, []int{0, 0, 1, 1, 2, 2})
	ls, errs := collectivetest.BuildLayouts(t, comms, func(int) gmi.Mapping { return m }, func(r int) []collective.LayoutOption {
		return []collective.LayoutOption{collective.WithDevice(nccl.ForLayout(devs[r], nccl.WithLibrary(f.nccl)))}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if !ls[0].NCCL() || ls[0].Strategy() != gmi.MultiRing {
		t.Fatalf("NCCL %v, strategy %s", ls[0].NCCL(), ls[0].Strategy())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make([]error, 6)
	var wg sync.WaitGroup
	for r, l := range ls[:5] { // rank 5 never comes
		p := cudatest.ToDevice(t, devs[r], make([]float32, 8))
		wg.Go(func() {
			out[r] = l.AllReduceDevice(ctx, collective.DevicePtr(p), 8, collective.Float32, collective.Sum)
		})
	}
	time.Sleep(30 * time.Millisecond)
	w.Lose(5, "exit status 1")
	wg.Wait()
	for r, err := range out[:5] {
		var le *collective.LostError
		if !errors.As(err, &le) || le.Rank != 5 {
			t.Errorf("rank %d: %v, want rank 5 lost", r, err)
		}
	}
}

// TestLayoutOnGPU runs the device path on device 0 of the real driver: a world
// of three GMIs of two virtual GPUs, all on the one device, so every step takes
// the host path through host copies of the device buffer (NCCL refuses two
// ranks on one GPU). Skipped only when there is no CUDA driver.
func TestLayoutOnGPU(t *testing.T) { layoutOneGPU(t, cudatest.OpenDriver(t)) }

// TestLayoutOneGPUFake runs TestLayoutOnGPU's world on the fake driver, whose
// primary contexts destroy their memory with their last reference as the real
// driver's do: the cleanup order that failed on an H100 ("Free: cuda: closed:
// device 0", devices closed by a defer before the buffers' cleanups ran) fails
// here too.
func TestLayoutOneGPUFake(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{})
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		t.Fatal(err)
	}
	fc := cudatest.OpenFakeCUDA(t, libs.CUDA)
	reclaimed, allocs := fc.Live(cudatest.Reclaimed), fc.Live(cudatest.LiveDeviceAllocs)
	t.Run("layout", func(t *testing.T) { layoutOneGPU(t, drv) })
	if got := fc.Live(cudatest.Reclaimed) - reclaimed; got != 0 {
		t.Errorf("%d objects were still alive when their device was closed", got)
	}
	if got := fc.Live(cudatest.LiveDeviceAllocs); got != allocs {
		t.Errorf("%d device allocations alive after the test, want %d", got, allocs)
	}
}

// layoutOneGPU is the three-GMI world on device 0 of drv. The devices are
// closed by cleanups registered before the buffers' (cudatest.OpenDevice), so
// the buffers are freed first.
func layoutOneGPU(t *testing.T, drv *cuda.Driver) {
	m := gmi.Mapping{{0, 1}, {2}}
	comms, _ := collectivetest.Comms(t, 3, collectivetest.Config{Transport: collectivetest.Shm})
	devs := make([]*cuda.Device, 3)
	for r := range devs {
		devs[r] = cudatest.OpenDevice(t, drv, 0)
	}
	for _, s := range []gmi.Strategy{gmi.MultiProcess, gmi.Hierarchical} {
		ls, errs := collectivetest.BuildLayouts(t, comms, func(int) gmi.Mapping { return m }, func(r int) []collective.LayoutOption {
			return []collective.LayoutOption{collective.WithStrategy(s), collective.WithDevice(nccl.ForLayout(devs[r])), collective.WithHostLinks()}
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		collectivetest.EachLayout(t, ls, func(ctx context.Context, l *collective.Layout, r int) error {
			in := make([]float32, 100000)
			collectivetest.Fill(in, r, 0)
			p := cudatest.ToDevice(t, devs[r], in)
			if err := l.AllReduceDevice(ctx, collective.DevicePtr(p), len(in), collective.Float32, collective.Sum); err != nil {
				return err
			}
			got, err := cudatest.FromDevice[float32](devs[r], p, len(in))
			if err != nil {
				return err
			}
			return collectivetest.Compare(string(s), got, collectivetest.References[float32](3, collective.Sum))
		})
	}
}
