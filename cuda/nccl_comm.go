package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// RedOp is an ncclRedOp_t.
type RedOp int32

// Reductions.
const (
	OpSum  RedOp = 0
	OpProd RedOp = 1
	OpMax  RedOp = 2
	OpMin  RedOp = 3
	OpAvg  RedOp = 4 // NCCL 2.10 and later
)

// NCCLComm is an NCCL communicator on one device, for device buffers. Its
// operations take a context and wait for the work to finish on the caller's
// stream; while they wait they watch for an asynchronous NCCL error
// (ncclCommGetAsyncError), the context, and Abort. If the context ends, a lost
// peer is reported (AbortOnLost), or NCCL reports an error, the communicator is
// aborted (ncclCommAbort), so nothing hangs on a dead peer: every waiting
// operation returns an error wrapping ErrAborted and the cause, and so do all
// later ones.
//
// The communicator is non-blocking (ncclCommInitRankConfig with blocking = 0)
// when the library has it (NCCL 2.14 and later); then creation and every call
// return at once and all waiting is done in Go. With an older NCCL, creation
// blocks until every rank has joined and cannot be interrupted.
//
// Operations run one at a time. Abort and Err may be called from any goroutine.
type NCCLComm struct {
	n           *NCCL
	dev         *Device
	rank, size  int
	nonBlocking bool

	opMu   sync.Mutex // one operation (or Close) at a time
	callMu sync.Mutex // in non-blocking mode, every NCCL call on comm
	comm   atomic.Uintptr
	closed bool // under opMu

	abortOnce sync.Once
	aborted   chan struct{} // closed by Abort
	cause     error         // set before aborted closes
}

// abortError is the error of an operation on an aborted communicator.
type abortError struct {
	op    string
	cause error
}

func (e *abortError) Error() string {
	return fmt.Sprintf("cuda: %s: NCCL communicator aborted: %v", e.op, e.cause)
}

func (e *abortError) Unwrap() []error { return []error{ErrAborted, e.cause} }

// PeerLostError is the cause of an abort by AbortOnLost.
type PeerLostError struct {
	Rank   int
	Reason string
}

func (e *PeerLostError) Error() string {
	return fmt.Sprintf("cuda: rank %d lost: %s", e.Rank, e.Reason)
}

// NewComm creates this rank's communicator of nranks ranks from id (which every
// rank must share, see ShareUniqueID) on dev. It waits until every rank has
// joined: if ctx ends first, the half-made communicator is aborted and NewComm
// returns ctx's error.
func (n *NCCL) NewComm(ctx context.Context, dev *Device, id UniqueID, nranks, rank int) (*NCCLComm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("cuda: NCCL communicator: rank %d of %d", rank, nranks)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cuda: ncclCommInitRank: %w", err)
	}
	c := &NCCLComm{n: n, dev: dev, rank: rank, size: nranks, aborted: make(chan struct{})}
	cid := ncclUniqueID{internal: id}
	var h uintptr
	var r int32
	if n.initRankConfig != nil {
		const name = "ncclCommInitRankConfig"
		c.nonBlocking = true
		cfg := &ncclConfig{size: uint64(unsafe.Sizeof(ncclConfig{})), magic: ncclConfigMagic, version: ncclConfigVersion, blocking: 0}
		if err := dev.do(func() error {
			r = n.initRankConfig(&h, int32(nranks), cid, int32(rank), cfg)
			return nil
		}); err != nil {
			return nil, err
		}
		runtime.KeepAlive(cfg)
		code := NCCLResult(r)
		if code != NCCLSuccess && code != NCCLInProgress {
			err := n.errorOf(name, h, code)
			if h != 0 {
				_ = dev.do(func() error { ccall(n.fn.commAbort, h); return nil })
			}
			return nil, err
		}
		c.comm.Store(h)
		if err := c.wait(ctx, name, 0, false); err != nil {
			return nil, err
		}
		return c, nil
	}
	const name = "ncclCommInitRank"
	if err := dev.do(func() error {
		r = n.initRank(&h, int32(nranks), cid, int32(rank))
		return nil
	}); err != nil {
		return nil, err
	}
	if code := NCCLResult(r); code != NCCLSuccess {
		return nil, n.errorOf(name, h, code)
	}
	c.comm.Store(h)
	return c, nil
}

