package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gear/cuda"
)

// NCCLComm is a communicator for device buffers, carried by NCCL. Its ranks
// are those of the world (NewNCCL) or of a host communicator (Comm.NCCL); its
// calls take device pointers (cuda.DevicePtr) with an element count and type,
// and wait until the work is done on the device.
//
// It keeps the error semantics of Comm: a call whose context ends aborts the
// NCCL communicator (ncclCommAbort) and returns the context's error, wrapped
// and naming the call; a rank that the world reports lost (Bootstrap.OnLost)
// aborts it and the waiting call returns *LostError naming that rank; a rank
// whose communicator fails publishes the cause, so that its peers abort too
// and return *AbortError (or the same *LostError) instead of waiting for it.
// After any error every call returns the same error. NCCL itself cannot tell
// mismatched calls apart (they hang until a context ends, or corrupt data):
// ranks must make the same calls in the same order.
//
// The caller's work on the buffers must be finished before a call (or be
// enqueued on the communicator's stream, WithNCCLStream); the buffers are the
// caller's again when the call returns.
//
// Calls are serialized; Err and Close may be called from any goroutine.
type NCCLComm struct {
	id    string
	rank  int
	size  int
	world []int // communicator rank -> world rank
	boot  Bootstrap
	dev   *cuda.Device
	nc    *cuda.NCCLComm

	stream    cuda.Stream
	ownStream bool

	opMu sync.Mutex
	seq  uint64
	busy atomic.Bool // a call is in progress (for Close)

	failMu sync.Mutex
	cause  error
	closed bool
	done   chan struct{} // closed when the communicator fails or closes

	unregLost   func()
	watchCancel context.CancelFunc
	wg          sync.WaitGroup
	closeOnce   sync.Once
}

// NCCLOption changes how NewNCCL and Comm.NCCL build an NCCLComm.
type NCCLOption func(*ncclConfig)

type ncclConfig struct {
	name      string
	lib       *cuda.NCCL
	stream    cuda.Stream
	hasStream bool
}

// WithNCCLName names the communicator: every rank must give the same name, and
// two NCCL communicators built from one Bootstrap (or one Comm) need different
// names. The unique ID travels under a bootstrap key derived from it. The
// default is "world" for NewNCCL and "nccl" for Comm.NCCL.
func WithNCCLName(name string) NCCLOption { return func(c *ncclConfig) { c.name = name } }

// WithNCCLLibrary uses n instead of the library cuda.OpenNCCL finds
// (GEAR_NCCL_LIB, then the usual places).
func WithNCCLLibrary(n *cuda.NCCL) NCCLOption { return func(c *ncclConfig) { c.lib = n } }

// WithNCCLStream runs the communicator's work on s, a stream of the device that
// the caller owns (and destroys after Close). Without it the communicator
// creates a stream of its own.
func WithNCCLStream(s cuda.Stream) NCCLOption {
	return func(c *ncclConfig) { c.stream, c.hasStream = s, true }
}

// ncclRemoteGrace is how long a call that NCCL failed because a peer aborted
// waits for that peer's notice, so that the error names the peer's cause rather
// than "remote error".
const ncclRemoteGrace = time.Second

// ncclCloseTimeout bounds how long Close waits for NCCL to finalize a healthy
// communicator before it aborts it.
const ncclCloseTimeout = 10 * time.Second

// NewNCCL builds an NCCL communicator of every rank of the world b describes,
// on dev. Every rank must call it with the same options: rank 0 creates the
// NCCL unique ID and publishes it through b (Set), the others wait for it
// (Wait), and all of them create the communicator, which returns once every
// rank has joined. NCCL needs each rank on a different GPU.
//
// Errors: the context's error; a rank lost while the others wait for it
// (*LostError); no NCCL library (errors.Is cuda.ErrNoNCCL); NCCL's own errors.
func NewNCCL(ctx context.Context, b Bootstrap, dev *cuda.Device, opts ...NCCLOption) (*NCCLComm, error) {
	cfg := ncclConfig{name: "world"}
	for _, o := range opts {
		o(&cfg)
	}
	if b == nil {
		return nil, errors.New("collective: NewNCCL: nil bootstrap")
	}
	rank, size := b.Rank(), b.Size()
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("collective: bootstrap says rank %d of %d", rank, size)
	}
	world := make([]int, size)
	for i := range world {
		world[i] = i
	}
	return newNCCL(ctx, b, dev, "nccl."+cfg.name, rank, world, cfg)
}

