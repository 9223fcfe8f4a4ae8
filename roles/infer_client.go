package roles

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/gear-rl/gear/collective"
)

// InferenceClient is an actor's end of an inference stream: Infer sends one
// observation to the policy worker and waits for its action; InferMany sends
// the observations of a ring of environments in one request and waits for
// their actions. A client holds one request at a time; concurrent calls take
// turns.
type InferenceClient struct {
	clientEnd
	server int
	obs    int
	act    int
	reqObs int // most observations per request

	tag      uint64
	pending  bool // a request is out whose reply has not been read
	pendingN int  // its observations

	// Shared memory.
	base int // offset of this client's slot

	// TCP.
	conn net.Conn
	out  []byte
	in   []byte
	got  int
}

// DialInference connects to the inference stream name served by world rank
// server (a policy worker), through shared memory when both are on one host and
// TCP otherwise (see WithTransport). It waits for the server to publish its
// endpoint.
//
// Errors: the context's error; ErrNoSlot when every shared-memory slot is taken;
// a *LostError naming the server when it dies first; connection errors.
func DialInference(ctx context.Context, b collective.Bootstrap, name string, server int, opts ...Option) (*InferenceClient, error) {
	if err := checkName("inference stream", name); err != nil {
		return nil, err
	}
	opt, err := buildConfig(b, opts)
	if err != nil {
		return nil, err
	}
	key := inferKey(name, server)
	ep, err := lookup(ctx, b, key)
	if err != nil {
		return nil, err
	}
	c := &InferenceClient{clientEnd: clientEnd{name: name, opt: opt, sem: make(chan struct{}, 1), closed: make(chan struct{})},
		server: server, obs: ep.Obs, act: ep.Act, reqObs: max(ep.ReqObs, 1)}
	c.boot, c.key = b, key
	shm, err := attachLocal(opt, b, ep, key, func() error { return c.attachShm(ep, b.Rank()) })
	if err != nil {
		return nil, err
	}
	if !shm {
		conn, err := dialTCP(ctx, ep.TCP, inferMagicTCP, ep.Nonce, b.Rank())
		if err != nil {
			if serverClosed(ctx, b, key) {
				return nil, peerClosed(rolePolicy, server, name)
			}
			return nil, fmt.Errorf("roles: dial inference stream %q of policy worker rank %d at %s: %w", name, server, ep.TCP, err)
		}
		c.conn, c.addr = conn, ep.TCP
		c.out = make([]byte, reqHeader+c.reqObs*c.obs)
		c.in = make([]byte, repHeader+c.reqObs*c.act)
	}
	c.watch = watchPeer(b, rolePolicy, server, c.wake)
	return c, nil
}

// attachShm maps the server's segment and claims a free slot.
func (c *InferenceClient) attachShm(ep endpoint, me int) error {
	slotSize := inferSlotSize(ep.Obs, ep.Act, c.reqObs)
	seg, err := openSegment(ep.Shm, inferHeader+ep.Slots*slotSize)
	if err != nil {
		return err
	}
	if atomic.LoadUint64(seg.u64(offMagic)) != inferMagic || binary.LittleEndian.Uint32(seg.mem[offLayout:]) != layoutV1 ||
		binary.LittleEndian.Uint64(seg.mem[inferOffSlotSz:]) != uint64(slotSize) ||
		binary.LittleEndian.Uint32(seg.mem[inferOffReqObs:]) != uint32(c.reqObs) {
		seg.close()
		return fmt.Errorf("roles: shared memory %s is not an inference stream of %d slots of %d bytes", ep.Shm, ep.Slots, slotSize)
	}
	for i := range ep.Slots {
		base := inferHeader + i*slotSize
		owner := seg.u32(base + slotOwner)
		if !atomic.CompareAndSwapUint32(owner, 0, uint32(me+1)) {
			continue
		}
		switch atomic.LoadUint32(seg.u32(base + slotState)) {
		case stIdle, stReply:
			// A reply left by a client that closed before reading it.
			atomic.StoreUint32(seg.u32(base+slotState), stIdle)
		default:
			// That client's request is still with the server.
			atomic.StoreUint32(owner, 0)
			continue
		}
		atomic.AddUint32(seg.u32(inferAttached), 1)
		c.seg, c.base = seg, base
		return nil
	}
	seg.close()
	return fmt.Errorf("roles: inference stream %q of policy worker rank %d: all %d slots taken: %w", c.name, c.server, ep.Slots, ErrNoSlot)
}

