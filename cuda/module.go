package cuda

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// Module is a loaded PTX or cubin module (cuModuleLoadData).
type Module struct {
	dev *Device
	h   uintptr
}

// Function is a kernel of a module (a CUfunction handle).
type Function struct {
	h    uintptr
	name string
}

// Name is the kernel's name in its module.
func (f Function) Name() string { return f.name }

// LoadModule loads a PTX image (text) into the device's primary context. The
// driver compiles PTX for the device on load (JIT), so PTX for compute_80 runs
// on sm_80, sm_90 and later.
func (dev *Device) LoadModule(image string) (*Module, error) {
	img := make([]byte, len(image)+1) // NUL-terminated copy
	copy(img, image)
	var h uintptr
	err := dev.call("cuModuleLoadData", dev.drv.fn.cuModuleLoadData, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&img[0])))
	runtime.KeepAlive(img)
	if err != nil {
		return nil, err
	}
	return &Module{dev: dev, h: h}, nil
}

// Function looks a kernel up by name.
func (m *Module) Function(name string) (Function, error) {
	cname := append([]byte(name), 0)
	var h uintptr
	if err := m.dev.call("cuModuleGetFunction", m.dev.drv.fn.cuModuleGetFunction, uintptr(unsafe.Pointer(&h)), m.h, uintptr(unsafe.Pointer(&cname[0]))); err != nil {
		return Function{}, fmt.Errorf("%w (kernel %q)", err, name)
	}
	return Function{h: h, name: name}, nil
}

// Unload releases the module; its functions must not be launched afterwards.
func (m *Module) Unload() error {
	if m == nil || m.h == 0 {
		return nil
	}
	h := m.h
	m.h = 0
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := m.dev.drv
	if err := d.check("cuCtxSetCurrent", ccall(d.fn.cuCtxSetCurrent, m.dev.ctx)); err != nil {
		return err
	}
	return d.check("cuModuleUnload", ccall(d.fn.cuModuleUnload, h))
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z int }

// LaunchConfig is the shape and stream of a kernel launch.
type LaunchConfig struct {
	Grid, Block Dim3
	SharedMem   int    // dynamic shared memory, bytes
	Stream      Stream // 0: the legacy default stream
}

func (d Dim3) orOne() Dim3 {
	if d.Y == 0 {
		d.Y = 1
	}
	if d.Z == 0 {
		d.Z = 1
	}
	return d
}

// maxKernelArgs bounds the arguments of one launch.
const maxKernelArgs = 32

// kernelArgs is the kernelParams array of cuLaunchKernel: ptrs[i] points at
// vals[i]. It lives on the heap so the addresses stay valid for the call.
type kernelArgs struct {
	vals [maxKernelArgs]uint64
	ptrs [maxKernelArgs]unsafe.Pointer
}

// packArgs stores each argument in 8 bytes, little-endian, so a pointer to it is
// also a valid pointer to its 4-byte or 1-byte form.
func packArgs(args []any) (*kernelArgs, error) {
	if len(args) > maxKernelArgs {
		return nil, fmt.Errorf("cuda: cuLaunchKernel: %d arguments, at most %d", len(args), maxKernelArgs)
	}
	ka := new(kernelArgs)
	for i, a := range args {
		var v uint64
		switch x := a.(type) {
		case DevicePtr:
			v = uint64(x)
		case uintptr:
			v = uint64(x)
		case int:
			v = uint64(int64(x))
		case int64:
			v = uint64(x)
		case uint64:
			v = x
		case int32:
			v = uint64(uint32(x))
		case uint32:
			v = uint64(x)
		case uint8:
			v = uint64(x)
		case float32:
			v = uint64(math.Float32bits(x))
		case float64:
			v = math.Float64bits(x)
		case []byte:
			// A parameter passed by value as its bytes (a struct or an
			// array); the driver copies them during the call.
			if len(x) == 0 {
				return nil, fmt.Errorf("cuda: cuLaunchKernel: argument %d is an empty []byte", i)
			}
			ka.ptrs[i] = unsafe.Pointer(&x[0])
			continue
		default:
			return nil, fmt.Errorf("cuda: cuLaunchKernel: argument %d has unsupported type %T", i, a)
		}
		ka.vals[i] = v
		ka.ptrs[i] = unsafe.Pointer(&ka.vals[i])
	}
	return ka, nil
}

// Launch enqueues kernel f on cfg.Stream (cuLaunchKernel). Each argument is one
// kernel parameter: DevicePtr, uintptr, int64, uint64 and int are 8 bytes,
// int32, uint32 and float32 are 4, uint8 is 1, float64 is 8, and a []byte is a
// parameter of its length passed by value (a struct or array parameter, such
// as a gather's row indices); the types must match the kernel's parameters.
func (dev *Device) Launch(f Function, cfg LaunchConfig, args ...any) error {
	ka, err := packArgs(args)
	if err != nil {
		return err
	}
	g, b := cfg.Grid.orOne(), cfg.Block.orOne()
	if g.X <= 0 || b.X <= 0 {
		return fmt.Errorf("cuda: cuLaunchKernel %s: empty grid %v or block %v", f.name, cfg.Grid, cfg.Block)
	}
	var params uintptr
	if len(args) > 0 {
		params = uintptr(unsafe.Pointer(&ka.ptrs[0]))
	}
	err = dev.call("cuLaunchKernel", dev.drv.fn.cuLaunchKernel, f.h,
		uintptr(g.X), uintptr(g.Y), uintptr(g.Z), uintptr(b.X), uintptr(b.Y), uintptr(b.Z),
		uintptr(cfg.SharedMem), uintptr(cfg.Stream), params, 0)
	runtime.KeepAlive(ka)
	runtime.KeepAlive(args)
	if err != nil {
		return fmt.Errorf("%w (kernel %s)", err, f.name)
	}
	return nil
}
