package nccl_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/collective/nccl"
	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

// The NCCL communicator against the fake libcuda and libnccl of cuda/cudatest:
// the fake NCCL matches the calls of communicators created in this process
// (one goroutine per rank) and carries them out on the fake's "device" memory.
// On a machine with a GPU, TestNCCLOnGPU runs the same calls on device 0.

// fakeGPU is the fake driver and NCCL.
type fakeGPU struct {
	drv  *cuda.Driver
	nccl *cuda.NCCL
	nc   *cudatest.FakeNCCL
}

func openFakeGPU(t *testing.T) *fakeGPU {
	t.Helper()
	libs := cudatest.Build(t, cudatest.Options{})
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		t.Fatal(err)
	}
	n, err := cuda.OpenNCCL(cuda.WithLibrary(libs.NCCL))
	if err != nil {
		t.Fatal(err)
	}
	return &fakeGPU{drv: drv, nccl: n, nc: cudatest.OpenFakeNCCL(t, libs.NCCL)}
}

// devices opens one Device per rank, rank r on the fake's device gpus[r] % 2
// (the fake has two), closed when the test ends.
func (f *fakeGPU) devices(t *testing.T, gpus []int) []*cuda.Device {
	t.Helper()
	devs := make([]*cuda.Device, len(gpus))
	for r, g := range gpus {
		d, err := f.drv.Device(g % 2)
		if err != nil {
			t.Fatal(err)
		}
		devs[r] = d
	}
	t.Cleanup(func() {
		for _, d := range devs {
			if err := d.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return devs
}

// ncclWorld builds an n-rank world and an NCCLComm per rank, one per device.
func ncclWorld(t *testing.T, f *fakeGPU, n int) ([]*nccl.Comm, *collectivetest.World, []*cuda.Device) {
	t.Helper()
	gpus := make([]int, n)
	for r := range gpus {
		gpus[r] = r
	}
	devs := f.devices(t, gpus)
	w := collectivetest.NewWorld(n)
	comms := make([]*nccl.Comm, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			comms[r], errs[r] = nccl.New(ctx, w.Bootstrap(r), devs[r], nccl.WithLibrary(f.nccl))
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: nccl.New: %v", r, err)
		}
	}
	return comms, w, devs
}

func TestNCCLComm(t *testing.T) {
	f := openFakeGPU(t)
	const n = 3
	comms, _, devs := ncclWorld(t, f, n)
	const count = 37
	collectivetest.EachRank(t, n, func(ctx context.Context, r int) error {
		c, dev := comms[r], devs[r]
		if c.Rank() != r || c.Size() != n || c.WorldRank(r) != r || c.Device() != dev || c.Stream() == 0 {
			return fmt.Errorf("rank %d/%d, world rank %d, stream %#x", c.Rank(), c.Size(), c.WorldRank(r), c.Stream())
		}
		check := func(what string, p cuda.DevicePtr, want func(i int) float64, m int) error {
			got, err := cudatest.FromDevice[float64](dev, p, m)
			if err != nil {
				return err
			}
			return collectivetest.Compare(what, got, want)
		}
		in := make([]float64, count)
		collectivetest.Fill(in, r, 0)
		send := cudatest.ToDevice(t, dev, in)
		recv := cudatest.ToDevice(t, dev, make([]float64, n*count))
		for _, op := range collectivetest.Ops {
			if err := c.AllReduce(ctx, send, recv, count, collective.Float64, op); err != nil {
				return err
			}
			if err := check("AllReduce "+op.String(), recv, collectivetest.References[float64](n, op), count); err != nil {
				return err
			}
		}
		// In place, int32.
		ints := make([]int32, count)
		collectivetest.Fill(ints, r, 0)
		ip := cudatest.ToDevice(t, dev, ints)
		if err := c.AllReduce(ctx, ip, ip, count, collective.Int32, collective.Sum); err != nil {
			return err
		}
		gotInts, err := cudatest.FromDevice[int32](dev, ip, count)
		if err != nil {
			return err
		}
		if err := collectivetest.Compare("AllReduce int32 in place", gotInts, collectivetest.References[int32](n, collective.Sum)); err != nil {
			return err
		}
		if err := c.Reduce(ctx, send, recv, count, collective.Float64, collective.Max, 2); err != nil {
			return err
		}
		if r == 2 {
			if err := check("Reduce", recv, collectivetest.References[float64](n, collective.Max), count); err != nil {
				return err
			}
		}
		if err := c.Broadcast(ctx, send, recv, count, collective.Float64, 1); err != nil {
			return err
		}
		if err := check("Broadcast", recv, collectivetest.Inputs[float64](1), count); err != nil {
			return err
		}
		if err := c.AllGather(ctx, send, recv, count, collective.Float64); err != nil {
			return err
		}
		if err := check("AllGather", recv, func(i int) float64 { return collectivetest.Inputs[float64](i / count)(i % count) }, n*count); err != nil {
			return err
		}
		big := make([]float64, n*count)
		collectivetest.Fill(big, r, 0)
		bigp := cudatest.ToDevice(t, dev, big)
		if err := c.ReduceScatter(ctx, bigp, recv, count, collective.Float64, collective.Sum); err != nil {
			return err
		}
		ref := collectivetest.References[float64](n, collective.Sum)
		if err := check("ReduceScatter", recv, func(i int) float64 { return ref(r*count + i) }, count); err != nil {
			return err
		}
		// Point to point: 0 sends to 1, then 1 to 2, then 2 to 0.
		next, prev := (r+1)%n, (r+n-1)%n
		for turn := range n {
			switch r {
			case turn:
				err = c.Send(ctx, send, count, collective.Float64, next)
			case (turn + 1) % n:
				err = c.Recv(ctx, recv, count, collective.Float64, prev)
			}
			if err != nil {
				return err
			}
		}
		return check("Recv", recv, collectivetest.Inputs[float64](prev), count)
	})
	if m := f.nc.Count(cudatest.CountMisuse); m != 0 {
		t.Errorf("%d calls on dead NCCL communicators", m)
	}
}

// A lost peer aborts the NCCL communicator: the waiting call returns
// *LostError naming it, and so does every later call.
func TestNCCLLostPeer(t *testing.T) {
	f := openFakeGPU(t)
	comms, w, devs := ncclWorld(t, f, 3)
	aborts := f.nc.Count(cudatest.CountAborts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 { // rank 2 never calls
		buf := cudatest.ToDevice(t, devs[r], []float32{1, 2})
		wg.Go(func() { errs[r] = comms[r].AllReduce(ctx, buf, buf, 2, collective.Float32, collective.Sum) })
	}
	time.Sleep(20 * time.Millisecond)
	lost := time.Now()
	w.Lose(2, "exit status 3")
	wg.Wait()
	if took := time.Since(lost); took > 2*time.Second {
		t.Errorf("the calls returned %v after the loss", took)
	}
	for r, err := range errs {
		var le *collective.LostError
		if !errors.As(err, &le) || le.Rank != 2 || le.Reason != "exit status 3" {
			t.Fatalf("rank %d: %v, want rank 2 lost", r, err)
		}
		if want := "collective: lost rank 2: exit status 3"; err.Error() != want {
			t.Errorf("rank %d: %q, want %q", r, err, want)
		}
		buf := cudatest.ToDevice(t, devs[r], []float32{1})
		if again := comms[r].Broadcast(ctx, buf, buf, 1, collective.Float32, 0); again != err {
			t.Errorf("rank %d: the next call: %v, want the same error", r, again)
		}
		if comms[r].Err() != err {
			t.Errorf("rank %d: Err() = %v", r, comms[r].Err())
		}
	}
	if got := f.nc.Count(cudatest.CountAborts) - aborts; got < 2 {
		t.Errorf("%d NCCL communicators aborted, want at least 2", got)
	}
}

// A context that ends aborts this rank's NCCL communicator; the peer hears of
// it (its NCCL call aborts) and returns *AbortError with the cause.
func TestNCCLContext(t *testing.T) {
	f := openFakeGPU(t)
	comms, _, devs := ncclWorld(t, f, 2)
	buf0 := cudatest.ToDevice(t, devs[0], []float32{1, 2})
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := comms[0].AllReduce(short, buf0, buf0, 2, collective.Float32, collective.Sum)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "collective: NCCL AllReduce(sum, float32, 2 elements) as call 1") {
		t.Fatalf("rank 0: %v, want the deadline naming the call", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a deadline of 50ms returned after %v", took)
	}
	if again := comms[0].AllReduce(context.Background(), buf0, buf0, 2, collective.Float32, collective.Sum); again != err {
		t.Errorf("rank 0, next call: %v, want the first error", again)
	}
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	buf1 := cudatest.ToDevice(t, devs[1], []float32{1, 2})
	err = comms[1].AllReduce(ctx, buf1, buf1, 2, collective.Float32, collective.Sum)
	var ae *collective.AbortError
	if !errors.As(err, &ae) || ae.Rank != 0 || !strings.Contains(ae.Cause, "deadline exceeded") {
		t.Fatalf("rank 1: %v, want rank 0's failure", err)
	}
	t.Logf("rank 1: %v", err)
}

// A cancelled context on every rank, with no peer missing: each rank's call
// returns the context's error or the other's abort, none hangs.
func TestNCCLCancelWhileWaiting(t *testing.T) {
	f := openFakeGPU(t)
	comms, _, devs := ncclWorld(t, f, 2)
	ctx, cancel := context.WithCancel(context.Background())
	buf := cudatest.ToDevice(t, devs[0], []float32{1})
	done := make(chan error, 1)
	go func() { done <- comms[0].AllReduce(ctx, buf, buf, 1, collective.Float32, collective.Sum) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return 10s after its context was cancelled")
	}
}

func TestNCCLBadArguments(t *testing.T) {
	f := openFakeGPU(t)
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *nccl.Comm, p cuda.DevicePtr) error
		want string
	}{
		{"bytes reduced", func(ctx context.Context, c *nccl.Comm, p cuda.DevicePtr) error {
			return c.AllReduce(ctx, p, p, 4, collective.Bytes, collective.Sum)
		}, "bytes cannot be reduced"},
		{"root", func(ctx context.Context, c *nccl.Comm, p cuda.DevicePtr) error {
			return c.Broadcast(ctx, p, p, 1, collective.Float32, 2)
		}, "root 2 of 2 ranks"},
		{"count", func(ctx context.Context, c *nccl.Comm, p cuda.DevicePtr) error {
			return c.AllGather(ctx, p, p, -1, collective.Int64)
		}, "count -1"},
		{"peer", func(ctx context.Context, c *nccl.Comm, p cuda.DevicePtr) error {
			return c.Send(ctx, p, 1, collective.Float32, 0)
		}, "Send(float32, 1 elements, to rank 0) as call 1: peer 0 (this is rank 0 of 2)"},
		{"reduction", func(ctx context.Context, c *nccl.Comm, p cuda.DevicePtr) error {
			return c.AllReduce(ctx, p, p, 1, collective.Float32, collective.Op(9))
		}, "reduction op(9)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, _, devs := ncclWorld(t, f, 2)
			p := cudatest.ToDevice(t, devs[0], make([]float32, 4))
			err := tc.call(context.Background(), comms[0], p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "collective: NCCL ") {
				t.Fatalf("%v, want an error naming %q", err, tc.want)
			}
			if again := comms[0].AllReduce(context.Background(), p, p, 1, collective.Float32, collective.Sum); again != err {
				t.Errorf("next call: %v, want the first error", again)
			}
			t.Logf("rank 0: %v", err)
			// The peer hears of it.
			p1 := cudatest.ToDevice(t, devs[1], make([]float32, 4))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := comms[1].AllReduce(ctx, p1, p1, 1, collective.Float32, collective.Sum); !errors.Is(err, collective.ErrAborted) {
				t.Errorf("peer: %v, want ErrAborted", err)
			}
		})
	}
}