// wake interrupts a wait: the server was reported lost, or the client closes.
func (c *InferenceClient) wake() {
	if c.seg != nil {
		c.seg.wake(c.base + slotWord)
	}
	if c.conn != nil {
		c.conn.Close()
	}
}

// Sizes returns the stream's largest observation and its action size.
func (c *InferenceClient) Sizes() (obsBytes, actBytes int) { return c.obs, c.act }

// MaxRequestObs returns the most observations one InferMany may send.
func (c *InferenceClient) MaxRequestObs() int { return c.reqObs }

// Infer sends obs (at most ObsBytes) and waits for the action, which it copies
// into act (exactly ActBytes). It returns the parameter version the policy
// worker used. If ctx ends first, Infer returns its error, and the next call
// first collects (and drops) the late reply.
//
// Errors: ErrTooLarge or a size error for obs and act; the context's error;
// ErrClosed after Close; a *LostError naming the policy worker when it dies; an
// error matching ErrPeerClosed when it closed the stream.
func (c *InferenceClient) Infer(ctx context.Context, obs, act []byte) (uint64, error) {
	if len(obs) > c.obs {
		return 0, fmt.Errorf("roles: observation of %d bytes, stream %q takes at most %d: %w", len(obs), c.name, c.obs, ErrTooLarge)
	}
	if len(act) != c.act {
		return 0, fmt.Errorf("roles: action buffer of %d bytes, stream %q's actions have %d", len(act), c.name, c.act)
	}
	return c.infer(ctx, obs, 1, act)
}

// InferMany sends n observations in one request, obs holding them one after
// the other (n equal parts of at most ObsBytes each), and waits for their n
// actions, which it copies into acts in the same order (exactly n×ActBytes).
// n is at most the stream's MaxRequestObs. It returns the parameter version
// the policy worker used for all of them. Otherwise it is Infer.
//
// Errors: those of Infer; ErrTooLarge for more than MaxRequestObs observations.
func (c *InferenceClient) InferMany(ctx context.Context, obs []byte, n int, acts []byte) (uint64, error) {
	switch {
	case n < 1:
		return 0, fmt.Errorf("roles: request of %d observations on stream %q: want at least 1", n, c.name)
	case n > c.reqObs:
		return 0, fmt.Errorf("roles: request of %d observations, stream %q takes at most %d: %w", n, c.name, c.reqObs, ErrTooLarge)
	case len(obs)%n != 0:
		return 0, fmt.Errorf("roles: %d bytes of observations do not split into %d equal observations", len(obs), n)
	case len(obs)/n > c.obs:
		return 0, fmt.Errorf("roles: observations of %d bytes, stream %q takes at most %d: %w", len(obs)/n, c.name, c.obs, ErrTooLarge)
	case len(acts) != n*c.act:
		return 0, fmt.Errorf("roles: action buffer of %d bytes for %d observations, stream %q's actions have %d", len(acts), n, c.name, c.act)
	}
	return c.infer(ctx, obs, n, acts)
}

func (c *InferenceClient) infer(ctx context.Context, obs []byte, n int, acts []byte) (uint64, error) {
	if err := c.acquire(ctx); err != nil {
		return 0, err
	}
	defer c.release()
	select {
	case <-c.closed:
		return 0, ErrClosed
	default:
	}
	if err := c.watch.err(); err != nil {
		return 0, err
	}
	if c.seg != nil {
		return c.inferShm(ctx, obs, n, acts)
	}
	return c.inferTCP(ctx, obs, n, acts)
}

