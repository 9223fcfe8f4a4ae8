package roles

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/errmark"
)

// Reader is the parameter service's read end, on a policy worker or an inline
// actor. It keeps a private copy of one version: Params and Version. MaybeRefresh
// takes a newer version at most every `every` steps; Latest takes it now; Wait
// blocks until a version is at least some number.
//
// A Reader is used by one goroutine; Close may come from any.
type Reader struct {
	clientEnd
	pub   int
	n     int
	every int64
	me    int

	cur, spare []float32
	version    uint64
	lastStep   int64
	refreshed  bool
	fw         uint64

	nonce  []byte
	connMu sync.Mutex // the connection is dropped by fetches, closed by wakes
	conn   net.Conn
}

// NewReader opens the parameter service name: it waits for the publisher's
// endpoint, then maps its segment (same host) or prepares to fetch over TCP.
// every is the refresh period of MaybeRefresh in steps (at least 1). The reader
// holds no version yet: Version is 0 and Params nil until a refresh takes one.
func NewReader(ctx context.Context, b collective.Bootstrap, name string, every int, opts ...Option) (*Reader, error) {
	if err := checkName("parameter service", name); err != nil {
		return nil, err
	}
	if every < 1 {
		return nil, fmt.Errorf("roles: parameter reader of %q refreshing every %d steps: want at least 1", name, every)
	}
	opt, err := buildConfig(b, opts)
	if err != nil {
		return nil, err
	}
	key := paramKey(name)
	ep, err := lookup(ctx, b, key)
	if err != nil {
		return nil, err
	}
	if ep.Floats < 1 {
		return nil, fmt.Errorf("roles: endpoint %s: %d floats", key, ep.Floats)
	}
	r := &Reader{clientEnd: clientEnd{name: name, opt: opt, sem: make(chan struct{}, 1), closed: make(chan struct{})},
		pub: ep.Rank, n: ep.Floats, every: int64(every), me: b.Rank()}
	r.boot, r.key = b, key
	shm, err := attachLocal(opt, b, ep, key, func() error { return r.attachShm(ep) })
	if err != nil {
		return nil, err
	}
	if !shm {
		r.addr, r.nonce = ep.TCP, ep.Nonce
		r.bye = make(chan struct{})
	}
	r.watch = watchPeer(b, rolePublisher, ep.Rank, r.wake)
	return r, nil
}

func (r *Reader) attachShm(ep endpoint) error {
	seg, err := openSegment(ep.Shm, paramSegSize(ep.Floats))
	if err != nil {
		return err
	}
	if atomic.LoadUint64(seg.u64(offMagic)) != paramMagic || binary.LittleEndian.Uint32(seg.mem[offLayout:]) != layoutV1 ||
		binary.LittleEndian.Uint64(seg.mem[paramOffN:]) != uint64(ep.Floats) {
		seg.close()
		return fmt.Errorf("roles: shared memory %s is not a parameter service of %d floats", ep.Shm, ep.Floats)
	}
	r.seg = seg
	return nil
}

// wake interrupts a wait: the publisher was reported lost, or the reader closes.
func (r *Reader) wake() {
	if r.seg != nil {
		r.seg.wake(paramNotify)
	}
	if c := r.connLoad(); c != nil {
		c.Close()
	}
}

// Len is the number of parameters.
func (r *Reader) Len() int { return r.n }

// Params is the reader's copy of version Version: nil before the first version.
// It belongs to the reader: the caller reads it, and must not keep it past the
// next call that takes a newer version (MaybeRefresh, Latest, Wait).
func (r *Reader) Params() []float32 { return r.cur }

// Version is the version of Params (0: none yet): record it with the
// trajectories generated with these parameters.
func (r *Reader) Version() uint64 { return r.version }

// MaybeRefresh takes the newest version if at least `every` steps passed since
// the last refresh (or there was none, or step went backwards); it reports
// whether it took a newer version. It never waits for one to appear.
//
// Errors: the context's error; ErrClosed; a *LostError naming the publisher; an
// error matching ErrPeerClosed when it closed the service, then on every later
// call.
func (r *Reader) MaybeRefresh(ctx context.Context, step int64) (bool, error) {
	if r.refreshed && step >= r.lastStep && step-r.lastStep < r.every {
		return false, nil
	}
	r.refreshed, r.lastStep = true, step
	return r.refresh(ctx, 0)
}

// Latest takes the newest version now, if newer than the one held, and returns
// the version held afterwards (0 while nothing was published). Errors as for
// MaybeRefresh.
func (r *Reader) Latest(ctx context.Context) (uint64, error) {
	_, err := r.refresh(ctx, 0)
	return r.version, err
}

