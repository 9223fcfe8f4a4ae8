package rank

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gear-rl/gear/internal/metrics"
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

	comms   comms         // built on demand by Comm and RoleComm
	metrics *metrics.Rank // this rank's metrics segment (nil: none)

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
		cfg.heartbeat = info.HeartbeatTimeout
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
		w.metrics = openMetrics(cfg.info == nil, info, log)
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
			Size: info.Size, Generation: info.Restart, Timeout: info.RdzvTimeout, Logger: log,
			Heartbeat: info.HeartbeatInterval, HeartbeatTimeout: info.HeartbeatTimeout})
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
	w.metrics = openMetrics(cfg.info == nil, info, log)
	return w, nil
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
		w.metrics.Close()
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
