package store

import (
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/internal/futex"
)

// bell lets a goroutine of any process attached to a shard sleep until another
// process changes what it waits for (a free row), rather than poll:
// word is a futex word in the segment's header and sleeping says that someone
// may be asleep on it. A change of state rings the bell after it is made; only
// a ring that finds sleeping set costs a system call, so a shard that nobody
// waits on pays one atomic load per ring.
//
// The two sides pair up as in Dekker's protocol: a sleeper reads word, sets
// sleeping, then checks its condition; a ringer changes the state, then reads
// sleeping. Go's atomics are sequentially consistent, so either the sleeper
// sees the change or the ringer sees sleeping, moves word and wakes it. A
// sleeper of a build that did not ring (or a ring lost to a process that
// died) costs at most the sleep's bound, as the poll it replaces did.
type bell struct {
	word     *atomic.Uint32
	sleeping *atomic.Uint32
}

func newBell(base unsafe.Pointer, off int) bell {
	return bell{word: (*atomic.Uint32)(unsafe.Add(base, off)), sleeping: (*atomic.Uint32)(unsafe.Add(base, off+4))}
}

// ring wakes every sleeper, if any (the caller has made its change).
func (b bell) ring() {
	if b.sleeping.Load() == 0 || !b.sleeping.CompareAndSwap(1, 0) {
		return
	}
	b.word.Add(1)
	futex.Wake((*uint32)(unsafe.Pointer(b.word)), math.MaxInt32)
}

// wait sleeps up to d, until a ring, unless ready holds; it may return early.
func (b bell) wait(ready func() bool, d time.Duration) {
	v := b.word.Load()
	b.sleeping.Store(1)
	if ready() {
		return
	}
	futex.Wait((*uint32)(unsafe.Pointer(b.word)), v, d)
}