func TestNCCLClose(t *testing.T) {
	f := openFakeGPU(t)
	comms, _, devs := ncclWorld(t, f, 2)
	buf := cudatest.ToDevice(t, devs[0], []float32{1})
	done := make(chan error, 1)
	go func() {
		done <- comms[0].AllReduce(context.Background(), buf, buf, 1, collective.Float32, collective.Sum)
	}()
	time.Sleep(20 * time.Millisecond)
	if err := comms[0].Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, collective.ErrClosed) {
			t.Fatalf("the call in progress: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close left the call in progress waiting")
	}
	if err := comms[0].Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := comms[0].AllReduce(context.Background(), buf, buf, 1, collective.Float32, collective.Sum); !errors.Is(err, collective.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// A rank lost while the others create the communicator ends their wait.
func TestNCCLLostWhileCreating(t *testing.T) {
	f := openFakeGPU(t)
	devs := f.devices(t, []int{0, 1, 0})
	w := collectivetest.NewWorld(3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			c, err := nccl.New(ctx, w.Bootstrap(r), devs[r], nccl.WithLibrary(f.nccl))
			if c != nil {
				c.Close()
			}
			errs[r] = err
		})
	}
	time.Sleep(20 * time.Millisecond)
	w.Lose(2, "killed")
	wg.Wait()
	for r, err := range errs {
		var le *collective.LostError
		if !errors.As(err, &le) || le.Rank != 2 {
			t.Errorf("rank %d: %v, want rank 2 lost", r, err)
		}
	}
}

