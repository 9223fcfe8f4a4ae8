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
)

// InferenceConfig describes a policy worker's inference stream.
type InferenceConfig struct {
	// MaxBatch is the most observations a batch holds (default 64, or
	// MaxRequestObs if that is more): a request of n observations counts n,
	// and one that would overflow the batch waits for the next.
	MaxBatch int
	// MaxDelay bounds how long a batch waits for more requests once its oldest
	// has arrived (default 2ms). Within that bound the wait is adaptive (see
	// Next): a batch goes out as soon as every attached client has a request
	// in it, and otherwise once the clients missing from it are overdue by
	// their own recent pace.
	MaxDelay time.Duration
	// ObsBytes is the size of the largest observation (required).
	ObsBytes int
	// ActBytes is the size of every action (required).
	ActBytes int
	// MaxRequestObs is the most observations one request may carry (default
	// 1): an actor stepping a ring of K environments sends all K in one
	// request (InferMany) and gets K actions back.
	MaxRequestObs int
	// Slots is the number of shared-memory clients the server takes (default 64);
	// TCP clients are not limited.
	Slots int
}

func (c InferenceConfig) withDefaults() InferenceConfig {
	if c.MaxRequestObs == 0 {
		c.MaxRequestObs = 1
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = max(64, c.MaxRequestObs)
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
	case c.MaxRequestObs < 1 || c.MaxRequestObs > 1<<20:
		return fmt.Errorf("roles: InferenceConfig.MaxRequestObs %d: want 1 to 1048576", c.MaxRequestObs)
	case c.MaxRequestObs > c.MaxBatch:
		return fmt.Errorf("roles: InferenceConfig.MaxRequestObs %d: more than MaxBatch %d, so such a request fits no batch", c.MaxRequestObs, c.MaxBatch)
	case int64(c.MaxRequestObs)*int64(max(c.ObsBytes, c.ActBytes)) > 1<<30:
		return fmt.Errorf("roles: InferenceConfig.MaxRequestObs %d: requests of %d observations of %d bytes (or actions of %d) exceed 1GiB", c.MaxRequestObs, c.MaxRequestObs, c.ObsBytes, c.ActBytes)
	case c.Slots < 1 || c.Slots > 1<<16:
		return fmt.Errorf("roles: InferenceConfig.Slots %d: want 1 to 65536", c.Slots)
	}
	return nil
}

// Shared-memory layout of an inference stream: the common header, then
//
//	24   obs bytes u32, act bytes u32
//	32   slot size u64
//	40   observations per request u32 (MaxRequestObs)
//	192  doorbell u32: the futex word the server sleeps on; clients bump it
//	256  server sleeping u32
//	320  attached u32: clients holding a slot
//	512  slot 0, slot 1, ...
//
// and in each slot:
//
//	+0    owner u32: 0 free, else the client's world rank + 1
//	+64   state u32 (idle, request, busy, reply), length of each observation
//	      u32, request tag u64 (+72), reply tag u64 (+80), version u64 (+88),
//	      observations in the request u32 (+96)
//	+128  client futex word u32; +192 client sleeping u32
//	+256  observations (MaxRequestObs × ObsBytes, padded to 64), then actions
//	      (MaxRequestObs × ActBytes)
//
// A client owns its slot's observations while the state is idle, and writes the
// state request; the server moves it to busy, reads the observations in place
// (the batch's views point at them), has the policy write the actions in place
// and moves it to reply; the client reads the actions and moves it back to idle.
const (
	inferMagic     = 0x32666e6972616567 // "gearinf2"
	inferOffObs    = 24
	inferOffAct    = 28
	inferOffSlotSz = 32
	inferOffReqObs = 40
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
	slotCount    = 96
	slotWord     = 128
	slotSleeping = 192
	slotData     = 256

	stIdle    = 0
	stRequest = 1
	stBusy    = 2
	stReply   = 3
)

func inferSlotSize(obs, act, reqObs int) int {
	return slotData + align64(reqObs*obs) + align64(reqObs*act)
}

// TCP framing of an inference stream: a request is tag u64, the length of each
// observation u32, the number of observations u32 and the observations; a reply
// is tag u64, version u64 and one action per observation. A reply with tag
// goodbyeTag says the server closed the stream.
const (
	inferMagicTCP = "GRI1"
	reqHeader     = 16
	repHeader     = 16
	goodbyeTag    = ^uint64(0)
)

