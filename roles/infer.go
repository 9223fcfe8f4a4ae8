package roles

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
)

// InferenceConfig describes a policy worker's inference stream.
type InferenceConfig struct {
	// MaxBatch flushes a batch as soon as it holds this many requests (default 64).
	MaxBatch int
	// MaxDelay flushes a batch once its oldest request has waited this long
	// (default 2ms). A batch is also flushed as soon as every attached client
	// has a request in it, since no more can come.
	MaxDelay time.Duration
	// ObsBytes is the size of the largest observation (required).
	ObsBytes int
	// ActBytes is the size of every action (required).
	ActBytes int
	// Slots is the number of shared-memory clients the server takes (default 64);
	// TCP clients are not limited.
	Slots int
}

func (c InferenceConfig) withDefaults() InferenceConfig {
	if c.MaxBatch == 0 {
		c.MaxBatch = 64
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = 2 * time.Millisecond
	}
	if c.Slots == 0 {
		c.Slots = 64
	}
	return c
}

// Validate names the first field that is out of range.
func (c InferenceConfig) Validate() error {
	switch {
	case c.MaxBatch < 1:
		return fmt.Errorf("roles: InferenceConfig.MaxBatch %d: want at least 1", c.MaxBatch)
	case c.MaxDelay < 0:
		return fmt.Errorf("roles: InferenceConfig.MaxDelay %v: want 0 or more", c.MaxDelay)
	case c.ObsBytes < 1 || c.ObsBytes > 1<<30:
		return fmt.Errorf("roles: InferenceConfig.ObsBytes %d: want 1 to 1GiB", c.ObsBytes)
	case c.ActBytes < 1 || c.ActBytes > 1<<30:
		return fmt.Errorf("roles: InferenceConfig.ActBytes %d: want 1 to 1GiB", c.ActBytes)
	case c.Slots < 1 || c.Slots > 1<<16:
		return fmt.Errorf("roles: InferenceConfig.Slots %d: want 1 to 65536", c.Slots)
	}
	return nil
}

// Shared-memory layout of an inference stream: the common header, then
//
//	24   obs bytes u32, act bytes u32
//	32   slot size u64
//	192  doorbell u32: the futex word the server sleeps on; clients bump it
//	256  server sleeping u32
//	320  attached u32: clients holding a slot
//	512  slot 0, slot 1, ...
//
// and in each slot:
//
//	+0    owner u32: 0 free, else the client's world rank + 1
//	+64   state u32 (idle, request, busy, reply), obs length u32,
//	      request tag u64 (+72), reply tag u64 (+80), version u64 (+88)
//	+128  client futex word u32; +192 client sleeping u32
//	+256  observation (ObsBytes, padded to 64), then action (ActBytes)
//
// A client owns its slot's observation while the state is idle, and writes the
// state request; the server moves it to busy, reads the observation in place,
// writes the action and moves it to reply; the client reads the action and moves
// it back to idle.
const (
	inferMagic     = 0x31666e6972616567 // "gearinf1"
	inferOffObs    = 24
	inferOffAct    = 28
	inferOffSlotSz = 32
	inferDoorbell  = 192
	inferSleeping  = 256
	inferAttached  = 320
	inferHeader    = 512

	slotOwner    = 0
	slotState    = 64
	slotObsLen   = 68
	slotTag      = 72
	slotReplyTag = 80
	slotVersion  = 88
	slotWord     = 128
	slotSleeping = 192
	slotData     = 256

	stIdle    = 0
	stRequest = 1
	stBusy    = 2
	stReply   = 3
)

func inferSlotSize(obs, act int) int { return slotData + align64(obs) + align64(act) }

// TCP framing of an inference stream: a request is tag u64, observation length
// u32, 4 bytes of padding and the observation; a reply is tag u64, version u64 and
// the action. A reply with tag goodbyeTag says the server closed the stream.
const (
	inferMagicTCP = "GRI1"
	reqHeader     = 16
	repHeader     = 16
	goodbyeTag    = ^uint64(0)
)

// request is one observation in the server's hands.
type request struct {
	client  int // world rank of the client
	obs     []byte
	tag     uint64
	arrived time.Time
	from    replier
	slot    int // shared-memory slot, for the shared-memory replier
}

// replier delivers an action to the client of a request.
type replier interface {
	reply(r *request, act []byte, version uint64)
}