// NCCL builds an NCCL communicator of the ranks of c, with the same ranks, on
// dev. It is collective over c's ranks (every rank of c must call it, with the
// same options), but it exchanges only through the Bootstrap, so c may be in
// use meanwhile. The NCCL communicator is independent of c: close both.
func (c *Comm) NCCL(ctx context.Context, dev *cuda.Device, opts ...NCCLOption) (*NCCLComm, error) {
	cfg := ncclConfig{name: "nccl"}
	for _, o := range opts {
		o(&cfg)
	}
	return newNCCL(ctx, c.boot, dev, c.id+"."+cfg.name, c.rank, c.world, cfg)
}

// kvAt is a Bootstrap seen from a communicator rank: the NCCL unique ID is made
// by the communicator's rank 0.
type kvAt struct {
	Bootstrap
	rank int
}

func (k kvAt) Rank() int { return k.rank }

func newNCCL(ctx context.Context, b Bootstrap, dev *cuda.Device, id string, rank int, world []int, cfg ncclConfig) (_ *NCCLComm, err error) {
	if ctx == nil {
		return nil, errors.New("collective: nil context")
	}
	if dev == nil {
		return nil, errors.New("collective: NCCL communicator: nil device")
	}
	if cfg.name == "" || strings.ContainsAny(cfg.name, "/ \t\n") {
		return nil, fmt.Errorf("collective: NCCL communicator name %q: want a non-empty name without '/' or spaces", cfg.name)
	}
	lib := cfg.lib
	if lib == nil {
		if lib, err = cuda.OpenNCCL(); err != nil {
			return nil, fmt.Errorf("collective: NCCL communicator %q: %w", id, err)
		}
	}
	d := &NCCLComm{id: id, rank: rank, size: len(world), world: world, boot: b, dev: dev, done: make(chan struct{})}
	if cfg.hasStream {
		d.stream = cfg.stream
	} else {
		if d.stream, err = dev.NewStream(); err != nil {
			return nil, fmt.Errorf("collective: NCCL communicator %q: %w", id, err)
		}
		d.ownStream = true
		defer func() {
			if err != nil {
				dev.DestroyStream(d.stream)
			}
		}()
	}
	// A rank lost while the others wait for it ends the wait.
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if len(world) > 1 {
		unreg := b.OnLost(func(w int, reason string) {
			if r := d.commRank(w); r >= 0 && r != rank {
				cancel(&LostError{Rank: r, WorldRank: w, Reason: reason})
			}
		})
		defer unreg()
	}
	wrap := func(err error) error {
		var le *LostError
		if cause := context.Cause(cctx); errors.As(cause, &le) {
			return le
		}
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("collective: NCCL communicator %q: %w", id, ctx.Err())
		}
		return fmt.Errorf("collective: NCCL communicator %q: %w", id, err)
	}
	uid, err := lib.ShareUniqueID(cctx, kvAt{b, rank}, d.key("nccl-uid"))
	if err != nil {
		return nil, wrap(err)
	}
	if d.nc, err = lib.NewComm(cctx, dev, uid, len(world), rank); err != nil {
		return nil, wrap(err)
	}
	d.start()
	return d, nil
}

func (d *NCCLComm) key(what string) string { return "collective/" + d.id + "/" + what }

// commRank is the communicator rank of world rank w, or -1.
func (d *NCCLComm) commRank(w int) int {
	for r, x := range d.world {
		if x == w {
			return r
		}
	}
	return -1
}

