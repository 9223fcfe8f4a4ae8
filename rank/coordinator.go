package rank

import (
	"bufio"
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// CoordinatorConfig describes the world a Coordinator assembles.
type CoordinatorConfig struct {
	// Addr is the address to listen on; "" means 127.0.0.1:0 (loopback, a free
	// port). Listen on other interfaces only for multi-node jobs.
	Addr  string
	JobID string
	Token string
	Size  int
	// Generation is the world this coordinator assembles: 0 for a job's first,
	// n after n restarts. A rank whose join names another generation (a
	// straggler of a world the launcher already stopped) is refused by name.
	Generation int
	// Timeout bounds assembly, counted from the first rank's arrival; 0 means
	// DefaultRdzvTimeout.
	Timeout time.Duration
	// HandshakeTimeout bounds how long a new connection may take to prove the
	// token and join; 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// Heartbeat is how often the coordinator pings each joined rank (which
	// answers), and HeartbeatTimeout how long either side waits for a word
	// from the other before it takes it for gone: a rank the coordinator has
	// not heard from for that long is lost, with its host named. 0 means
	// DefaultHeartbeat and DefaultHeartbeatTimeout.
	Heartbeat, HeartbeatTimeout time.Duration
	// MaxPending caps the connections that have not yet proven the token; one
	// over the cap is refused at once ("busy", which a rank answers by dialing
	// again). 0 means DefaultMaxPending plus the world's size, so that every
	// rank can be connecting at once.
	MaxPending int
	// Logger receives refused connections (at Warn, with the peer's address
	// and the reason, at most refusalLogBurst a second) and lost ranks; nil
	// discards.
	Logger *slog.Logger
	// OnFail, if set, is called once, from a coordinator goroutine, when the world
	// cannot assemble. err is a *RendezvousError.
	OnFail func(err error)
	// OnLost, if set, is called from a coordinator goroutine once for every rank
	// that joined and then died (its connection broke without a goodbye, or the
	// launcher reported its exit).
	OnLost func(rank int, reason string)
	// ExitReports says that the launcher reports every rank's exit (RankExited).
	// A connection that breaks without a goodbye then waits up to ExitReportWait
	// for the report, so that peers learn the exit status, not just "connection
	// closed".
	ExitReports bool
}

// ExitReportWait is how long a broken connection waits for the launcher's report
// of the rank's exit (CoordinatorConfig.ExitReports).
const ExitReportWait = 100 * time.Millisecond

// DefaultHandshakeTimeout bounds how long a new connection may take to prove the
// token and join: a rank sends both as soon as it sees the hello.
const DefaultHandshakeTimeout = 3 * time.Second

// DefaultMaxPending is how many connections beyond the world's size may be
// proving the token at once.
const DefaultMaxPending = 64

// The heartbeat's defaults: a host that stops answering is lost within
// DefaultHeartbeatTimeout plus one DefaultHeartbeat (DetectionTime), 6.5s.
// The timeout is four times the longest silence measured on a 2-core
// machine under 24 busy processes beside a 4-rank job (1.49s, the
// coordinator's LongestSilence, docs/elastic.md), where the former 1.5s
// gave false losses.
const (
	DefaultHeartbeat        = 500 * time.Millisecond
	DefaultHeartbeatTimeout = 6 * time.Second
)

// CheckHeartbeat checks a job's heartbeat settings, 0 standing for the
// default: neither may be negative, and the timeout must be at least twice
// the interval, so that one late ping is not a loss. The error names the
// settings; launchers check them before they start anything.
func CheckHeartbeat(interval, timeout time.Duration) error {
	if interval < 0 || timeout < 0 {
		return fmt.Errorf("rank: heartbeat interval %v, timeout %v: must not be negative (0 means the default)", interval, timeout)
	}
	i, t := interval, timeout
	if i == 0 {
		i = DefaultHeartbeat
	}
	if t == 0 {
		t = DefaultHeartbeatTimeout
	}
	if t < 2*i {
		return fmt.Errorf("rank: heartbeat timeout %v: must be at least twice the interval, %v", t, i)
	}
	return nil
}

// DetectionTime is how long a coordinator with heartbeat interval and
// timeout (0: the defaults) may take to find a silent rank lost: the
// timeout, plus up to one interval until the next check.
func DetectionTime(interval, timeout time.Duration) time.Duration {
	if interval <= 0 {
		interval = DefaultHeartbeat
	}
	if timeout <= 0 {
		timeout = DefaultHeartbeatTimeout
	}
	return timeout + interval
}

// pingFrame is the heartbeat, the same both ways.
var pingFrame = frame(msgPing, func(*enc) {})

// Coordinator runs the rendezvous of one job: ranks connect, prove the job token,
// join, and receive the world table once all have joined; then it carries their
// key-value exchange, barriers and the news of lost ranks. The launcher runs one
// per job; under SLURM without a launcher, rank 0 runs it.
type Coordinator struct {
	cfg CoordinatorConfig
	ln  net.Listener
	log *slog.Logger
	wg  sync.WaitGroup

	refusals refusalLog
	stop     chan struct{} // closed by Close
	longest  atomic.Int64  // the longest silence of a joined rank seen, in ns

	mu        sync.Mutex
	closed    bool
	conns     map[*coordConn]struct{}
	pending   int // connections that have not proven the token
	ranks     []rankState
	joinedN   int
	peers     []Peer
	assembled bool
	failed    *RendezvousError
	timer     *time.Timer
	kv        map[string][]byte
	waiters   map[string][]waiter
	barriers  map[uint64]int
	gone      string // why barriers can no longer complete ("" while they can)

	closeOnce sync.Once
}

type rankPhase int

const (
	phaseAbsent rankPhase = iota // not joined yet
	phaseJoined
	phaseLeft   // said goodbye
	phaseLost   // died after joining
	phaseExited // ended before joining
)

type rankState struct {
	phase  rankPhase
	conn   *coordConn
	reason string
}

type waiter struct {
	c  *coordConn
	id uint64
}

// NewCoordinator listens on cfg.Addr and serves until Close.
func NewCoordinator(cfg CoordinatorConfig) (*Coordinator, error) {
	if cfg.Size < 1 {
		return nil, fmt.Errorf("rank: coordinator: world size %d: want at least 1", cfg.Size)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultRdzvTimeout
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending + cfg.Size
	}
	if err := CheckHeartbeat(cfg.Heartbeat, cfg.HeartbeatTimeout); err != nil {
		return nil, err
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("rank: coordinator: listen on %s: %w", cfg.Addr, err)
	}
	c := &Coordinator{
		cfg:      cfg,
		ln:       ln,
		log:      log,
		refusals: refusalLog{log: log},
		stop:     make(chan struct{}),
		conns:    make(map[*coordConn]struct{}),
		ranks:    make([]rankState, cfg.Size),
		peers:    make([]Peer, cfg.Size),
		kv:       make(map[string][]byte),
		waiters:  make(map[string][]waiter),
		barriers: make(map[uint64]int),
	}
	c.wg.Add(2)
	go c.accept()
	go c.heartbeat()
	return c, nil
}

// heartbeat pings every joined rank each Heartbeat, and declares lost the
// ranks it has not heard from for HeartbeatTimeout, grouped by host: when a
// host vanishes, all its ranks go at once, and the reason names it.
func (c *Coordinator) heartbeat() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.Heartbeat)
	defer tick.Stop()
	// A coordinator that did not run for a while (an overloaded host) has not
	// read what the ranks sent meanwhile either: silence is counted from the
	// end of such a stall, not from before it.
	prev, since := time.Now().UnixNano(), int64(0)
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		now := time.Now().UnixNano()
		if time.Duration(now-prev) > 2*c.cfg.Heartbeat {
			since = now
		}
		prev = now
		var post []func()
		var drop []*coordConn
		c.mu.Lock()
		if !c.assembled {
			// Ranks waiting for the world say nothing; the rendezvous
			// timeout bounds that wait.
			c.mu.Unlock()
			continue
		}
		// A host is lost when one of its ranks is past the timeout; its other
		// ranks go with it if they too have missed pings: silent for two pings,
		// where a rank that answers is silent for one at most. Cut off at the
		// same moment, their last words came up to a ping apart (each answers
		// its own ping), and more under load, so they cross the timeout at
		// different ticks; a longer bar (half the timeout, as it was) let a
		// rank cut a ping later go alone, the host named with one rank and
		// then again with the other.
		gaps := make([]int64, len(c.ranks)) // each rank's silence; -1: not joined
		lostHosts := map[string]bool{}
		for r := range c.ranks {
			st := &c.ranks[r]
			gaps[r] = -1
			if st.phase != phaseJoined {
				continue
			}
			gaps[r] = now - max(st.conn.lastSeen.Load(), since)
			if gaps[r] > c.longest.Load() {
				c.longest.Store(gaps[r])
			}
			if time.Duration(gaps[r]) > c.cfg.HeartbeatTimeout {
				lostHosts[HostName(c.peers[r].Host)] = true
			}
		}
		missed := 2 * c.cfg.Heartbeat
		silent := map[string][]int{} // host -> ranks
		var hosts []string
		for r, gap := range gaps {
			if gap < 0 {
				continue
			}
			if h := HostName(c.peers[r].Host); lostHosts[h] && time.Duration(gap) > missed {
				if _, ok := silent[h]; !ok {
					hosts = append(hosts, h)
				}
				silent[h] = append(silent[h], r)
				continue
			}
			c.ranks[r].conn.send(pingFrame)
		}
		for _, h := range hosts {
			ranks := silent[h]
			reason := fmt.Sprintf("host %s unreachable: no word from its ranks %s for %v", h, FormatRanks(ranks), c.cfg.HeartbeatTimeout)
			if len(ranks) == 1 {
				reason = fmt.Sprintf("host %s unreachable: no word from rank %d for %v", h, ranks[0], c.cfg.HeartbeatTimeout)
			}
			for _, r := range ranks {
				drop = append(drop, c.ranks[r].conn)
				post = append(post, c.lostLocked(r, reason)...)
			}
		}
		c.mu.Unlock()
		for _, cc := range drop {
			cc.nc.Close() // unblocks its reader and writer on a dead connection
		}
		run(post)
	}
}