// FromComm builds NCCL communicators of split groups, named by their world
// ranks; a lost rank of one group leaves the other alone.
func TestNCCLOfSplit(t *testing.T) {
	f := openFakeGPU(t)
	const n = 4
	comms, w := collectivetest.Comms(t, n, collectivetest.Config{})
	devs := f.devices(t, []int{0, 1, 0, 1})
	subs := make([]*collective.Comm, n)
	nccls := make([]*nccl.Comm, n)
	t.Cleanup(func() {
		for r := range n {
			if nccls[r] != nil {
				nccls[r].Close()
			}
		}
		collectivetest.CloseAll(subs)
	})
	collectivetest.EachRank(t, n, func(ctx context.Context, r int) error {
		// Groups {1,3} and {0,2}, ranked in reverse.
		sub, err := comms[r].Split(ctx, 1-r%2, -r)
		if err != nil {
			return err
		}
		subs[r] = sub
		nccls[r], err = nccl.FromComm(ctx, sub, devs[r], nccl.WithLibrary(f.nccl))
		if err != nil {
			return err
		}
		d := nccls[r]
		if d.Size() != 2 || d.WorldRank(d.Rank()) != r || d.Rank() != sub.Rank() {
			return fmt.Errorf("NCCL rank %d of %d, world rank %d", d.Rank(), d.Size(), d.WorldRank(d.Rank()))
		}
		p := cudatest.ToDevice(t, devs[r], []int64{int64(r), 10})
		if err := d.AllReduce(ctx, p, p, 2, collective.Int64, collective.Sum); err != nil {
			return err
		}
		got, err := cudatest.FromDevice[int64](devs[r], p, 2)
		if err != nil {
			return err
		}
		if want := int64(r%2*2 + 2); got[0] != want || got[1] != 20 {
			return fmt.Errorf("got %v, want [%d 20]", got, want)
		}
		return nil
	})
	// World rank 3 dies: group {1,3} fails naming it, group {0,2} works.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	p1 := cudatest.ToDevice(t, devs[1], []float32{1})
	go func() { done <- nccls[1].AllReduce(ctx, p1, p1, 1, collective.Float32, collective.Sum) }()
	time.Sleep(20 * time.Millisecond)
	w.Lose(3, "gone")
	var le *collective.LostError
	if err := <-done; !errors.As(err, &le) || le.WorldRank != 3 || le.Rank != nccls[1].Rank()^1 {
		t.Fatalf("rank 1: %v, want world rank 3 lost", err)
	}
	collectivetest.EachRank(t, 2, func(ctx context.Context, i int) error {
		r := 2 * i
		p := cudatest.ToDevice(t, devs[r], []float32{1})
		return nccls[r].AllReduce(ctx, p, p, 1, collective.Float32, collective.Sum)
	})
}