// request is one request, of n observations, in the server's hands.
type request struct {
	client  int    // world rank of the client
	n       int    // observations
	stride  int    // bytes of each observation
	obs     []byte // n×stride bytes: a view of the slot or connection buffer
	act     []byte // n×ActBytes bytes: where the actions go, in place
	tag     uint64
	arrived time.Time
	from    replier
	slot    int   // shared-memory slot, for the shared-memory replier
	pace    *pace // the client's pace, for the adaptive batching
	row     int   // the request's first row in its batch
}

// replier sends a request's actions (already written in place, in r.act) to
// its client.
type replier interface {
	send(r *request, version uint64)
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
	mark   closeMark
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

	// Batching: gather is held by the Next that gathers; held is a request
	// that did not fit the last batch. paceMu guards the clients' paces.
	gather   chan struct{}
	held     *request
	paceMu   sync.Mutex
	slotPace []pace
	tcpPace  map[*pace]struct{}
	stats    inferStats
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
		reqs:    make(chan *request, cfg.Slots+256),
		closed:  make(chan struct{}),
		gather:  make(chan struct{}, 1),
		tcpPace: map[*pace]struct{}{},
	}
	ep := endpoint{Rank: b.Rank(), Host: b.Host(), PID: os.Getpid(), Obs: cfg.ObsBytes, Act: cfg.ActBytes, Slots: cfg.Slots, ReqObs: cfg.MaxRequestObs}
	if opt.transport != TransportTCP && shmSupported {
		s.slotSize = inferSlotSize(cfg.ObsBytes, cfg.ActBytes, cfg.MaxRequestObs)
		s.slotPace = make([]pace, cfg.Slots)
		segName := segmentName(b, fmt.Sprintf("infer.%s.r%d.%x", name, b.Rank(), newNonce()[:4]))
		seg, err := createSegment(segName, inferHeader+cfg.Slots*s.slotSize)
		if err != nil {
			return nil, err
		}
		s.seg = seg
		seg.initHeader(uint32(cfg.Slots))
		binary.LittleEndian.PutUint32(seg.mem[inferOffObs:], uint32(cfg.ObsBytes))
		binary.LittleEndian.PutUint32(seg.mem[inferOffAct:], uint32(cfg.ActBytes))
		binary.LittleEndian.PutUint64(seg.mem[inferOffSlotSz:], uint64(s.slotSize))
		binary.LittleEndian.PutUint32(seg.mem[inferOffReqObs:], uint32(cfg.MaxRequestObs))
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
	s.mark = closeMark{b: b, key: inferKey(name, b.Rank())}
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
// while they fit (MaxBatch observations; a request that does not fit opens the
// next batch), until every attached client has a request in the batch, or no
// client missing from it is due. A client's pace is the time from a reply to
// its next request (a moving average); a missing client is waited for until
// twice its pace has passed since its last reply, so a batch waits about as
// long as its clients take to step their environments, and not at all for a
// client that is slower than its pace, idle or gone. A client's pace is known
// from its second request on: while a client of unknown pace misses, the batch
// waits for MaxDelay. MaxDelay after
// the first request's arrival bounds every wait. If ctx ends while a batch is partly
// gathered, Next returns what it has (those clients wait for their replies);
// with nothing gathered it returns ctx's error. Next may be called from several
// goroutines; they gather one at a time, and each batch goes to one of them.
//
// Errors: ErrClosed after Close; the context's error.
func (s *InferenceServer) Next(ctx context.Context) (*Batch, error) {
	select {
	case <-s.closed:
		return nil, ErrClosed
	default:
	}
	select {
	case s.gather <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closed:
		return nil, ErrClosed
	}
	defer func() { <-s.gather }()
	first := s.held
	s.held = nil
	if first == nil {
		select {
		case first = <-s.reqs:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.closed:
			return nil, ErrClosed
		}
		s.arrive(first)
	}
	b := &Batch{s: s, reqs: make([]*request, 0, min(s.cfg.MaxBatch, 64))}
	b.add(first)
	limit := first.arrived.Add(s.cfg.MaxDelay)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	// take adds r to the batch, or holds it for the next one when it does not
	// fit; it reports whether the batch is full.
	take := func(r *request) bool {
		s.arrive(r)
		if b.rows+r.n > s.cfg.MaxBatch {
			s.held = r
			return true
		}
		b.add(r)
		return b.rows >= s.cfg.MaxBatch
	}
	why := &s.stats.full
gather:
	for b.rows < s.cfg.MaxBatch {
		select {
		case r := <-s.reqs:
			if take(r) {
				break gather
			}
			continue
		default:
		}
		if len(b.reqs) >= s.Clients() {
			why = &s.stats.allIn // every attached client is in the batch
			break
		}
		now := time.Now()
		until, paced := s.due(now), true
		if until.After(limit) {
			until, paced = limit, false
		}
		wait := until.Sub(now)
		if wait <= 0 {
			why = &s.stats.maxDelay
			if paced {
				why = &s.stats.paced
			}
			break
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case r := <-s.reqs:
			if take(r) {
				break gather
			}
		case <-timer.C:
		case <-ctx.Done():
			why = &s.stats.cancelled
			break gather
		case <-s.closed:
			return nil, ErrClosed
		}
	}
	why.Add(1)
	s.stats.batches.Add(1)
	s.stats.requests.Add(int64(len(b.reqs)))
	s.stats.observations.Add(int64(b.rows))
	return b, nil
}

// pace is what the server knows of a client's rhythm: when it last got a
// reply, and how long it then takes to send its next request.
type pace struct {
	client    int           // the client's world rank
	lastReply time.Time     // zero before the first reply
	think     time.Duration // moving average of reply-to-request times
	known     bool          // think holds at least one sample
	out       bool          // a request of the client is in the server's hands
}

// paceSlack is added to every client's due time: the resolution of the wait.
const paceSlack = 20 * time.Microsecond

// arrive notes r's arrival in its client's pace.
func (s *InferenceServer) arrive(r *request) {
	p := r.pace
	if p == nil {
		return
	}
	s.paceMu.Lock()
	defer s.paceMu.Unlock()
	if p.client != r.client {
		*p = pace{client: r.client} // the slot has a new owner
	}
	if !p.out && !p.lastReply.IsZero() {
		t := min(max(r.arrived.Sub(p.lastReply), 0), s.cfg.MaxDelay)
		if !p.known {
			p.think, p.known = t, true
		} else {
			p.think += (t - p.think) / 8
		}
	}
	p.out = true
}

// due returns the time until which a batch should wait for the clients missing
// from it (those with no request in the server's hands): the latest due time
// (last reply + 2 × pace) of those whose due time lies ahead, or never (the
// far future) while a client whose pace is unknown (not yet answered once and
// asked again) misses; now when there is none.
func (s *InferenceServer) due(now time.Time) time.Time {
	until := now
	never := false
	consider := func(p *pace) {
		switch {
		case p.out:
			// In this batch or in another.
		case !p.known:
			never = true
		default:
			if d := p.lastReply.Add(2*p.think + paceSlack); d.After(until) {
				until = d
			}
		}
	}
	// The order of the locks is that of Batch.send: life, then paceMu.
	s.life.RLock()
	defer s.life.RUnlock()
	s.paceMu.Lock()
	defer s.paceMu.Unlock()
	if s.seg != nil {
		if !s.shut {
			for i := range s.slotPace {
				owner := int(atomic.LoadUint32(s.seg.u32(inferHeader+i*s.slotSize+slotOwner))) - 1
				if owner < 0 {
					continue
				}
				if _, lost := s.shmLost.Load(owner); lost {
					continue
				}
				p := &s.slotPace[i]
				if p.client != owner {
					*p = pace{client: owner} // a new owner, not answered yet
				}
				consider(p)
			}
		}
	}
	for p := range s.tcpPace {
		consider(p)
	}
	if never {
		return now.Add(time.Hour)
	}
	return until
}

// replied notes the replies to b's requests in their clients' paces.
func (s *InferenceServer) replied(b *Batch) {
	now := time.Now()
	s.paceMu.Lock()
	defer s.paceMu.Unlock()
	for _, r := range b.reqs {
		if p := r.pace; p != nil {
			p.out, p.lastReply = false, now
		}
	}
}

// InferenceStats counts the batches of a server and why each went out.
type InferenceStats struct {
	Batches, Requests, Observations int64
	// Full batches held MaxBatch observations, or the next request did not fit.
	Full int64
	// AllIn batches held a request of every attached client.
	AllIn int64
	// Paced batches went out once no missing client was due.
	Paced int64
	// MaxDelay batches went out when their first request had waited MaxDelay.
	MaxDelay int64
	// Cancelled batches went out when the context of Next ended.
	Cancelled int64
}

type inferStats struct {
	batches, requests, observations         atomic.Int64
	full, allIn, paced, maxDelay, cancelled atomic.Int64
}

// Stats returns the counts of the batches Next returned so far.
func (s *InferenceServer) Stats() InferenceStats {
	t := &s.stats
	return InferenceStats{
		Batches: t.batches.Load(), Requests: t.requests.Load(), Observations: t.observations.Load(),
		Full: t.full.Load(), AllIn: t.allIn.Load(), Paced: t.paced.Load(), MaxDelay: t.maxDelay.Load(), Cancelled: t.cancelled.Load(),
	}
}

// Close ends the stream: clients get an error saying that it was closed
// (ErrPeerClosed), the segment is removed and the goroutines are joined. Batches
// not yet replied to can no longer be (Reply returns ErrClosed), and their
// observation views become invalid. Close is idempotent.
func (s *InferenceServer) Close() error {
	var err error
	s.once.Do(func() {
		s.mark.set()
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
			s.tcp.shutdown(0)
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
	actOff := slotData + align64(s.cfg.MaxRequestObs*s.cfg.ObsBytes)
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
			// nothing on the Go heap may be reused across it. The observations
			// stay where the client wrote them, and the actions go straight
			// into the slot.
			stride := min(int(atomic.LoadUint32(seg.u32(base+slotObsLen))), s.cfg.ObsBytes)
			count := min(max(int(atomic.LoadUint32(seg.u32(base+slotCount))), 1), s.cfg.MaxRequestObs)
			obs := base + slotData
			act := base + actOff
			r := &request{
				client:  int(atomic.LoadUint32(seg.u32(base+slotOwner))) - 1,
				n:       count,
				stride:  stride,
				tag:     atomic.LoadUint64(seg.u64(base + slotTag)),
				obs:     seg.mem[obs : obs+count*stride : obs+count*stride],
				act:     seg.mem[act : act+count*s.cfg.ActBytes : act+count*s.cfg.ActBytes],
				arrived: time.Now(),
				from:    shmReplier{s},
				slot:    i,
				pace:    &s.slotPace[i],
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

func (sr shmReplier) send(r *request, version uint64) {
	s := sr.s
	seg := s.seg
	base := inferHeader + r.slot*s.slotSize
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
	out   []byte        // the reply frame; the actions are written into it in place
	ready chan struct{} // the reply frame is filled
}

func (s *InferenceServer) serveConn(c *tconn) {
	a := s.cfg.ActBytes
	ic := &inferConn{c: c, obs: make([]byte, s.cfg.MaxRequestObs*s.cfg.ObsBytes), out: make([]byte, repHeader+s.cfg.MaxRequestObs*a), ready: make(chan struct{}, 1)}
	p := &pace{client: c.peer}
	ic.req = request{client: c.peer, from: ic, pace: p}
	s.tcpCount.Add(1)
	defer s.tcpCount.Add(-1)
	s.paceMu.Lock()
	s.tcpPace[p] = struct{}{}
	s.paceMu.Unlock()
	defer func() {
		s.paceMu.Lock()
		delete(s.tcpPace, p)
		s.paceMu.Unlock()
	}()
	var hdr [reqHeader]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		stride := int(binary.LittleEndian.Uint32(hdr[8:]))
		n := max(int(binary.LittleEndian.Uint32(hdr[12:])), 1)
		if stride > s.cfg.ObsBytes || n > s.cfg.MaxRequestObs {
			return // the client checks sizes; this one breaks the protocol
		}
		if _, err := io.ReadFull(c, ic.obs[:n*stride]); err != nil {
			return
		}
		ic.req.tag = binary.LittleEndian.Uint64(hdr[:])
		ic.req.n, ic.req.stride = n, stride
		ic.req.obs = ic.obs[: n*stride : n*stride]
		ic.req.act = ic.out[repHeader : repHeader+n*a : repHeader+n*a]
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
		if err := c.write(ic.out[:repHeader+n*a]); err != nil {
			return
		}
	}
}

func (ic *inferConn) send(r *request, version uint64) {
	binary.LittleEndian.PutUint64(ic.out[0:], r.tag)
	binary.LittleEndian.PutUint64(ic.out[8:], version)
	select {
	case ic.ready <- struct{}{}:
	default:
	}
}

// Batch is a set of requests that Next gathered, as rows: one per observation,
// the observations of each request in order, requests in the order they were
// gathered. Its observation views point into the stream's buffers (the
// client's shared-memory slot for local clients), and so do its action views:
// both are valid until Reply or Send; observations must not be written.
type Batch struct {
	s       *InferenceServer
	reqs    []*request
	of      []int32 // the request of each row
	rows    int
	replied bool
}

func (b *Batch) add(r *request) {
	r.row = b.rows
	j := int32(len(b.reqs))
	b.reqs = append(b.reqs, r)
	for range r.n {
		b.of = append(b.of, j)
	}
	b.rows += r.n
}

// at returns the request of row i and the row's index in it.
func (b *Batch) at(i int) (*request, int) {
	r := b.reqs[b.of[i]]
	return r, i - r.row
}

// Len is the number of rows: the observations of every request.
func (b *Batch) Len() int { return b.rows }

// Requests is the number of requests (each of one client).
func (b *Batch) Requests() int { return len(b.reqs) }

// Client is the world rank of the actor that sent row i.
func (b *Batch) Client(i int) int { return b.reqs[b.of[i]].client }

// Obs is the observation of row i: a view valid until Reply or Send.
func (b *Batch) Obs(i int) []byte {
	r, k := b.at(i)
	return r.obs[k*r.stride : (k+1)*r.stride : (k+1)*r.stride]
}

// Action is where row i's action goes: a view of ActBytes in the stream's
// buffer (the client's shared-memory slot, or the reply frame of a TCP
// client), valid until Reply or Send. Fill every row's, then Send.
func (b *Batch) Action(i int) []byte {
	r, k := b.at(i)
	a := b.s.cfg.ActBytes
	return r.act[k*a : (k+1)*a : (k+1)*a]
}

// Gather copies the observations into dst, each padded to ObsBytes (zeros after
// a shorter observation), and returns the filled part: the batch as one
// Len()×ObsBytes matrix for a forward pass.
func (b *Batch) Gather(dst []byte) []byte {
	ob := b.s.cfg.ObsBytes
	need := b.rows * ob
	if cap(dst) < need {
		dst = make([]byte, need)
	}
	dst = dst[:need]
	for _, r := range b.reqs {
		for k := range r.n {
			row := dst[(r.row+k)*ob : (r.row+k+1)*ob]
			n := copy(row, r.obs[k*r.stride:(k+1)*r.stride])
			clear(row[n:])
		}
	}
	return dst
}

// Reply answers every request: actions holds Len() actions of ActBytes each, in
// row order, and version is the parameter version the policy used (the actors
// record it with their trajectories). actions is copied into the stream's
// buffers; the views are invalid once Reply returns.
//
// Errors: ErrClosed after the server's Close; a wrong actions length; a second
// Reply or Send.
func (b *Batch) Reply(actions []byte, version uint64) error {
	s := b.s
	if len(actions) != b.rows*s.cfg.ActBytes && !b.replied {
		return fmt.Errorf("roles: reply with %d bytes of actions for %d observations of %d bytes each", len(actions), b.rows, s.cfg.ActBytes)
	}
	a := s.cfg.ActBytes
	return b.send(version, func() {
		for _, r := range b.reqs {
			copy(r.act, actions[r.row*a:(r.row+r.n)*a])
		}
	})
}

// Send answers every request with the actions written into the Action views,
// and version (as Reply). The views are invalid once Send returns.
//
// Errors: ErrClosed after the server's Close; a second Reply or Send.
func (b *Batch) Send(version uint64) error { return b.send(version, nil) }

func (b *Batch) send(version uint64, fill func()) error {
	s := b.s
	if b.replied {
		return errors.New("roles: batch already replied")
	}
	s.life.RLock()
	defer s.life.RUnlock()
	if s.shut {
		return ErrClosed
	}
	b.replied = true
	if fill != nil {
		fill()
	}
	s.replied(b)
	for _, r := range b.reqs {
		r.from.send(r, version)
	}
	return nil
}
