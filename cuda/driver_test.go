package cuda_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

// The variables package cuda reads, by their names in the rank contract.
const (
	envCUDALib = "GEAR_CUDA_LIB"
	envNCCLLib = "GEAR_NCCL_LIB"
)

func TestEnvVariables(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{})
	t.Setenv(envCUDALib, libs.CUDA)
	if _, err := cuda.OpenDriver(); err != nil {
		t.Errorf("OpenDriver with %s set: %v", envCUDALib, err)
	}
	t.Setenv(envCUDALib, filepath.Join(t.TempDir(), "nothing.so"))
	if _, err := cuda.OpenDriver(); !errors.Is(err, cuda.ErrNoDriver) || !strings.Contains(err.Error(), "nothing.so") {
		t.Errorf("OpenDriver with %s naming a missing file: %v", envCUDALib, err)
	}
	t.Setenv(envNCCLLib, libs.NCCL)
	n, err := cuda.OpenNCCL()
	if err != nil {
		t.Fatalf("OpenNCCL with %s set: %v", envNCCLLib, err)
	}
	if n.Path() != libs.NCCL {
		t.Errorf("OpenNCCL loaded %s, want %s", n.Path(), libs.NCCL)
	}
}

func TestNoDriver(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	_, err := cuda.OpenDriver(cuda.WithLibrary(missing))
	if !errors.Is(err, cuda.ErrNoDriver) {
		t.Fatalf("OpenDriver(missing): got %v, want ErrNoDriver", err)
	}
	if !strings.HasPrefix(err.Error(), "cuda: no CUDA driver: ") || !strings.Contains(err.Error(), missing) {
		t.Errorf("error text %q: want the prefix and the path", err)
	}
	// A library that is not a driver.
	libs := cudatest.Build(t, cudatest.Options{})
	_, err = cuda.OpenDriver(cuda.WithLibrary(libs.NCCL))
	if !errors.Is(err, cuda.ErrNoDriver) || !strings.Contains(err.Error(), "lacks cuInit") {
		t.Errorf("OpenDriver(libnccl): got %v, want ErrNoDriver naming cuInit", err)
	}
	// Every CPU path works without a driver.
	out := make([]int64, 2)
	if err := cuda.WeightedSampleCPU([]float32{0, 1, 3}, []float64{0.1, 0.9}, out); err != nil || out[0] != 1 || out[1] != 2 {
		t.Errorf("WeightedSampleCPU without a driver: %v %v", out, err)
	}
}

func TestInitFailureIsNoDriver(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{InitError: 100})
	_, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if !errors.Is(err, cuda.ErrNoDriver) {
		t.Fatalf("got %v, want ErrNoDriver", err)
	}
	var cerr *cuda.Error
	if !errors.As(err, &cerr) || cerr.Code != cuda.ErrorNoDevice || cerr.Func != "cuInit" {
		t.Fatalf("got %#v, want a cuInit CUDA_ERROR_NO_DEVICE", cerr)
	}
	want := "cuda: no CUDA driver: cuInit: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected"
	if err.Error() != want {
		t.Errorf("error text\n got %q\nwant %q", err, want)
	}
}

func TestDeviceInfo(t *testing.T) {
	f := openFake(t, 1)
	if v := f.drv.Version(); v != 13000 {
		t.Errorf("Version = %d", v)
	}
	n, err := f.drv.DeviceCount()
	if err != nil || n != 2 {
		t.Errorf("DeviceCount = %d, %v", n, err)
	}
	name, err := f.dev.Name()
	if err != nil || name != "Fake GPU 1 (gear cudatest)" {
		t.Errorf("Name = %q, %v", name, err)
	}
	major, minor, err := f.dev.ComputeCapability()
	if err != nil || major != 9 || minor != 0 {
		t.Errorf("ComputeCapability = %d.%d, %v", major, minor, err)
	}
	sms, err := f.dev.Attribute(cuda.AttrMultiprocessorCount)
	if err != nil || sms != 132 {
		t.Errorf("SMs = %d, %v", sms, err)
	}
	mem, err := f.dev.TotalMemory()
	if err != nil || mem != 80<<30 {
		t.Errorf("TotalMemory = %d, %v", mem, err)
	}
	if _, err := f.drv.Device(7); err == nil {
		t.Error("Device(7) of 2 succeeded")
	} else if !strings.HasPrefix(err.Error(), "cuda: cuDeviceGet: CUDA_ERROR_INVALID_DEVICE (101)") {
		t.Errorf("Device(7): %v", err)
	}
}

