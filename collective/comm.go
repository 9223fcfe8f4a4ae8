package collective

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/internal/shmname"
)

// Undefined is the color a rank gives Split to be in no new communicator.
const Undefined = -1

// Comm is a communicator: a group of ranks, each with its index (Rank) among Size,
// that run collectives together. Every rank of the group must make the same calls
// on it in the same order. A Comm is safe for use by several goroutines, but its
// calls are serialized, and two goroutines calling collectives on one Comm
// concurrently would make their order differ between ranks: give each goroutine
// its own communicator (Split).
type Comm struct {
	id    string
	rank  int
	size  int
	world []int // communicator rank -> world rank
	boot  Bootstrap
	cfg   config
	spin  time.Duration // resolved Tuning.Spin
	local int           // ranks of the world on this host (for Split)
	// cpuRanks: ranks of the world that share this machine's CPUs (under
	// one kernel: hosts in network namespaces of one machine count together);
	// more than the CPUs makes waits yield.
	cpuRanks int
	// cpus: the fewest CPUs that a rank under this machine's kernel may use,
	// as the ranks reported them (the same on every rank).
	cpus int
	// board: the shared-memory transport, when every rank of the communicator
	// is on this host; boardMax: the largest AllReduce it runs on the host's
	// board (Tuning.BoardBytes resolved; 0: the board is not used).
	board    *shmTransport
	boardMax int
	// chunk and ring are the frame payload and the shared-memory ring
	// capacity: the Tuning's, or less for many ranks on a host
	// (Tuning.InboxBytes); the same on every rank.
	chunk, ring int

	hostOf    []int    // host index of every rank
	hosts     [][]int  // ranks of every host, hosts in order of their first rank
	hostNames []string // every host's name, for errors: its identity up to the last '/'

	links []link // by rank; nil for this rank
	in    []inbox
	trans []transport
	pool  *bufPool
	sig   *signals

	opMu   sync.Mutex
	seq    uint64
	splits uint64
	x      call
	hist   [8]header // the last calls, by sequence number, to name them in errors

	idleScan func() error // the call in progress looks at the other peers' frames
	group    group        // every rank, in order

	streaming bool          // some link streams (shared memory)
	chooser   streamChooser // whether streaming pays, learned per size class

	failMu sync.Mutex
	cause  error
	closed bool

	watchCancel context.CancelFunc
	wg          sync.WaitGroup
	unregLost   func()
	closeOnce   sync.Once

	// met: the calls' counters (collective/metrics.go), written under
	// opMu; last, so that its size leaves the other fields' lines alone.
	met metrics.Comm
}

// inbox is this rank's view of the frames from one peer: the link, and the frames
// taken off the link early because a receive was looking for another kind (a
// collective's frames while a Recv waits for a tag, or the other way round).
type inbox struct {
	l          link
	stash      []qframe
	held       int // heldNone, heldLink or heldStash
	stashIndex int
}

// peerInfo is what ranks tell each other when they build a communicator.
type peerInfo struct {
	Host   string `json:"host"`
	PID    int    `json:"pid"`
	TCP    string `json:"tcp,omitempty"`
	Nonce  []byte `json:"nonce,omitempty"`
	Seg    string `json:"seg,omitempty"`
	Boot   string `json:"boot,omitempty"` // the kernel's boot ID: ranks with equal ones share CPUs
	CPUs   int    `json:"cpus,omitempty"` // the CPUs this rank may use
	Mode   string `json:"mode"`
	Loop   bool   `json:"loop,omitempty"`
	Tuning Tuning `json:"tuning"`
}

// Optional Bootstrap capabilities, found by type assertion.
type (
	// jobIDBootstrap names the job, for the names of shared-memory segments.
	jobIDBootstrap interface{ JobID() string }
	// listenHostBootstrap knows the address by which other hosts reach this rank.
	listenHostBootstrap interface{ ListenHost() string }
)

