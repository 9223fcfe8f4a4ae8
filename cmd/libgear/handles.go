package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/sample/reverb"
	"github.com/gear-rl/gear/store"
)

// Statuses, as gear.h defines them.
const (
	statusOK      = 0
	statusError   = 1
	statusClosed  = 2
	statusTimeout = 3
	statusInvalid = 4
	statusPending = 5
)

// errInvalid marks the errors of bad arguments found here.
var errInvalid = errors.New("invalid argument")

// errHandle is the error of a call on a freed or unknown handle.
var errHandle = errors.New("libgear: no such handle (closed)")

// invalidf is an error wrapping errInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("libgear: %w: %s", errInvalid, fmt.Sprintf(format, args...))
}

// statusOf maps a Go error onto a status.
func statusOf(err error) C.int32_t {
	var pe *reverb.ParamError
	var fe *jobs.FieldError
	switch {
	case err == nil:
		return statusOK
	case errors.Is(err, errHandle), errors.Is(err, store.ErrClosed), errors.Is(err, sample.ErrClosed),
		errors.Is(err, collective.ErrClosed), errors.Is(err, roles.ErrClosed), errors.Is(err, roles.ErrPeerClosed):
		return statusClosed
	case errors.Is(err, context.DeadlineExceeded):
		return statusTimeout
	case errors.Is(err, errInvalid), errors.As(err, &pe), errors.As(err, &fe), errors.Is(err, store.ErrLayout),
		errors.Is(err, sample.ErrPriority), errors.Is(err, roles.ErrInvalid), errors.Is(err, roles.ErrStaleVersion),
		errors.Is(err, store.ErrName):
		return statusInvalid
	}
	return statusError
}

// lastErr holds each thread's last error text: a C caller's thread is the
// thread the exported function runs on, so gettid names the caller.
var lastErr sync.Map // int -> string

// fail records err for the calling thread and returns its status.
func fail(err error) C.int32_t {
	if err == nil {
		return statusOK
	}
	lastErr.Store(unix.Gettid(), err.Error())
	return statusOf(err)
}

// guard turns a panic into an error status; every export defers it.
func guard(st *C.int32_t) {
	if r := recover(); r != nil {
		*st = fail(fmt.Errorf("libgear: panic: %v", r))
	}
}

// gear_last_error copies the calling thread's last error text into buf (at
// most cap bytes, not NUL-terminated) and returns its whole length in bytes
// (0: no error): call again with a larger buffer when it exceeds cap.
//
//export gear_last_error
func gear_last_error(buf *C.char, capacity C.int64_t) (n C.int64_t) {
	defer func() { _ = recover() }()
	v, ok := lastErr.Load(unix.Gettid())
	if !ok {
		return 0
	}
	s := v.(string)
	if buf != nil && capacity > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(capacity)), s)
	}
	return C.int64_t(len(s))
}

// closer is what a handle holds.
type closer interface{ close() error }

var (
	handlesMu sync.RWMutex
	handles   = map[uint64]closer{}
	nextID    uint64
)

func register(c closer) C.uint64_t {
	handlesMu.Lock()
	defer handlesMu.Unlock()
	nextID++
	handles[nextID] = c
	return C.uint64_t(nextID)
}

// lookup returns the handle h as a T. Every call on a handle passes here,
// and paces the calling thread (pace).
func lookup[T closer](h C.uint64_t) (T, error) {
	pace()
	handlesMu.RLock()
	c, ok := handles[uint64(h)]
	handlesMu.RUnlock()
	t, isT := c.(T)
	if !ok {
		return t, errHandle
	}
	if !isT {
		return t, invalidf("handle %d is a %T, not a %T", uint64(h), c, t)
	}
	return t, nil
}

// gear_close frees handle h, closing what it holds. Freeing a handle twice
// returns GEAR_CLOSED.
//
//export gear_close
func gear_close(h C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	handlesMu.Lock()
	c, ok := handles[uint64(h)]
	delete(handles, uint64(h))
	handlesMu.Unlock()
	if !ok {
		return fail(errHandle)
	}
	return fail(c.close())
}

// timeoutCtx is a context ending after ms milliseconds (never, for ms < 0).
func timeoutCtx(ms C.int64_t) (context.Context, context.CancelFunc) {
	if ms < 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
}

// op is an operation that runs in a goroutine of its own.
type op struct {
	done   chan struct{}
	cancel context.CancelFunc
	err    error
	result C.uint64_t
}

func (o *op) close() error {
	o.cancel()
	<-o.done
	return nil
}

// start runs f in a goroutine under a context that gear_op_cancel ends, and
// returns the operation's handle. f returns the handle it made, if any.
func start(out *C.uint64_t, f func(ctx context.Context) (C.uint64_t, error)) C.int32_t {
	if out == nil {
		return nullArg("the operation's out")
	}
	ctx, cancel := context.WithCancel(context.Background())
	o := &op{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(o.done)
		defer func() {
			if r := recover(); r != nil {
				o.err = fmt.Errorf("libgear: panic: %v", r)
			}
		}()
		o.result, o.err = f(ctx)
	}()
	*out = register(o)
	return statusOK
}