func TestErrorText(t *testing.T) {
	f := openFake(t, 0)
	f.cu.Fail("cuMemAlloc_v2", 2, 1)
	_, err := f.dev.Alloc(1 << 20)
	want := "cuda: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	var cerr *cuda.Error
	if !errors.As(err, &cerr) || cerr.Code != cuda.ErrorOutOfMemory {
		t.Errorf("not an *Error with the code: %#v", err)
	}
	// A code the driver cannot name falls back to gear's table, then to a
	// generic name.
	f.cu.Fail("cuMemAlloc_v2", 46, 1)
	if _, err := f.dev.Alloc(8); err == nil || err.Error() != "cuda: cuMemAlloc_v2: CUDA_ERROR_DEVICE_UNAVAILABLE (46)" {
		t.Errorf("unnamed code: %v", err)
	}
	f.cu.Fail("cuMemAlloc_v2", 12345, 1)
	if _, err := f.dev.Alloc(8); err == nil || err.Error() != "cuda: cuMemAlloc_v2: CUDA_ERROR_UNKNOWN_CODE (12345)" {
		t.Errorf("unknown code: %v", err)
	}
	// And the allocation works again.
	p, err := f.dev.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.dev.Free(p); err != nil {
		t.Fatal(err)
	}
	if err := f.dev.Free(p); err == nil || !strings.Contains(err.Error(), "cuMemFree_v2: CUDA_ERROR_INVALID_VALUE") {
		t.Errorf("double free: %v", err)
	}
}

func TestMemoryAndCopies(t *testing.T) {
	f := openFake(t, 0)
	dev := f.dev
	before := f.cu.Live(cudatest.LiveDeviceAllocs)

	// Pinned, mapped, portable host memory.
	host, err := dev.AllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	if fl := f.cu.HostFlags(unsafe.Pointer(&host[0])); fl != 3 {
		t.Errorf("cuMemHostAlloc flags = %#x, want PORTABLE|DEVICEMAP", fl)
	}
	hp, err := dev.HostDevicePointer(host)
	if err != nil || hp == 0 {
		t.Errorf("HostDevicePointer(AllocHost) = %#x, %v", hp, err)
	}
	for i := range host {
		host[i] = byte(i * 7)
	}

	// Device memory round trip, synchronous and on a stream.
	d, err := dev.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CopyHtoD(d, host); err != nil {
		t.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	d2, err := dev.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CopyDtoDAsync(d2, d, 4096, s); err != nil {
		t.Fatal(err)
	}
	if err := dev.MemsetAsync(d2.Add(100), 0xff, 10, s); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 4096)
	if err := dev.CopyDtoHAsync(back, d2, s); err != nil {
		t.Fatal(err)
	}
	if err := dev.StreamSynchronize(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	for i := range back {
		want := byte(i * 7)
		if i >= 100 && i < 110 {
			want = 0xff
		}
		if back[i] != want {
			t.Fatalf("byte %d: got %#x, want %#x", i, back[i], want)
		}
	}
	// A copy past the end of an allocation is refused.
	if err := dev.CopyHtoD(d.Add(4000), host[:200]); err == nil {
		t.Error("copy past the allocation succeeded")
	}

	// Registered host memory (as a shard's column table).
	table := make([]byte, 1<<16)
	tp, err := dev.RegisterHost(table)
	if err != nil {
		t.Fatal(err)
	}
	if tp != cuda.DevicePtr(uintptr(unsafe.Pointer(&table[0]))) {
		t.Errorf("fake device pointer %#x of registered memory is not its address", tp)
	}
	if fl := f.cu.HostFlags(unsafe.Pointer(&table[0])); fl != 3 {
		t.Errorf("cuMemHostRegister_v2 flags = %#x, want PORTABLE|DEVICEMAP", fl)
	}
	if _, err := dev.RegisterHost(table[100:200]); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED") {
		t.Errorf("registering twice: %v", err)
	}
	if err := dev.UnregisterHost(table); err != nil {
		t.Fatal(err)
	}
	if err := dev.UnregisterHost(table); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED (713)") {
		t.Errorf("unregistering twice: %v", err)
	}

	// Events time the stream.
	e1, _ := dev.NewEvent()
	e2, _ := dev.NewEvent()
	if err := dev.Record(e1, s); err != nil {
		t.Fatal(err)
	}
	if err := dev.Record(e2, s); err != nil {
		t.Fatal(err)
	}
	if err := dev.EventSynchronize(context.Background(), e2); err != nil {
		t.Fatal(err)
	}
	if el, err := dev.Elapsed(e1, e2); err != nil || el < 0 {
		t.Errorf("Elapsed = %v, %v", el, err)
	}
	for _, e := range []cuda.Event{e1, e2} {
		if err := dev.DestroyEvent(e); err != nil {
			t.Error(err)
		}
	}
	if err := dev.Synchronize(context.Background()); err != nil {
		t.Error(err)
	}
	for _, p := range []cuda.DevicePtr{d, d2} {
		if err := dev.Free(p); err != nil {
			t.Error(err)
		}
	}
	if err := dev.FreeHost(host); err != nil {
		t.Error(err)
	}
	if err := dev.DestroyStream(s); err != nil {
		t.Error(err)
	}
	for kind, want := range map[int]int{cudatest.LiveDeviceAllocs: before, cudatest.LiveHostAllocs: 0, cudatest.LiveRegistrations: 0, cudatest.LiveStreams: 0, cudatest.LiveEvents: 0} {
		if got := f.cu.Live(kind); got != want {
			t.Errorf("live objects of kind %d: %d, want %d", kind, got, want)
		}
	}
}