// New builds the communicator of the whole world that b describes. Every rank of
// the world must call it, with the same options; it returns when the transports to
// every peer are up. Ranks on one host (equal b.Host()) talk through shared memory,
// others through TCP, unless WithTransport or WithLoopback says otherwise.
//
// Errors: the context's error; errors from the bootstrap; a transport that cannot
// be set up; ranks that disagree on options.
func New(ctx context.Context, b Bootstrap, opts ...Option) (*Comm, error) {
	cfg := config{name: "world", tuning: DefaultTuning()}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.tuning.validate(); err != nil {
		return nil, err
	}
	cfg.transport = strings.ToLower(strings.TrimSpace(cfg.transport))
	if cfg.transport == "auto" {
		cfg.transport = TransportAuto
	}
	switch cfg.transport {
	case TransportAuto, TransportTCP, TransportShm:
	default:
		return nil, fmt.Errorf("collective: unknown transport %q (want \"\", %q or %q)", cfg.transport, TransportTCP, TransportShm)
	}
	if cfg.name == "" || strings.ContainsAny(cfg.name, "/ \t\n") {
		return nil, fmt.Errorf("collective: communicator name %q: want a non-empty name without '/' or spaces", cfg.name)
	}
	rank, size := b.Rank(), b.Size()
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("collective: bootstrap says rank %d of %d", rank, size)
	}
	if cfg.listenHost == "" {
		if lh, ok := b.(listenHostBootstrap); ok {
			cfg.listenHost = lh.ListenHost()
		}
		if cfg.listenHost == "" {
			cfg.listenHost = "127.0.0.1"
		}
	}
	world := make([]int, size)
	for i := range world {
		world[i] = i
	}
	c := newComm(cfg.name, rank, size, world, b, cfg)
	ex := &bootExchange{b: b, prefix: "collective/" + c.id + "/setup", rank: rank, size: size}
	if err := c.build(ctx, ex); err != nil {
		return nil, err
	}
	c.start()
	return c, nil
}

func newComm(id string, rank, size int, world []int, b Bootstrap, cfg config) *Comm {
	c := &Comm{id: id, rank: rank, size: size, world: world, boot: b, cfg: cfg, pool: &bufPool{}, sig: newSignals(),
		chunk: cfg.tuning.ChunkBytes, ring: cfg.tuning.RingBytes}
	c.idleScan = func() error { return c.x.scan(false) }
	c.met.Name = id
	c.group = group{ranks: make([]int, size), me: rank}
	for i := range c.group.ranks {
		c.group.ranks[i] = i
	}
	return c
}

// Rank is this rank's index in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the communicator.
func (c *Comm) Size() int { return c.size }

// WorldRank is the world rank of the communicator's rank r.
func (c *Comm) WorldRank(r int) int { return c.world[r] }

// Name is the communicator's name, the same on every rank and unique among the
// communicators of its world: "world" (or WithName's) for New, derived from the
// parent's for Split. The communicator keeps its bootstrap keys under
// "collective/<Name>/"; what is built on it (a Layout, an NCCL communicator of
// package github.com/gear-rl/gear/collective/nccl) keeps its own under names derived from it.
func (c *Comm) Name() string { return c.id }

// Bootstrap is the Bootstrap of the communicator's world (for a Split
// communicator, its parent's), for packages that build on a communicator:
// its Rank and Size are the world's, not the communicator's.
func (c *Comm) Bootstrap() Bootstrap { return c.boot }

// Hosts returns the ranks of the communicator grouped by host, hosts in the order
// of their lowest rank.
func (c *Comm) Hosts() [][]int {
	out := make([][]int, len(c.hosts))
	for i, h := range c.hosts {
		out[i] = slices.Clone(h)
	}
	return out
}

// CPURanks returns how many ranks of the world share this machine's CPUs: the
// ranks of this host, and those of other hosts under the same kernel (network
// namespaces or containers of one machine). More of them than CPUs makes the
// communicator's waits yield the CPU rather than spin.
func (c *Comm) CPURanks() int { return c.cpuRanks }

