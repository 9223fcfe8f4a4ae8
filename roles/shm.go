package roles

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/internal/futex"
)

// Shared memory common to the three streams. A segment is created by the server
// end (policy worker, trainer, publisher), which holds an exclusive flock on it
// for as long as it lives; clients map it and probe that lock to learn that the
// owner died without a word (a probe that gets the lock means the owner's process
// is gone). Every segment starts with the same words:
//
//	0    magic u64 (one per stream kind)
//	8    layout version u32, kind-specific u32
//	16   owner pid u64
//	128  closed u32: 1 once the owner closed the stream on purpose
//
// Waiting polls for a while (WithSpin), then announces itself in a "sleeping"
// counter and sleeps on a futex word with FUTEX_WAIT; the other side bumps the
// word and calls FUTEX_WAKE only when the counter says someone sleeps, so that the
// fast path makes no system call. Sleeps are cut into slices so that a waiter
// also probes the owner's liveness while it waits.
const (
	offMagic   = 0
	offLayout  = 8
	offKind    = 12
	offPID     = 16
	offClosed  = 128
	layoutV1   = 1
	sleepSlice = 100 * time.Millisecond
	cacheLine  = 64
)

func align64(n int) int { return (n + cacheLine - 1) &^ (cacheLine - 1) }

// segment is a mapped shared-memory segment (or anonymous memory, fd -1).
type segment struct {
	name  string
	owner bool // this process created it: it unlinks it on close
	fd    int

	mu  sync.RWMutex // held for reading by wakes from other goroutines, for writing by unmap
	mem []byte
}

func (s *segment) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&s.mem[off])) }
func (s *segment) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&s.mem[off])) }

// wake bumps the futex word at off and wakes every sleeper on it, unless the
// segment is already unmapped. Wakes from OnLost hooks and context callbacks go
// through here, since they may race with close.
func (s *segment) wake(off int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mem == nil {
		return
	}
	w := s.u32(off)
	atomic.AddUint32(w, 1)
	futex.Wake(w, math.MaxInt32)
}

// initHeader writes the common header of a new segment but its magic, which
// the owner stores last, once the words of its kind are written too.
func (s *segment) initHeader(kind uint32) {
	binary.LittleEndian.PutUint32(s.mem[offLayout:], layoutV1)
	binary.LittleEndian.PutUint32(s.mem[offKind:], kind)
	binary.LittleEndian.PutUint64(s.mem[offPID:], uint64(os.Getpid()))
}

// closedFlag reports whether the owner closed the stream.
func (s *segment) closedFlag() bool { return atomic.LoadUint32(s.u32(offClosed)) != 0 }

// ownerGone probes the owner's lock: true means its process is gone.
func (s *segment) ownerGone() bool {
	if s.owner || s.fd < 0 {
		return false
	}
	return !probeOwner(s.fd)
}

// close unmaps the segment, closes its descriptor and, for the owner, unlinks it.
func (s *segment) close() error {
	s.mu.Lock()
	mem := s.mem
	s.mem = nil
	s.mu.Unlock()
	if mem != nil {
		unmapMem(mem)
	}
	var err error
	if s.owner && s.name != "" {
		err = unlinkSegment(s.name)
	}
	if s.fd >= 0 {
		closeFD(s.fd)
		s.fd = -1
	}
	return err
}

// notify bumps word and wakes its sleepers if the sleeping counter says any.
// The callers made their condition true (with an atomic store) before calling;
// sleepers increment sleeping before they recheck the condition, so one of the two
// sides always sees the other (both are sequentially consistent atomics).
func notify(word, sleeping *uint32) {
	if atomic.LoadUint32(sleeping) != 0 {
		atomic.AddUint32(word, 1)
		futex.Wake(word, math.MaxInt32)
	}
}

// spinUntil polls cond for about d; it reports whether cond became true.
func spinUntil(cond func() bool, d time.Duration) bool {
	if cond() {
		return true
	}
	if d <= 0 {
		return false
	}
	start := time.Now()
	for i := 1; ; i++ {
		if cond() {
			return true
		}
		if i&31 == 0 {
			if time.Since(start) > d {
				return false
			}
			runtime.Gosched()
		}
	}
}

// awaitShm waits until cond is true: it spins for spin, then sleeps on word
// (counted in sleeping) in slices, calling check after every wakeup; check's error
// ends the wait. A cancelled ctx wakes the sleeper through seg.wake(wordOff).
func awaitShm(ctx context.Context, seg *segment, wordOff, sleepingOff int, spin time.Duration, cond func() bool, check func() error) error {
	if spinUntil(cond, spin) {
		return nil
	}
	if err := check(); err != nil {
		return err
	}
	word, sleeping := seg.u32(wordOff), seg.u32(sleepingOff)
	stop := context.AfterFunc(ctx, func() { seg.wake(wordOff) })
	defer stop()
	for {
		seen := atomic.LoadUint32(word)
		atomic.AddUint32(sleeping, 1)
		if cond() {
			atomic.AddUint32(sleeping, ^uint32(0))
			return nil
		}
		futex.Wait(word, seen, sleepSlice)
		atomic.AddUint32(sleeping, ^uint32(0))
		if cond() {
			return nil
		}
		if err := check(); err != nil {
			return err
		}
	}
}

// fence orders the plain loads before it against the atomic loads after it, and
// the atomic store before it against the plain stores after it: an atomic
// read-modify-write is a full barrier on the architectures Go supports. The word
// is the caller's own, so the fence costs no shared cache line.
func fence(word *uint64) { atomic.AddUint64(word, 1) }
