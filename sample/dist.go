package sample

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/cuda"
)

// Mode is how a distributed table selects a sampled batch.
type Mode int

const (
	// ModeAuto picks ModeSplit for uniform and prioritized samplers without
	// max_times_sampled, ModeCentralized for them with it, and ModeDecentralized
	// for FIFO, LIFO and the heaps.
	ModeAuto Mode = iota
	// ModeSplit draws how many picks each shard gives from a multinomial over the
	// shards' weight sums, then lets every shard draw its share: the distribution
	// of a centralized draw, moving O(ranks) numbers plus the batch. Uniform and
	// prioritized samplers, max_times_sampled 0.
	ModeSplit
	// ModeCentralized gathers every item (index, priority, times sampled) at a
	// root, which runs the single-process table's sampling and broadcasts the
	// batch: O(items) numbers. Uniform and prioritized samplers.
	ModeCentralized
	// ModeDecentralized lets every shard offer the head of its order, and merges
	// the heads the same way on every rank: O(ranks * batch). FIFO, LIFO and the
	// heaps.
	ModeDecentralized
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeSplit:
		return "split"
	case ModeCentralized:
		return "centralized"
	case ModeDecentralized:
		return "decentralized"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Local is one rank's shard of a distributed table: a *Table, or a *ShardTable,
// whose rows the distributed table can also collect.
type Local interface {
	localTable() *Table
	localShard() *ShardTable
}

func (t *Table) localTable() *Table       { return t }
func (t *Table) localShard() *ShardTable  { return nil }
func (st *ShardTable) localTable() *Table { return st.t }
func (st *ShardTable) localShard() *ShardTable {
	return st
}

// DistOption tunes NewDistTable. Every rank must pass the same options.
type DistOption func(*DistTable)

// WithMode chooses the selection mode (default ModeAuto).
func WithMode(m Mode) DistOption { return func(d *DistTable) { d.mode = m } }

// WithRoot chooses the root of centralized selection (default 0).
func WithRoot(r int) DistOption { return func(d *DistTable) { d.root = r } }

// WithSeed seeds the selection (default 0). A seed fixes every selection, given
// the same items in the same shards.
func WithSeed(seed uint64) DistOption { return func(d *DistTable) { d.seed = seed } }

// WithCancelGrace sets how long a collective call goes on waiting for the other
// ranks after its context ends (default 5s). Within the grace a cancelled Sample
// or Sync ends cleanly on every rank at their next exchange; past it the
// communication fails, and with it the communicator.
func WithCancelGrace(dt time.Duration) DistOption { return func(d *DistTable) { d.grace = dt } }

// WithNCCL gives CollectDevice the NCCL communicator through which owners send
// remote rows, device to device: rank r of nc must be rank r of the table's
// communicator, on the device the local shard table is registered with
// (ShardTable.RegisterDevice). The table does not own nc; it uses it only inside
// CollectDevice, so another user's NCCL calls must not run meanwhile.
func WithNCCL(nc *cuda.NCCLComm) DistOption { return func(d *DistTable) { d.nccl = nc } }

// WithSyncInterval sets how often a Sample that the rate limiter holds back looks
// at the global counts again (default 2ms; a local change also wakes it).
func WithSyncInterval(dt time.Duration) DistOption { return func(d *DistTable) { d.every = dt } }

// DistTable is a replay table spread over the ranks of a communicator, one shard
// per rank. Inserts go to the local shard (its Insert, or a writer committing into
// its store shard). The rate limiter's counts are global, the sums over the
// shards, and the same on every rank after each collective call. Sample, Collect
// and Sync are collective: every rank calls them, in the same order, from one
// goroutine at a time.
//
// An item's global index is shard*capacity + local index, where capacity is the
// store shard's capacity (a plain Table's max size + 1).
type DistTable struct {
	comm     *collective.Comm
	rank     int
	size     int
	t        *Table
	st       *ShardTable
	capacity int
	kind     Kind
	exponent float64
	rl       RateLimit
	maxTimes int64
	mode     Mode
	root     int
	seed     uint64
	every    time.Duration
	grace    time.Duration
	nccl     *cuda.NCCLComm // remote rows of CollectDevice; nil without

	opMu   sync.Mutex // one collective call at a time
	calls  uint64
	last   globalState
	closed bool // Close has finished (opMu)

	closing   chan struct{} // closed when Close starts: wakes a waiting Sample
	closeOnce sync.Once

	observe func(*globalState) // tests: every global state shares are given from

	// scratch
	syncBuf  []float64
	picks    []Pick
	slots    []int
	seen     []int64 // by slot: picks of a split draw so far
	drawBuf  []byte  // a split draw's exchange: this rank's picks, then every rank's
	stageOut []byte  // Collect's packed small rows, to send
	stageIn  []byte  // and received
	posBuf   []int32 // a split draw's shard of each position

	// collection in place (inplace.go)
	peers      []peerShard // by rank, after the first Collect
	inPlaceOff bool
	counts     collectCounters
}

const (
	flagCancelled = 1 << iota
	flagClosed
	flagBadArgument
)

// NewDistTable makes local this rank's shard of a distributed table over comm.
// Every rank calls it (it is collective) with a shard of the same configuration:
// sampler kind and exponent, rate limit, max_times_sampled, capacity and, for
// store shards, layout; the error names what differs. From then on the local
// table's inserts wait on their share of the global rate limiter, and its own
// Sample is refused. The table does not own comm or local; give it a communicator
// of its own (comm.Split), since another user's collective calls on the same one
// would interleave differently on different ranks.
func NewDistTable(ctx context.Context, comm *collective.Comm, local Local, opts ...DistOption) (*DistTable, error) {
	t := local.localTable()
	d := &DistTable{comm: comm, rank: comm.Rank(), size: comm.Size(), t: t, st: local.localShard(),
		every: 2 * time.Millisecond, grace: 5 * time.Second, closing: make(chan struct{})}
	for _, o := range opts {
		o(d)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.distributed {
		return nil, fmt.Errorf("sample: table %q is already a shard of a distributed table", t.name)
	}
	d.kind = t.sampler.Kind()
	if p, ok := t.sampler.(*Prioritized); ok {
		d.exponent = p.Exponent()
	}
	d.rl = t.limiter.Config()
	d.maxTimes = t.maxTimes
	d.capacity = t.maxSize + 1
	var specHash uint64
	if d.st != nil {
		d.capacity = d.st.shard.Capacity()
		specHash = hashSpec(fmt.Sprintf("%+v", d.st.shard.Spec()))
	}
	// A bad option on one rank must not leave the others waiting: it travels
	// with the configuration.
	optErr := d.checkOptions()
	bad := 0.0
	if optErr != nil {
		bad = 1
	}
	desc := []float64{bad, float64(d.kind), d.exponent, d.rl.SamplesPerInsert, float64(d.rl.MinSize), d.rl.MinDiff, d.rl.MaxDiff,
		float64(d.maxTimes), float64(d.capacity), float64(d.mode), float64(d.root), float64(d.seed >> 32), float64(d.seed & (1<<32 - 1)), float64(specHash)}
	names := []string{"options", "sampler", "exponent", "samples_per_insert", "min_size", "min_diff", "max_diff",
		"max_times_sampled", "capacity", "mode", "root", "seed", "seed", "store layout"}
	all := make([]float64, len(desc)*d.size)
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	if err := collective.AllGather(cctx, comm, desc, all); err != nil {
		return nil, fmt.Errorf("sample: distributed table %q: comparing shards: %w", t.name, err)
	}
	for r := range d.size {
		if all[r*len(desc)] != 0 {
			if optErr != nil {
				return nil, optErr
			}
			return nil, fmt.Errorf("sample: distributed table %q: rank %d's options are invalid", t.name, r)
		}
	}
	for r := range d.size {
		for i, v := range all[r*len(desc) : (r+1)*len(desc)] {
			if math.Float64bits(v) != math.Float64bits(all[i]) {
				return nil, fmt.Errorf("sample: distributed table %q: %s differs: rank 0 has %v, rank %d has %v", t.name, names[i], all[i], r, v)
			}
		}
	}
	if d.mode == ModeAuto {
		switch {
		case d.ordered():
			d.mode = ModeDecentralized
		case d.maxTimes == 0:
			d.mode = ModeSplit
		default:
			d.mode = ModeCentralized
		}
	}
	t.distributed = true
	t.share = 0
	if _, err := d.syncLocked(ctx, cctx, 0); err != nil {
		t.distributed = false
		return nil, err
	}
	return d, nil
}

func hashSpec(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h >> 12 // exact as a float64
}

func (d *DistTable) ordered() bool {
	switch d.kind {
	case KindFIFO, KindLIFO, KindMaxHeap, KindMinHeap:
		return true
	}
	return false
}

func (d *DistTable) checkOptions() error {
	name := d.t.name
	switch {
	case d.root < 0 || d.root >= d.size:
		return fmt.Errorf("sample: distributed table %q: root %d: want a rank of %d", name, d.root, d.size)
	case d.every <= 0:
		return fmt.Errorf("sample: distributed table %q: sync interval %v: want > 0", name, d.every)
	case d.grace < 0:
		return fmt.Errorf("sample: distributed table %q: cancel grace %v: want >= 0", name, d.grace)
	case d.nccl != nil && (d.nccl.Rank() != d.rank || d.nccl.Size() != d.size):
		return fmt.Errorf("sample: distributed table %q: NCCL communicator is rank %d of %d, the table's communicator rank %d of %d: they must match",
			name, d.nccl.Rank(), d.nccl.Size(), d.rank, d.size)
	}
	if _, ok := d.t.sampler.(Ordered); !ok && d.ordered() {
		return fmt.Errorf("sample: distributed table %q: the %v sampler does not list its order", name, d.kind)
	}
	switch d.mode {
	case ModeAuto:
	case ModeSplit:
		if d.ordered() || d.maxTimes != 0 {
			return fmt.Errorf("sample: distributed table %q: split mode needs a uniform or prioritized sampler and max_times_sampled 0 (have %v, %d)", name, d.kind, d.maxTimes)
		}
	case ModeCentralized:
		if d.ordered() {
			return fmt.Errorf("sample: distributed table %q: centralized mode needs a uniform or prioritized sampler, not %v", name, d.kind)
		}
	case ModeDecentralized:
		if !d.ordered() {
			return fmt.Errorf("sample: distributed table %q: decentralized mode needs a FIFO, LIFO or heap sampler, not %v", name, d.kind)
		}
	default:
		return fmt.Errorf("sample: distributed table %q: unknown mode %d", name, int(d.mode))
	}
	if d.kind != KindUniform && d.kind != KindPrioritized && !d.ordered() {
		return fmt.Errorf("sample: distributed table %q: sampler %v has no distributed selection", name, d.kind)
	}
	return nil
}

// Mode is the selection mode in use.
func (d *DistTable) Mode() Mode { return d.mode }

// Capacity is the number of indices per shard: global index = shard*Capacity +
// local index.
func (d *DistTable) Capacity() int { return d.capacity }

// Local is this rank's shard.
func (d *DistTable) Local() *Table { return d.t }

// DistInfo is a distributed table's state as of its last collective call.
type DistInfo struct {
	// Local is this rank's shard.
	Local Info
	// Size is the number of items over all shards; ShardSizes by rank.
	Size       int64
	ShardSizes []int64
	// Limiter is the global rate limiter.
	Limiter LimiterInfo
	Mode    Mode
}

// Info reports the state seen by the last collective call, and the local shard's
// state now.
func (d *DistTable) Info() DistInfo {
	local := d.t.Info()
	d.opMu.Lock()
	defer d.opMu.Unlock()
	info := DistInfo{Local: local, Size: d.last.size, Limiter: d.last.lim.Info(), Mode: d.mode}
	for _, s := range d.last.shards {
		info.ShardSizes = append(info.ShardSizes, s.size)
	}
	return info
}

// Close makes later calls on this rank fail with ErrClosed; call it on every rank
// after the last collective call. It is idempotent. The local table becomes a
// table of its own again (its rate limiter sees its own counts); Close does not
// close it or the communicator. It detaches the shards of the peers that Collect
// read in place.
//
// Close may be called while another goroutine is in a collective call on this
// rank. A Sample waiting for the global rate limiter wakes, tells the other ranks
// at its next sync (which they are in, waiting too), and returns ErrClosed; the
// other ranks' Samples return ErrClosed naming this rank. A call exchanging with
// the other ranks finishes first. Close returns once the call has. A later Sample
// or Sync on this rank still meets the other ranks' matching call once, so that
// it fails there the same way instead of waiting.
func (d *DistTable) Close() error {
	d.closeOnce.Do(func() { close(d.closing) })
	d.opMu.Lock()
	defer d.opMu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.t.mu.Lock()
	d.t.distributed = false
	d.t.notify()
	d.t.mu.Unlock()
	return d.closePeers()
}

// isClosing reports whether Close has been called.
func (d *DistTable) isClosing() bool {
	select {
	case <-d.closing:
		return true
	default:
		return false
	}
}

// graceful returns a context for collective calls that ends grace after ctx does,
// so that the other ranks can hear of a cancellation before the communication is
// cut, and the function that releases it.
func graceful(ctx context.Context, grace time.Duration) (context.Context, func()) {
	c, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var timer *time.Timer
	released := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !released {
			timer = time.AfterFunc(grace, cancel)
		}
	})
	return c, func() {
		stop()
		mu.Lock()
		released = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// Tags of the distributed table's point-to-point messages.
const (
	tagCentral = 0x5a000 + iota
	tagCollectRequest
	tagCollectStatus
	tagCollectData
)

// errNoShard is returned by Collect on a table without store shards.
var errNoShard = errors.New("sample: collect needs store shards (NewDistTable over *ShardTable)")