// InferenceServer is the policy worker's end of an inference stream: it gathers
// the observations of its actors into batches (Next) and answers each batch with
// actions (Batch.Reply).
type InferenceServer struct {
	name   string
	cfg    InferenceConfig
	opt    config
	reqs   chan *request
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	unreg  func()

	// life is held for reading while a reply writes into shared memory, and for
	// writing by Close before it unmaps.
	life     sync.RWMutex
	shut     bool
	seg      *segment
	slotSize int
	lostSlot atomic.Int32 // slots whose owner died
	shmLost  sync.Map     // rank -> struct{}: lost ranks already counted

	tcp      *tcpServer
	tcpCount atomic.Int32
}

// NewInferenceServer starts the inference stream name of this rank (a policy
// worker) and publishes its endpoint under "roles/infer/<name>/<rank>": a
// shared-memory segment for clients of this host and a TCP listener for the
// others (see WithTransport). Each rank may serve a name once per world.
func NewInferenceServer(ctx context.Context, b collective.Bootstrap, name string, cfg InferenceConfig, opts ...Option) (*InferenceServer, error) {
	if err := checkName("inference stream", name); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opt, err := buildConfig(b, opts)
	if err != nil {
		return nil, err
	}
	s := &InferenceServer{
		name: name, cfg: cfg, opt: opt,
		reqs:   make(chan *request, cfg.Slots+256),
		closed: make(chan struct{}),
	}
	ep := endpoint{Rank: b.Rank(), Host: b.Host(), PID: os.Getpid(), Obs: cfg.ObsBytes, Act: cfg.ActBytes, Slots: cfg.Slots}
	if opt.transport != TransportTCP && shmSupported {
		s.slotSize = inferSlotSize(cfg.ObsBytes, cfg.ActBytes)
		segName := rank.SegmentName(jobID(b), fmt.Sprintf("roles.infer.%s.r%d.%x", name, b.Rank(), newNonce()[:4]))
		seg, err := createSegment(segName, inferHeader+cfg.Slots*s.slotSize)
		if err != nil {
			return nil, err
		}
		s.seg = seg
		seg.initHeader(uint32(cfg.Slots))
		binary.LittleEndian.PutUint32(seg.mem[inferOffObs:], uint32(cfg.ObsBytes))
		binary.LittleEndian.PutUint32(seg.mem[inferOffAct:], uint32(cfg.ActBytes))
		binary.LittleEndian.PutUint64(seg.mem[inferOffSlotSz:], uint64(s.slotSize))
		atomic.StoreUint64(seg.u64(offMagic), inferMagic)
		ep.Shm = seg.name
		s.wg.Go(s.pollShm)
	} else if opt.transport == TransportShm {
		return nil, errNoShmTransport()
	}
	if s.tcp, err = listenTCP(opt, inferMagicTCP, &ep, s.serveConn); err != nil {
		s.Close()
		return nil, err
	}
	s.unreg = b.OnLost(s.clientLost)
	if err := publish(ctx, b, inferKey(name, b.Rank()), ep); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func errNoShmTransport() error {
	return errors.New("roles: TransportShm asked for, but this platform has no shared-memory streams")
}

// Config is the server's configuration, defaults filled in.
func (s *InferenceServer) Config() InferenceConfig { return s.cfg }

// Clients is the number of clients attached now (shared-memory slots held by
// live ranks, and TCP connections).
func (s *InferenceServer) Clients() int {
	n := int(s.tcpCount.Load())
	if s.seg != nil {
		s.life.RLock()
		if !s.shut {
			n += int(atomic.LoadUint32(s.seg.u32(inferAttached))) - int(s.lostSlot.Load())
		}
		s.life.RUnlock()
	}
	return max(n, 0)
}

// Next returns the next batch: it waits for a first request, then gathers more
// until the batch holds MaxBatch requests, or the first has waited MaxDelay, or
// every attached client is in the batch. If ctx ends while a batch is partly
// gathered, Next returns what it has (those clients wait for their replies);
// with nothing gathered it returns ctx's error. Next may be called from several
// goroutines; each batch goes to one of them.
//
// Errors: ErrClosed after Close; the context's error.
func (s *InferenceServer) Next(ctx context.Context) (*Batch, error) {
	select {
	case <-s.closed:
		return nil, ErrClosed
	default:
	}
	var first *request
	select {
	case first = <-s.reqs:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closed:
		return nil, ErrClosed
	}
	b := &Batch{s: s, reqs: make([]*request, 1, s.cfg.MaxBatch)}
	b.reqs[0] = first
	deadline := first.arrived.Add(s.cfg.MaxDelay)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
gather:
	for len(b.reqs) < s.cfg.MaxBatch {
		select {
		case r := <-s.reqs:
			b.reqs = append(b.reqs, r)
			continue
		default:
		}
		if len(b.reqs) >= s.Clients() {
			break // every attached client is in the batch
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			break
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case r := <-s.reqs:
			b.reqs = append(b.reqs, r)
		case <-timer.C:
			break gather
		case <-ctx.Done():
			break gather
		case <-s.closed:
			return nil, ErrClosed
		}
	}
	return b, nil
}

// Close ends the stream: clients get an error saying that it was closed
// (ErrPeerClosed), the segment is removed and the goroutines are joined. Batches
// not yet replied to can no longer be (Reply returns ErrClosed), and their
// observation views become invalid. Close is idempotent.
func (s *InferenceServer) Close() error {
	var err error
	s.once.Do(func() {
		if s.tcp != nil {
			goodbye := make([]byte, repHeader+s.cfg.ActBytes)
			binary.LittleEndian.PutUint64(goodbye, goodbyeTag)
			s.tcp.goodbye(goodbye)
		}
		close(s.closed)
		if s.unreg != nil {
			s.unreg()
		}
		s.life.Lock()
		s.shut = true
		s.life.Unlock()
		if s.seg != nil {
			atomic.StoreUint32(s.seg.u32(offClosed), 1)
			s.seg.wake(inferDoorbell)
			for i := range s.cfg.Slots {
				s.seg.wake(inferHeader + i*s.slotSize + slotWord)
			}
		}
		if s.tcp != nil {
			s.tcp.shutdown()
		}
		s.wg.Wait()
		if s.seg != nil {
			err = s.seg.close()
		}
	})
	return err
}

// clientLost counts a dead client's slot as detached, so that batches stop
// waiting for it.
func (s *InferenceServer) clientLost(r int, _ string) {
	if s.seg == nil {
		return
	}
	s.life.RLock()
	defer s.life.RUnlock()
	if s.shut {
		return
	}
	if _, dup := s.shmLost.LoadOrStore(r, struct{}{}); dup {
		return
	}
	for i := range s.cfg.Slots {
		if atomic.LoadUint32(s.seg.u32(inferHeader+i*s.slotSize+slotOwner)) == uint32(r+1) {
			s.lostSlot.Add(1)
		}
	}
}

// pollShm moves the shared-memory requests into the server's queue: it scans the
// slots for requests, and sleeps on the doorbell when there are none.
func (s *InferenceServer) pollShm() {
	seg := s.seg
	n := s.cfg.Slots
	states := make([]*uint32, n)
	for i := range n {
		states[i] = seg.u32(inferHeader + i*s.slotSize + slotState)
	}
	pending := func() bool {
		for _, st := range states {
			if atomic.LoadUint32(st) == stRequest {
				return true
			}
		}
		return false
	}
	check := func() error {
		select {
		case <-s.closed:
			return ErrClosed
		default:
			return nil
		}
	}
	for {
		found := false
		for i, st := range states {
			if atomic.LoadUint32(st) != stRequest {
				continue
			}
			found = true
			base := inferHeader + i*s.slotSize
			atomic.StoreUint32(st, stBusy)
			// A fresh request each time: the slot's next request is handed over
			// through shared memory, which the race detector cannot see, so
			// nothing on the Go heap may be reused across it.
			obsLen := min(int(atomic.LoadUint32(seg.u32(base+slotObsLen))), s.cfg.ObsBytes)
			r := &request{
				client:  int(atomic.LoadUint32(seg.u32(base+slotOwner))) - 1,
				tag:     atomic.LoadUint64(seg.u64(base + slotTag)),
				obs:     seg.mem[base+slotData : base+slotData+obsLen : base+slotData+obsLen],
				arrived: time.Now(),
				from:    shmReplier{s},
				slot:    i,
			}
			select {
			case s.reqs <- r:
			case <-s.closed:
				return
			}
		}
		if found {
			continue
		}
		if err := awaitShm(context.Background(), seg, inferDoorbell, inferSleeping, s.opt.spin, pending, check); err != nil {
			return
		}
	}
}

// shmReplier answers requests that came through shared memory.
type shmReplier struct{ s *InferenceServer }

func (sr shmReplier) reply(r *request, act []byte, version uint64) {
	s := sr.s
	seg := s.seg
	base := inferHeader + r.slot*s.slotSize
	copy(seg.mem[base+slotData+align64(s.cfg.ObsBytes):], act)
	atomic.StoreUint64(seg.u64(base+slotVersion), version)
	atomic.StoreUint64(seg.u64(base+slotReplyTag), r.tag)
	atomic.StoreUint32(seg.u32(base+slotState), stReply)
	notify(seg.u32(base+slotWord), seg.u32(base+slotSleeping))
}

// inferConn is the server's side of one TCP client.
type inferConn struct {
	c     *tconn
	req   request
	obs   []byte
	out   []byte        // the reply frame
	ready chan struct{} // the reply frame is filled
}

func (s *InferenceServer) serveConn(c *tconn) {
	ic := &inferConn{c: c, obs: make([]byte, s.cfg.ObsBytes), out: make([]byte, repHeader+s.cfg.ActBytes), ready: make(chan struct{}, 1)}
	ic.req = request{client: c.peer, from: ic}
	s.tcpCount.Add(1)
	defer s.tcpCount.Add(-1)
	var hdr [reqHeader]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(hdr[8:]))
		if n > s.cfg.ObsBytes {
			return // the client checks sizes; this one breaks the protocol
		}
		if _, err := io.ReadFull(c, ic.obs[:n]); err != nil {
			return
		}
		ic.req.tag = binary.LittleEndian.Uint64(hdr[:])
		ic.req.obs = ic.obs[:n:n]
		ic.req.arrived = time.Now()
		select {
		case s.reqs <- &ic.req:
		case <-s.closed:
			return
		}
		select {
		case <-ic.ready:
		case <-s.closed:
			return
		}
		if err := c.write(ic.out); err != nil {
			return
		}
	}
}