// Rank is this rank's index in the communicator.
func (c *NCCLComm) Rank() int { return c.rank }

// Size is the number of ranks of the communicator.
func (c *NCCLComm) Size() int { return c.size }

// NonBlocking reports whether the communicator was created non-blocking.
func (c *NCCLComm) NonBlocking() bool { return c.nonBlocking }

// Abort aborts the communicator (ncclCommAbort) with reason as the cause: work in
// flight on the device is stopped, waiting operations return, and every later
// operation fails. It may be called from any goroutine, more than once (only the
// first reason counts), and after Close (then it does nothing).
func (c *NCCLComm) Abort(reason error) {
	if reason == nil {
		reason = errors.New("aborted by the caller")
	}
	c.abortOnce.Do(func() {
		c.cause = reason
		close(c.aborted)
		if c.nonBlocking {
			c.callMu.Lock()
			defer c.callMu.Unlock()
		}
		if h := c.comm.Swap(0); h != 0 {
			_ = c.dev.do(func() error { ccall(c.n.fn.commAbort, h); return nil })
		}
	})
}

// AbortOnLost aborts the communicator when the world reports a lost rank.
// onLost is the world's registration function (collective.Bootstrap.OnLost,
// rank.World.OnLost); the returned function unregisters. The cause of the abort
// is a *PeerLostError.
func (c *NCCLComm) AbortOnLost(onLost func(fn func(rank int, reason string)) (unregister func())) (unregister func()) {
	return onLost(func(rank int, reason string) {
		c.Abort(&PeerLostError{Rank: rank, Reason: reason})
	})
}

// Err polls the communicator's asynchronous error once: nil while it is healthy,
// the abort error after an abort.
func (c *NCCLComm) Err() error {
	st, err := c.asyncState("ncclCommGetAsyncError")
	if err != nil {
		return err
	}
	if st != NCCLSuccess && st != NCCLInProgress {
		return c.n.errorOf("ncclCommGetAsyncError", c.comm.Load(), st)
	}
	return nil
}

func (c *NCCLComm) abortErr(op string) error {
	<-c.aborted // closed before comm is cleared, so cause is set
	return &abortError{op: op, cause: c.cause}
}

// asyncState reads ncclCommGetAsyncError.
func (c *NCCLComm) asyncState(op string) (NCCLResult, error) {
	if c.nonBlocking {
		c.callMu.Lock()
		defer c.callMu.Unlock()
	}
	h := c.comm.Load()
	if h == 0 {
		return 0, c.abortErr(op)
	}
	var st int32
	if err := c.dev.do(func() error {
		return c.n.check("ncclCommGetAsyncError", h, ccall(c.n.fn.commGetAsyncError, h, uintptr(unsafe.Pointer(&st))))
	}); err != nil {
		return 0, err
	}
	return NCCLResult(st), nil
}

// wait polls until the communicator is no longer in progress and, if onStream,
// stream s has passed the enqueued work. It aborts the communicator when ctx
// ends or NCCL reports an error.
func (c *NCCLComm) wait(ctx context.Context, op string, s Stream, onStream bool) error {
	err := poll(ctx, c.aborted, func() (bool, error) {
		st, err := c.asyncState(op)
		if err != nil {
			return false, err
		}
		switch st {
		case NCCLInProgress:
			return false, nil
		case NCCLSuccess:
		default:
			nerr := c.n.errorOf(op, c.comm.Load(), st)
			c.Abort(nerr)
			return false, c.abortErr(op)
		}
		if !onStream {
			return true, nil
		}
		return c.dev.StreamDone(s)
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errStopped):
		return c.abortErr(op)
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		c.Abort(fmt.Errorf("%s: %w", op, ctx.Err()))
		return c.abortErr(op)
	}
	return err
}