// Wait blocks until a version of at least min is published, takes the newest
// and returns its version. Errors as for MaybeRefresh, and one matching
// ErrInvalid for a min above 2^63-1, which no publisher can reach.
func (r *Reader) Wait(ctx context.Context, min uint64) (uint64, error) {
	if min > maxVersion {
		return r.version, errmark.Errorf(ErrInvalid, "roles: wait for parameter version %d: versions are at most 2^63-1", min)
	}
	for {
		if _, err := r.refresh(ctx, min); err != nil {
			return r.version, err
		}
		if r.version >= min {
			return r.version, nil
		}
	}
}

// refresh takes a version newer than the one held. With min > 0 it first waits
// until a version of at least min exists (TCP: until one newer than held).
func (r *Reader) refresh(ctx context.Context, min uint64) (bool, error) {
	if err := r.acquire(ctx); err != nil {
		return false, err
	}
	defer r.release()
	if err := r.check(ctx); err != nil {
		return false, err
	}
	if r.seg != nil {
		return r.refreshShm(ctx, min)
	}
	return r.refreshTCP(ctx, min > r.version)
}

func (r *Reader) refreshShm(ctx context.Context, min uint64) (bool, error) {
	seg := r.seg
	if min > r.version {
		latest := seg.u64(paramLatest)
		ready := func() bool { return atomic.LoadUint64(latest)>>1 >= min }
		if err := awaitShm(ctx, seg, paramNotify, paramSleeping, r.opt.spin, ready, func() error { return r.check(ctx) }); err != nil {
			return false, err
		}
	}
	if r.spare == nil {
		r.spare = make([]float32, r.n)
	}
	v, ok := readParams(seg, r.n, r.version, r.spare, &r.fw)
	if !ok {
		return false, nil
	}
	r.take(v)
	return true, nil
}

func (r *Reader) take(v uint64) {
	r.cur, r.spare = r.spare, r.cur
	r.version = v
}

func (r *Reader) connLoad() net.Conn {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	return r.conn
}

func (r *Reader) connStore(c net.Conn) {
	r.connMu.Lock()
	r.conn = c
	r.connMu.Unlock()
}

// refreshTCP fetches a version newer than the one held; wait asks the publisher
// to answer only once there is one.
func (r *Reader) refreshTCP(ctx context.Context, wait bool) (bool, error) {
	if r.connLoad() == nil {
		c, err := dialTCP(ctx, r.addr, paramMagicTCP, r.nonce, r.me)
		if err != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			return false, r.connErr(err)
		}
		r.connStore(c)
	}
	c := r.connLoad()
	var req [fetchSize]byte
	binary.LittleEndian.PutUint64(req[:], r.version)
	if wait {
		req[8] = 1
	}
	if _, err := c.Write(req[:]); err != nil {
		return false, r.dropConn(ctx, err)
	}
	var hdr [answerHeader]byte
	got := 0
	if err := readCtx(ctx, c, hdr[:], &got); err != nil {
		return false, r.dropConn(ctx, err)
	}
	v, count := binary.LittleEndian.Uint64(hdr[:]), binary.LittleEndian.Uint64(hdr[8:])
	switch {
	case v == paramGoodbye:
		// The publisher closed: the reader remembers it and lets go of the
		// connection, so that every later fetch fails the same way (check)
		// instead of writing to a closed peer.
		r.closeConn()
		r.sayBye()
		return false, peerClosed(rolePublisher, r.pub, r.name)
	case count == 0:
		return false, nil
	case count != uint64(r.n) || v <= r.version:
		return false, r.dropConn(ctx, fmt.Errorf("answer of version %d with %d floats to a reader of %d floats at version %d", v, count, r.n, r.version))
	}
	if r.spare == nil {
		r.spare = make([]float32, r.n)
	}
	body := floatBytes(r.spare)
	got = 0
	if err := readCtx(ctx, c, body, &got); err != nil {
		return false, r.dropConn(ctx, err)
	}
	toLittleEndian(body)
	r.take(v)
	return true, nil
}

// dropConn closes the connection after a failed or cancelled exchange (the next
// fetch dials again) and returns the reader's error.
func (r *Reader) dropConn(ctx context.Context, err error) error {
	r.closeConn()
	if r.watch.err() == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return r.connErr(err)
}

// closeConn closes the connection, if any, and forgets it.
func (r *Reader) closeConn() {
	if c := r.connLoad(); c != nil {
		c.Close()
		r.connStore(nil)
	}
}

// Close releases the reader; a fetch in progress returns ErrClosed. It is
// idempotent.
func (r *Reader) Close() error {
	var err error
	r.once.Do(func() {
		close(r.closed)
		r.watch.stop()
		r.wake()
		r.sem <- struct{}{}
		if r.seg != nil {
			err = r.seg.close()
		}
		if c := r.connLoad(); c != nil {
			if cerr := c.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
				err = cerr
			}
		}
	})
	return err
}