// Err returns the error that made the communicator fail, or nil.
func (c *Comm) Err() error {
	c.failMu.Lock()
	defer c.failMu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return c.cause
}

// exchanger is how the ranks building a communicator swap their details: through
// the bootstrap for New, through the parent communicator for Split.
type exchanger interface {
	allGather(ctx context.Context, blob []byte) ([][]byte, error)
	barrier(ctx context.Context) error
}

type bootExchange struct {
	b          Bootstrap
	prefix     string
	rank, size int
	step       int
}

// gatherLimit bounds the value that allGather's root publishes: beyond it (a
// world of thousands of ranks) every rank reads every other's key instead.
const gatherLimit = 512 << 10

// allGather publishes blob under this rank's key; rank 0 reads every rank's and
// publishes them all under one key, which the other ranks read. A world of n
// ranks thus makes about 3n requests to the bootstrap rather than n^2.
func (e *bootExchange) allGather(ctx context.Context, blob []byte) ([][]byte, error) {
	e.step++
	key := fmt.Sprintf("%s/%d/", e.prefix, e.step)
	if e.size == 1 {
		return [][]byte{blob}, nil
	}
	if err := e.b.Set(ctx, key+fmt.Sprint(e.rank), blob); err != nil {
		return nil, fmt.Errorf("collective: publish %s%d: %w", key, e.rank, err)
	}
	if e.rank == 0 {
		out, err := e.gather(ctx, key, blob, 1)
		if err != nil {
			return nil, err
		}
		all := packBlobs(out)
		if len(all) > gatherLimit {
			all = nil // too large for one value: the others read every key
		}
		if err := e.b.Set(ctx, key+"all", all); err != nil {
			return nil, fmt.Errorf("collective: publish %sall: %w", key, err)
		}
		return out, nil
	}
	all, err := e.b.Wait(ctx, key+"all")
	if err != nil {
		return nil, fmt.Errorf("collective: wait for rank 0 to gather the ranks' details: %w", err)
	}
	if len(all) == 0 {
		return e.gather(ctx, key, blob, 0)
	}
	out, err := unpackBlobs(all, e.size)
	if err != nil {
		return nil, fmt.Errorf("collective: details gathered by rank 0: %w", err)
	}
	out[e.rank] = blob
	return out, nil
}

// gather reads the keys of ranks from on under key.
func (e *bootExchange) gather(ctx context.Context, key string, blob []byte, from int) ([][]byte, error) {
	out := make([][]byte, e.size)
	out[e.rank] = blob
	for r := from; r < e.size; r++ {
		if r == e.rank {
			continue
		}
		v, err := e.b.Wait(ctx, key+fmt.Sprint(r))
		if err != nil {
			return nil, fmt.Errorf("collective: wait for rank %d to set up: %w", r, err)
		}
		out[r] = v
	}
	return out, nil
}