// TestNCCLOnGPU runs the NCCL backend on device 0 of the real driver, as a
// world of one rank (NCCL refuses two ranks on one GPU). It is skipped only
// when there is no CUDA driver.
func TestNCCLOnGPU(t *testing.T) {
	dev := cudatest.OpenGPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := collectivetest.NewWorld(1)
	c, err := nccl.New(ctx, w.Bootstrap(0), dev)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	in := []float32{1, 2.5, -3, 4}
	send := cudatest.ToDevice(t, dev, in)
	recv := cudatest.ToDevice(t, dev, make([]float32, 4))
	if err := c.AllReduce(ctx, send, recv, 4, collective.Float32, collective.Sum); err != nil {
		t.Fatal(err)
	}
	got, err := cudatest.FromDevice[float32](dev, recv, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := collectivetest.Compare("AllReduce", got, func(i int) float32 { return in[i] }); err != nil {
		t.Error(err)
	}
	if err := c.Broadcast(ctx, send, recv, 4, collective.Float32, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.AllGather(ctx, send, recv, 4, collective.Float32); err != nil {
		t.Fatal(err)
	}
	if err := c.ReduceScatter(ctx, send, recv, 4, collective.Float32, collective.Max); err != nil {
		t.Fatal(err)
	}
	if got, err = cudatest.FromDevice[float32](dev, recv, 4); err != nil {
		t.Fatal(err)
	}
	if err := collectivetest.Compare("ReduceScatter", got, func(i int) float32 { return in[i] }); err != nil {
		t.Error(err)
	}
}
