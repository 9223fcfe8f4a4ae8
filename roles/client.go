package roles

import (
	"context"
	"fmt"
	"sync"

	"github.com/gear-rl/gear/collective"
)

// clientEnd is what the client ends of the three streams (InferenceClient,
// SampleSender, Reader) share: the stream's name, the server's segment (shared
// memory) or address (TCP), the turn that calls take one at a time, and the
// liveness of both ends.
type clientEnd struct {
	name   string
	opt    config
	seg    *segment      // shared memory: the server's segment; nil over TCP
	addr   string        // TCP: the server's address
	sem    chan struct{} // held by the call in progress, and by Close for good
	closed chan struct{} // closed by Close
	once   sync.Once     // guards Close
	// bye is closed once the client learned that the server closed the stream
	// over TCP (the parameter service's goodbye answer, the sample stream's
	// goodbye credit); from then on every call fails with ErrPeerClosed. It is
	// nil over shared memory, where the segment's closed flag says the same, and
	// for the inference stream, whose client keeps the goodbye reply instead.
	bye     chan struct{}
	byeOnce sync.Once
	watch   *peerWatch // the server; set once the end is attached
	// boot and key find the server's close mark (closemark.go) when a
	// connection fails.
	boot collective.Bootstrap
	key  string
}

// sayBye closes bye (once): the server closed the stream.
func (e *clientEnd) sayBye() {
	if e.bye != nil {
		e.byeOnce.Do(func() { close(e.bye) })
	}
}

// Transport says which transport the client end uses: TransportShm or
// TransportTCP.
func (e *clientEnd) Transport() Transport {
	if e.seg != nil {
		return TransportShm
	}
	return TransportTCP
}

// acquire waits for the end's turn; release gives it back.
//
// Errors: the context's error; ErrClosed.
func (e *clientEnd) acquire(ctx context.Context) error {
	select {
	case e.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closed:
		return ErrClosed
	}
}

func (e *clientEnd) release() { <-e.sem }

// check reports why the end cannot go on, if it cannot: the server closed the
// stream, the server was lost, the end was closed, ctx ended, or (shared
// memory) the server closed the stream or its process is gone. A goodbye comes
// first: a server that said it closed is not lost afterwards.
func (e *clientEnd) check(ctx context.Context) error {
	select {
	case <-e.bye:
		return peerClosed(e.watch.role, e.watch.rank, e.name)
	default:
	}
	if err := e.watch.err(); err != nil {
		return err
	}
	select {
	case <-e.closed:
		return ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if e.seg != nil {
		if e.seg.closedFlag() {
			return peerClosed(e.watch.role, e.watch.rank, e.name)
		}
		if e.seg.ownerGone() {
			return e.watch.fail(fmt.Sprintf("its process ended (shared memory %s lost its owner)", e.seg.name))
		}
	}
	return nil
}

// connErr turns a broken connection into the end's error, recording the loss
// of the server unless the server or the end closed on purpose.
func (e *clientEnd) connErr(err error) error {
	select {
	case <-e.bye:
		return peerClosed(e.watch.role, e.watch.rank, e.name)
	default:
	}
	if lost := e.watch.err(); lost != nil {
		return lost
	}
	select {
	case <-e.closed:
		return ErrClosed
	default:
	}
	if serverClosed(context.Background(), e.boot, e.key) {
		// Closed before this end ever reached it, or while it was away.
		e.sayBye()
		return peerClosed(e.watch.role, e.watch.rank, e.name)
	}
	return e.watch.fail(fmt.Sprintf("connection to %s broke: %v", e.addr, err))
}

// attachLocal attaches to the server through shared memory (attach) when
// useShm says that it runs on this host, and reports whether it did. A segment
// that does not attach means another /dev/shm behind an equal host identity:
// the client falls back to TCP, unless the transport is TransportShm or the
// server has no TCP endpoint.
func attachLocal(opt config, b collective.Bootstrap, ep endpoint, key string, attach func() error) (bool, error) {
	shm, err := useShm(opt, b, ep, key)
	if err != nil || !shm {
		return false, err
	}
	if err := attach(); err != nil {
		if opt.transport == TransportShm || ep.TCP == "" {
			return false, err
		}
		return false, nil
	}
	return true, nil
}
