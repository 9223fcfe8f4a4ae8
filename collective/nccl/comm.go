package nccl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/cuda"
)

// Comm is a communicator for device buffers, carried by NCCL. Its ranks are
// those of the world (New) or of a host communicator (FromComm); its calls take
// device pointers (cuda.DevicePtr) with an element count and type, and wait
// until the work is done on the device.
//
// It keeps the error semantics of collective.Comm: a call whose context ends
// aborts the NCCL communicator (ncclCommAbort) and returns the context's
// error, wrapped and naming the call; a rank that the world reports lost
// (Bootstrap.OnLost) aborts it and the waiting call returns
// *collective.LostError naming that rank; a rank whose communicator fails
// publishes the cause, so that its peers abort too and return
// *collective.AbortError (or the same *LostError) instead of waiting for it.
// After any error every call returns the same error. NCCL itself cannot tell
// mismatched calls apart (they hang until a context ends, or corrupt data):
// ranks must make the same calls in the same order.
//
// The caller's work on the buffers must be finished before a call (or be
// enqueued on the communicator's stream, WithStream); the buffers are the
// caller's again when the call returns.
//
// Calls are serialized; Err and Close may be called from any goroutine.
type Comm struct {
	id    string
	rank  int
	size  int
	world []int // communicator rank -> world rank
	boot  collective.Bootstrap
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

// Option changes how New, FromComm and ForLayout build NCCL communicators.
type Option func(*config)

type config struct {
	name      string
	lib       *cuda.NCCL
	stream    cuda.Stream
	hasStream bool
}

// WithName names the communicator: every rank must give the same name, and
// two NCCL communicators built from one Bootstrap (or one collective.Comm)
// need different names. The unique ID travels under a bootstrap key derived
// from it. The default is "world" for New and "nccl" for FromComm; ForLayout
// names its communicators "layout", whatever this option says.
func WithName(name string) Option { return func(c *config) { c.name = name } }

// WithLibrary uses n instead of the library cuda.OpenNCCL finds
// (GEAR_NCCL_LIB, then the usual places).
func WithLibrary(n *cuda.NCCL) Option { return func(c *config) { c.lib = n } }

// WithStream runs the communicator's work on s, a stream of the device that
// the caller owns (and destroys after Close). Without it the communicator
// creates a stream of its own.
func WithStream(s cuda.Stream) Option {
	return func(c *config) { c.stream, c.hasStream = s, true }
}

// ncclRemoteGrace is how long a call that NCCL failed because a peer aborted
// waits for that peer's notice, so that the error names the peer's cause rather
// than "remote error".
const ncclRemoteGrace = time.Second

// ncclCloseTimeout bounds how long Close waits for NCCL to finalize a healthy
// communicator before it aborts it.
const ncclCloseTimeout = 10 * time.Second

// New builds an NCCL communicator of every rank of the world b describes, on
// dev. Every rank must call it with the same options: rank 0 creates the NCCL
// unique ID and publishes it through b (Set), the others wait for it (Wait),
// and all of them create the communicator, which returns once every rank has
// joined. NCCL needs each rank on a different GPU.
//
// Errors: the context's error; a rank lost while the others wait for it
// (*collective.LostError); no NCCL library (errors.Is cuda.ErrNoNCCL); NCCL's
// own errors.
func New(ctx context.Context, b collective.Bootstrap, dev *cuda.Device, opts ...Option) (*Comm, error) {
	cfg := config{name: "world"}
	for _, o := range opts {
		o(&cfg)
	}
	if b == nil {
		return nil, errors.New("collective: nccl.New: nil bootstrap")
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

// FromComm builds an NCCL communicator of the ranks of c, with the same
// ranks, on dev. It is collective over c's ranks (every rank of c must call
// it, with the same options), but it exchanges only through c's Bootstrap, so
// c may be in use meanwhile. The NCCL communicator is independent of c: close
// both.
//
// Errors: those of New.
func FromComm(ctx context.Context, c *collective.Comm, dev *cuda.Device, opts ...Option) (*Comm, error) {
	if c == nil {
		return nil, errors.New("collective: NCCL communicator: nil communicator")
	}
	cfg := config{name: "nccl"}
	for _, o := range opts {
		o(&cfg)
	}
	world := make([]int, c.Size())
	for r := range world {
		world[r] = c.WorldRank(r)
	}
	return newNCCL(ctx, c.Bootstrap(), dev, c.Name()+"."+cfg.name, c.Rank(), world, cfg)
}

// kvAt is a Bootstrap seen from a communicator rank: the NCCL unique ID is made
// by the communicator's rank 0.
type kvAt struct {
	collective.Bootstrap
	rank int
}

func (k kvAt) Rank() int { return k.rank }

func newNCCL(ctx context.Context, b collective.Bootstrap, dev *cuda.Device, id string, rank int, world []int, cfg config) (_ *Comm, err error) {
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
	d := &Comm{id: id, rank: rank, size: len(world), world: world, boot: b, dev: dev, done: make(chan struct{})}
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
				cancel(&collective.LostError{Rank: r, WorldRank: w, Reason: reason})
			}
		})
		defer unreg()
	}
	wrap := func(err error) error {
		var le *collective.LostError
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

func (d *Comm) key(what string) string { return "collective/" + d.id + "/" + what }

// commRank is the communicator rank of world rank w, or -1.
func (d *Comm) commRank(w int) int {
	for r, x := range d.world {
		if x == w {
			return r
		}
	}
	return -1
}

// start watches for lost ranks and for the failure notices of other ranks.
func (d *Comm) start() {
	if d.size == 1 {
		return
	}
	d.unregLost = d.boot.OnLost(func(w int, reason string) {
		if r := d.commRank(w); r >= 0 && r != d.rank {
			d.fail(&collective.LostError{Rank: r, WorldRank: w, Reason: reason}, false)
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
		d.fail(collective.DecodeAbortNote(v), false)
	}()
}

// Rank is this rank's index in the communicator.
func (d *Comm) Rank() int { return d.rank }

// Size is the number of ranks in the communicator.
func (d *Comm) Size() int { return d.size }

// WorldRank is the world rank of the communicator's rank r.
func (d *Comm) WorldRank(r int) int { return d.world[r] }

// Device is the device the communicator runs on.
func (d *Comm) Device() *cuda.Device { return d.dev }

// Stream is the stream the communicator's work runs on.
func (d *Comm) Stream() cuda.Stream { return d.stream }

// Err returns the error that made the communicator fail,
// collective.ErrClosed after Close, or nil.
func (d *Comm) Err() error {
	d.failMu.Lock()
	defer d.failMu.Unlock()
	if d.closed {
		return collective.ErrClosed
	}
	return d.cause
}

// fail makes the communicator fail with err unless it failed already: it aborts
// the NCCL communicator (a call in progress returns) and, for a cause found on
// this rank, tells the other ranks. It returns the communicator's cause.
func (d *Comm) fail(err error, publish bool) error {
	d.failMu.Lock()
	if d.cause != nil {
		cause := d.cause
		d.failMu.Unlock()
		return cause
	}
	d.cause = err
	close(d.done)
	publish = publish && err != collective.ErrClosed && d.size > 1 && d.watchCancel != nil
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
			d.boot.Set(ctx, d.key("nccl-abort"), collective.EncodeAbortNote(d.rank, err))
		}()
	}
	return err
}

// ncclCall describes one call, for its checks and its errors.
type ncclCall struct {
	name    string // the operation: "AllReduce", "Send", ...
	dtype   collective.DType
	op      collective.Op // the reduction of calls that reduce
	reduces bool
	count   int
	root    int // the root of Reduce and Broadcast; -1: none
	peer    int // the peer of Send and Recv; -1: none
}

// describe names the call x the way errors print it, as collective.Comm names
// its calls: "NCCL AllReduce(sum, float32, 100 elements) as call 7".
func (d *Comm) describe(x ncclCall) string {
	switch x.name {
	case "Send":
		return fmt.Sprintf("NCCL Send(%v, %d elements, to rank %d) as call %d", x.dtype, x.count, x.peer, d.seq)
	case "Recv":
		return fmt.Sprintf("NCCL Recv(%v, %d elements, from rank %d) as call %d", x.dtype, x.count, x.peer, d.seq)
	}
	s := "NCCL " + x.name + "("
	if x.reduces {
		s += x.op.String() + ", "
	}
	s += fmt.Sprintf("%v, %d elements", x.dtype, max(x.count, 0))
	if x.name == "Reduce" || x.name == "Broadcast" {
		s += fmt.Sprintf(", root %d", x.root)
	}
	return s + fmt.Sprintf(") as call %d", d.seq)
}

// check checks the arguments of a call and converts its type and reduction.
func (d *Comm) check(x ncclCall) (cuda.DType, cuda.RedOp, error) {
	dt, err := ncclType(x.dtype)
	if err != nil {
		return 0, 0, err
	}
	if x.count < 0 {
		return 0, 0, fmt.Errorf("count %d", x.count)
	}
	var op cuda.RedOp
	if x.reduces {
		if x.dtype == collective.Bytes {
			return 0, 0, errors.New("bytes cannot be reduced")
		}
		if op, err = ncclOp(x.op); err != nil {
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
func (d *Comm) call(ctx context.Context, x ncclCall, run func(ctx context.Context, dt cuda.DType, op cuda.RedOp) error) error {
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
	what := d.describe(x)
	dt, op, err := d.check(x)
	if err != nil {
		return d.fail(fmt.Errorf("collective: %s: %w", what, err), true)
	}
	if err := ctx.Err(); err != nil {
		return d.fail(fmt.Errorf("collective: %s: %w", what, err), true)
	}
	err = run(ctx, dt, op)
	if cause := d.Err(); cause != nil {
		// A lost rank, another rank's notice, or Close aborted the call. An
		// abort ends the kernels that wait for their peers, so the stream
		// may come back done, without an error, and the result unfinished:
		// a call that ends on a failed communicator did not complete.
		return cause
	}
	if err == nil {
		return nil
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
func ncclType(dt collective.DType) (cuda.DType, error) {
	switch dt {
	case collective.Float32:
		return cuda.Float32, nil
	case collective.Float64:
		return cuda.Float64, nil
	case collective.Int32:
		return cuda.Int32, nil
	case collective.Int64:
		return cuda.Int64, nil
	case collective.Bytes:
		return cuda.Uint8, nil
	}
	return 0, fmt.Errorf("element type %v", dt)
}

// ncclOp maps a reduction to NCCL's.
func ncclOp(op collective.Op) (cuda.RedOp, error) {
	switch op {
	case collective.Sum:
		return cuda.OpSum, nil
	case collective.Prod:
		return cuda.OpProd, nil
	case collective.Min:
		return cuda.OpMin, nil
	case collective.Max:
		return cuda.OpMax, nil
	}
	return 0, fmt.Errorf("reduction %v", op)
}

// AllReduce reduces count elements of type dt at send, element-wise by op,
// across every rank, into recv on every rank. send may equal recv (in place).
func (d *Comm) AllReduce(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, op collective.Op) error {
	x := ncclCall{name: "AllReduce", dtype: dt, op: op, reduces: true, count: count, root: -1, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, o cuda.RedOp) error {
		return d.nc.AllReduce(ctx, d.stream, send, recv, count, t, o)
	})
}

// Reduce reduces count elements at send across every rank into root's recv;
// recv matters only on root. send may equal recv.
func (d *Comm) Reduce(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, op collective.Op, root int) error {
	x := ncclCall{name: "Reduce", dtype: dt, op: op, reduces: true, count: count, root: root, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, o cuda.RedOp) error {
		return d.nc.Reduce(ctx, d.stream, send, recv, count, t, o, root)
	})
}

// Broadcast copies count elements at root's send into recv on every rank;
// send matters only on root, and may equal recv.
func (d *Comm) Broadcast(ctx context.Context, send, recv cuda.DevicePtr, count int, dt collective.DType, root int) error {
	x := ncclCall{name: "Broadcast", dtype: dt, count: count, root: root, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, _ cuda.RedOp) error {
		return d.nc.Broadcast(ctx, d.stream, send, recv, count, t, root)
	})
}

// AllGather puts every rank's sendCount elements at send into recv (Size() *
// sendCount elements), rank r's at element r*sendCount, on every rank. send
// may be recv's block of this rank.
func (d *Comm) AllGather(ctx context.Context, send, recv cuda.DevicePtr, sendCount int, dt collective.DType) error {
	x := ncclCall{name: "AllGather", dtype: dt, count: sendCount, root: -1, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, _ cuda.RedOp) error {
		return d.nc.AllGather(ctx, d.stream, send, recv, sendCount, t)
	})
}

// ReduceScatter reduces send (Size() * recvCount elements) element-wise by op
// across every rank and gives rank r block r of the result in recv.
func (d *Comm) ReduceScatter(ctx context.Context, send, recv cuda.DevicePtr, recvCount int, dt collective.DType, op collective.Op) error {
	x := ncclCall{name: "ReduceScatter", dtype: dt, op: op, reduces: true, count: recvCount, root: -1, peer: -1}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, o cuda.RedOp) error {
		return d.nc.ReduceScatter(ctx, d.stream, send, recv, recvCount, t, o)
	})
}

