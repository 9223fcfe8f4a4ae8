package cuda_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
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

// stream creates a stream on f's device, destroyed when the test ends (before
// the device is closed).
func (f *fake) stream(t *testing.T) cuda.Stream {
	t.Helper()
	s, err := f.dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.dev.DestroyStream(s); err != nil {
			t.Errorf("DestroyStream: %v", err)
		}
	})
	return s
}

// onDevices runs fn on the fake device and on the real GPU (skipped without a
// driver): one suite for both. gpu tells fn which one it has, for sizes the
// fake would take too long to emulate.
func onDevices(t *testing.T, fn func(t *testing.T, dev *cuda.Device, gpu bool)) {
	t.Run("fake", func(t *testing.T) { fn(t, openFake(t, 0).dev, false) })
	t.Run("gpu", func(t *testing.T) { fn(t, cudatest.OpenGPU(t), true) })
}
