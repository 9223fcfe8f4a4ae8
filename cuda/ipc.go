package cuda

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// IPCHandle is a CUipcMemHandle: 64 opaque bytes that name a device
// allocation for other processes on the same machine (cuIpcGetMemHandle).
// It is plain data, to be sent to the other process by any means.
type IPCHandle struct {
	Reserved [64]byte
}

// ipcLazyEnablePeerAccess is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, the one flag
// cuIpcOpenMemHandle takes.
const ipcLazyEnablePeerAccess = 1

// ipcOpen calls cuIpcOpenMemHandle_v2, which takes the 64-byte handle by
// value: purego passes it as the C ABI of the platform wants.
type ipcOpenFunc func(p *uintptr, h IPCHandle, flags uint32) int32

var (
	ipcOpenMu    sync.Mutex
	ipcOpenFuncs = map[uintptr]ipcOpenFunc{}
)

func (d *Driver) ipcOpen() (ipcOpenFunc, error) {
	if d.fn.cuIpcOpenMemHandle == 0 || d.fn.cuIpcGetMemHandle == 0 || d.fn.cuIpcCloseMemHandle == 0 {
		return nil, fmt.Errorf("cuda: %s lacks CUDA IPC (cuIpcOpenMemHandle)", d.lib.path)
	}
	ipcOpenMu.Lock()
	defer ipcOpenMu.Unlock()
	f, ok := ipcOpenFuncs[d.fn.cuIpcOpenMemHandle]
	if !ok {
		purego.RegisterFunc(&f, d.fn.cuIpcOpenMemHandle)
		ipcOpenFuncs[d.fn.cuIpcOpenMemHandle] = f
	}
	return f, nil
}

// IPCHandle exports device memory p, the base of an allocation from Alloc,
// for another process (cuIpcGetMemHandle). The memory stays p's owner's: it
// must outlive every process that opened the handle.
func (dev *Device) IPCHandle(p DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	if _, err := dev.drv.ipcOpen(); err != nil {
		return h, err
	}
	err := dev.call("cuIpcGetMemHandle", dev.drv.fn.cuIpcGetMemHandle, uintptr(unsafe.Pointer(&h)), uintptr(p))
	return h, err
}

// OpenIPC maps the device memory another process exported with IPCHandle
// into this device's context (cuIpcOpenMemHandle_v2) and returns its address
// here. A handle cannot be opened in the process that made it. Opened again
// in a process that has it open, it gives the same mapping one more reference:
// each OpenIPC needs its CloseIPC, and the last one unmaps it, before the
// device is closed.
func (dev *Device) OpenIPC(h IPCHandle) (DevicePtr, error) {
	open, err := dev.drv.ipcOpen()
	if err != nil {
		return 0, err
	}
	var p uintptr
	err = dev.do(func() error {
		return dev.drv.check("cuIpcOpenMemHandle_v2", uintptr(open(&p, h, ipcLazyEnablePeerAccess)))
	})
	return DevicePtr(p), err
}

// CloseIPC unmaps memory from OpenIPC (cuIpcCloseMemHandle).
func (dev *Device) CloseIPC(p DevicePtr) error {
	if _, err := dev.drv.ipcOpen(); err != nil {
		return err
	}
	return dev.call("cuIpcCloseMemHandle", dev.drv.fn.cuIpcCloseMemHandle, uintptr(p))
}