// LongestSilence is the longest a joined rank has been silent, as the
// heartbeat found it at its checks (a stall of the coordinator itself not
// counted): what a heartbeat timeout must exceed on this machine for the
// job to see no false loss. A launcher logs it when a world ends.
func (c *Coordinator) LongestSilence() time.Duration { return time.Duration(c.longest.Load()) }

// Addr is the address ranks dial (GEAR_RDZV_ADDR).
func (c *Coordinator) Addr() string { return c.ln.Addr().String() }

// Close stops listening, drops every connection and waits for the coordinator's
// goroutines. It is idempotent.
func (c *Coordinator) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		if c.timer != nil {
			c.timer.Stop()
		}
		conns := make([]*coordConn, 0, len(c.conns))
		for cc := range c.conns {
			conns = append(conns, cc)
		}
		c.mu.Unlock()
		c.ln.Close()
		close(c.stop)
		for _, cc := range conns {
			cc.close()
			cc.nc.Close() // a writer blocked on a peer that reads nothing ends now
		}
	})
	c.wg.Wait()
	c.refusals.flush()
	return nil
}

// RankExited tells the coordinator that rank's process ended (the launcher knows
// this first); clean says it exited with status 0. A rank that said goodbye is
// not lost. One that joined and did not is lost, with reason: at once after a
// failure, and after ExitReportWait after a clean exit, since its goodbye may
// still be on its way (the launcher can reap a rank before the coordinator
// reads the rank's last frame), so that its peers do not give up on frames it
// sent before it ended. One that never joined makes the world fail to assemble
// as soon as any other rank is waiting for it.
func (c *Coordinator) RankExited(rank int, clean bool, reason string) {
	if rank < 0 || rank >= c.cfg.Size {
		return
	}
	var post []func()
	c.mu.Lock()
	st := &c.ranks[rank]
	switch {
	case st.phase == phaseAbsent:
		st.phase, st.reason = phaseExited, reason
		if c.joinedN > 0 {
			post = c.failLocked(fmt.Sprintf("rank %d ended before joining (%s)", rank, reason))
		}
	case st.phase == phaseJoined && clean && !c.closed:
		c.loseLaterLocked(rank, reason)
	case st.phase == phaseJoined:
		post = c.lostLocked(rank, reason)
	}
	c.mu.Unlock()
	run(post)
}

