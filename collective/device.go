package collective

import "context"

// The device path of a Layout (AllReduceDevice) reaches the GPU only through
// the interfaces below, so that package collective, and every program that
// uses it, links no GPU binding. Package github.com/gear-rl/gear/collective/nccl implements them
// with CUDA and NCCL (nccl.ForLayout).

// DevicePtr is the address of a buffer in device memory, as a device binding
// gives it. cuda.DevicePtr (and the pointers of other bindings) convert to it
// and back: all are address-sized integers.
type DevicePtr uintptr

// Device is what a Layout needs of this rank's device (WithDevice) to reduce
// device buffers: copies between device memory and the host, for the steps
// that take the host path. A Device that also implements DeviceLinks can carry
// the layout's "nccl" groups on the device itself.
//
// The copies are synchronous: they return once the bytes are in place. A
// Layout calls them from the goroutine of its call, one at a time.
type Device interface {
	// CopyToHost copies len(dst) bytes of device memory at src into dst.
	CopyToHost(dst []byte, src DevicePtr) error
	// CopyToDevice copies src into device memory at dst.
	CopyToDevice(dst DevicePtr, src []byte) error
}

// DeviceLinks is the optional capability of a Device (found by type assertion)
// to reduce device memory in place among ranks on different GPUs, as NCCL
// does. NewLayout uses it for the groups whose link is "nccl" when every
// rank's Device has it and says it is available; otherwise those groups take
// the host path too.
type DeviceLinks interface {
	// LinksAvailable reports whether this rank can build device groups (for
	// NCCL: whether the library loads). It must not wait for other ranks.
	LinksAvailable() bool
	// NewDeviceGroup builds the device group of the ranks of c, one of the
	// layout's sub-communicators, ranked as c. It is collective over c's ranks,
	// which build their groups in the same order; it may exchange through c's
	// Bootstrap (under keys derived from c.Name()), and must not make calls on
	// c itself, which the layout may be using meanwhile. A rank lost while the
	// others wait for it must end their wait with *LostError.
	NewDeviceGroup(ctx context.Context, c *Comm) (DeviceGroup, error)
}

// DeviceGroup runs one group's steps on a device buffer, in place, among the
// ranks of the communicator it was built for (ranks and roots are that
// communicator's). Each call returns once the result is in device memory.
//
// Its errors follow Comm's: the context's error wrapped and naming the call,
// *LostError (errors.Is ErrRankLost) naming the lost rank and its world rank,
// *AbortError (ErrAborted) when another rank's group failed, ErrClosed; after
// an error every call returns the same error.
type DeviceGroup interface {
	AllReduce(ctx context.Context, buf DevicePtr, count int, dt DType, op Op) error
	Reduce(ctx context.Context, buf DevicePtr, count int, dt DType, op Op, root int) error
	Broadcast(ctx context.Context, buf DevicePtr, count int, dt DType, root int) error
	// Fail makes the group fail with err, the layout's cause, unless it failed
	// already: a call in progress returns, and every later call returns the
	// group's cause. It does not tell the other ranks (the layout does), and
	// it may be called from any goroutine.
	Fail(err error)
	// Close releases the group; a call in progress returns ErrClosed. It does
	// not wait for the other ranks, and is idempotent.
	Close() error
}
