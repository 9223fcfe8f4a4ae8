package cuda_test

import (
	"errors"
	"testing"
	"unsafe"

	"go.uber.org/goleak"

	"gear/cuda"
	"gear/cuda/cudatest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fake is a device of the fake driver, with the fake's inspector.
type fake struct {
	libs cudatest.Libs
	drv  *cuda.Driver
	dev  *cuda.Device
	cu   *cudatest.FakeCUDA
}

// openFake loads the fake driver and retains device ordinal; the device is
// closed when the test ends.
func openFake(t *testing.T, ordinal int) *fake {
	t.Helper()
	libs := cudatest.Build(t, cudatest.Options{})
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		t.Fatalf("OpenDriver(fake): %v", err)
	}
	dev, err := drv.Device(ordinal)
	if err != nil {
		t.Fatalf("Device(%d): %v", ordinal, err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &fake{libs: libs, drv: drv, dev: dev, cu: cudatest.OpenFakeCUDA(t, libs.CUDA)}
}

// openGPU opens device 0 of the real driver, or skips the test when there is
// no CUDA driver.
func openGPU(t *testing.T) *cuda.Device {
	t.Helper()
	drv, err := cuda.OpenDriver()
	if errors.Is(err, cuda.ErrNoDriver) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dev, err := drv.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return dev
}

// onDevices runs fn on the fake device and on the real GPU (skipped without a
// driver): one suite for both. gpu tells fn which one it has, for sizes the
// fake would take too long to emulate.
func onDevices(t *testing.T, fn func(t *testing.T, dev *cuda.Device, gpu bool)) {
	t.Run("fake", func(t *testing.T) { fn(t, openFake(t, 0).dev, false) })
	t.Run("gpu", func(t *testing.T) { fn(t, openGPU(t), true) })
}

// toDevice copies xs into new device memory, freed when the test ends.
func toDevice[T any](t *testing.T, dev *cuda.Device, xs []T) cuda.DevicePtr {
	t.Helper()
	b := asBytes(xs)
	p, err := dev.Alloc(max(len(b), 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Free(p); err != nil {
			t.Errorf("Free: %v", err)
		}
	})
	if err := dev.CopyHtoD(p, b); err != nil {
		t.Fatal(err)
	}
	return p
}

func asBytes[T any](xs []T) []byte {
	if len(xs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&xs[0])), len(xs)*int(unsafe.Sizeof(xs[0])))
}