func (c *InferenceClient) inferShm(ctx context.Context, obs []byte, n int, acts []byte) (uint64, error) {
	seg, base := c.seg, c.base
	state := seg.u32(base + slotState)
	if c.pending {
		if err := c.awaitShm(ctx); err != nil {
			return 0, err
		}
		atomic.StoreUint32(state, stIdle)
		c.pending = false
	}
	copy(seg.mem[base+slotData:], obs)
	c.tag++
	atomic.StoreUint32(seg.u32(base+slotObsLen), uint32(len(obs)/n))
	atomic.StoreUint32(seg.u32(base+slotCount), uint32(n))
	atomic.StoreUint64(seg.u64(base+slotTag), c.tag)
	atomic.StoreUint32(state, stRequest)
	notify(seg.u32(inferDoorbell), seg.u32(inferSleeping))
	c.pending = true
	if err := c.awaitShm(ctx); err != nil {
		return 0, err
	}
	if got := atomic.LoadUint64(seg.u64(base + slotReplyTag)); got != c.tag {
		return 0, fmt.Errorf("roles: inference stream %q: reply tagged %d for request %d", c.name, got, c.tag)
	}
	copy(acts, seg.mem[base+slotData+align64(c.reqObs*c.obs):])
	v := atomic.LoadUint64(seg.u64(base + slotVersion))
	atomic.StoreUint32(state, stIdle)
	c.pending = false
	return v, nil
}

// awaitShm waits for the slot's reply.
func (c *InferenceClient) awaitShm(ctx context.Context) error {
	seg := c.seg
	state := seg.u32(c.base + slotState)
	ready := func() bool { return atomic.LoadUint32(state) == stReply }
	check := func() error { return c.check(ctx) }
	return awaitShm(ctx, seg, c.base+slotWord, c.base+slotSleeping, c.opt.spin, ready, check)
}

func (c *InferenceClient) inferTCP(ctx context.Context, obs []byte, n int, acts []byte) (uint64, error) {
	if c.pending {
		if _, err := c.readReply(ctx, nil); err != nil {
			return 0, err
		}
	}
	c.tag++
	binary.LittleEndian.PutUint64(c.out[0:], c.tag)
	binary.LittleEndian.PutUint32(c.out[8:], uint32(len(obs)/n))
	binary.LittleEndian.PutUint32(c.out[12:], uint32(n))
	m := copy(c.out[reqHeader:], obs)
	if _, err := c.conn.Write(c.out[:reqHeader+m]); err != nil {
		return 0, c.connErr(err)
	}
	c.pending, c.pendingN = true, n
	return c.readReply(ctx, acts)
}

// readReply reads replies until the one for the current tag, whose actions it
// copies into acts (when not nil). A reply's header comes first: the server's
// goodbye is a header alone, and the actions that follow any other are those
// of the request it answers.
func (c *InferenceClient) readReply(ctx context.Context, acts []byte) (uint64, error) {
	for {
		err := readCtx(ctx, c.conn, c.in[:repHeader], &c.got)
		tag := binary.LittleEndian.Uint64(c.in[0:])
		if err == nil && tag == goodbyeTag {
			// The goodbye stays in c.in, read whole, and the request pending:
			// every later call comes back here without writing, and fails the
			// same way.
			return 0, peerClosed(rolePolicy, c.server, c.name)
		}
		if err == nil {
			err = readCtx(ctx, c.conn, c.in[:repHeader+c.pendingN*c.act], &c.got)
		}
		if err != nil {
			if ctx.Err() != nil && c.watch.err() == nil {
				return 0, ctx.Err()
			}
			return 0, c.connErr(err)
		}
		c.got = 0
		switch {
		case tag < c.tag:
			continue // the late reply to a cancelled request
		case tag > c.tag:
			return 0, fmt.Errorf("roles: inference stream %q: reply tagged %d for request %d", c.name, tag, c.tag)
		}
		c.pending = false
		if acts != nil {
			copy(acts, c.in[repHeader:repHeader+c.pendingN*c.act])
		}
		return binary.LittleEndian.Uint64(c.in[8:]), nil
	}
}

// Close detaches from the stream: it waits for an Infer in progress to return
// (with ErrClosed) and gives the shared-memory slot back. It is idempotent.
func (c *InferenceClient) Close() error {
	var err error
	c.once.Do(func() {
		close(c.closed)
		c.watch.stop()
		c.wake()
		c.sem <- struct{}{} // no Infer runs past this point
		if c.seg != nil {
			atomic.AddUint32(c.seg.u32(inferAttached), ^uint32(0))
			atomic.StoreUint32(c.seg.u32(c.base+slotOwner), 0)
			err = c.seg.close()
		}
		if c.conn != nil {
			if cerr := c.conn.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
				err = cerr
			}
		}
	})
	return err
}
