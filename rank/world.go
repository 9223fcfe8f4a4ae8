package rank

import (
	"bufio"
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Peer is one rank as it registered with the rendezvous.
type Peer struct {
	Rank      int
	LocalRank int
	LocalSize int
	Node      int
	NumNodes  int
	Role      string
	RoleRank  int
	Host      string // host identity (HostID); equal hosts share memory
	PID       int
	// Endpoints are the small facts the rank registered when it joined
	// (WithEndpoints): a TCP listen address, shared-memory names.
	Endpoints map[string]string
}

// Role is one MPMD group of the world: its ranks, in role-rank order.
type Role struct {
	Name  string
	Ranks []int
}

// Size is the number of ranks in the role.
func (r Role) Size() int { return len(r.Ranks) }

// Option changes how Init joins the world.
type Option func(*initConfig)

type initConfig struct {
	info      *Info
	log       *slog.Logger
	endpoints map[string]string
	timeout   time.Duration
	hostID    string
	heartbeat time.Duration
}

// WithInfo joins with info instead of reading the environment (FromEnv).
func WithInfo(info Info) Option { return func(c *initConfig) { c.info = &info } }

// WithLogger sends the world's logs to l (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(c *initConfig) { c.log = l } }

// WithEndpoints registers small facts (listen addresses, segment names) that every
// rank sees in Peers once the world assembles.
func WithEndpoints(ep map[string]string) Option {
	return func(c *initConfig) { c.endpoints = maps.Clone(ep) }
}

// WithTimeout overrides Info.RdzvTimeout: how long Init waits for the world.
func WithTimeout(d time.Duration) Option { return func(c *initConfig) { c.timeout = d } }

// WithHostID overrides the host identity (HostID).
func WithHostID(id string) Option { return func(c *initConfig) { c.hostID = id } }

// WithHeartbeatTimeout sets how long the rank waits for a word from the
// coordinator (which pings every DefaultHeartbeat) before it takes it for gone;
// the default is DefaultHeartbeatTimeout. It must exceed the coordinator's
// heartbeat interval.
func WithHeartbeatTimeout(d time.Duration) Option { return func(c *initConfig) { c.heartbeat = d } }

// World is the calling process's world: its place, the other ranks, a barrier, a
// small key-value exchange and news of lost ranks. A World is safe for concurrent
// use. World implements collective.Bootstrap.
type World struct {
	info Info
	host string
	// heartbeatTimeout: with no word from the coordinator for this long, the
	// rank takes it for gone.
	heartbeatTimeout time.Duration
	peers            []Peer
	roles            []Role
	log              *slog.Logger

	conn   net.Conn // nil for a world of one
	coord  *Coordinator
	lock   *JobLock // held shared under SLURM, so that gearrun clean sees the job
	reader *bufio.Reader
	wmu    sync.Mutex
	w      *bufio.Writer

	bmu sync.Mutex // serialises Barrier
	gen uint64

	mu       sync.Mutex
	closed   bool
	broken   error // first loss or coordinator failure; Barrier and Wait fail with it
	nextID   uint64
	pending  map[uint64]pendingReq
	barrier  map[uint64]chan error
	cache    map[string][]byte
	local    map[string]chan struct{} // world of one: keys waited for
	lost     map[int]string
	lostFns  map[int]func(int, string)
	nextFn   int
	notes    []lostNote
	noteWake chan struct{}

	comms comms // built on demand by Comm and RoleComm

	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type reply struct {
	found bool
	val   []byte
	err   error
}

type pendingReq struct {
	ch  chan reply
	typ byte
}

type lostNote struct {
	fns    []func(int, string)
	rank   int
	reason string
}

// Init joins the world described by the environment (FromEnv) or by WithInfo and
// returns it once every rank has joined. A world of one contacts nothing. Under
// SLURM without a launcher, rank 0 also runs the coordinator.
//
// Errors: *RendezvousError (errors.Is ErrRendezvous) naming the ranks that never
// joined; ErrTokenRefused; the context's error wrapped with what was being awaited.
func Init(ctx context.Context, opts ...Option) (*World, error) {
	var cfg initConfig
	for _, o := range opts {
		o(&cfg)
	}
	var info Info
	if cfg.info != nil {
		info = *cfg.info
	} else {
		var err error
		if info, err = FromEnv(); err != nil {
			return nil, err
		}
	}
	if cfg.timeout > 0 {
		info.RdzvTimeout = cfg.timeout
	}
	if info.RdzvTimeout <= 0 {
		info.RdzvTimeout = DefaultRdzvTimeout
	}
	if info.JobID == "" {
		info.JobID = LocalJobID()
	}
	log := cfg.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host := cfg.hostID
	if host == "" {
		host = HostID()
	}
	if cfg.heartbeat <= 0 {
		cfg.heartbeat = DefaultHeartbeatTimeout
	}
	w := &World{
		info:             info,
		heartbeatTimeout: cfg.heartbeat,
		host:             host,
		log:              log,
		pending:          make(map[uint64]pendingReq),
		barrier:          make(map[uint64]chan error),
		cache:            make(map[string][]byte),
		lost:             make(map[int]string),
		lostFns:          make(map[int]func(int, string)),
		noteWake:         make(chan struct{}, 1),
		done:             make(chan struct{}),
	}
	self := Peer{Rank: info.Rank, LocalRank: info.LocalRank, LocalSize: info.LocalSize,
		Node: info.NodeRank, NumNodes: info.NumNodes, Role: info.Role, RoleRank: info.RoleRank,
		Host: host, PID: os.Getpid(), Endpoints: cfg.endpoints}
	if info.Size == 1 {
		w.peers = []Peer{self}
		w.roles = buildRoles(w.peers)
		w.local = make(map[string]chan struct{})
		return w, nil
	}
	if info.ServeRdzv {
		addr := info.RdzvAddr
		if info.NumNodes > 1 {
			if _, port, err := net.SplitHostPort(addr); err == nil {
				addr = ":" + port // other nodes must reach it
			}
		}
		c, err := NewCoordinator(CoordinatorConfig{Addr: addr, JobID: info.JobID, Token: info.Token,
			Size: info.Size, Generation: info.Restart, Timeout: info.RdzvTimeout, Logger: log})
		if err != nil {
			return nil, err
		}
		w.coord = c
		if info.NumNodes <= 1 {
			info.RdzvAddr = c.Addr()
			w.info.RdzvAddr = c.Addr()
		}
	}
	if info.Source == SourceSlurm {
		l, err := LockJob("", info.JobID, false)
		if err != nil {
			if w.coord != nil {
				w.coord.Close()
			}
			return nil, err
		}
		w.lock = l
	}
	peers, err := w.join(ctx, self)
	if err != nil {
		w.lock.Close()
		if w.conn != nil {
			w.conn.Close()
		}
		if w.coord != nil {
			w.coord.Close()
		}
		return nil, err
	}
	w.peers = peers
	w.roles = buildRoles(peers)
	w.wg.Add(2)
	go w.readLoop()
	go w.notifyLoop()
	return w, nil
}

// join dials the coordinator, proves the token and waits for the world table.
func (w *World) join(ctx context.Context, self Peer) ([]Peer, error) {
	info := w.info
	// The coordinator's own assembly timeout starts at the first arrival and ends
	// first; this one only guards against a coordinator that never answers.
	ctx, cancel := context.WithTimeout(ctx, info.RdzvTimeout+5*time.Second)
	defer cancel()
	m := joinMsg{JobID: info.JobID, Peer: self, Size: info.Size, Generation: info.Restart}
	joinFrame := m.encode()
	if len(joinFrame)+1 > maxJoinFrame {
		return nil, fmt.Errorf("rank: rendezvous: this rank's facts take %d bytes, over the limit of %d (are its endpoints small?)", len(joinFrame)+1, maxJoinFrame)
	}
	var d net.Dialer
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 500*time.Millisecond) {
		nc, err := d.DialContext(ctx, "tcp", info.RdzvAddr)
		if err == nil {
			var busy bool
			if busy, err = w.handshake(ctx, nc, joinFrame); err == nil {
				break
			}
			nc.Close()
			w.conn = nil
			if !busy {
				return nil, err
			}
		} else if info.Source != SourceSlurm || ctx.Err() != nil {
			// Under SLURM the coordinator (rank 0) may start after this rank.
			return nil, fmt.Errorf("rank: rendezvous at %s: %w", info.RdzvAddr, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rank: rendezvous at %s: %w", info.RdzvAddr, err)
		case <-time.After(backoff):
		}
	}
	return w.awaitWorld(ctx)
}

// handshake proves the token on a new connection to the coordinator and joins;
// busy reports that the coordinator turned the connection away for now.
func (w *World) handshake(ctx context.Context, nc net.Conn, joinFrame []byte) (busy bool, err error) {
	info := w.info
	w.conn = nc
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	r := bufio.NewReaderSize(nc, 8192)
	w.w = bufio.NewWriterSize(nc, 4096)
	w.reader = r
	// Until the coordinator proves the token, nothing it sends may be large.
	typ, p, err := readFrameMax(r, nil, maxHandshakeFrame)
	if err != nil {
		return false, w.ctxErr(ctx, err, "reading the coordinator's hello")
	}
	if typ == msgRefuse {
		d := dec{b: p}
		msg := d.str(maxHandshakeFrame)
		if msg == busyRefusal {
			return true, fmt.Errorf("rank: rendezvous at %s: coordinator busy", info.RdzvAddr)
		}
		return false, fmt.Errorf("rank: rendezvous at %s: refused: %s", info.RdzvAddr, msg)
	}
	if typ != msgHello || len(p) != len(wireMagic)+nonceSize || string(p[:len(wireMagic)]) != wireMagic {
		return false, fmt.Errorf("rank: rendezvous at %s: not a gear coordinator", info.RdzvAddr)
	}
	serverNonce := p[len(wireMagic):]
	auth := authMsg{Nonce: newNonce(), Rank: uint32(info.Rank)}
	copy(auth.Proof[:], clientProof(info.Token, serverNonce, auth.Nonce[:], info.JobID, info.Rank))
	w.w.Write(auth.frame())
	if err := writeFrame(w.w, msgJoin, joinFrame); err != nil {
		return false, w.ctxErr(ctx, err, "joining")
	}
	typ, p, err = readFrameMax(r, nil, maxHandshakeFrame)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			err = fmt.Errorf("%w (the coordinator closed the connection: a wrong job token, or another job's coordinator)", err)
		}
		return false, w.ctxErr(ctx, err, "waiting for the coordinator's welcome")
	}
	switch typ {
	case msgRefuse:
		d := dec{b: p}
		msg := d.str(maxHandshakeFrame)
		if msg == "job token refused" {
			return false, fmt.Errorf("%w by the coordinator at %s", ErrTokenRefused, info.RdzvAddr)
		}
		return false, fmt.Errorf("rank: rendezvous at %s: refused: %s", info.RdzvAddr, msg)
	case msgWelcome:
		d := dec{b: p}
		proof := d.bytes(64)
		if !hmac.Equal(proof, serverProof(info.Token, serverNonce, auth.Nonce[:])) {
			return false, fmt.Errorf("%w: the coordinator at %s could not prove it knows the token", ErrTokenRefused, info.RdzvAddr)
		}
	default:
		return false, fmt.Errorf("rank: rendezvous at %s: unexpected message %d", info.RdzvAddr, typ)
	}
	return false, nil
}