// start watches for lost ranks and for the failure notices of other ranks.
func (d *NCCLComm) start() {
	if d.size == 1 {
		return
	}
	d.unregLost = d.boot.OnLost(func(w int, reason string) {
		if r := d.commRank(w); r >= 0 && r != d.rank {
			d.fail(&LostError{Rank: r, WorldRank: w, Reason: reason}, false)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	d.watchCancel = cancel
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		v, err := d.boot.Wait(ctx, d.key("nccl-abort"))
		if err != nil {
			return
		}
		d.fail(decodeAbort(v), false)
	}()
}

// Rank is this rank's index in the communicator.
func (d *NCCLComm) Rank() int { return d.rank }

// Size is the number of ranks in the communicator.
func (d *NCCLComm) Size() int { return d.size }

// WorldRank is the world rank of the communicator's rank r.
func (d *NCCLComm) WorldRank(r int) int { return d.world[r] }

// Device is the device the communicator runs on.
func (d *NCCLComm) Device() *cuda.Device { return d.dev }

// Stream is the stream the communicator's work runs on.
func (d *NCCLComm) Stream() cuda.Stream { return d.stream }

// Err returns the error that made the communicator fail, ErrClosed after Close,
// or nil.
func (d *NCCLComm) Err() error {
	d.failMu.Lock()
	defer d.failMu.Unlock()
	if d.closed {
		return ErrClosed
	}
	return d.cause
}

// fail makes the communicator fail with err unless it failed already: it aborts
// the NCCL communicator (a call in progress returns) and, for a cause found on
// this rank, tells the other ranks. It returns the communicator's cause.
func (d *NCCLComm) fail(err error, publish bool) error {
	d.failMu.Lock()
	if d.cause != nil {
		cause := d.cause
		d.failMu.Unlock()
		return cause
	}
	d.cause = err
	close(d.done)
	publish = publish && err != ErrClosed && d.size > 1 && d.watchCancel != nil
	if publish {
		d.wg.Add(1)
	}
	d.failMu.Unlock()
	if d.nc != nil {
		d.nc.Abort(err)
	}
	if publish {
		go func() {
			defer d.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d.boot.Set(ctx, d.key("nccl-abort"), encodeAbort(d.rank, err))
		}()
	}
	return err
}

// ncclCall describes one call: its header (for errors), and the root or peer
// it names (-1: none).
type ncclCall struct {
	h     header
	count int
	root  int
	peer  int
	send  bool // a Send (kindP2P)
}

func (d *NCCLComm) describe(x ncclCall) string {
	if x.h.kind == kindP2P {
		dir := "Send(%v, %d elements, to rank %d) as call %d"
		if !x.send {
			dir = "Recv(%v, %d elements, from rank %d) as call %d"
		}
		return "NCCL " + fmt.Sprintf(dir, x.h.dtype, x.count, x.peer, d.seq)
	}
	return "NCCL " + x.h.describe()
}

// check checks the arguments of a call and converts its type and reduction.
func (d *NCCLComm) check(x ncclCall) (cuda.DType, cuda.RedOp, error) {
	dt, err := ncclType(x.h.dtype)
	if err != nil {
		return 0, 0, err
	}
	if x.count < 0 {
		return 0, 0, fmt.Errorf("count %d", x.count)
	}
	var op cuda.RedOp
	if x.h.kind.reduces() {
		if x.h.dtype == Bytes {
			return 0, 0, errors.New("bytes cannot be reduced")
		}
		if op, err = ncclOp(x.h.op); err != nil {
			return 0, 0, err
		}
	}
	if x.root != -1 && (x.root < 0 || x.root >= d.size) {
		return 0, 0, fmt.Errorf("root %d of %d ranks", x.root, d.size)
	}
	if x.peer != -1 && (x.peer < 0 || x.peer >= d.size || x.peer == d.rank) {
		return 0, 0, fmt.Errorf("peer %d (this is rank %d of %d)", x.peer, d.rank, d.size)
	}
	return dt, op, nil
}

// call runs one NCCL operation, and turns its error into the communicator's.
func (d *NCCLComm) call(ctx context.Context, x ncclCall, run func(ctx context.Context, dt cuda.DType, op cuda.RedOp) error) error {
	if ctx == nil {
		return errors.New("collective: nil context")
	}
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.busy.Store(true)
	defer d.busy.Store(false)
	if err := d.Err(); err != nil {
		return err
	}
	d.seq++
	x.h.seq = d.seq
	what := d.describe(x)
	dt, op, err := d.check(x)
	if err != nil {
		return d.fail(fmt.Errorf("collective: %s: %w", what, err), true)
	}
	if err := ctx.Err(); err != nil {
		return d.fail(fmt.Errorf("collective: %s: %w", what, err), true)
	}
	err = run(ctx, dt, op)
	if err == nil {
		return nil
	}
	if cause := d.Err(); cause != nil {
		return cause // a lost rank, another rank's notice, or Close aborted the call
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return d.fail(fmt.Errorf("collective: %s: %w", what, ctx.Err()), true)
	}
	var nerr *cuda.NCCLError
	if errors.As(err, &nerr) && (nerr.Code == cuda.NCCLRemoteError || nerr.Code == cuda.NCCLSystemError) {
		// A peer aborted, or its connection broke: its notice (or the
		// world's news of its death) is usually on the way.
		t := time.NewTimer(ncclRemoteGrace)
		select {
		case <-d.done:
		case <-t.C:
		}
		t.Stop()
		if cause := d.Err(); cause != nil {
			return cause
		}
	}
	return d.fail(fmt.Errorf("collective: %s: %w", what, err), true)
}

// ncclType maps an element type to NCCL's.
func ncclType(dt DType) (cuda.DType, error) {
	switch dt {
	case Float32:
		return cuda.Float32, nil
	case Float64:
		return cuda.Float64, nil
	case Int32:
		return cuda.Int32, nil
	case Int64:
		return cuda.Int64, nil
	case Bytes:
		return cuda.Uint8, nil
	}
	return 0, fmt.Errorf("element type %v", dt)
}

// ncclOp maps a reduction to NCCL's.
func ncclOp(op Op) (cuda.RedOp, error) {
	switch op {
	case Sum:
		return cuda.OpSum, nil
	case Prod:
		return cuda.OpProd, nil
	case Min:
		return cuda.OpMin, nil
	case Max:
		return cuda.OpMax, nil
	}
	return 0, fmt.Errorf("reduction %v", op)
}

// AllReduce reduces count elements of type dt at send, element-wise by op,
// across every rank, into recv on every rank. send may equal recv (in place).
func (d *NCCLComm) AllReduce(ctx context.Context, send, recv cuda.DevicePtr, count int, dt DType, op Op) error {
	x := ncclCall{h: header{kind: kindAllReduce, dtype: dt, op: op, count: uint64(max(count, 0))}, count: count, root: -1, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, o cuda.RedOp) error {
		return d.nc.AllReduce(ctx, d.stream, send, recv, count, t, o)
	})
}

// Reduce reduces count elements at send across every rank into root's recv;
// recv matters only on root. send may equal recv.
func (d *NCCLComm) Reduce(ctx context.Context, send, recv cuda.DevicePtr, count int, dt DType, op Op, root int) error {
	x := ncclCall{h: header{kind: kindReduce, dtype: dt, op: op, root: uint32(root), count: uint64(max(count, 0))}, count: count, root: root, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, o cuda.RedOp) error {
		return d.nc.Reduce(ctx, d.stream, send, recv, count, t, o, root)
	})
}