func TestStreamWaitHonoursContext(t *testing.T) {
	f := openFake(t, 0)
	s := f.stream(t)
	f.cu.Hold(uintptr(s), 1)
	if done, err := f.dev.StreamDone(s); done || err != nil {
		t.Fatalf("StreamDone on a busy stream = %v, %v", done, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := f.dev.StreamSynchronize(ctx, s); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("StreamSynchronize on a busy stream: %v", err)
	}
	f.cu.Hold(uintptr(s), -1)
	if err := f.dev.StreamSynchronize(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// probePTX declares one kernel with parameters of every width gear passes.
const probePTX = `
.version 7.8
.target sm_80
.address_size 64

.visible .entry probe(
	.param .u64 probe_param_0,
	.param .u32 probe_param_1,
	.param .f32 probe_param_2,
	.param .f64 probe_param_3,
	.param .u8 probe_param_4,
	.param .s64 probe_param_5,
	.param .align 8 .b8 probe_param_6[8]
)
{
	ret;
}
`

func TestLaunchPassesParameters(t *testing.T) {
	f := openFake(t, 0)
	mod, err := f.dev.LoadModule(probePTX)
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Unload()
	fn, err := mod.Function("probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mod.Function("nope"); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_NOT_FOUND (500)") {
		t.Errorf("missing kernel: %v", err)
	}
	s, _ := f.dev.NewStream()
	defer f.dev.DestroyStream(s)
	cfg := cuda.LaunchConfig{Grid: cuda.Dim3{X: 7, Y: 3}, Block: cuda.Dim3{X: 128, Y: 2}, SharedMem: 1024, Stream: s}
	args := []any{cuda.DevicePtr(0x1122334455667788), uint32(0xdeadbeef), float32(1.5), math.Pi, uint8(0x7f), int64(-42), uint64(0x0102030405060708)}
	if err := f.dev.Launch(fn, cfg, args...); err != nil {
		t.Fatal(err)
	}
	l := f.cu.LastLaunch()
	if l.Name != "probe" || l.Grid != [3]uint32{7, 3, 1} || l.Block != [3]uint32{128, 2, 1} || l.SharedMem != 1024 || l.Stream != uintptr(s) {
		t.Errorf("launch recorded as %+v", l)
	}
	le := binary.LittleEndian
	want := [][]byte{
		le.AppendUint64(nil, 0x1122334455667788),
		le.AppendUint32(nil, 0xdeadbeef),
		le.AppendUint32(nil, math.Float32bits(1.5)),
		le.AppendUint64(nil, math.Float64bits(math.Pi)),
		{0x7f},
		le.AppendUint64(nil, uint64(0xffffffffffffffd6)),
		le.AppendUint64(nil, 0x0102030405060708),
	}
	if len(l.Params) != len(want) {
		t.Fatalf("%d parameters recorded, want %d", len(l.Params), len(want))
	}
	for i := range want {
		if string(l.Params[i]) != string(want[i]) {
			t.Errorf("parameter %d: got % x, want % x", i, l.Params[i], want[i])
		}
	}
	if err := f.dev.Launch(fn, cuda.LaunchConfig{Grid: cuda.Dim3{X: 1}, Block: cuda.Dim3{X: 2048}}, args...); err == nil ||
		!strings.Contains(err.Error(), "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE") || !strings.Contains(err.Error(), "probe") {
		t.Errorf("oversized block: %v", err)
	}
	if err := f.dev.Launch(fn, cfg, "not a parameter"); err == nil {
		t.Error("a string kernel argument was accepted")
	}
}

func TestLoadModuleRejectsBadPTX(t *testing.T) {
	f := openFake(t, 0)
	if _, err := f.dev.LoadModule("not ptx"); err == nil || !strings.Contains(err.Error(), "cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE") {
		t.Errorf("garbage: %v", err)
	}
	newer := strings.Replace(probePTX, ".version 7.8", ".version 9.9", 1)
	if _, err := f.dev.LoadModule(newer); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)") {
		t.Errorf("PTX too new: %v", err)
	}
}

func TestEmbeddedPTXLoads(t *testing.T) {
	// The fake checks every gear kernel's PTX parameters against the C++
	// signature it runs, so a launch cannot silently misread an argument.
	f := openFake(t, 0)
	mod, err := f.dev.LoadModule(cuda.PTX())
	if err != nil {
		t.Fatal(err)
	}
	if err := mod.Unload(); err != nil {
		t.Fatal(err)
	}
}

func TestContextIsCurrentOnEveryThread(t *testing.T) {
	// The fake refuses calls on threads without a current context; many
	// goroutines on many threads must all succeed.
	f := openFake(t, 0)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 16 {
		wg.Go(func() {
			for range 20 {
				p, err := f.dev.Alloc(64)
				if err != nil {
					errs <- err
					return
				}
				if err := f.dev.Free(p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCloseReleasesTheContext(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{})
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		t.Fatal(err)
	}
	fc := cudatest.OpenFakeCUDA(t, libs.CUDA)
	refs := fc.Live(cudatest.LiveContextRefs)
	mods := fc.Live(cudatest.LiveModules)
	dev, err := drv.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	s, err := dev.NewSampler() // loads gear's module
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, 1)
	w := []float64{1, 2}
	wd, _ := dev.Alloc(16)
	_ = dev.CopyHtoD(wd, cudatest.Bytes(w))
	if err := s.WeightedSample(context.Background(), 0, wd, 2, cuda.Float64, []float64{0.9}, out); err != nil || out[0] != 1 {
		t.Fatalf("WeightedSample = %v, %v", out, err)
	}
	_ = dev.Free(wd)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fc.Live(cudatest.LiveModules); got != mods+1 {
		t.Errorf("modules: %d, want %d", got, mods+1)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := fc.Live(cudatest.LiveContextRefs); got != refs {
		t.Errorf("context references after Close: %d, want %d", got, refs)
	}
	if got := fc.Live(cudatest.LiveModules); got != mods {
		t.Errorf("modules after Close: %d, want %d", got, mods)
	}
	if _, err := dev.Alloc(8); !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("Alloc after Close: %v", err)
	}
}

func TestNCCLCandidates(t *testing.T) {
	home := t.TempDir()
	venv := t.TempDir()
	mk := func(dir string) string {
		p := filepath.Join(dir, "nvidia", "nccl", "lib", "libnccl.so.2")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	user10 := mk(filepath.Join(home, ".local", "lib", "python3.10", "site-packages"))
	user12 := mk(filepath.Join(home, ".local", "lib", "python3.12", "site-packages"))
	env := mk(filepath.Join(venv, "lib", "python3.11", "site-packages"))
	t.Setenv("HOME", home)
	t.Setenv("VIRTUAL_ENV", venv)
	t.Setenv("CONDA_PREFIX", "")
	t.Setenv(envNCCLLib, "")
	got := cuda.NCCLCandidates()
	pos := map[string]int{}
	for i, p := range got {
		pos[p] = i + 1
	}
	if got[0] != "libnccl.so.2" {
		t.Errorf("first candidate %q, want the loader's", got[0])
	}
	if !(pos[env] > 0 && pos[user12] > pos[env] && pos[user10] > pos[user12]) {
		t.Errorf("candidates %q: want the virtualenv, then the user's newest Python first", got)
	}
	t.Setenv(envNCCLLib, "/opt/nccl/libnccl.so.2")
	if got := cuda.NCCLCandidates(); len(got) != 1 || got[0] != "/opt/nccl/libnccl.so.2" {
		t.Errorf("with %s set: %q", envNCCLLib, got)
	}
}

// Memory freed after its device is closed is refused twice over: by Device
// (ErrClosed), and by the fake driver itself, which destroys a primary
// context's memory with its last reference as the real driver does, so a free
// through the device retained anew fails too. While another Device holds the
// context, the memory lives on.
func TestFreeAfterCloseIsRefused(t *testing.T) {
	libs := cudatest.Build(t, cudatest.Options{})
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		t.Fatal(err)
	}
	fc := cudatest.OpenFakeCUDA(t, libs.CUDA)
	reclaimed := fc.Live(cudatest.Reclaimed)

	a, b := cudatest.OpenDevice(t, drv, 1), cudatest.OpenDevice(t, drv, 1)
	p, err := a.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(p); !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("Free after Close: %v, want ErrClosed", err)
	}
	if err := b.Free(p); err != nil { // b still holds the context
		t.Fatalf("Free through a device that holds the context: %v", err)
	}

	p, err = b.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil { // the last reference: the context goes
		t.Fatal(err)
	}
	if got := fc.Live(cudatest.Reclaimed) - reclaimed; got != 2 {
		t.Errorf("%d objects destroyed with the context, want 2 (the memory and the stream)", got)
	}
	c := cudatest.OpenDevice(t, drv, 1)
	var ce *cuda.Error
	if err := c.Free(p); !errors.As(err, &ce) || ce.Code != cuda.ErrorInvalidValue {
		t.Errorf("Free of memory destroyed with its context: %v, want CUDA_ERROR_INVALID_VALUE", err)
	}
	if err := c.DestroyStream(s); !errors.As(err, &ce) || ce.Code != cuda.ErrorInvalidHandle {
		t.Errorf("DestroyStream of a stream destroyed with its context: %v, want CUDA_ERROR_INVALID_HANDLE", err)
	}
}

// TestFailReachesEveryCall checks that the fake's Fail makes the next call of
// each driver function gear uses fail with the injected code, once, and only
// that function's calls (EventSynchronize waits without cuEventQuery).
func TestFailReachesEveryCall(t *testing.T) {
	f := openFake(t, 0)
	dev := f.dev
	ctx := context.Background()
	s := f.stream(t)
	ev, err := dev.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer dev.DestroyEvent(ev)
	if err := dev.Record(ev, s); err != nil {
		t.Fatal(err)
	}
	buf, err := dev.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(buf)
	host := make([]byte, 64)
	calls := []struct {
		fn   string
		call func() error
	}{
		{"cuStreamWaitEvent", func() error { return dev.StreamWaitEvent(s, ev) }},
		{"cuEventRecord", func() error { return dev.Record(ev, s) }},
		{"cuMemsetD8Async", func() error { return dev.MemsetAsync(buf, 0, 64, s) }},
		{"cuMemcpyDtoDAsync_v2", func() error { return dev.CopyDtoDAsync(buf, buf.Add(32), 32, s) }},
		{"cuMemcpyHtoDAsync_v2", func() error { return dev.CopyHtoDAsync(buf, host, s) }},
		{"cuStreamSynchronize", func() error { return dev.StreamSynchronize(ctx, s) }},
		{"cuStreamQuery", func() error { _, err := dev.StreamDone(s); return err }},
		{"cuEventQuery", func() error { _, err := dev.EventDone(ev); return err }},
		{"cuEventSynchronize", func() error { return dev.EventSynchronize(ctx, ev) }},
		{"cuEventElapsedTime_v2", func() error { _, err := dev.Elapsed(ev, ev); return err }},
		{"cuStreamCreate", func() error {
			s2, err := dev.NewStream()
			if err == nil {
				err = dev.DestroyStream(s2)
			}
			return err
		}},
		{"cuEventCreate", func() error {
			e2, err := dev.NewEvent()
			if err == nil {
				err = dev.DestroyEvent(e2)
			}
			return err
		}},
	}
	for _, c := range calls {
		f.cu.Fail(c.fn, 2, 1) // CUDA_ERROR_OUT_OF_MEMORY
		if err := c.call(); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
			t.Errorf("%s after Fail: %v, want CUDA_ERROR_OUT_OF_MEMORY", c.fn, err)
		}
		if err := c.call(); err != nil {
			t.Errorf("%s a second time: %v, want the failure spent", c.fn, err)
		}
	}
}
