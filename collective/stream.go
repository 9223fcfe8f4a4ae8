package collective

import (
	"math/bits"
	"time"
)

// Whether writing shared-memory frames with streaming stores (which bypass the
// writer's cache) pays depends on the machine, and on the same machine on where
// the ranks' cores are: measured here, it made calls of 64 KiB to 64 MiB three
// times faster while the two cores were far apart (a transfer from one core's
// cache to the other's cost more than a trip through memory) and twice slower
// while they were close. So every rank learns it while it runs, for each size
// class on its own: it times its calls in both modes at first, then uses the
// faster mode, timing the other one again every so often, as the placement of
// cores can change under a running job. The choice is local to the writer (a
// reader does not care how a frame was written), so ranks need not agree; as
// every rank counts the same calls, they try the other mode on the same calls.

const (
	streamWindow  = 4  // samples kept per mode; the estimate is their minimum
	streamExplore = 32 // after the trials, one call in this many tries the other mode
)

// A call's duration includes waiting for the slowest rank to arrive, which only
// ever adds, so a mode's estimate is the least of its last few durations.

type streamChooser struct {
	classes [65]streamClass
}

type streamClass struct {
	calls   uint32
	samples [2][streamWindow]time.Duration // [cached, streaming]
	n       [2]uint32
}

// streamClassOf is the size class of a call moving bytes bytes.
func streamClassOf(bytes uint64) int { return bits.Len64(bytes) }

func (c *streamClass) estimate(m int) time.Duration {
	best := time.Duration(1<<63 - 1)
	for i := range min(c.n[m], streamWindow) {
		best = min(best, c.samples[m][i])
	}
	return best
}

// pick says whether the next call of class k streams, and whether to time it.
func (s *streamChooser) pick(k int) (stream, timed bool) {
	c := &s.classes[k]
	c.calls++
	switch {
	case c.calls == 1:
		return true, false // first touch of buffers and rings: not representative
	case c.calls <= 1+2*streamWindow:
		return c.calls%2 == 0, true
	}
	best := c.estimate(1) < c.estimate(0)
	if c.calls%streamExplore == 0 {
		return !best, true
	}
	return best, true
}

// record adds a timed call of class k.
func (s *streamChooser) record(k int, stream bool, d time.Duration) {
	c := &s.classes[k]
	m := 0
	if stream {
		m = 1
	}
	c.samples[m][c.n[m]%streamWindow] = d
	c.n[m]++
}