// packBlobs concatenates blobs, each after its length (uvarint).
func packBlobs(blobs [][]byte) []byte {
	var out []byte
	for _, b := range blobs {
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out
}

// unpackBlobs undoes packBlobs, which must have packed n blobs.
func unpackBlobs(p []byte, n int) ([][]byte, error) {
	out := make([][]byte, n)
	for i := range out {
		l, k := binary.Uvarint(p)
		if k <= 0 || l > uint64(len(p)-k) {
			return nil, fmt.Errorf("blob %d of %d is cut short", i, n)
		}
		out[i] = p[k : k+int(l) : k+int(l)]
		p = p[k+int(l):]
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%d bytes after %d blobs", len(p), n)
	}
	return out, nil
}

func (e *bootExchange) barrier(ctx context.Context) error {
	_, err := e.allGather(ctx, []byte{1})
	return err
}

// prepare makes what this rank must publish before it knows its peers: a TCP
// listener and the name of its shared-memory inbox.
func (c *Comm) prepare() (peerInfo, *tcpTransport, error) {
	info := peerInfo{Host: c.boot.Host(), PID: os.Getpid(), Boot: bootID(), CPUs: runtime.NumCPU(), Mode: c.cfg.transport, Tuning: c.cfg.tuning}
	if c.cfg.loopback != nil {
		info.Loop = true
		info.Mode = "loopback"
		return info, nil, nil
	}
	var tt *tcpTransport
	if c.size > 1 {
		var err error
		tt, err = listenTCP(c.id, c.rank, c.cfg.listenHost)
		if err != nil {
			return info, nil, err
		}
		info.TCP = tt.addr()
		info.Nonce = tt.nonce[:]
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	info.Seg = segmentName(c.boot, fmt.Sprintf("%s.r%d.%s", c.id, c.rank, hex.EncodeToString(rnd[:])))
	return info, tt, nil
}

// segmentName names the host's collective segment (shmname.Coll, removed
// between a restarted job's generations): "gear.<job>.coll.<rest>", with the
// job ID from the bootstrap when it has one, else this process's.
func segmentName(b Bootstrap, rest string) string {
	job := shmname.LocalJobID()
	if j, ok := b.(jobIDBootstrap); ok && j.JobID() != "" {
		job = j.JobID()
	}
	return shmname.Make(job, shmname.Coll, rest)
}

// build exchanges details with the peers through the bootstrap and brings up the
// transports (New). Split does the same through the parent communicator.
func (c *Comm) build(ctx context.Context, ex exchanger) (err error) {
	info, tt, err := c.prepare()
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if tt != nil {
				tt.close(nil)
			}
			for _, t := range c.trans {
				t.close(nil)
			}
			c.trans = nil
		}
	}()
	blob, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("collective: encode details: %w", err)
	}
	blobs, err := ex.allGather(ctx, blob)
	if err != nil {
		return err
	}
	infos := make([]peerInfo, len(blobs))
	for r, bl := range blobs {
		if err := json.Unmarshal(bl, &infos[r]); err != nil {
			return fmt.Errorf("collective: details of rank %d: %w", r, err)
		}
	}
	return c.connect(ctx, ex, infos, tt)
}

