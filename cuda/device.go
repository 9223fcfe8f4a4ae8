package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// DevicePtr is a CUdeviceptr: an address in the device's (unified) address space.
// It is a plain address-sized value, so buffers from other CUDA bindings (for
// example Gorgonia's cu.DevicePtr) convert to it directly.
type DevicePtr uintptr

// Add returns p + off bytes.
func (p DevicePtr) Add(off int) DevicePtr { return p + DevicePtr(off) }

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int32

// Device attributes gear reads.
const (
	AttrMaxThreadsPerBlock                DeviceAttribute = 1
	AttrMaxGridDimX                       DeviceAttribute = 5
	AttrMaxGridDimY                       DeviceAttribute = 6
	AttrMaxSharedMemoryPerBlock           DeviceAttribute = 8
	AttrWarpSize                          DeviceAttribute = 10
	AttrClockRate                         DeviceAttribute = 13
	AttrMultiprocessorCount               DeviceAttribute = 16
	AttrIntegrated                        DeviceAttribute = 18
	AttrCanMapHostMemory                  DeviceAttribute = 19
	AttrPCIBusID                          DeviceAttribute = 33
	AttrPCIDeviceID                       DeviceAttribute = 34
	AttrMemoryClockRate                   DeviceAttribute = 36
	AttrGlobalMemoryBusWidth              DeviceAttribute = 37
	AttrUnifiedAddressing                 DeviceAttribute = 41
	AttrComputeCapabilityMajor            DeviceAttribute = 75
	AttrComputeCapabilityMinor            DeviceAttribute = 76
	AttrHostRegisterSupported             DeviceAttribute = 99
	AttrPageableMemoryAccess              DeviceAttribute = 88
	AttrCanUseHostPointerForRegisteredMem DeviceAttribute = 91
)

// Flags of cuMemHostAlloc and cuMemHostRegister.
const (
	hostPortable  = 0x01
	hostDeviceMap = 0x02
)

// Device is one CUDA device with its primary context retained. Every method makes
// the primary context current on the calling OS thread for the duration of the
// call, so a Device may be used from any goroutine, and concurrently.
type Device struct {
	drv     *Driver
	ordinal int
	handle  int32
	ctx     uintptr
	closed  atomic.Bool

	closeOnce sync.Once
	closeErr  error

	kernelsOnce sync.Once
	kernels     *gearKernels
	kernelsErr  error
}

// Driver is the driver the device came from.
func (dev *Device) Driver() *Driver { return dev.drv }

// Ordinal is the device's index among the visible devices.
func (dev *Device) Ordinal() int { return dev.ordinal }

// Context is the primary context (a CUcontext), for passing to other bindings.
func (dev *Device) Context() uintptr { return dev.ctx }

