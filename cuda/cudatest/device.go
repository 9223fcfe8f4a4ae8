package cudatest

import (
	"errors"
	"os"
	"testing"
	"unsafe"

	"github.com/gear-rl/gear/cuda"
)

// ToDevice copies xs into new memory on dev, which is freed (and the free
// checked) when the test ends. Cleanups run last in, first out, so dev must
// have been opened with a cleanup registered earlier (OpenGPU, OpenDevice),
// never closed by a defer of the test function, which runs before every
// cleanup: memory freed after its device is closed fails, on the real driver
// and on the fake alike.
func ToDevice[T any](tb testing.TB, dev *cuda.Device, xs []T) cuda.DevicePtr {
	tb.Helper()
	b := Bytes(xs)
	p, err := dev.Alloc(max(len(b), 8))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := dev.Free(p); err != nil {
			tb.Errorf("Free: %v", err)
		}
	})
	if err := dev.CopyHtoD(p, b); err != nil {
		tb.Fatal(err)
	}
	return p
}

// FromDevice reads n elements of T at p on dev.
func FromDevice[T any](dev *cuda.Device, p cuda.DevicePtr, n int) ([]T, error) {
	out := make([]T, n)
	return out, dev.CopyDtoH(Bytes(out), p)
}

// Bytes is the memory of xs as bytes (nil for none).
func Bytes[T any](xs []T) []byte {
	if len(xs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&xs[0])), len(xs)*int(unsafe.Sizeof(xs[0])))
}

// OpenDriver opens the system's CUDA driver, or skips the test when there is
// none (a machine without a GPU); any other error fails it.
func OpenDriver(tb testing.TB) *cuda.Driver {
	tb.Helper()
	drv, err := cuda.OpenDriver()
	if errors.Is(err, cuda.ErrNoDriver) {
		tb.Skipf("skipping: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return drv
}

// OpenDevice retains device ordinal of drv, closed (and the close checked) when
// the test ends, after the cleanups registered later (ToDevice's frees).
func OpenDevice(tb testing.TB, drv *cuda.Driver, ordinal int) *cuda.Device {
	tb.Helper()
	dev, err := drv.Device(ordinal)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := dev.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return dev
}

// OpenGPU opens device 0 of the system's CUDA driver (OpenDriver), closed (and
// the close checked) when the test ends.
func OpenGPU(tb testing.TB) *cuda.Device {
	tb.Helper()
	return OpenDevice(tb, OpenDriver(tb), 0)
}

// BenchDevice is the device a GPU benchmark runs on: device 0 of the fake
// driver (Build) when GEAR_BENCH_FAKE=1, whose library path it also returns,
// else device 0 of the system's driver (OpenGPU: skipped without one, lib "").
// Figures from the fake say nothing of a GPU; it checks that the benchmark
// runs.
func BenchDevice(tb testing.TB) (dev *cuda.Device, lib string) {
	tb.Helper()
	if os.Getenv("GEAR_BENCH_FAKE") != "1" {
		return OpenGPU(tb), ""
	}
	libs := Build(tb, Options{})
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		tb.Fatal(err)
	}
	return OpenDevice(tb, drv, 0), libs.CUDA
}