// connect sets up the links to every peer from their details (indexed by
// communicator rank).
func (c *Comm) connect(ctx context.Context, ex exchanger, infos []peerInfo, tt *tcpTransport) error {
	me := infos[c.rank]
	for r, in := range infos {
		if in.Mode != me.Mode || in.Tuning != me.Tuning {
			return fmt.Errorf("collective: ranks disagree on options: rank %d has transport %q and %+v, rank %d has transport %q and %+v",
				c.rank, me.Mode, me.Tuning, r, in.Mode, in.Tuning)
		}
	}
	// Hosts, in order of their first rank.
	c.hostOf = make([]int, c.size)
	index := map[string]int{}
	for r, in := range infos {
		h, ok := index[in.Host]
		if !ok {
			h = len(c.hosts)
			index[in.Host] = h
			c.hosts = append(c.hosts, nil)
			name := in.Host
			if i := strings.LastIndexByte(name, '/'); i > 0 {
				name = name[:i] // "n2/3fa9..." (rank.HostID) names node n2
			}
			c.hostNames = append(c.hostNames, name)
		}
		c.hostOf[r] = h
		c.hosts[h] = append(c.hosts[h], r)
	}
	if c.local == 0 {
		c.local = len(c.hosts[c.hostOf[c.rank]])
	}
	if c.cpuRanks == 0 {
		// Ranks in other network namespaces of this machine are other hosts
		// but share its CPUs: count the ranks under this kernel.
		for _, in := range infos {
			if in.Boot == me.Boot && (in.Boot != "" || in.Host == me.Host) {
				c.cpuRanks++
			}
		}
		c.cpuRanks = max(c.cpuRanks, c.local)
	}
	c.cpus = 0
	for _, in := range infos {
		if in.Boot == me.Boot && (in.Boot != "" || in.Host == me.Host) && in.CPUs > 0 && (c.cpus == 0 || in.CPUs < c.cpus) {
			c.cpus = in.CPUs
		}
	}
	if c.cpus == 0 {
		c.cpus = runtime.NumCPU()
	}
	c.spin = c.cfg.tuning.spinFor(c.cpuRanks)
	c.links = make([]link, c.size)
	if c.cfg.loopback == nil && me.Mode != TransportTCP {
		// Every rank knows every host's ranks, so all size rings and chunks
		// alike (a host without shared memory too, over TCP).
		maxLocal := 0
		for _, h := range c.hosts {
			maxLocal = max(maxLocal, len(h))
		}
		c.ring, c.chunk = c.cfg.tuning.shmSizes(maxLocal)
	}
	maxP := c.chunk

	if c.cfg.loopback != nil {
		lb := c.cfg.loopback
		if err := lb.register(c.id, c.rank, c.size); err != nil {
			return err
		}
		if err := ex.barrier(ctx); err != nil {
			lb.unregister(c.id, c.rank)
			return err
		}
		var peers []int
		for r := range c.size {
			if r != c.rank {
				peers = append(peers, r)
			}
		}
		lt, err := lb.connect(c.id, c.rank, peers, maxP, c.sig, c.lostError)
		if err != nil {
			lb.unregister(c.id, c.rank)
			return err
		}
		c.trans = append(c.trans, lt)
		for r, l := range lt.links {
			c.links[r] = l
		}
		if err := ex.barrier(ctx); err != nil {
			return err
		}
	} else {
		var shmPeers []shmPeer
		var tcpPeers []tcpPeer
		meLocal := -1
		for r, in := range infos {
			sameHost := c.hostOf[r] == c.hostOf[c.rank]
			switch {
			case me.Mode == TransportShm && !sameHost:
				return fmt.Errorf("collective: transport %q asked for, but rank %d is on host %q and rank %d on host %q", TransportShm, c.rank, me.Host, r, in.Host)
			case me.Mode != TransportTCP && sameHost:
				if r == c.rank {
					meLocal = len(shmPeers)
				}
				shmPeers = append(shmPeers, shmPeer{rank: r, seg: in.Seg, pid: in.PID})
			case r != c.rank:
				tcpPeers = append(tcpPeers, tcpPeer{rank: r, addr: in.TCP, nonce: in.Nonce})
			}
		}
		if len(shmPeers) > 1 && !shmAvailable() {
			if me.Mode == TransportShm {
				return errors.New("collective: shared memory asked for, but this system has none")
			}
			// No shared memory here: every peer over TCP.
			for _, p := range shmPeers {
				if p.rank != c.rank {
					tcpPeers = append(tcpPeers, tcpPeer{rank: p.rank, addr: infos[p.rank].TCP, nonce: infos[p.rank].Nonce})
				}
			}
			shmPeers = nil
		}
		var st *shmTransport
		if len(shmPeers) > 1 {
			var err error
			st, err = newShmTransport(meLocal, shmPeers, c.ring, maxP, c.spin, c.cpuRanks > runtime.NumCPU(), c.sig, c.pool, c.lostError)
			if err != nil {
				return err
			}
			st.boardSpin = c.cfg.tuning.boardSpinFor(c.cpuRanks, c.cpus)
			c.trans = append(c.trans, st)
		}
		if len(tcpPeers) > 0 {
			tt.spin, tt.yield = c.spin, c.cpuRanks > runtime.NumCPU()
			for _, p := range tcpPeers {
				if infos[p.rank].Host == me.Host && infos[p.rank].PID == me.PID {
					tt.gosched = true // peers are goroutines of this process
				}
			}
			if err := tt.connect(ctx, tcpPeers, c.cfg.tuning, c.sig, c.pool, c.lostError, c.failFrom); err != nil {
				return err
			}
			c.trans = append(c.trans, tt)
			for _, p := range tcpPeers {
				c.links[p.rank] = tt.link(p.rank)
			}
		} else if tt != nil {
			tt.ln.Close()
		}
		// Every inbox exists: map the peers'.
		if err := ex.barrier(ctx); err != nil {
			return err
		}
		if st != nil {
			if err := st.attach(); err != nil {
				return err
			}
			for i, p := range shmPeers {
				if i != meLocal {
					c.links[p.rank] = st.link(i)
				}
			}
			c.streaming = true
			if len(c.hosts) == 1 {
				c.board = st
				c.boardMax = c.cfg.tuning.boardFor(c.size, c.cpuRanks, c.cpus)
			}
		}
		// Every peer has mapped this rank's inbox: its name can go.
		if err := ex.barrier(ctx); err != nil {
			return err
		}
		if st != nil {
			st.unlinkOwn()
		}
	}
	c.in = make([]inbox, c.size)
	for r := range c.in {
		c.in[r].l = c.links[r]
	}
	return nil
}