func (w *World) ctxErr(ctx context.Context, err error, what string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("rank: rendezvous at %s: %s: %w", w.info.RdzvAddr, what, ctx.Err())
	}
	return fmt.Errorf("rank: rendezvous at %s: %s: %w", w.info.RdzvAddr, what, err)
}

// awaitWorld waits for the world table after the welcome.
func (w *World) awaitWorld(ctx context.Context) ([]Peer, error) {
	info := w.info
	nc, r := w.conn, w.reader
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	typ, p, err := readFrameMax(r, nil, worldFrameLimit(info.Size))
	if err != nil {
		return nil, w.ctxErr(ctx, err, fmt.Sprintf("waiting for the other %d ranks", info.Size-1))
	}
	switch typ {
	case msgWorld:
		peers, err := decodeWorld(p)
		if err != nil {
			return nil, err
		}
		if len(peers) != info.Size {
			return nil, fmt.Errorf("rank: rendezvous: world table has %d ranks, want %d", len(peers), info.Size)
		}
		nc.SetDeadline(time.Time{})
		w.reader = r
		return peers, nil
	case msgFail:
		d := dec{b: p}
		e := &RendezvousError{Reason: d.str(4096), Missing: d.ints(maxRanks, maxRanks)}
		if d.err != nil {
			return nil, d.err
		}
		return nil, e
	default:
		return nil, fmt.Errorf("rank: rendezvous at %s: unexpected message %d", info.RdzvAddr, typ)
	}
}