// loseLaterLocked makes rank lost with reason after ExitReportWait, unless it
// said goodbye meanwhile (lostLocked then finds it no longer joined) or the
// coordinator closed: the news that settles whether a rank that ended is lost
// (its goodbye, the launcher's exit report) may still be on its way.
func (c *Coordinator) loseLaterLocked(rank int, reason string) {
	c.wg.Add(1)
	time.AfterFunc(ExitReportWait, func() {
		defer c.wg.Done()
		c.mu.Lock()
		var post []func()
		if !c.closed {
			post = c.lostLocked(rank, reason)
		}
		c.mu.Unlock()
		run(post)
	})
}

func run(fns []func()) {
	for _, f := range fns {
		f()
	}
}

func (c *Coordinator) accept() {
	defer c.wg.Done()
	backoff := time.Duration(0)
	for {
		nc, err := c.ln.Accept()
		if err != nil {
			c.mu.Lock()
			closed := c.closed
			c.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, say: keep serving the ranks that joined, and
			// try again in a while.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			c.refusals.warn("", "cannot accept connections: "+err.Error())
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		c.admit(nc)
	}
}

// admit serves a new connection, unless too many are proving the token.
func (c *Coordinator) admit(nc net.Conn) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		nc.Close()
		return
	}
	if c.pending >= c.cfg.MaxPending {
		c.mu.Unlock()
		c.refusals.warn(nc.RemoteAddr().String(), fmt.Sprintf("too many connections proving the token (%d)", c.cfg.MaxPending))
		// A few bytes into an empty send buffer: the write does not block.
		nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		nc.Write(frame(msgRefuse, func(e *enc) { e.str(busyRefusal) }))
		nc.Close()
		return
	}
	c.pending++
	cc := newCoordConn(nc)
	c.conns[cc] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() { defer c.wg.Done(); c.serve(cc) }()
}