// Send sends count elements at buf to rank dst, which must Recv them with the
// same count and type. NCCL may wait for dst to receive before it returns.
func (d *Comm) Send(ctx context.Context, buf cuda.DevicePtr, count int, dt collective.DType, dst int) error {
	x := ncclCall{name: "Send", dtype: dt, count: count, root: -1, peer: dst}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, _ cuda.RedOp) error {
		return d.nc.Send(ctx, d.stream, buf, count, t, dst)
	})
}

// Recv receives count elements of type dt from rank src into buf.
func (d *Comm) Recv(ctx context.Context, buf cuda.DevicePtr, count int, dt collective.DType, src int) error {
	x := ncclCall{name: "Recv", dtype: dt, count: count, root: -1, peer: src}
	return d.call(ctx, x, func(ctx context.Context, t cuda.DType, _ cuda.RedOp) error {
		return d.nc.Recv(ctx, d.stream, buf, count, t, src)
	})
}

// Close releases the communicator: a healthy one is finalized and destroyed
// (waiting at most 10 s for NCCL, then aborting), a failed one was aborted
// already. A call in progress on another goroutine is aborted and returns
// collective.ErrClosed. Close does not wait for the other ranks; it is
// idempotent. It destroys the stream the communicator created, not one given
// by WithStream.
func (d *Comm) Close() error {
	var err error
	d.closeOnce.Do(func() {
		d.failMu.Lock()
		healthy := d.cause == nil
		d.closed = true
		d.failMu.Unlock()
		if d.busy.Load() {
			d.fail(collective.ErrClosed, false)
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
		d.fail(collective.ErrClosed, false)
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
