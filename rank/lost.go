package rank

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"
)

type lostNote struct {
	fns    []func(int, string)
	rank   int
	reason string
}

// OnLost registers fn to be called, from the world's notifier goroutine, once for
// every rank that died (including ranks lost before the call). The returned
// function unregisters fn.
func (w *World) OnLost(fn func(rank int, reason string)) (unregister func()) {
	w.mu.Lock()
	id := w.nextFn
	w.nextFn++
	w.lostFns[id] = fn
	if len(w.lost) > 0 && !w.closed {
		for _, r := range slices.Sorted(maps.Keys(w.lost)) {
			w.notes = append(w.notes, lostNote{fns: []func(int, string){fn}, rank: r, reason: w.lost[r]})
		}
		w.wakeNotifier()
	}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.lostFns, id)
		w.mu.Unlock()
	}
}

// Lost returns the ranks known to have died, with the reasons.
func (w *World) Lost() map[int]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.lost)
}

// readLoop dispatches the coordinator's messages until the connection ends.
func (w *World) readLoop() {
	defer w.wg.Done()
	buf := make([]byte, 0, 512)
	for {
		// Wait for the next frame's first byte (consuming nothing), then read
		// the frame; the coordinator's pings keep a healthy connection busy.
		w.conn.SetReadDeadline(time.Now().Add(w.heartbeatTimeout))
		_, err := w.reader.Peek(1)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// A rank that was not scheduled for a while wakes up to an expired
			// deadline with the coordinator's pings unread: look once more,
			// briefly, before giving up on it.
			w.conn.SetReadDeadline(time.Now().Add(w.heartbeatTimeout / 4))
			_, err = w.reader.Peek(1)
		}
		var typ byte
		var p []byte
		if err == nil {
			w.conn.SetReadDeadline(time.Now().Add(w.heartbeatTimeout))
			typ, p, err = readFrameMax(w.reader, buf, maxRequestFrame)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("no word from it at %s for %v (its host unreachable?)", w.info.RdzvAddr, w.heartbeatTimeout)
			}
			w.fail(fmt.Errorf("%w: %v", ErrCoordinatorGone, err))
			return
		}
		if typ == msgPing {
			w.send(msgPing, func(*enc) {}) // a broken connection fails the next read
			continue
		}
		if cap(p) > cap(buf) {
			buf = p[:0]
		}
		d := dec{b: p}
		switch typ {
		case msgOK, msgErr, msgValue:
			id := d.uint()
			var r reply
			switch typ {
			case msgErr:
				// The coordinator's only refusal: a second Set of a key.
				r.err = fmt.Errorf("%w (%s)", ErrKeyExists, d.str(4096))
			case msgValue:
				r.found = d.bool()
				r.val = d.bytes(maxValue)
			}
			w.mu.Lock()
			pr, ok := w.pending[id]
			delete(w.pending, id)
			w.mu.Unlock()
			if ok && d.err == nil {
				pr.ch <- r
			}
		case msgBarrierDone:
			gen, msg := d.uint(), d.str(4096)
			w.mu.Lock()
			ch := w.barrier[gen]
			var err error
			if msg != "" {
				err = w.broken
				if err == nil {
					err = fmt.Errorf("rank: barrier %d: %s", gen, msg)
				}
			}
			w.mu.Unlock()
			if ch != nil {
				ch <- err
			}
		case msgLost:
			rank, reason := d.int(maxRanks), d.str(4096)
			if d.err == nil {
				w.markLost(rank, reason)
			}
		default:
			w.log.Warn("rank: unexpected message from the coordinator", "type", typ)
		}
		if d.err != nil {
			w.log.Warn("rank: malformed message from the coordinator", "type", typ, "err", d.err)
		}
	}
}

func (w *World) markLost(rank int, reason string) {
	err := &LostError{Rank: rank, Reason: reason}
	if w.multiHost() && rank >= 0 && rank < len(w.peers) {
		err.Host = HostName(w.peers[rank].Host)
	}
	w.mu.Lock()
	if _, ok := w.lost[rank]; ok {
		w.mu.Unlock()
		return
	}
	w.lost[rank] = reason
	fns := slices.Collect(maps.Values(w.lostFns))
	if len(fns) > 0 {
		w.notes = append(w.notes, lostNote{fns: fns, rank: rank, reason: reason})
		w.wakeNotifier()
	}
	w.mu.Unlock()
	w.log.Warn("rank: rank lost", "rank", rank, "reason", reason)
	w.fail(err)
}

// multiHost reports whether the world's ranks are on more than one host, where
// a lost rank's error names its host.
func (w *World) multiHost() bool {
	for _, p := range w.peers {
		if p.Host != w.peers[0].Host {
			return true
		}
	}
	return false
}

// fail breaks the world: pending barriers and waits end with err; when the
// coordinator is gone, every pending request does.
func (w *World) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if w.broken == nil {
		w.broken = err
	}
	for _, ch := range w.barrier {
		select {
		case ch <- w.broken:
		default:
		}
	}
	gone := errors.Is(err, ErrCoordinatorGone)
	for id, pr := range w.pending {
		if pr.typ != msgWait && !gone {
			continue
		}
		select {
		case pr.ch <- reply{err: err}:
		default:
		}
		delete(w.pending, id)
	}
}

func (w *World) wakeNotifier() {
	select {
	case w.noteWake <- struct{}{}:
	default:
	}
}

// notifyLoop runs OnLost callbacks, in order, outside every lock.
func (w *World) notifyLoop() {
	defer w.wg.Done()
	for {
		select {
		case <-w.noteWake:
		case <-w.done:
			return
		}
		w.mu.Lock()
		notes := w.notes
		w.notes = nil
		w.mu.Unlock()
		for _, n := range notes {
			for _, fn := range n.fns {
				fn(n.rank, n.reason)
			}
		}
	}
}