// serve runs one connection: handshake, join, then requests until it ends.
func (c *Coordinator) serve(cc *coordConn) {
	rank := -1
	proven := false
	defer func() {
		cc.close()
		var post []func()
		const reason = "its connection to the coordinator closed"
		c.mu.Lock()
		delete(c.conns, cc)
		if !proven {
			c.pending--
		}
		if rank >= 0 && !c.closed && c.ranks[rank].conn == cc && c.ranks[rank].phase == phaseJoined {
			if c.cfg.ExitReports && !c.closed {
				c.loseLaterLocked(rank, reason)
			} else {
				post = c.lostLocked(rank, reason)
			}
		}
		c.mu.Unlock()
		run(post)
	}()
	remote := cc.nc.RemoteAddr().String()
	cc.nc.SetDeadline(time.Now().Add(c.cfg.HandshakeTimeout))
	nonce := newNonce()
	var e enc
	e.raw([]byte(wireMagic))
	e.raw(nonce[:])
	if err := writeFrame(cc.w, msgHello, e.b); err != nil {
		c.refusals.warn(remote, "writing the hello: "+err.Error())
		return
	}
	auth, err := readAuth(cc.r)
	if err != nil {
		c.refusals.warn(remote, handshakeFailure("auth", err))
		return
	}
	want := clientProof(c.cfg.Token, nonce[:], auth.Nonce[:], c.cfg.JobID, int(auth.Rank))
	if !hmac.Equal(auth.Proof[:], want) {
		c.refusals.warn(remote, fmt.Sprintf("the job token proof of a claimed rank %d does not match (another job's rank, or a wrong token)", auth.Rank))
		c.refuse(cc, "job token refused")
		return
	}
	c.mu.Lock()
	c.pending--
	proven = true
	c.mu.Unlock()
	typ, payload, err := readFrameMax(cc.r, nil, maxJoinFrame)
	if err != nil {
		c.refusals.warn(remote, handshakeFailure("join", err))
		return
	}
	if typ != msgJoin {
		c.refusals.warn(remote, fmt.Sprintf("message of type %d where a join belongs", typ))
		return
	}
	join, err := decodeJoin(payload)
	if err == nil && (join.Peer.Rank != int(auth.Rank) || join.JobID != c.cfg.JobID) {
		err = fmt.Errorf("rank %d of job %q joins on a proof for rank %d of job %q", join.Peer.Rank, join.JobID, auth.Rank, c.cfg.JobID)
	}
	if err != nil {
		c.refusals.warn(remote, "malformed join: "+err.Error())
		c.refuse(cc, "malformed join: "+err.Error())
		return
	}
	cc.nc.SetDeadline(time.Time{})
	cc.lastSeen.Store(time.Now().UnixNano())
	cc.startWriter(&c.wg, max(10*time.Second, c.cfg.HeartbeatTimeout))
	post, ok := c.join(cc, join, nonce[:], auth.Nonce[:], remote)
	run(post)
	if !ok {
		return
	}
	rank = join.Peer.Rank
	buf := make([]byte, 0, 512)
	for {
		typ, payload, err := readFrameMax(cc.r, buf, maxRequestFrame)
		cc.lastSeen.Store(time.Now().UnixNano())
		if err != nil {
			if errors.Is(err, errFrameTooLarge) {
				c.log.Warn("rank: coordinator: dropped rank's connection", "rank", rank, "remote", remote, "err", err)
			}
			return
		}
		if typ == msgPing {
			continue // its answer to the heartbeat
		}
		if cap(payload) > cap(buf) {
			buf = payload[:0]
		}
		if bye := c.handle(cc, rank, typ, payload); bye {
			return
		}
	}
}