func buildRoles(peers []Peer) []Role {
	var roles []Role
	index := map[string]int{}
	for _, p := range peers {
		i, ok := index[p.Role]
		if !ok {
			i = len(roles)
			index[p.Role] = i
			roles = append(roles, Role{Name: p.Role})
		}
		roles[i].Ranks = append(roles[i].Ranks, p.Rank)
	}
	for i := range roles {
		r := roles[i].Ranks
		slices.SortStableFunc(r, func(a, b int) int { return peers[a].RoleRank - peers[b].RoleRank })
	}
	return roles
}

// Info returns the facts the world was built from (the token included; do not
// print it: Info's String and LogValue leave it out).
func (w *World) Info() Info { return w.info }

// Rank is the caller's index in the world.
func (w *World) Rank() int { return w.info.Rank }

// Size is the number of ranks in the world.
func (w *World) Size() int { return w.info.Size }

// LocalRank is the caller's index among the ranks of its node.
func (w *World) LocalRank() int { return w.info.LocalRank }

// LocalSize is the number of ranks on the caller's node.
func (w *World) LocalSize() int { return w.info.LocalSize }

// NodeRank is the index of the caller's node.
func (w *World) NodeRank() int { return w.info.NodeRank }

// NumNodes is the number of nodes of the job.
func (w *World) NumNodes() int { return w.info.NumNodes }

