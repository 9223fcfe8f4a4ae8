package roles

import (
	"sync"
	"sync/atomic"

	"github.com/gear-rl/gear/collective"
)

// peerWatch follows the liveness of the one rank at the other end of a client's
// stream. The first news of its death wins: the coordinator's (OnLost), a broken
// connection, or a shared-memory segment without its owner. Once lost, the peer
// stays lost, and hook (set before watching starts) wakes whatever waits for it.
type peerWatch struct {
	role  string
	rank  int
	lost  atomic.Pointer[LostError]
	done  chan struct{} // closed when lost
	once  sync.Once
	hook  func()
	unreg func()
}

// watchPeer starts watching rank r of b. hook runs once, on the goroutine that
// reports the loss; it must not block.
func watchPeer(b collective.Bootstrap, role string, r int, hook func()) *peerWatch {
	w := &peerWatch{role: role, rank: r, done: make(chan struct{}), hook: hook}
	w.unreg = b.OnLost(func(lost int, reason string) {
		if lost == r {
			w.fail(reason)
		}
	})
	return w
}

// fail records the loss (the first reason wins) and runs the hook.
func (w *peerWatch) fail(reason string) *LostError {
	w.once.Do(func() {
		w.lost.Store(&LostError{Role: w.role, Rank: w.rank, Reason: reason})
		close(w.done)
		if w.hook != nil {
			w.hook()
		}
	})
	return w.lost.Load()
}

// err is the peer's *LostError, or nil while it lives.
func (w *peerWatch) err() error {
	if e := w.lost.Load(); e != nil {
		return e
	}
	return nil
}

// stop unregisters from the Bootstrap. The hook may still be running when stop
// returns; hooks guard what they touch.
func (w *peerWatch) stop() { w.unreg() }