// handshakeFailure says why reading the handshake's message what failed.
func handshakeFailure(what string, err error) string {
	var bad *errBadAuth
	switch {
	case errors.As(err, &bad):
		return bad.reason
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "no " + what + " within the handshake deadline"
	case errors.Is(err, io.EOF):
		return "closed before sending its " + what
	}
	return "reading its " + what + ": " + err.Error()
}

// refuse tells a connection that has no writer yet why it is dropped.
func (c *Coordinator) refuse(cc *coordConn, msg string) {
	var e enc
	e.str(msg)
	writeFrame(cc.w, msgRefuse, e.b)
}

// join admits a rank whose token proof checked out.
func (c *Coordinator) join(cc *coordConn, m joinMsg, nonce, clientNonce []byte, remote string) (post []func(), ok bool) {
	r := m.Peer.Rank
	c.mu.Lock()
	defer c.mu.Unlock()
	var refusal string
	switch {
	case m.Generation != c.cfg.Generation:
		refusal = fmt.Sprintf("rank %d of generation %d refused: the job is at generation %d", r, m.Generation, c.cfg.Generation)
	case m.Size != c.cfg.Size:
		refusal = fmt.Sprintf("rank %d says the world has %d ranks; it has %d", r, m.Size, c.cfg.Size)
	case r < 0 || r >= c.cfg.Size:
		refusal = fmt.Sprintf("rank %d is outside the world of %d", r, c.cfg.Size)
	case c.ranks[r].phase != phaseAbsent:
		refusal = fmt.Sprintf("rank %d joined already", r)
	}
	if refusal != "" {
		c.log.Warn("rank: coordinator: refused join", "remote", remote, "reason", refusal)
		cc.send(frame(msgRefuse, func(e *enc) { e.str(refusal) }))
		return nil, false
	}
	proof := serverProof(c.cfg.Token, nonce, clientNonce)
	cc.send(frame(msgWelcome, func(e *enc) { e.bytes(proof) }))
	if c.failed != nil {
		cc.send(failFrame(c.failed))
		return nil, false
	}
	c.ranks[r] = rankState{phase: phaseJoined, conn: cc}
	c.peers[r] = m.Peer
	c.joinedN++
	c.log.Debug("rank: coordinator: rank joined", "rank", r, "remote", remote, "joined", c.joinedN, "size", c.cfg.Size)
	for i := range c.ranks {
		if c.ranks[i].phase == phaseExited {
			return c.failLocked(fmt.Sprintf("rank %d ended before joining (%s)", i, c.ranks[i].reason)), true
		}
	}
	if c.joinedN == 1 && c.cfg.Size > 1 {
		c.timer = time.AfterFunc(c.cfg.Timeout, c.timeout)
	}
	if c.joinedN == c.cfg.Size {
		if c.timer != nil {
			c.timer.Stop()
		}
		c.assembled = true
		f := frame(msgWorld, func(e *enc) { e.raw(encodeWorld(c.peers)) })
		now := time.Now().UnixNano()
		for i := range c.ranks {
			c.ranks[i].conn.lastSeen.Store(now) // the heartbeat starts now
			c.ranks[i].conn.send(f)
		}
		c.log.Debug("rank: coordinator: world assembled", "size", c.cfg.Size)
	}
	return nil, true
}