// Role is the caller's MPMD group ("" in an SPMD job).
func (w *World) Role() string { return w.info.Role }

// RoleRank is the caller's index within its role.
func (w *World) RoleRank() int { return w.info.RoleRank }

// RoleSize is the number of ranks in the caller's role.
func (w *World) RoleSize() int {
	for _, r := range w.roles {
		if r.Name == w.info.Role {
			return len(r.Ranks)
		}
	}
	return 1
}

// Roles lists the world's roles in order of their first rank.
func (w *World) Roles() []Role {
	out := make([]Role, len(w.roles))
	for i, r := range w.roles {
		out[i] = Role{Name: r.Name, Ranks: slices.Clone(r.Ranks)}
	}
	return out
}

// JobID is the job's ID (a UUID under gearrun; "local-<pid>" alone).
func (w *World) JobID() string { return w.info.JobID }

// RestartCount is the world's generation: how many times the launcher
// restarted the job before this world (0 for the first).
func (w *World) RestartCount() int { return w.info.Restart }

// CheckpointDir is the job's checkpoint directory, readable by every host of
// the job, or "" when the job has none (GEAR_CHECKPOINT_DIR).
func (w *World) CheckpointDir() string { return w.info.CheckpointDir }

// Host is the caller's host identity (HostID).
func (w *World) Host() string { return w.host }

// ListenHost is the address by which other ranks can reach this one: the local
// address of its connection to the coordinator (127.0.0.1 when the coordinator is
// on loopback, and in a world of one). Communicators listen there.
func (w *World) ListenHost() string {
	if w.conn != nil {
		if a, ok := w.conn.LocalAddr().(*net.TCPAddr); ok && !a.IP.IsUnspecified() {
			return a.IP.String()
		}
	}
	return "127.0.0.1"
}

