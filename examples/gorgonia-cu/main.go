//go:build cu

// Command gorgonia-cu shows a program that already uses Gorgonia's CUDA binding
// (gorgonia.org/cu) handing its device buffers and streams to gear. gear's
// cuda.DevicePtr and cuda.Stream are plain address-sized values, so a
// cu.DevicePtr converts directly and a cu.Stream's handle is read out of it; both
// libraries work in device 0's primary context, so no copies or context
// switches are involved.
//
// The example is a module of its own, built only with the `cu` build tag, so
// that gear's go.mod never requires gorgonia.org/cu (whose package init exits
// the process when cuInit fails, and which needs cuda.h and libcuda at build
// time). Its go.mod points github.com/gear-rl/gear at this repository. To run it
// on a GPU machine with the CUDA headers installed:
//
//	cd examples/gorgonia-cu
//	go run -tags cu .
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/gear-rl/gear/cuda"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gorgonia-cu:", err)
		os.Exit(1)
	}
}

// streamOf reads the CUstream handle out of a cu.Stream: one pointer-sized word
// in every version of gorgonia.org/cu (a uintptr in older ones, a struct holding
// the C pointer in newer ones).
func streamOf(s cu.Stream) cuda.Stream {
	if unsafe.Sizeof(s) != unsafe.Sizeof(uintptr(0)) {
		panic("cu.Stream is not one pointer-sized handle")
	}
	return *(*cuda.Stream)(unsafe.Pointer(&s))
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// gear: the driver and device 0's primary context.
	drv, err := cuda.OpenDriver()
	if err != nil {
		return err
	}
	dev, err := drv.Device(0)
	if err != nil {
		return err
	}
	defer dev.Close()

	// Gorgonia: the same primary context, current on this thread for cu's calls.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pctx, err := cu.Device(0).RetainPrimaryCtx()
	if err != nil {
		return err
	}
	defer cu.Device(0).ReleasePrimaryCtx()
	if err := cu.SetCurrentContext(pctx); err != nil {
		return err
	}

	// Priorities that a Gorgonia model computed, in a cu buffer, and its stream.
	prio := []float32{0.1, 4, 0, 2.5, 7, 0.3, 0, 1}
	bytes := int64(4 * len(prio))
	buf, err := cu.MemAlloc(bytes)
	if err != nil {
		return err
	}
	defer cu.MemFree(buf)
	if err := cu.MemcpyHtoD(buf, unsafe.Pointer(&prio[0]), bytes); err != nil {
		return err
	}
	stream, err := cu.MakeStream(cu.NonBlocking)
	if err != nil {
		return err
	}
	defer stream.Destroy()

	// gear selects on the GPU straight from Gorgonia's buffer, on its stream.
	s, err := dev.NewSampler()
	if err != nil {
		return err
	}
	defer s.Close()
	draws := cuda.UniformDraws(42, 8)
	picked := make([]int64, len(draws))
	if err := s.WeightedSample(ctx, streamOf(stream), cuda.DevicePtr(buf), len(prio), cuda.Float32, draws, picked); err != nil {
		return err
	}
	top := make([]int64, 3)
	if err := s.TopK(ctx, streamOf(stream), cuda.DevicePtr(buf), len(prio), cuda.Float32, top); err != nil {
		return err
	}
	fmt.Println("weighted sample:", picked)
	fmt.Println("top 3:", top)
	return nil
}