// start watches for the failures of other ranks: the bootstrap's news of lost
// ranks, and failure notices other ranks publish.
func (c *Comm) start() {
	if c.size == 1 {
		return
	}
	c.unregLost = c.boot.OnLost(func(worldRank int, reason string) {
		for r, w := range c.world {
			if w == worldRank && r != c.rank {
				c.fail(c.lostError(r, reason), false)
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	c.watchCancel = cancel
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		v, err := c.boot.Wait(ctx, c.abortKey())
		if err != nil {
			return
		}
		c.fail(decodeAbort(v), false)
	}()
}

func (c *Comm) abortKey() string { return "collective/" + c.id + "/abort" }

// lostError names a lost peer.
func (c *Comm) lostError(rank int, reason string) error {
	e := &LostError{Rank: rank, WorldRank: c.world[rank], Reason: reason}
	if len(c.hosts) > 1 && rank < len(c.hostOf) {
		e.Host = c.hostNames[c.hostOf[rank]]
	}
	return e
}

// failFrom is how transports report a failure they noticed on their own.
func (c *Comm) failFrom(err error) { c.fail(err, true) }

// fail makes the communicator fail with err unless it failed already, wakes every
// wait, and, for a cause found on this rank, tells the other ranks. It returns the
// communicator's cause.
func (c *Comm) fail(err error, publish bool) error {
	c.failMu.Lock()
	if c.cause != nil {
		cause := c.cause
		c.failMu.Unlock()
		return cause
	}
	c.cause = err
	c.sig.failed.Store(true)
	close(c.sig.done)
	publish = publish && err != ErrClosed && c.size > 1 && c.watchCancel != nil
	if publish {
		c.wg.Add(1)
	}
	c.failMu.Unlock()
	c.sig.interrupt()
	if publish {
		go func() {
			defer c.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c.boot.Set(ctx, c.abortKey(), encodeAbort(c.rank, err))
		}()
	}
	return err
}

// Close releases the communicator: its shared memory, connections and goroutines.
// A call in progress on another goroutine returns ErrClosed. Close does not wait
// for the other ranks; it is idempotent.
func (c *Comm) Close() error {
	c.closeOnce.Do(func() {
		c.fail(ErrClosed, false)
		c.opMu.Lock()
		c.met.Flush()
		c.failMu.Lock()
		c.closed = true
		c.failMu.Unlock()
		var note []byte
		c.failMu.Lock()
		cause := c.cause
		c.failMu.Unlock()
		if cause != nil && cause != ErrClosed {
			note = encodeAbort(c.rank, cause)
		}
		for _, t := range c.trans {
			t.close(note)
		}
		for r := range c.in {
			for _, f := range c.in[r].stash {
				c.pool.put(f.own)
			}
			c.in[r].stash = nil
		}
		c.opMu.Unlock()
		if c.unregLost != nil {
			c.unregLost()
		}
		if c.watchCancel != nil {
			c.watchCancel()
		}
		c.wg.Wait()
	})
	return nil
}

// bootID is the running kernel's boot ID (Linux), or "".
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})