// Peers returns every rank's registration, indexed by rank: hosts, PIDs, roles,
// endpoints.
func (w *World) Peers() []Peer {
	out := make([]Peer, len(w.peers))
	for i, p := range w.peers {
		p.Endpoints = maps.Clone(p.Endpoints)
		out[i] = p
	}
	return out
}

// Err returns nil while every rank is alive and the coordinator reachable, else
// the first *LostError or ErrCoordinatorGone.
func (w *World) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.broken
}

// Barrier returns once every rank of the world has called Barrier, or fails with
// a *LostError when a rank died or left first.
func (w *World) Barrier(ctx context.Context) error {
	if w.conn == nil {
		return w.checkOpen()
	}
	w.bmu.Lock()
	defer w.bmu.Unlock()
	w.gen++
	gen := w.gen
	ch := make(chan error, 1)
	w.mu.Lock()
	if err := w.usableLocked(); err != nil {
		w.mu.Unlock()
		return err
	}
	w.barrier[gen] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.barrier, gen)
		w.mu.Unlock()
	}()
	if err := w.send(msgBarrier, func(e *enc) { e.uint(gen) }); err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("rank: barrier %d: %w", gen, ctx.Err())
	case <-w.done:
		return ErrClosed
	}
}

// Set publishes value under key to every rank. Keys are write-once per world:
// setting a key twice fails with ErrKeyExists. Values are at most 1 MiB.
func (w *World) Set(ctx context.Context, key string, value []byte) error {
	if len(key) > maxKey || len(value) > maxValue {
		return fmt.Errorf("rank: set %q: key over %d bytes or value over %d bytes", trim(key), maxKey, maxValue)
	}
	if w.conn == nil {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.closed {
			return ErrClosed
		}
		if _, ok := w.cache[key]; ok {
			return fmt.Errorf("%w: %q", ErrKeyExists, key)
		}
		w.cache[key] = slices.Clone(value)
		if ch, ok := w.local[key]; ok {
			close(ch)
			delete(w.local, key)
		}
		return nil
	}
	if _, err := w.request(ctx, msgSet, key, value); err != nil {
		return err
	}
	w.mu.Lock()
	w.cache[key] = slices.Clone(value)
	w.mu.Unlock()
	return nil
}

// Get returns the value of key and whether it has been set, without waiting.
func (w *World) Get(ctx context.Context, key string) ([]byte, bool, error) {
	w.mu.Lock()
	if v, ok := w.cache[key]; ok {
		w.mu.Unlock()
		return slices.Clone(v), true, nil
	}
	w.mu.Unlock()
	if w.conn == nil {
		return nil, false, w.checkOpen()
	}
	r, err := w.request(ctx, msgGet, key, nil)
	if err != nil || !r.found {
		return nil, false, err
	}
	w.remember(key, r.val)
	return r.val, true, nil
}

// Wait blocks until key has been set by some rank and returns its value. Once a
// rank is lost, Wait returns the *LostError for keys not yet known to the caller.
func (w *World) Wait(ctx context.Context, key string) ([]byte, error) {
	w.mu.Lock()
	if v, ok := w.cache[key]; ok {
		w.mu.Unlock()
		return slices.Clone(v), nil
	}
	if w.conn == nil {
		if w.closed {
			w.mu.Unlock()
			return nil, ErrClosed
		}
		ch, ok := w.local[key]
		if !ok {
			ch = make(chan struct{})
			w.local[key] = ch
		}
		w.mu.Unlock()
		select {
		case <-ch:
			return w.Wait(ctx, key)
		case <-ctx.Done():
			return nil, fmt.Errorf("rank: wait for %q: %w", trim(key), ctx.Err())
		case <-w.done:
			return nil, ErrClosed
		}
	}
	w.mu.Unlock()
	r, err := w.request(ctx, msgWait, key, nil)
	if err != nil {
		return nil, err
	}
	w.remember(key, r.val)
	return r.val, nil
}

func (w *World) remember(key string, val []byte) {
	w.mu.Lock()
	w.cache[key] = slices.Clone(val)
	w.mu.Unlock()
}

