package sample

import (
	"sync/atomic"
	"time"
)

// nap is where a shard table's ingest sleeps between its looks at the
// commit log, and what wakes it early (an insert made in this process, or
// Close).
//
// Go's timers sleep in the scheduler's poller, whose timeout counts whole
// milliseconds: a 20 µs time.Sleep lasts about 1.1 ms on Linux. A full
// table's writers take the rows its shard has beyond the table's size
// while their rows' evictions wait for ingest's next look, and two Python
// writers committing a row a microsecond used Python's default 1024 extra
// rows in 0.7 ms: they then waited for free rows, and inserted 1.24x to
// 1.31x one (docs/benchmarks.md, "Naps shorter than a millisecond"). On
// Linux a nap shorter than that is a read of a timerfd of its own, which
// Go's poller waits on like any file, its P free meanwhile, and which fires
// when asked (plus the kernel's 50 µs of timer slack). Longer naps, and
// every nap elsewhere or without a timerfd, take Go's timer, which cost the
// owner less CPU than a timerfd's millisecond naps in the same alternation
// (0.22 to 0.27 cores against 0.26 to 0.28 beside two writers).
type nap struct {
	word  atomic.Uint64 // moved by every wake
	clock napClock      // nil: Go's timer only
	kick  chan struct{} // a wake of a nap on Go's timer
	timer *time.Timer
}

// napFine is the longest nap taken on the timerfd: Go's timer serves
// longer ones about as well.
const napFine = time.Millisecond

// napClock is a timer a goroutine can wait on in Go's poller.
type napClock interface {
	// wait arms the timer to fire after d and, unless woke reports true
	// once it is armed, waits until it fires or until interrupt.
	wait(d time.Duration, woke func() bool)
	// interrupt ends the wait under way at once, readying its goroutine
	// directly (not through the poller, which a process whose threads are
	// all busy looks at only now and then). A wait that starts after it
	// clears it: nap's word carries such a wake (woke).
	interrupt()
	close()
}

func newNap() *nap {
	n := &nap{kick: make(chan struct{}, 1), clock: newNapClock(), timer: time.NewTimer(time.Hour)}
	n.timer.Stop()
	return n
}

// mark returns what sleep takes: read before looking for work, so that a
// wake after the look cuts the nap short.
func (n *nap) mark() uint64 { return n.word.Load() }

// wake ends the nap under way, or else the next one.
func (n *nap) wake() {
	n.word.Add(1)
	if n.clock != nil {
		n.clock.interrupt()
	}
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// sleep naps up to d, or until a wake after mark returned seen (Close
// wakes the nap after it cancels). A wake may also end a later nap early.
func (n *nap) sleep(seen uint64, d time.Duration) {
	if n.clock != nil && d < napFine {
		// Either the wake's move of word comes before woke's look, and the
		// nap ends there, or its interrupt comes after the arming, and
		// ends it.
		n.clock.wait(d, func() bool { return n.word.Load() != seen })
		return
	}
	n.timer.Reset(d)
	select {
	case <-n.kick:
	case <-n.timer.C:
	}
	n.timer.Stop()
}

// close frees the nap's timer; no sleep may follow, and a wake after it
// does nothing.
func (n *nap) close() {
	if n.clock != nil {
		n.clock.close()
	}
}