// do runs f with the primary context current on a locked OS thread.
func (dev *Device) do(f func() error) error {
	if dev.closed.Load() {
		return fmt.Errorf("%w: device %d", ErrClosed, dev.ordinal)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := dev.drv.check("cuCtxSetCurrent", ccall(dev.drv.fn.cuCtxSetCurrent, dev.ctx)); err != nil {
		return err
	}
	return f()
}

// call runs one driver function with the primary context current.
//
//go:uintptrescapes
func (dev *Device) call(name string, fn uintptr, args ...uintptr) error {
	if dev.closed.Load() {
		return fmt.Errorf("%w: device %d", ErrClosed, dev.ordinal)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := dev.drv.check("cuCtxSetCurrent", ccall(dev.drv.fn.cuCtxSetCurrent, dev.ctx)); err != nil {
		return err
	}
	return dev.drv.check(name, ccall(fn, args...))
}

// Close unloads gear's kernels and releases the primary context. Memory,
// streams, events and modules of the device must be freed first. Close is
// idempotent; calls after it return ErrClosed.
func (dev *Device) Close() error {
	dev.closeOnce.Do(func() {
		dev.kernelsOnce.Do(func() {}) // waits for a load in progress; none starts after
		var errs []error
		if dev.kernels != nil {
			errs = append(errs, dev.kernels.mod.Unload())
		}
		dev.closed.Store(true)
		errs = append(errs, dev.drv.check("cuDevicePrimaryCtxRelease_v2", ccall(dev.drv.fn.cuDevicePrimaryCtxRelease, uintptr(dev.handle))))
		dev.closeErr = errors.Join(errs...)
	})
	return dev.closeErr
}

// Name is the device's product name.
func (dev *Device) Name() (string, error) {
	buf := make([]byte, 256)
	if err := dev.drv.check("cuDeviceGetName", ccall(dev.drv.fn.cuDeviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev.handle))); err != nil {
		return "", err
	}
	for i, b := range buf {
		if b == 0 {
			return string(buf[:i]), nil
		}
	}
	return string(buf), nil
}

// Attribute reads one device attribute.
func (dev *Device) Attribute(a DeviceAttribute) (int, error) {
	var v int32
	if err := dev.drv.check("cuDeviceGetAttribute", ccall(dev.drv.fn.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(dev.handle))); err != nil {
		return 0, err
	}
	return int(v), nil
}

// ComputeCapability is the device's SM version, e.g. 9, 0 for an H100.
func (dev *Device) ComputeCapability() (major, minor int, err error) {
	if major, err = dev.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	minor, err = dev.Attribute(AttrComputeCapabilityMinor)
	return major, minor, err
}

// TotalMemory is the device's memory in bytes.
func (dev *Device) TotalMemory() (int64, error) {
	var n uint64
	if err := dev.drv.check("cuDeviceTotalMem_v2", ccall(dev.drv.fn.cuDeviceTotalMem, uintptr(unsafe.Pointer(&n)), uintptr(dev.handle))); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// Synchronize waits until all work on the device's primary context is done
// (cuCtxSynchronize). The driver call cannot be interrupted: if ctx ends first,
// Synchronize returns ctx's error while a goroutine stays in the call until the
// device's work ends. Work that can wait on other processes (NCCL) should be
// waited for through NCCLComm, whose waits abort instead.
func (dev *Device) Synchronize(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ctx.Done() == nil {
		return dev.call("cuCtxSynchronize", dev.drv.fn.cuCtxSynchronize)
	}
	done := make(chan error, 1)
	go func() { done <- dev.call("cuCtxSynchronize", dev.drv.fn.cuCtxSynchronize) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("cuda: cuCtxSynchronize: %w", ctx.Err())
	}
}

// Alloc allocates bytes of device memory (cuMemAlloc_v2). Free releases it.
func (dev *Device) Alloc(bytes int) (DevicePtr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda: cuMemAlloc_v2: size %d must be positive", bytes)
	}
	var p uintptr
	err := dev.call("cuMemAlloc_v2", dev.drv.fn.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(bytes))
	return DevicePtr(p), err
}

// Free releases device memory from Alloc. Freeing 0 does nothing.
func (dev *Device) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	return dev.call("cuMemFree_v2", dev.drv.fn.cuMemFree, uintptr(p))
}

// AllocHost allocates bytes of pinned (page-locked) host memory, mapped into the
// device's address space and portable to every context (cuMemHostAlloc with
// CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP). The slice belongs to the
// caller until FreeHost; the Go garbage collector does not manage it.
func (dev *Device) AllocHost(bytes int) ([]byte, error) {
	if bytes <= 0 {
		return nil, fmt.Errorf("cuda: cuMemHostAlloc: size %d must be positive", bytes)
	}
	var p unsafe.Pointer
	if err := dev.call("cuMemHostAlloc", dev.drv.fn.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(bytes), hostPortable|hostDeviceMap); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), bytes), nil
}