func (c *Coordinator) timeout() {
	c.mu.Lock()
	var post []func()
	if !c.assembled && c.failed == nil && !c.closed {
		post = c.failLocked(fmt.Sprintf("timed out after %v", c.cfg.Timeout))
	}
	c.mu.Unlock()
	run(post)
}

// failLocked ends assembly: every joined rank gets the error naming the missing
// ranks, and OnFail runs after the lock is released.
func (c *Coordinator) failLocked(reason string) []func() {
	if c.assembled || c.failed != nil {
		return nil
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	var missing []int
	for i := range c.ranks {
		if c.ranks[i].phase != phaseJoined && c.ranks[i].phase != phaseLeft {
			missing = append(missing, i)
		}
	}
	c.failed = &RendezvousError{Missing: missing, Reason: reason}
	c.log.Info("rank: coordinator: world did not assemble", "missing", FormatRanks(missing), "reason", reason)
	f := failFrame(c.failed)
	for i := range c.ranks {
		if c.ranks[i].phase == phaseJoined {
			c.ranks[i].conn.send(f)
		}
	}
	err := c.failed
	if c.cfg.OnFail == nil {
		return nil
	}
	return []func(){func() { c.cfg.OnFail(err) }}
}

func failFrame(e *RendezvousError) []byte {
	return frame(msgFail, func(en *enc) { en.str(e.Reason); en.ints(e.Missing) })
}

// lostLocked records that a joined rank died and tells everyone.
func (c *Coordinator) lostLocked(rank int, reason string) []func() {
	st := &c.ranks[rank]
	if st.phase != phaseJoined {
		return nil
	}
	st.phase, st.reason = phaseLost, reason
	if !c.assembled {
		st.phase = phaseExited
		return c.failLocked(fmt.Sprintf("rank %d ended before the world assembled (%s)", rank, reason))
	}
	c.log.Info("rank: coordinator: rank lost", "rank", rank, "reason", reason)
	f := frame(msgLost, func(e *enc) { e.int(rank); e.str(reason) })
	for i := range c.ranks {
		if c.ranks[i].phase == phaseJoined {
			c.ranks[i].conn.send(f)
		}
	}
	c.failBarriersLocked(fmt.Sprintf("rank %d lost: %s", rank, reason))
	if c.cfg.OnLost == nil {
		return nil
	}
	return []func(){func() { c.cfg.OnLost(rank, reason) }}
}

// failBarriersLocked ends every pending barrier with an error; later barriers fail
// at once.
func (c *Coordinator) failBarriersLocked(why string) {
	if c.gone == "" {
		c.gone = why
	}
	for gen := range c.barriers {
		f := frame(msgBarrierDone, func(e *enc) { e.uint(gen); e.str(c.gone) })
		for i := range c.ranks {
			if c.ranks[i].phase == phaseJoined {
				c.ranks[i].conn.send(f)
			}
		}
		delete(c.barriers, gen)
	}
}

// handle serves one request; it reports whether the rank said goodbye.
func (c *Coordinator) handle(cc *coordConn, rank int, typ byte, payload []byte) (bye bool) {
	d := dec{b: payload}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch typ {
	case msgSet:
		id, key, val := d.uint(), d.str(maxKey), d.bytes(maxValue)
		if d.err != nil {
			break
		}
		if _, ok := c.kv[key]; ok {
			cc.send(frame(msgErr, func(e *enc) { e.uint(id); e.str(fmt.Sprintf("key %q already set", key)) }))
			return false
		}
		c.kv[key] = val
		cc.send(frame(msgOK, func(e *enc) { e.uint(id) }))
		for _, w := range c.waiters[key] {
			w.c.send(valueFrame(w.id, true, val))
		}
		delete(c.waiters, key)
	case msgGet, msgWait:
		id, key := d.uint(), d.str(maxKey)
		if d.err != nil {
			break
		}
		val, ok := c.kv[key]
		if ok || typ == msgGet {
			cc.send(valueFrame(id, ok, val))
		} else {
			c.waiters[key] = append(c.waiters[key], waiter{cc, id})
		}
	case msgBarrier:
		gen := d.uint()
		if d.err != nil {
			break
		}
		if c.gone != "" {
			cc.send(frame(msgBarrierDone, func(e *enc) { e.uint(gen); e.str(c.gone) }))
			return false
		}
		c.barriers[gen]++
		if c.barriers[gen] == c.cfg.Size {
			delete(c.barriers, gen)
			f := frame(msgBarrierDone, func(e *enc) { e.uint(gen); e.str("") })
			for i := range c.ranks {
				c.ranks[i].conn.send(f)
			}
		}
	case msgBye:
		c.ranks[rank].phase = phaseLeft
		c.log.Debug("rank: coordinator: rank left", "rank", rank)
		c.failBarriersLocked(fmt.Sprintf("rank %d has left the world", rank))
		return true
	default:
		d.err = fmt.Errorf("rank: unknown message type %d", typ)
	}
	if d.err != nil {
		c.log.Warn("rank: coordinator: malformed request; dropping rank", "rank", rank, "err", d.err)
		cc.nc.Close()
	}
	return false
}

func valueFrame(id uint64, found bool, val []byte) []byte {
	return frame(msgValue, func(e *enc) { e.uint(id); e.bool(found); e.bytes(val) })
}

// frame encodes a whole frame (header included) once, so that a broadcast shares it.
func frame(typ byte, fill func(*enc)) []byte {
	e := enc{b: make([]byte, 5, 64)}
	fill(&e)
	n := len(e.b) - 4
	e.b[0], e.b[1], e.b[2], e.b[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	e.b[4] = typ
	return e.b
}

// coordConn is one rank's connection; sends are queued and written by writeLoop so
// that the coordinator never blocks on a slow rank while holding its lock.
type coordConn struct {
	nc net.Conn
	r  *bufio.Reader
	w  *bufio.Writer // used by serve before writeLoop takes over (handshake only)

	mu      sync.Mutex
	queue   [][]byte
	wake    chan struct{}
	done    chan struct{}
	closed  bool
	writing bool // writeLoop runs and closes nc
	// lastSeen is when the rank last sent anything (UnixNano).
	lastSeen atomic.Int64
	// writeTimeout bounds one write: a peer that takes no bytes for that long
	// is gone.
	writeTimeout time.Duration
}

func newCoordConn(nc net.Conn) *coordConn {
	return &coordConn{
		nc:   nc,
		r:    bufio.NewReaderSize(nc, 4096),
		w:    bufio.NewWriterSize(nc, 512),
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
}

func (cc *coordConn) send(f []byte) {
	cc.mu.Lock()
	if !cc.closed {
		cc.queue = append(cc.queue, f)
	}
	cc.mu.Unlock()
	select {
	case cc.wake <- struct{}{}:
	default:
	}
}

// close ends the connection: its writer sends what is queued and closes it,
// or, before the writer started, it is closed at once.
func (cc *coordConn) close() {
	cc.mu.Lock()
	if !cc.closed {
		cc.closed = true
		close(cc.done)
		if !cc.writing {
			cc.nc.Close()
		}
	}
	cc.mu.Unlock()
}

// startWriter starts the goroutine that writes what send queues; until then
// serve writes the handshake itself.
func (cc *coordConn) startWriter(wg *sync.WaitGroup, writeTimeout time.Duration) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.closed {
		return
	}
	cc.writing = true
	cc.writeTimeout = writeTimeout
	wg.Add(1)
	go func() { defer wg.Done(); cc.writeLoop() }()
}

func (cc *coordConn) writeLoop() {
	defer cc.nc.Close()
	for {
		cc.mu.Lock()
		q := cc.queue
		cc.queue = nil
		closed := cc.closed
		cc.mu.Unlock()
		for _, f := range q {
			cc.nc.SetWriteDeadline(time.Now().Add(cc.writeTimeout))
			if _, err := cc.nc.Write(f); err != nil {
				cc.close()
				return
			}
		}
		if closed {
			return
		}
		select {
		case <-cc.wake:
		case <-cc.done:
		}
	}
}