// run enqueues one operation (or group) and waits for it.
func (c *NCCLComm) run(ctx context.Context, op string, s Stream, enqueue func(comm uintptr) NCCLResult) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if c.closed {
		return fmt.Errorf("%w: NCCL communicator", ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	code, err := c.enqueue(ctx, op, enqueue)
	if err != nil {
		return err
	}
	switch code {
	case NCCLSuccess, NCCLInProgress:
	case NCCLInvalidArgument, NCCLInvalidUsage:
		return c.n.errorOf(op, c.comm.Load(), code)
	default:
		nerr := c.n.errorOf(op, c.comm.Load(), code)
		c.Abort(nerr)
		return c.abortErr(op)
	}
	return c.wait(ctx, op, s, true)
}

// enqueue makes the NCCL calls of one operation with the device's context
// current. In non-blocking mode they return at once and hold callMu; in blocking
// mode they may block (connecting to peers), so a context that ends meanwhile
// aborts the communicator from another goroutine, as NCCL allows.
func (c *NCCLComm) enqueue(ctx context.Context, op string, f func(comm uintptr) NCCLResult) (NCCLResult, error) {
	if c.nonBlocking {
		c.callMu.Lock()
		defer c.callMu.Unlock()
	} else {
		stop := context.AfterFunc(ctx, func() { c.Abort(fmt.Errorf("%s: %w", op, ctx.Err())) })
		defer stop()
	}
	h := c.comm.Load()
	if h == 0 {
		return 0, c.abortErr(op)
	}
	var code NCCLResult
	err := c.dev.do(func() error {
		code = f(h)
		return nil
	})
	return code, err
}

func (c *NCCLComm) checkCount(op string, count int) error {
	if count < 0 {
		return fmt.Errorf("cuda: %s: count %d", op, count)
	}
	return nil
}

// AllReduce reduces count elements of send across all ranks with op and leaves
// the result in recv on every rank (send may equal recv).
func (c *NCCLComm) AllReduce(ctx context.Context, s Stream, send, recv DevicePtr, count int, dt DType, op RedOp) error {
	if err := c.checkCount("ncclAllReduce", count); err != nil {
		return err
	}
	return c.run(ctx, "ncclAllReduce", s, func(h uintptr) NCCLResult {
		return NCCLResult(int32(ccall(c.n.fn.allReduce, uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(op), h, uintptr(s))))
	})
}

// Broadcast copies count elements of root's send into recv on every rank.
func (c *NCCLComm) Broadcast(ctx context.Context, s Stream, send, recv DevicePtr, count int, dt DType, root int) error {
	if err := c.checkCount("ncclBroadcast", count); err != nil {
		return err
	}
	return c.run(ctx, "ncclBroadcast", s, func(h uintptr) NCCLResult {
		return NCCLResult(int32(ccall(c.n.fn.broadcast, uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(root), h, uintptr(s))))
	})
}

// Reduce reduces count elements of send across all ranks with op into root's recv.
func (c *NCCLComm) Reduce(ctx context.Context, s Stream, send, recv DevicePtr, count int, dt DType, op RedOp, root int) error {
	if err := c.checkCount("ncclReduce", count); err != nil {
		return err
	}
	return c.run(ctx, "ncclReduce", s, func(h uintptr) NCCLResult {
		return NCCLResult(int32(ccall(c.n.fn.reduce, uintptr(send), uintptr(recv), uintptr(count), uintptr(dt), uintptr(op), uintptr(root), h, uintptr(s))))
	})
}

// AllGather concatenates every rank's sendCount elements, in rank order, into
// recv (Size()*sendCount elements) on every rank.
func (c *NCCLComm) AllGather(ctx context.Context, s Stream, send, recv DevicePtr, sendCount int, dt DType) error {
	if err := c.checkCount("ncclAllGather", sendCount); err != nil {
		return err
	}
	return c.run(ctx, "ncclAllGather", s, func(h uintptr) NCCLResult {
		return NCCLResult(int32(ccall(c.n.fn.allGather, uintptr(send), uintptr(recv), uintptr(sendCount), uintptr(dt), h, uintptr(s))))
	})
}

// ReduceScatter reduces send (Size()*recvCount elements) across all ranks with
// op and leaves block Rank() of the result in recv.
func (c *NCCLComm) ReduceScatter(ctx context.Context, s Stream, send, recv DevicePtr, recvCount int, dt DType, op RedOp) error {
	if err := c.checkCount("ncclReduceScatter", recvCount); err != nil {
		return err
	}
	return c.run(ctx, "ncclReduceScatter", s, func(h uintptr) NCCLResult {
		return NCCLResult(int32(ccall(c.n.fn.reduceScatter, uintptr(send), uintptr(recv), uintptr(recvCount), uintptr(dt), uintptr(op), h, uintptr(s))))
	})
}

// P2P is one send or receive of a SendRecv group.
type P2P struct {
	Send  bool // true: send Buf to Peer; false: receive Buf from Peer
	Peer  int
	Buf   DevicePtr
	Count int
	DType DType
}

// Send sends count elements of buf to peer, which must Recv them.
func (c *NCCLComm) Send(ctx context.Context, s Stream, buf DevicePtr, count int, dt DType, peer int) error {
	return c.SendRecv(ctx, s, P2P{Send: true, Peer: peer, Buf: buf, Count: count, DType: dt})
}

// Recv receives count elements from peer into buf.
func (c *NCCLComm) Recv(ctx context.Context, s Stream, buf DevicePtr, count int, dt DType, peer int) error {
	return c.SendRecv(ctx, s, P2P{Peer: peer, Buf: buf, Count: count, DType: dt})
}

// SendRecv runs sends and receives as one NCCL group (ncclGroupStart, the
// calls, ncclGroupEnd), so that ranks exchanging in both directions do not
// deadlock, and waits for all of them.
func (c *NCCLComm) SendRecv(ctx context.Context, s Stream, ops ...P2P) error {
	for _, o := range ops {
		if o.Peer < 0 || o.Peer >= c.size {
			return fmt.Errorf("cuda: ncclSend/ncclRecv: peer %d of %d", o.Peer, c.size)
		}
		if err := c.checkCount("ncclSend/ncclRecv", o.Count); err != nil {
			return err
		}
	}
	if len(ops) == 0 {
		return nil
	}
	return c.run(ctx, "ncclGroupEnd", s, func(h uintptr) NCCLResult {
		fn := c.n.fn
		if code := NCCLResult(int32(ccall(fn.groupStart))); code != NCCLSuccess {
			return code
		}
		first := NCCLSuccess
		for _, o := range ops {
			var code NCCLResult
			if o.Send {
				code = NCCLResult(int32(ccall(fn.send, uintptr(o.Buf), uintptr(o.Count), uintptr(o.DType), uintptr(o.Peer), h, uintptr(s))))
			} else {
				code = NCCLResult(int32(ccall(fn.recv, uintptr(o.Buf), uintptr(o.Count), uintptr(o.DType), uintptr(o.Peer), h, uintptr(s))))
			}
			if first == NCCLSuccess && code != NCCLSuccess && code != NCCLInProgress {
				first = code
			}
		}
		end := NCCLResult(int32(ccall(fn.groupEnd)))
		if first != NCCLSuccess {
			return first
		}
		return end
	})
}

// Close finalizes the communicator (ncclCommFinalize, waiting under ctx for
// NCCL to flush its work; if ctx ends, it aborts instead) and destroys it
// (ncclCommDestroy). After an abort it only marks the communicator closed.
// Close is idempotent.
func (c *NCCLComm) Close(ctx context.Context) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.comm.Load() == 0 {
		return nil
	}
	if c.nonBlocking && c.n.fn.commFinalize != 0 {
		code, err := c.enqueue(ctx, "ncclCommFinalize", func(h uintptr) NCCLResult {
			return NCCLResult(int32(ccall(c.n.fn.commFinalize, h)))
		})
		if err != nil {
			return err
		}
		if code != NCCLSuccess && code != NCCLInProgress {
			c.Abort(c.n.errorOf("ncclCommFinalize", c.comm.Load(), code))
			return c.abortErr("ncclCommFinalize")
		}
		if err := c.wait(ctx, "ncclCommFinalize", 0, false); err != nil {
			return err
		}
	}
	if c.nonBlocking {
		c.callMu.Lock()
		defer c.callMu.Unlock()
	}
	h := c.comm.Swap(0)
	if h == 0 {
		return nil // aborted meanwhile
	}
	c.abortOnce.Do(func() { c.cause = ErrClosed; close(c.aborted) })
	var code NCCLResult
	if err := c.dev.do(func() error {
		code = NCCLResult(int32(ccall(c.n.fn.commDestroy, h)))
		return nil
	}); err != nil {
		return err
	}
	if code != NCCLSuccess && code != NCCLInProgress {
		return c.n.errorOf("ncclCommDestroy", 0, code)
	}
	return nil
}