// FreeHost releases memory from AllocHost.
func (dev *Device) FreeHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return dev.call("cuMemFreeHost", dev.drv.fn.cuMemFreeHost, uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// RegisterHost page-locks existing host memory (typically a shard's column table
// in shared memory) and maps it for the device, portable to every context
// (cuMemHostRegister_v2 with CU_MEMHOSTREGISTER_PORTABLE |
// CU_MEMHOSTREGISTER_DEVICEMAP), and returns its device pointer
// (cuMemHostGetDevicePointer_v2). Kernels then read it over PCIe without a copy.
//
// b must stay mapped until UnregisterHost: it must be memory the Go garbage
// collector does not own (mmap'd shared memory, or AllocHost), never a Go slice.
func (dev *Device) RegisterHost(b []byte) (DevicePtr, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("cuda: cuMemHostRegister_v2: empty buffer")
	}
	base := unsafe.Pointer(unsafe.SliceData(b))
	var dp uintptr
	err := dev.do(func() error {
		if err := dev.drv.check("cuMemHostRegister_v2", ccall(dev.drv.fn.cuMemHostRegister, uintptr(base), uintptr(len(b)), hostPortable|hostDeviceMap)); err != nil {
			return err
		}
		if err := dev.drv.check("cuMemHostGetDevicePointer_v2", ccall(dev.drv.fn.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&dp)), uintptr(base), 0)); err != nil {
			_ = ccall(dev.drv.fn.cuMemHostUnregister, uintptr(base))
			return err
		}
		return nil
	})
	return DevicePtr(dp), err
}

// HostDevicePointer returns the device pointer of host memory that is registered
// (RegisterHost) or allocated mapped (AllocHost).
func (dev *Device) HostDevicePointer(b []byte) (DevicePtr, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("cuda: cuMemHostGetDevicePointer_v2: empty buffer")
	}
	var dp uintptr
	err := dev.call("cuMemHostGetDevicePointer_v2", dev.drv.fn.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&dp)), uintptr(unsafe.Pointer(unsafe.SliceData(b))), 0)
	return DevicePtr(dp), err
}

// UnregisterHost undoes RegisterHost. No kernel may still be reading b.
func (dev *Device) UnregisterHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return dev.call("cuMemHostUnregister", dev.drv.fn.cuMemHostUnregister, uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// CopyHtoD copies src to device memory at dst and returns when the copy is
// done on the device: work enqueued afterwards on any stream sees it. From
// pageable memory cuMemcpyHtoD returns once the driver has staged src, while
// its DMA may still be under way on the legacy default stream, which the
// streams of NewStream do not wait for (on an H200 a gather kernel ran before
// a fill copied this way and was overwritten by it); CopyHtoD then waits for
// that stream.
func (dev *Device) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := dev.call("cuMemcpyHtoD_v2", dev.drv.fn.cuMemcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src))); err != nil {
		return err
	}
	return dev.call("cuStreamSynchronize", dev.drv.fn.cuStreamSynchronize, 0)
}

// CopyDtoH copies len(dst) bytes from device memory at src and returns when the
// copy is done.
func (dev *Device) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return dev.call("cuMemcpyDtoH_v2", dev.drv.fn.cuMemcpyDtoH, uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(src), uintptr(len(dst)))
}

// CopyHtoDAsync enqueues a copy of src to dst on stream s. src must stay alive
// and unchanged until s has passed the copy; it is asynchronous only when src is
// pinned (AllocHost or RegisterHost), otherwise the driver stages it first.
func (dev *Device) CopyHtoDAsync(dst DevicePtr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	return dev.call("cuMemcpyHtoDAsync_v2", dev.drv.fn.cuMemcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src)), uintptr(s))
}

// CopyDtoHAsync enqueues a copy of len(dst) bytes from src into dst on stream s.
// dst must stay alive, and unread, until s has passed the copy.
func (dev *Device) CopyDtoHAsync(dst []byte, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return dev.call("cuMemcpyDtoHAsync_v2", dev.drv.fn.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(src), uintptr(len(dst)), uintptr(s))
}

// CopyDtoDAsync enqueues a device-to-device copy of bytes on stream s.
func (dev *Device) CopyDtoDAsync(dst, src DevicePtr, bytes int, s Stream) error {
	if bytes == 0 {
		return nil
	}
	return dev.call("cuMemcpyDtoDAsync_v2", dev.drv.fn.cuMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(bytes), uintptr(s))
}

// MemsetAsync enqueues setting bytes of device memory at dst to value.
func (dev *Device) MemsetAsync(dst DevicePtr, value byte, bytes int, s Stream) error {
	if bytes == 0 {
		return nil
	}
	return dev.call("cuMemsetD8Async", dev.drv.fn.cuMemsetD8Async, uintptr(dst), uintptr(value), uintptr(bytes), uintptr(s))
}