// OnLost registers fn to be called, from the world's notifier goroutine, once for
// every rank that died (including ranks lost before the call). The returned
// function unregisters fn.
func (w *World) OnLost(fn func(rank int, reason string)) (unregister func()) {
	w.mu.Lock()
	id := w.nextFn
	w.nextFn++
	w.lostFns[id] = fn
	if len(w.lost) > 0 && !w.closed {
		for _, r := range slices.Sorted(maps.Keys(w.lost)) {
			w.notes = append(w.notes, lostNote{fns: []func(int, string){fn}, rank: r, reason: w.lost[r]})
		}
		w.wakeNotifier()
	}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.lostFns, id)
		w.mu.Unlock()
	}
}

// Lost returns the ranks known to have died, with the reasons.
func (w *World) Lost() map[int]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.lost)
}

// Close leaves the world (the coordinator learns that this rank ended on purpose,
// so it is not reported lost) and waits for the world's goroutines. It is
// idempotent and safe to call concurrently with other methods, which then return
// ErrClosed.
func (w *World) Close() error {
	w.closeOnce.Do(func() {
		w.closeComms()
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		if w.conn != nil {
			w.send(msgBye, func(*enc) {})
			// Half-close so that the coordinator reads the goodbye before EOF.
			if tc, ok := w.conn.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}
		close(w.done)
		if w.conn != nil {
			w.conn.Close()
		}
		w.wg.Wait()
		if w.coord != nil {
			w.coord.Close()
		}
		w.lock.Close()
	})
	return nil
}

func (w *World) checkOpen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	return nil
}

func (w *World) usableLocked() error {
	if w.closed {
		return ErrClosed
	}
	return w.broken
}

func (w *World) send(typ byte, fill func(*enc)) error {
	var e enc
	fill(&e)
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if err := writeFrame(w.w, typ, e.b); err != nil {
		return fmt.Errorf("%w: %v", ErrCoordinatorGone, err)
	}
	return nil
}

// request sends a set, get or wait and waits for its answer.
func (w *World) request(ctx context.Context, typ byte, key string, value []byte) (reply, error) {
	what := map[byte]string{msgSet: "set", msgGet: "get", msgWait: "wait for"}[typ]
	ch := make(chan reply, 1)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return reply{}, ErrClosed
	}
	if typ == msgWait && w.broken != nil {
		err := w.broken
		w.mu.Unlock()
		return reply{}, fmt.Errorf("rank: wait for %q: %w", trim(key), err)
	}
	w.nextID++
	id := w.nextID
	w.pending[id] = pendingReq{ch, typ}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.pending, id)
		w.mu.Unlock()
	}()
	err := w.send(typ, func(e *enc) {
		e.uint(id)
		e.str(key)
		if typ == msgSet {
			e.bytes(value)
		}
	})
	if err != nil {
		return reply{}, fmt.Errorf("rank: %s %q: %w", what, trim(key), err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return reply{}, fmt.Errorf("rank: %s %q: %w", what, trim(key), r.err)
		}
		return r, nil
	case <-ctx.Done():
		return reply{}, fmt.Errorf("rank: %s %q: %w", what, trim(key), ctx.Err())
	case <-w.done:
		return reply{}, ErrClosed
	}
}

func trim(key string) string {
	if len(key) > 64 {
		return key[:64] + "..."
	}
	return key
}

