package cuda

import (
	"unsafe"
)

// driverFuncs holds the addresses of the driver entry points gear uses, looked up
// by their exported (versioned) names.
type driverFuncs struct {
	cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString          uintptr
	cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, cuDeviceGetAttribute  uintptr
	cuDeviceTotalMem, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease uintptr
	cuCtxSetCurrent, cuCtxSynchronize                                     uintptr
	cuMemAlloc, cuMemFree, cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost  uintptr
	cuMemHostRegister, cuMemHostUnregister, cuMemHostGetDevicePointer     uintptr
	cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync      uintptr
	cuMemcpyDtoDAsync, cuMemsetD8Async, cuMemcpyBatchAsync                uintptr
	cuModuleLoadData, cuModuleUnload, cuModuleGetFunction, cuLaunchKernel uintptr
	cuStreamCreate, cuStreamDestroy, cuStreamQuery, cuStreamSynchronize   uintptr
	cuEventCreate, cuEventDestroy, cuEventRecord, cuEventQuery            uintptr
	cuEventSynchronize, cuEventElapsedTime, cuStreamWaitEvent             uintptr
	cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle            uintptr
}

func (f *driverFuncs) symbols() []symbol {
	return []symbol{
		sym(&f.cuInit, "cuInit"),
		sym(&f.cuDriverGetVersion, "cuDriverGetVersion"),
		sym(&f.cuGetErrorName, "cuGetErrorName"),
		sym(&f.cuGetErrorString, "cuGetErrorString"),
		sym(&f.cuDeviceGetCount, "cuDeviceGetCount"),
		sym(&f.cuDeviceGet, "cuDeviceGet"),
		sym(&f.cuDeviceGetName, "cuDeviceGetName"),
		sym(&f.cuDeviceGetAttribute, "cuDeviceGetAttribute"),
		sym(&f.cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
		sym(&f.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
		sym(&f.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
		sym(&f.cuCtxSetCurrent, "cuCtxSetCurrent"),
		sym(&f.cuCtxSynchronize, "cuCtxSynchronize"),
		sym(&f.cuMemAlloc, "cuMemAlloc_v2"),
		sym(&f.cuMemFree, "cuMemFree_v2"),
		optSym(&f.cuMemAllocHost, "cuMemAllocHost_v2"),
		sym(&f.cuMemHostAlloc, "cuMemHostAlloc"),
		sym(&f.cuMemFreeHost, "cuMemFreeHost"),
		sym(&f.cuMemHostRegister, "cuMemHostRegister_v2"),
		sym(&f.cuMemHostUnregister, "cuMemHostUnregister"),
		sym(&f.cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
		sym(&f.cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
		sym(&f.cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
		sym(&f.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
		sym(&f.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
		sym(&f.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
		sym(&f.cuMemsetD8Async, "cuMemsetD8Async"),
		optSym(&f.cuMemcpyBatchAsync, "cuMemcpyBatchAsync"), // 12.8's form, with failIdx; kept by 13's drivers
		sym(&f.cuModuleLoadData, "cuModuleLoadData"),
		sym(&f.cuModuleUnload, "cuModuleUnload"),
		sym(&f.cuModuleGetFunction, "cuModuleGetFunction"),
		sym(&f.cuLaunchKernel, "cuLaunchKernel"),
		sym(&f.cuStreamCreate, "cuStreamCreate"),
		sym(&f.cuStreamDestroy, "cuStreamDestroy_v2"),
		sym(&f.cuStreamQuery, "cuStreamQuery"),
		sym(&f.cuStreamSynchronize, "cuStreamSynchronize"),
		sym(&f.cuEventCreate, "cuEventCreate"),
		sym(&f.cuEventDestroy, "cuEventDestroy_v2"),
		sym(&f.cuEventRecord, "cuEventRecord"),
		sym(&f.cuStreamWaitEvent, "cuStreamWaitEvent"),
		sym(&f.cuEventQuery, "cuEventQuery"),
		sym(&f.cuEventSynchronize, "cuEventSynchronize"),
		sym(&f.cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
		optSym(&f.cuIpcGetMemHandle, "cuIpcGetMemHandle"),
		optSym(&f.cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"),
		optSym(&f.cuIpcCloseMemHandle, "cuIpcCloseMemHandle"),
	}
}

// Driver is the CUDA driver library, loaded and initialised. It holds no context
// of its own: Device retains a device's primary context. A Driver is safe for
// concurrent use and is never unloaded.
type Driver struct {
	lib     *library
	fn      driverFuncs
	version int
}

// cudaCandidates lists where OpenDriver looks for libcuda.so.1, in order.
func cudaCandidates(o options) []string {
	if o.path != "" {
		return []string{o.path}
	}
	if p := o.getenv(envCUDALib); p != "" {
		return []string{p}
	}
	return []string{
		"libcuda.so.1", // the loader: LD_LIBRARY_PATH, ld.so.cache
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"/usr/lib/aarch64-linux-gnu/libcuda.so.1",
		"/usr/lib64/libcuda.so.1",
		"/usr/local/nvidia/lib64/libcuda.so.1",
		"/usr/lib/wsl/lib/libcuda.so.1",
	}
}

// OpenDriver loads the CUDA driver (GEAR_CUDA_LIB if set, else libcuda.so.1 from
// the loader's path and the usual directories) and calls cuInit. Without a usable
// driver the error wraps ErrNoDriver and reads "cuda: no CUDA driver: ...".
// Opening again is cheap: the loader returns the same library.
func OpenDriver(opts ...Option) (*Driver, error) {
	o := buildOptions(opts)
	lib, err := openFirst(cudaCandidates(o))
	if err != nil {
		return nil, &wrapped{ErrNoDriver, err}
	}
	d := &Driver{lib: lib}
	if err := lib.bind(d.fn.symbols()); err != nil {
		return nil, &wrapped{ErrNoDriver, err}
	}
	if err := d.check("cuInit", ccall(d.fn.cuInit, 0)); err != nil {
		return nil, &wrapped{ErrNoDriver, err}
	}
	var v int32
	if err := d.check("cuDriverGetVersion", ccall(d.fn.cuDriverGetVersion, uintptr(unsafe.Pointer(&v)))); err != nil {
		return nil, err
	}
	d.version = int(v)
	return d, nil
}

// Path is the library that was loaded.
func (d *Driver) Path() string { return d.lib.path }

// Version is the driver's CUDA version, 1000*major + 10*minor (13000 for 13.0).
func (d *Driver) Version() int { return d.version }

// check turns a CUresult into nil or an *Error naming fn.
func (d *Driver) check(fn string, r uintptr) error {
	code := Result(int32(r))
	if code == Success {
		return nil
	}
	return d.errorOf(fn, code)
}

func (d *Driver) errorOf(fn string, code Result) *Error {
	e := &Error{Func: fn, Code: code}
	var p unsafe.Pointer
	if d.fn.cuGetErrorName != 0 && ccall(d.fn.cuGetErrorName, uintptr(code), uintptr(unsafe.Pointer(&p))) == 0 {
		e.Name = ptrString(p)
	}
	if e.Name == "" {
		e.Name = resultNames[code]
	}
	if e.Name == "" {
		e.Name = "CUDA_ERROR_UNKNOWN_CODE"
	}
	p = nil
	if d.fn.cuGetErrorString != 0 && ccall(d.fn.cuGetErrorString, uintptr(code), uintptr(unsafe.Pointer(&p))) == 0 {
		e.Desc = ptrString(p)
	}
	return e
}

// DeviceCount is the number of CUDA devices the process can see (after
// CUDA_VISIBLE_DEVICES).
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", ccall(d.fn.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Device retains the primary context of the device with the given ordinal.
// Close releases it.
func (d *Driver) Device(ordinal int) (*Device, error) {
	var h int32
	if err := d.check("cuDeviceGet", ccall(d.fn.cuDeviceGet, uintptr(unsafe.Pointer(&h)), uintptr(ordinal))); err != nil {
		return nil, err
	}
	var ctx uintptr
	if err := d.check("cuDevicePrimaryCtxRetain", ccall(d.fn.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), uintptr(h))); err != nil {
		return nil, err
	}
	return &Device{drv: d, ordinal: ordinal, handle: h, ctx: ctx}, nil
}