func (ic *inferConn) reply(r *request, act []byte, version uint64) {
	binary.LittleEndian.PutUint64(ic.out[0:], r.tag)
	binary.LittleEndian.PutUint64(ic.out[8:], version)
	copy(ic.out[repHeader:], act)
	select {
	case ic.ready <- struct{}{}:
	default:
	}
}

// Batch is a set of requests that Next gathered. Its observation views point
// into the stream's buffers (shared memory for local clients): they are valid
// until Reply, and must not be written.
type Batch struct {
	s       *InferenceServer
	reqs    []*request
	replied bool
}

// Len is the number of requests.
func (b *Batch) Len() int { return len(b.reqs) }

// Client is the world rank of the actor that sent request i.
func (b *Batch) Client(i int) int { return b.reqs[i].client }

// Obs is the observation of request i: a view valid until Reply.
func (b *Batch) Obs(i int) []byte { return b.reqs[i].obs }

// Gather copies the observations into dst, each padded to ObsBytes (zeros after
// a shorter observation), and returns the filled part: the batch as one
// Len()×ObsBytes matrix for a forward pass.
func (b *Batch) Gather(dst []byte) []byte {
	ob := b.s.cfg.ObsBytes
	need := len(b.reqs) * ob
	if cap(dst) < need {
		dst = make([]byte, need)
	}
	dst = dst[:need]
	for i, r := range b.reqs {
		n := copy(dst[i*ob:(i+1)*ob], r.obs)
		clear(dst[i*ob+n : (i+1)*ob])
	}
	return dst
}

// Reply answers every request: actions holds Len() actions of ActBytes each, in
// request order, and version is the parameter version the policy used (the
// actors record it with their trajectories). actions is copied; the observation
// views are invalid once Reply returns.
//
// Errors: ErrClosed after the server's Close; a wrong actions length; a second
// Reply.
func (b *Batch) Reply(actions []byte, version uint64) error {
	s := b.s
	if b.replied {
		return errors.New("roles: batch already replied")
	}
	if len(actions) != len(b.reqs)*s.cfg.ActBytes {
		return fmt.Errorf("roles: reply with %d bytes of actions for %d requests of %d bytes each", len(actions), len(b.reqs), s.cfg.ActBytes)
	}
	s.life.RLock()
	defer s.life.RUnlock()
	if s.shut {
		return ErrClosed
	}
	b.replied = true
	a := s.cfg.ActBytes
	for i, r := range b.reqs {
		r.from.reply(r, actions[i*a:(i+1)*a], version)
	}
	return nil
}