// gear_op_wait waits up to ms milliseconds (forever for ms < 0) for operation
// op: GEAR_PENDING while it goes on, else its own status (its error is then
// the thread's last error).
//
//export gear_op_wait
func gear_op_wait(h C.uint64_t, ms C.int64_t) (st C.int32_t) {
	defer guard(&st)
	o, err := lookup[*op](h)
	if err != nil {
		return fail(err)
	}
	if ms < 0 {
		<-o.done
	} else {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case <-o.done:
		case <-t.C:
			return statusPending
		}
	}
	return fail(o.err)
}

// gear_op_cancel ends operation op's context; wait for it with gear_op_wait.
//
//export gear_op_cancel
func gear_op_cancel(h C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	o, err := lookup[*op](h)
	if err != nil {
		return fail(err)
	}
	o.cancel()
	return statusOK
}

// gear_op_result stores the handle that finished operation op made (0: none).
//
//export gear_op_result
func gear_op_result(h C.uint64_t, out *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	if out == nil {
		return nullArg("gear_op_result: out")
	}
	o, err := lookup[*op](h)
	if err != nil {
		return fail(err)
	}
	select {
	case <-o.done:
	default:
		return fail(invalidf("operation %d is still running", uint64(h)))
	}
	*out = o.result
	return statusOK
}

// nullArg is the error status of a pointer argument that is NULL where the
// call must write or read through it. Every export checks such pointers
// before it touches them, rather than leaving a nil dereference to guard: a
// dereference is a signal first, and in a process that installed its own
// SIGSEGV handler after loading libgear (Python's faulthandler, as pytest
// does) that handler ends the process before Go can make it a panic.
func nullArg(what string) C.int32_t {
	return fail(invalidf("%s: a NULL pointer", what))
}

// gostring copies a C string of n bytes.
func gostring(p *C.char, n C.int64_t) string {
	if p == nil || n <= 0 {
		return ""
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n)))
}

// copyOut copies s into buf (cap bytes) and returns its length.
func copyOut(s string, buf *C.char, capacity C.int64_t, n *C.int64_t) {
	if buf != nil && capacity > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(capacity)), s)
	}
	if n != nil {
		*n = C.int64_t(len(s))
	}
}

// A C thread that calls into Go runs each call as a goroutine locked to its
// own M, and that M keeps its P from one call to the next: the goroutine
// never passes through the scheduler. Go's monitor thread (sysmon) counts
// that as one goroutine running without a break, and after 10 ms (the
// runtime's forcePreemptNS) it signals the thread and hands its P off; each
// time it does, it goes back to polling every 20 µs for the next fifty
// rounds. So a Python writer inserting a row a call, or a learner sampling
// in a loop, kept its process's monitor awake about a thousand times a
// second (a 20 µs sleep lasts a clock tick, about 1 ms, on the virtual
// machines measured): each wake-up takes a CPU from the caller, or from the
// processes beside it: two writer processes sharing a table's two CPUs with
// its owner inserted about 4% fewer rows, 1.51x to 1.62x one writer's
// against 1.57x to 1.68x with pace (docs/benchmarks.md, "Calls that pass
// through the scheduler").
//
// pace lets the calling goroutine pass through the scheduler
// (runtime.Gosched, a few microseconds for a locked goroutine) once every
// paceEvery of calls, looking at the clock only every paceCheck calls: the
// monitor then sees a fresh slice each time, takes nothing, and sleeps up
// to 10 ms at a time. The count and the clock are the process's, not each
// thread's: with several calling threads the one whose call comes due
// yields, which keeps most of them, not every one, under the monitor's
// 10 ms.
func pace() {
	if paceDue() {
		runtime.Gosched()
	}
}

// paceDue counts a call and reports whether it is the one to yield: the
// first to look at the clock paceEvery or more after the last yield.
func paceDue() bool {
	if paceCalls.Add(1)%paceCheck != 0 {
		return false
	}
	now := paceClock()
	last := paceLast.Load()
	return now-last >= int64(paceEvery) && paceLast.CompareAndSwap(last, now)
}

// paceEvery is how often pace yields, well under the monitor's 10 ms;
// paceCheck is how many calls pass between two looks at the clock (a
// clock read costs about as much as ten calls' bookkeeping here; one a
// paceCheck calls is lost in a call's cost).
const (
	paceEvery = 4 * time.Millisecond
	paceCheck = 64
)

var (
	paceCalls atomic.Uint32
	paceLast  atomic.Int64 // when pace last yielded, by paceClock
	paceStart = time.Now()
	// paceClock is monotonic time in ns (a test's fake clock replaces it).
	paceClock = func() int64 { return int64(time.Since(paceStart)) }
)
