package cuda

import (
	"context"
	"errors"
	"runtime"
	"time"
	"unsafe"
)

// Stream is a CUstream handle: a plain address-sized value, so a stream created
// by another binding (for example Gorgonia's cu.Stream) passes straight in. Zero
// is the legacy default stream.
type Stream uintptr

// Event is a CUevent handle.
type Event uintptr

const streamNonBlocking = 0x1 // CU_STREAM_NON_BLOCKING

// NewStream creates a stream that does not synchronise with the legacy default
// stream (CU_STREAM_NON_BLOCKING). DestroyStream releases it.
func (dev *Device) NewStream() (Stream, error) {
	var s uintptr
	err := dev.call("cuStreamCreate", dev.drv.fn.cuStreamCreate, uintptr(unsafe.Pointer(&s)), streamNonBlocking)
	return Stream(s), err
}

// DestroyStream releases a stream from NewStream. Work already enqueued still runs.
func (dev *Device) DestroyStream(s Stream) error {
	if s == 0 {
		return nil
	}
	return dev.call("cuStreamDestroy_v2", dev.drv.fn.cuStreamDestroy, uintptr(s))
}

// StreamDone reports whether all work enqueued on s has finished (cuStreamQuery).
func (dev *Device) StreamDone(s Stream) (bool, error) {
	return dev.query("cuStreamQuery", dev.drv.fn.cuStreamQuery, uintptr(s))
}

// query calls a driver query (cuStreamQuery, cuEventQuery): done on
// CUDA_SUCCESS, not yet on CUDA_ERROR_NOT_READY, an error otherwise.
func (dev *Device) query(name string, fn, arg uintptr) (bool, error) {
	var code Result
	err := dev.do(func() error {
		code = Result(int32(ccall(fn, arg)))
		return nil
	})
	switch {
	case err != nil:
		return false, err
	case code == Success:
		return true, nil
	case code == ErrorNotReady:
		return false, nil
	}
	return false, dev.drv.errorOf(name, code)
}

// StreamSynchronize waits until all work enqueued on s has finished. With a
// context that can end it polls cuStreamQuery, and returns ctx's error if ctx
// ends first; the work then goes on, and buffers it uses stay in use until a
// later wait succeeds. With a context that cannot end it calls
// cuStreamSynchronize.
func (dev *Device) StreamSynchronize(ctx context.Context, s Stream) error {
	if ctx.Done() == nil {
		return dev.call("cuStreamSynchronize", dev.drv.fn.cuStreamSynchronize, uintptr(s))
	}
	return poll(ctx, nil, func() (bool, error) { return dev.StreamDone(s) })
}

// NewEvent creates an event that records timing. DestroyEvent releases it.
func (dev *Device) NewEvent() (Event, error) {
	var e uintptr
	err := dev.call("cuEventCreate", dev.drv.fn.cuEventCreate, uintptr(unsafe.Pointer(&e)), 0)
	return Event(e), err
}

// DestroyEvent releases an event from NewEvent.
func (dev *Device) DestroyEvent(e Event) error {
	if e == 0 {
		return nil
	}
	return dev.call("cuEventDestroy_v2", dev.drv.fn.cuEventDestroy, uintptr(e))
}

// Record enqueues event e on stream s (cuEventRecord).
func (dev *Device) Record(e Event, s Stream) error {
	return dev.call("cuEventRecord", dev.drv.fn.cuEventRecord, uintptr(e), uintptr(s))
}

// StreamWaitEvent makes the work enqueued on s after this call wait until the
// work before e's last Record (on any stream) has finished; the host does not
// wait. An event never recorded makes no wait.
func (dev *Device) StreamWaitEvent(s Stream, e Event) error {
	return dev.call("cuStreamWaitEvent", dev.drv.fn.cuStreamWaitEvent, uintptr(s), uintptr(e), 0)
}

// EventDone reports whether the work before e's last Record has finished.
func (dev *Device) EventDone(e Event) (bool, error) {
	return dev.query("cuEventQuery", dev.drv.fn.cuEventQuery, uintptr(e))
}

// EventSynchronize waits for e, as StreamSynchronize waits for a stream: polling
// cuEventQuery under a context that can end, cuEventSynchronize otherwise.
func (dev *Device) EventSynchronize(ctx context.Context, e Event) error {
	if ctx.Done() == nil {
		return dev.call("cuEventSynchronize", dev.drv.fn.cuEventSynchronize, uintptr(e))
	}
	return poll(ctx, nil, func() (bool, error) { return dev.EventDone(e) })
}

// Elapsed is the time between two recorded, completed events.
func (dev *Device) Elapsed(start, end Event) (time.Duration, error) {
	var ms float32
	if err := dev.call("cuEventElapsedTime", dev.drv.fn.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// poll calls done until it reports true or an error, ctx ends, or stop closes.
// It spins (yielding the processor) for the first spin interval, where GPU work
// usually ends, then sleeps with a doubling backoff up to maxSleep. The spin
// outlasts a gather of a batch over the bus (16 MiB: about 0.3 ms on PCIe 5)
// and a learner's step: a wait that sleeps wakes up late, and on Linux a Go
// timer of 20 us fires after about 1.1 ms (the median of 200).
func poll(ctx context.Context, stop <-chan struct{}, done func() (bool, error)) error {
	const (
		spin     = 2 * time.Millisecond
		minSleep = 20 * time.Microsecond
		maxSleep = time.Millisecond
	)
	start := time.Now()
	sleep := minSleep
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return errStopped
		default:
		}
		if time.Since(start) < spin {
			runtime.Gosched()
			continue
		}
		if timer == nil {
			timer = time.NewTimer(sleep)
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return errStopped
		case <-timer.C:
		}
		if sleep < maxSleep {
			sleep *= 2
		}
	}
}

// errStopped is what poll returns when its stop channel closes; callers replace
// it with their own reason.
var errStopped = errors.New("cuda: wait stopped")