// Broadcast copies count elements at root's send into recv on every rank;
// send matters only on root, and may equal recv.
func (d *NCCLComm) Broadcast(ctx context.Context, send, recv cuda.DevicePtr, count int, dt DType, root int) error {
	x := ncclCall{h: header{kind: kindBroadcast, dtype: dt, root: uint32(root), count: uint64(max(count, 0))}, count: count, root: root, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, _ cuda.RedOp) error {
		return d.nc.Broadcast(ctx, d.stream, send, recv, count, t, root)
	})
}

// AllGather puts every rank's sendCount elements at send into recv (Size() *
// sendCount elements), rank r's at element r*sendCount, on every rank. send
// may be recv's block of this rank.
func (d *NCCLComm) AllGather(ctx context.Context, send, recv cuda.DevicePtr, sendCount int, dt DType) error {
	x := ncclCall{h: header{kind: kindAllGather, dtype: dt, count: uint64(max(sendCount, 0))}, count: sendCount, root: -1, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, _ cuda.RedOp) error {
		return d.nc.AllGather(ctx, d.stream, send, recv, sendCount, t)
	})
}

// ReduceScatter reduces send (Size() * recvCount elements) element-wise by op
// across every rank and gives rank r block r of the result in recv.
func (d *NCCLComm) ReduceScatter(ctx context.Context, send, recv cuda.DevicePtr, recvCount int, dt DType, op Op) error {
	x := ncclCall{h: header{kind: kindReduceScatter, dtype: dt, op: op, count: uint64(max(recvCount, 0))}, count: recvCount, root: -1, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, o cuda.RedOp) error {
		return d.nc.ReduceScatter(ctx, d.stream, send, recv, recvCount, t, o)
	})
}

