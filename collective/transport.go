package collective

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// link is the narrow interface every transport implements: two ordered streams of
// frames between this rank and one peer of a communicator. Frames from one peer
// arrive in the order that peer committed them.
//
// A send is reserve then commit, so that a caller can produce a frame's payload in
// place (a reduction can write straight into a shared-memory ring). A receive is
// next then release, so that a caller can consume a payload in place (a reduction
// can read straight out of the ring). One goroutine at a time uses a link.
//
// The in-process, shared-memory and TCP transports implement it; they differ only in
// where the bytes live between commit and next.
type link interface {
	// reserve waits for room for a frame of n payload bytes (n <= maxPayload) and
	// returns the payload to fill. The next call on the sending side is commit.
	reserve(ctx context.Context, n int) ([]byte, error)
	// commit sends the reserved frame with header h; h.n must be its payload length.
	commit(ctx context.Context, h header) error
	// next waits for the next frame from the peer. The payload is valid until
	// release, which must come before the next call to next.
	next(ctx context.Context) (header, []byte, error)
	// release gives the frame returned by next back to the transport.
	release()
	// peek returns the header of the next frame from the peer if one is waiting,
	// without waiting and without taking it. Not while a frame is held.
	peek() (header, bool)
	// maxPayload is the largest payload one frame carries.
	maxPayload() int
	// streams reports whether the peer reads frames in place from memory this
	// rank wrote them to (shared memory): then writing large frames with
	// streaming stores, which bypass this core's cache, pays.
	streams() bool
}

// transport owns the links to a set of peers and the resources behind them.
type transport interface {
	// close says goodbye to the peers and frees the transport's resources. The
	// communicator calls it once, after its last operation has returned. note,
	// if not empty, is why this rank's communicator failed (encodeAbort): the
	// peers get it instead of "closed the communicator".
	close(note []byte)
}

// signals is what every wait of a communicator's links watches: the failure of the
// communicator, and the context of the call in progress.
type signals struct {
	failed atomic.Bool
	done   chan struct{} // closed when the communicator fails or closes

	mu     sync.Mutex
	wakers []func() // interrupt sleepers (shared memory futex waits)

	// The call in progress; only the goroutine running it touches these.
	stop func() bool
	// idle is called by waits now and then (not on their fast path): it looks
	// at what the other peers sent, so that mismatched calls that wait for each
	// other in a cycle are found.
	idle func() error
}

// idlePeriod is how often a waiting queue looks at the other peers.
const idlePeriod = 10 * time.Millisecond

func (s *signals) onIdle() error {
	if s.idle == nil {
		return nil
	}
	return s.idle()
}

func newSignals() *signals { return &signals{done: make(chan struct{})} }

// addWaker registers fn to be called whenever waits must look at the signals again.
func (s *signals) addWaker(fn func()) {
	s.mu.Lock()
	s.wakers = append(s.wakers, fn)
	s.mu.Unlock()
}

// interrupt wakes every sleeping wait so that it rechecks the signals.
func (s *signals) interrupt() {
	s.mu.Lock()
	ws := s.wakers
	s.mu.Unlock()
	for _, w := range ws {
		w()
	}
}

// arm, called by a wait before it sleeps, makes the end of the call's context
// interrupt the sleep; a wait that only spins checks ctx.Err itself. end, at the
// end of the call, undoes it. A stale interrupt after end only causes a spurious
// wakeup.
func (s *signals) arm(ctx context.Context) {
	if s.stop != nil || ctx.Done() == nil {
		return
	}
	s.stop = context.AfterFunc(ctx, s.interrupt)
}

func (s *signals) end() {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
}

// qframe is a frame held in memory: a header and its payload buffer.
type qframe struct {
	h   header
	buf []byte // payload
	own *[]byte
}

// frameQueue is an unbounded FIFO of frames with one consumer; the in-process
// transport and the TCP readers fill it. end is the error pop returns once the
// queue is empty and no more frames will come.
type frameQueue struct {
	mu     sync.Mutex
	frames []qframe
	head   int
	end    error
	notify chan struct{}
}

func newFrameQueue() *frameQueue { return &frameQueue{notify: make(chan struct{}, 1)} }

func (q *frameQueue) push(f qframe) {
	q.mu.Lock()
	if q.end != nil {
		q.mu.Unlock()
		return
	}
	if q.head > 0 && q.head == len(q.frames) {
		q.frames = q.frames[:0]
		q.head = 0
	}
	q.frames = append(q.frames, f)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// finish marks the end of the stream: pop returns err once the queue is empty.
func (q *frameQueue) finish(err error) {
	q.mu.Lock()
	if q.end == nil {
		q.end = err
	}
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// pop waits for the next frame.
func (q *frameQueue) pop(ctx context.Context, sig *signals) (qframe, error) {
	var tick *time.Timer
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		q.mu.Lock()
		if q.head < len(q.frames) {
			f := q.frames[q.head]
			q.frames[q.head] = qframe{}
			q.head++
			q.mu.Unlock()
			return f, nil
		}
		end := q.end
		q.mu.Unlock()
		if end != nil {
			return qframe{}, end
		}
		if sig.failed.Load() {
			return qframe{}, errStopped
		}
		if tick == nil {
			if err := sig.onIdle(); err != nil {
				return qframe{}, err
			}
			tick = time.NewTimer(idlePeriod)
			continue
		}
		select {
		case <-q.notify:
		case <-ctx.Done():
			return qframe{}, ctx.Err()
		case <-sig.done:
			return qframe{}, errStopped
		case <-tick.C:
			if err := sig.onIdle(); err != nil {
				return qframe{}, err
			}
			tick.Reset(idlePeriod)
		}
	}
}

// peek returns the header of the first frame, if any.
func (q *frameQueue) peek() (header, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head < len(q.frames) {
		return q.frames[q.head].h, true
	}
	return header{}, false
}

// bufPool recycles frame buffers by power-of-two size class.
type bufPool struct {
	classes [32]sync.Pool
}

func sizeClass(n int) int {
	c := 6 // 64 bytes at least
	for 1<<c < n {
		c++
	}
	return c
}

func (p *bufPool) get(n int) *[]byte {
	c := sizeClass(n)
	if v := p.classes[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<c)
	return &b
}

func (p *bufPool) put(b *[]byte) {
	if b == nil || cap(*b) == 0 {
		return
	}
	c := sizeClass(cap(*b))
	if 1<<c != cap(*b) {
		return
	}
	p.classes[c].Put(b)
}

// tryPop takes a frame without waiting.
func (q *frameQueue) tryPop() (qframe, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head < len(q.frames) {
		f := q.frames[q.head]
		q.frames[q.head] = qframe{}
		q.head++
		return f, true
	}
	return qframe{}, false
}