// readLoop dispatches the coordinator's messages until the connection ends.
func (w *World) readLoop() {
	defer w.wg.Done()
	buf := make([]byte, 0, 512)
	for {
		// Wait for the next frame's first byte (consuming nothing), then read
		// the frame; the coordinator's pings keep a healthy connection busy.
		w.conn.SetReadDeadline(time.Now().Add(w.heartbeatTimeout))
		_, err := w.reader.Peek(1)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// A rank that was not scheduled for a while wakes up to an expired
			// deadline with the coordinator's pings unread: look once more,
			// briefly, before giving up on it.
			w.conn.SetReadDeadline(time.Now().Add(w.heartbeatTimeout / 4))
			_, err = w.reader.Peek(1)
		}
		var typ byte
		var p []byte
		if err == nil {
			w.conn.SetReadDeadline(time.Now().Add(w.heartbeatTimeout))
			typ, p, err = readFrameMax(w.reader, buf, maxRequestFrame)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("no word from it at %s for %v (its host unreachable?)", w.info.RdzvAddr, w.heartbeatTimeout)
			}
			w.fail(fmt.Errorf("%w: %v", ErrCoordinatorGone, err))
			return
		}
		if typ == msgPing {
			w.send(msgPing, func(*enc) {}) // a broken connection fails the next read
			continue
		}
		if cap(p) > cap(buf) {
			buf = p[:0]
		}
		d := dec{b: p}
		switch typ {
		case msgOK, msgErr, msgValue:
			id := d.uint()
			var r reply
			switch typ {
			case msgErr:
				// The coordinator's only refusal: a second Set of a key.
				r.err = fmt.Errorf("%w (%s)", ErrKeyExists, d.str(4096))
			case msgValue:
				r.found = d.bool()
				r.val = d.bytes(maxValue)
			}
			w.mu.Lock()
			pr, ok := w.pending[id]
			delete(w.pending, id)
			w.mu.Unlock()
			if ok && d.err == nil {
				pr.ch <- r
			}
		case msgBarrierDone:
			gen, msg := d.uint(), d.str(4096)
			w.mu.Lock()
			ch := w.barrier[gen]
			var err error
			if msg != "" {
				err = w.broken
				if err == nil {
					err = fmt.Errorf("rank: barrier %d: %s", gen, msg)
				}
			}
			w.mu.Unlock()
			if ch != nil {
				ch <- err
			}
		case msgLost:
			rank, reason := d.int(maxRanks), d.str(4096)
			if d.err == nil {
				w.markLost(rank, reason)
			}
		default:
			w.log.Warn("rank: unexpected message from the coordinator", "type", typ)
		}
		if d.err != nil {
			w.log.Warn("rank: malformed message from the coordinator", "type", typ, "err", d.err)
		}
	}
}

func (w *World) markLost(rank int, reason string) {
	err := &LostError{Rank: rank, Reason: reason}
	if w.multiHost() && rank >= 0 && rank < len(w.peers) {
		err.Host = HostName(w.peers[rank].Host)
	}
	w.mu.Lock()
	if _, ok := w.lost[rank]; ok {
		w.mu.Unlock()
		return
	}
	w.lost[rank] = reason
	fns := slices.Collect(maps.Values(w.lostFns))
	if len(fns) > 0 {
		w.notes = append(w.notes, lostNote{fns: fns, rank: rank, reason: reason})
		w.wakeNotifier()
	}
	w.mu.Unlock()
	w.log.Warn("rank: rank lost", "rank", rank, "reason", reason)
	w.fail(err)
}

// multiHost reports whether the world's ranks are on more than one host, where
// a lost rank's error names its host.
func (w *World) multiHost() bool {
	for _, p := range w.peers {
		if p.Host != w.peers[0].Host {
			return true
		}
	}
	return false
}

// fail breaks the world: pending barriers and waits end with err; when the
// coordinator is gone, every pending request does.
func (w *World) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if w.broken == nil {
		w.broken = err
	}
	for _, ch := range w.barrier {
		select {
		case ch <- w.broken:
		default:
		}
	}
	gone := errors.Is(err, ErrCoordinatorGone)
	for id, pr := range w.pending {
		if pr.typ != msgWait && !gone {
			continue
		}
		select {
		case pr.ch <- reply{err: err}:
		default:
		}
		delete(w.pending, id)
	}
}

func (w *World) wakeNotifier() {
	select {
	case w.noteWake <- struct{}{}:
	default:
	}
}

// notifyLoop runs OnLost callbacks, in order, outside every lock.
func (w *World) notifyLoop() {
	defer w.wg.Done()
	for {
		select {
		case <-w.noteWake:
		case <-w.done:
			return
		}
		w.mu.Lock()
		notes := w.notes
		w.notes = nil
		w.mu.Unlock()
		for _, n := range notes {
			for _, fn := range n.fns {
				fn(n.rank, n.reason)
			}
		}
	}
}
