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
	// bye is closed when the server says goodbye outside the replies (the
	// sample stream's credit frames); nil for the streams whose goodbye is a
	// reply.
	bye   chan struct{}
	watch *peerWatch // the server; set once the end is attached
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

// check reports why the end cannot go on, if it cannot: the server was lost,
// the end was closed, ctx ended, or (shared memory) the server closed the
// stream or its process is gone.
func (e *clientEnd) check(ctx context.Context) error {
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
// of the server unless the end or the server closed on purpose.
func (e *clientEnd) connErr(err error) error {
	if lost := e.watch.err(); lost != nil {
		return lost
	}
	select {
	case <-e.closed:
		return ErrClosed
	case <-e.bye:
		return peerClosed(e.watch.role, e.watch.rank, e.name)
	default:
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