// Send sends count elements at buf to rank dst, which must Recv them with the
// same count and type. NCCL may wait for dst to receive before it returns.
func (d *NCCLComm) Send(ctx context.Context, buf cuda.DevicePtr, count int, dt DType, dst int) error {
	x := ncclCall{h: header{kind: kindP2P, dtype: dt}, count: count, root: -1, peer: dst, send: true}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, _ cuda.RedOp) error {
		return d.nc.Send(ctx, d.stream, buf, count, t, dst)
	})
}

// Recv receives count elements of type dt from rank src into buf.
func (d *NCCLComm) Recv(ctx context.Context, buf cuda.DevicePtr, count int, dt DType, src int) error {
	x := ncclCall{h: header{kind: kindP2P, dtype: dt}, count: count, root: -1, peer: src}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, _ cuda.RedOp) error {
		return d.nc.Recv(ctx, d.stream, buf, count, t, src)
	})
}

// Close releases the communicator: a healthy one is finalized and destroyed
// (waiting at most 10 s for NCCL, then aborting), a failed one was aborted
// already. A call in progress on another goroutine is aborted and returns
// ErrClosed. Close does not wait for the other ranks; it is idempotent. It
// destroys the stream the communicator created, not one given by
// WithNCCLStream.
func (d *NCCLComm) Close() error {
	var err error
	d.closeOnce.Do(func() {
		d.failMu.Lock()
		healthy := d.cause == nil
		d.closed = true
		d.failMu.Unlock()
		if d.busy.Load() {
			d.fail(ErrClosed, false)
			healthy = false
		}
		d.opMu.Lock()
		if healthy {
			ctx, cancel := context.WithTimeout(context.Background(), ncclCloseTimeout)
			err = d.nc.Close(ctx)
			cancel()
			if errors.Is(err, cuda.ErrAborted) {
				err = nil // finalizing took too long, or a peer aborted meanwhile
			}
		} else {
			d.nc.Close(context.Background())
		}
		d.fail(ErrClosed, false)
		d.opMu.Unlock()
		if d.unregLost != nil {
			d.unregLost()
		}
		if d.watchCancel != nil {
			d.watchCancel()
		}
		d.wg.Wait()
		if d.ownStream {
			if serr := d.dev.DestroyStream(d.stream); serr != nil && err == nil {
				err = fmt.Errorf("collective: NCCL communicator %q: %w", d.id, serr)
			}
		}
		if err != nil {
			err = fmt.Errorf("collective: closing NCCL communicator %q: %w", d.id, err)
		}
	})
	return err
}
