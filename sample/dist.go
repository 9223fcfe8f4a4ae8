package sample

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
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
	closed bool

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

// globalState is what the last sync learned: every shard's state and the global
// rate limiter.
type globalState struct {
	shards []shardState
	lim    RateLimiter
	size   int64
	weight float64
}

type shardState struct {
	inserts, samples, deletes, size int64
	weight                          float64
	demand                          int64 // inserts waiting for the rate limiter
	flags                           int64
}

const (
	flagCancelled = 1 << iota
	flagClosed
	flagBadArgument
)

const syncFields = 7

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
		every: 2 * time.Millisecond, grace: 5 * time.Second}
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

// syncLocked exchanges every shard's counts and state (t.mu held), sets the global
// rate limiter and gives this shard its share of the global insert room.
func (d *DistTable) syncLocked(ctx, cctx context.Context, flags int64) (*globalState, error) {
	t := d.t
	ins, smp, del := t.limiter.Counts()
	mine := shardState{inserts: ins, samples: smp, deletes: del, size: int64(t.sampler.Len()), demand: int64(t.blockedIns), flags: flags}
	if p, ok := t.sampler.(*Prioritized); ok {
		mine.weight = p.Total()
	}
	if d.st != nil && d.st.pending() {
		mine.demand++
	}
	if ctx.Err() != nil {
		mine.flags |= flagCancelled
	}
	if t.closed || d.closed {
		mine.flags |= flagClosed
	}
	if len(d.syncBuf) != syncFields*d.size {
		d.syncBuf = make([]float64, syncFields*d.size)
	}
	send := []float64{float64(mine.inserts), float64(mine.samples), float64(mine.deletes), float64(mine.size), mine.weight, float64(mine.demand), float64(mine.flags)}
	if err := collective.AllGather(cctx, d.comm, send, d.syncBuf); err != nil {
		return nil, fmt.Errorf("sample: distributed table %q: sync: %w", t.name, err)
	}
	g := &d.last
	g.shards = g.shards[:0]
	var gi, gs, gd int64
	g.size, g.weight = 0, 0
	for r := range d.size {
		v := d.syncBuf[r*syncFields:]
		s := shardState{inserts: int64(v[0]), samples: int64(v[1]), deletes: int64(v[2]), size: int64(v[3]), weight: v[4], demand: int64(v[5]), flags: int64(v[6])}
		g.shards = append(g.shards, s)
		gi, gs, gd = gi+s.inserts, gs+s.samples, gd+s.deletes
		g.size += s.size
		g.weight += s.weight
	}
	g.lim = RateLimiter{cfg: d.rl}
	g.lim.SetCounts(gi, gs, gd)
	t.share = d.shareOf(g)
	t.notify()
	return g, nil
}

// shareOf splits the global insert room among the shards in proportion to their
// waiting inserts (evenly when none wait), the same way on every rank.
func (d *DistTable) shareOf(g *globalState) int64 {
	const unlimited = 1 << 40
	room := g.lim.MaxInserts(unlimited)
	if room >= unlimited {
		return unlimited
	}
	var demand int64
	for _, s := range g.shards {
		demand += s.demand
	}
	shares := make([]int64, d.size)
	given := int64(0)
	for r, s := range g.shards {
		if demand == 0 {
			shares[r] = room / int64(d.size)
		} else {
			shares[r] = int64(float64(room) * float64(s.demand) / float64(demand))
		}
		given += shares[r]
	}
	for r := 0; given < room; r = (r + 1) % d.size {
		if demand == 0 || g.shards[r].demand > 0 {
			shares[r]++
			given++
		}
	}
	return shares[d.rank]
}

// Sync is a collective call that refreshes the global counts and the shards'
// shares of the insert room (Sample does it too).
//
// Errors: the communicator's; ErrClosed.
func (d *DistTable) Sync(ctx context.Context) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.t.mu.Lock()
	defer d.t.mu.Unlock()
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	g, err := d.syncLocked(ctx, cctx, 0)
	if err != nil {
		return err
	}
	return d.flagError(ctx, g, "sync", nil)
}

// flagError turns a rank's cancellation or closing, seen by every rank in the same
// sync, into the same decision everywhere.
func (d *DistTable) flagError(ctx context.Context, g *globalState, op string, argErr error) error {
	for r, s := range g.shards {
		switch {
		case s.flags&flagBadArgument != 0:
			if r == d.rank && argErr != nil {
				return argErr
			}
			return fmt.Errorf("sample: distributed table %q: %s: rank %d's arguments are bad", d.t.name, op, r)
		case s.flags&flagClosed != 0:
			return fmt.Errorf("%w: %s on distributed table %q: rank %d closed its shard", ErrClosed, op, d.t.name, r)
		case s.flags&flagCancelled != 0:
			if r == d.rank {
				return fmt.Errorf("sample: distributed table %q: %s: %w", d.t.name, op, ctx.Err())
			}
			return fmt.Errorf("sample: distributed table %q: %s: abandoned: rank %d's context ended", d.t.name, op, r)
		}
	}
	return nil
}

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

// Close makes later calls on this rank fail; call it on every rank after the last
// collective call. It is idempotent. The local table becomes a table of its own
// again (its rate limiter sees its own counts); Close does not close it or the
// communicator. It detaches the shards of the peers that Collect read in place.
func (d *DistTable) Close() error {
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

// globalRand is the random source every rank shares for one call.
func (d *DistTable) globalRand() *rand.Rand {
	return rand.New(rand.NewPCG(d.seed, d.calls*0x9e3779b97f4a7c15+1))
}

// localRand is this rank's random source for one call.
func (d *DistTable) localRand() *rand.Rand {
	return rand.New(rand.NewPCG(d.seed^(uint64(d.rank)+1)*0xbf58476d1ce4e5b9, d.calls*0x94d049bb133111eb+2))
}

// Sample is a collective call that returns the same batch of 1 to n items on
// every rank, selected from all shards with the local table's semantics (a
// flexible batch: it waits for the global rate limiter to allow one sample, then
// takes what it allows, up to n). Items' Index fields are global indices.
// max_times_sampled deletes an item on its shard; a store shard holds the rows of
// such items for collection until the Batch is released, on that rank.
//
// Errors: ErrClosed, on every rank, when a rank closed its table; the context's
// error on a rank whose context ended before the batch, and on the others an
// error naming that rank; the communicator's errors.
func (d *DistTable) Sample(ctx context.Context, n int) (*Batch, error) {
	b := &Batch{}
	if err := d.SampleInto(ctx, b, n); err != nil {
		return nil, err
	}
	return b, nil
}

// SampleInto is Sample reusing b (released first).
func (d *DistTable) SampleInto(ctx context.Context, b *Batch, n int) error {
	// A bad argument travels with the sync, so that every rank fails alike.
	var argErr error
	var flags int64
	if n < 1 {
		argErr = fmt.Errorf("sample: distributed table %q: sample of %d items: want n >= 1", d.t.name, n)
		flags = flagBadArgument
	}
	b.Release()
	b.st = d.st
	d.opMu.Lock()
	defer d.opMu.Unlock()
	t := d.t
	t.mu.Lock()
	defer t.mu.Unlock()
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	var g *globalState
	allowed := 0
	for {
		var err error
		if g, err = d.syncLocked(ctx, cctx, flags); err != nil {
			return err
		}
		if err := d.flagError(ctx, g, "sample", argErr); err != nil {
			return err
		}
		if allowed = int(g.lim.MaxSamples(int64(n))); allowed > 0 {
			break
		}
		if ctx.Err() == nil {
			t.blockedSmp++
			t.waitChangeLocked(ctx, d.every)
			t.blockedSmp--
		}
	}
	d.calls++
	if cap(b.Items) < allowed {
		b.Items = make([]Sampled, allowed)
	}
	b.Items = b.Items[:allowed]
	var err error
	switch d.mode {
	case ModeSplit:
		err = d.splitDraw(cctx, g, b)
	case ModeCentralized:
		err = d.centralDraw(cctx, g, b)
	case ModeDecentralized:
		err = d.mergeDraw(cctx, g, b)
	}
	if err == nil { // every rank knows what the batch did to the global counts
		g.lim.Sample(int64(len(b.Items)))
		for _, s := range b.Items {
			if s.Deleted {
				g.lim.Delete(1)
				g.size--
				g.shards[s.Index/d.capacity].size--
			}
		}
	}
	t.notify()
	return err
}

// onDeleted is the hook for items a collective sample deletes on this shard.
func (d *DistTable) onDeleted(b *Batch) func(Item) {
	if d.st == nil {
		return nil
	}
	return func(it Item) { d.st.holdAndRelease(b, it) }
}

// applyPickLocked counts one sample of the local item at slot, deleting it when it
// reaches max_times_sampled.
func (t *Table) applyPickLocked(slot int, hook func(Item)) (Item, bool) {
	p := &t.items[slot]
	p.TimesSampled++
	if p.TimesSampled == 1 {
		t.uniqueSamples++
	}
	t.limiter.Sample(1)
	it := *p
	if t.maxTimes > 0 && p.TimesSampled >= t.maxTimes {
		t.deleteSlot(slot, hook)
		return it, true
	}
	return it, false
}

// pickBytes is the encoded size of one sampled item.
const pickBytes = 64

func encodePick(b []byte, s *Sampled) {
	le.PutUint64(b[0:], uint64(s.Index))
	le.PutUint64(b[8:], s.Key)
	le.PutUint64(b[16:], math.Float64bits(s.Priority))
	le.PutUint64(b[24:], math.Float64bits(s.Probability))
	le.PutUint64(b[32:], uint64(s.TimesSampled))
	le.PutUint64(b[40:], uint64(s.Inserted))
	le.PutUint64(b[48:], s.Seq)
	var flags uint64
	if s.Deleted {
		flags = 1
	}
	le.PutUint64(b[56:], flags|uint64(s.TableSize)<<1)
}

func decodePick(b []byte, s *Sampled) {
	s.Index = int(le.Uint64(b[0:]))
	s.Key = le.Uint64(b[8:])
	s.Ref = s.Key
	s.Priority = math.Float64frombits(le.Uint64(b[16:]))
	s.Probability = math.Float64frombits(le.Uint64(b[24:]))
	s.TimesSampled = int64(le.Uint64(b[32:]))
	s.Inserted = int64(le.Uint64(b[40:]))
	s.Seq = le.Uint64(b[48:])
	f := le.Uint64(b[56:])
	s.Deleted = f&1 != 0
	s.TableSize = int(f >> 1)
}

// splitDraw: a multinomial over the shards' weights decides which shard draws each
// position; every shard draws its positions locally; an AllGather of the picks
// gives every rank the batch.
func (d *DistTable) splitDraw(ctx context.Context, g *globalState, b *Batch) error {
	t := d.t
	n := len(b.Items)
	weights := make([]float64, d.size)
	var total float64
	for r, s := range g.shards {
		if d.kind == KindUniform || g.weight <= 0 {
			weights[r] = float64(s.size)
		} else {
			weights[r] = s.weight
		}
		total += weights[r]
	}
	positions := assignShards(d.globalRand(), weights, n, d.posBuf[:0])
	d.posBuf = positions
	counts := make([]int, d.size)
	for _, s := range positions {
		counts[s]++
	}
	mine := counts[d.rank]
	most := 0
	for _, c := range counts {
		most = max(most, c)
	}
	if need := most * pickBytes * (1 + d.size); cap(d.drawBuf) < need {
		d.drawBuf = make([]byte, need)
	}
	send := d.drawBuf[:most*pickBytes]
	all := d.drawBuf[len(send) : len(send)*(1+d.size)]
	var drawErr error
	if mine > 0 {
		if cap(d.picks) < mine {
			d.picks = make([]Pick, mine)
		}
		picks := d.picks[:mine]
		if drawErr = t.drawLocked(ctx, d.localRand(), picks); drawErr != nil {
			// The others learn of it from the exchange: a first pick of index -1.
			le.PutUint64(send, ^uint64(0))
		} else {
			// The picks count once every rank's draw has succeeded (below), but
			// the batch shows them counted: a slot picked twice shows 1, then 2.
			scale := weights[d.rank] / total
			if len(d.seen) < len(t.items) {
				d.seen = make([]int64, len(t.items))
			}
			for i, p := range picks {
				it := t.items[p.Slot]
				d.seen[p.Slot]++
				it.TimesSampled += d.seen[p.Slot]
				s := Sampled{Item: it, Probability: p.Probability * scale, TableSize: int(g.size)}
				s.Index = d.rank*d.capacity + it.Index
				encodePick(send[i*pickBytes:], &s)
			}
			for _, p := range picks {
				d.seen[p.Slot] = 0
			}
		}
	}
	if err := collective.AllGather(ctx, d.comm, send, all); err != nil {
		return fmt.Errorf("sample: distributed table %q: split draw: %w", t.name, err)
	}
	for r, c := range counts {
		if c > 0 && le.Uint64(all[r*len(send):]) == ^uint64(0) {
			if r == d.rank {
				return fmt.Errorf("sample: distributed table %q: split draw: %w", t.name, drawErr)
			}
			return fmt.Errorf("sample: distributed table %q: split draw: rank %d's local draw failed", t.name, r)
		}
	}
	if mine > 0 {
		for _, p := range d.picks[:mine] {
			t.applyPickLocked(p.Slot, nil)
		}
	}
	next := make([]int, d.size)
	for i, s := range positions {
		decodePick(all[(int(s)*most+next[s])*pickBytes:], &b.Items[i])
		next[s]++
	}
	return nil
}

// itemBytes is the encoded size of one item sent to the root of a centralized
// selection.
const itemBytes = 48

// centralDraw: every shard sends its items to the root, which samples from all of
// them as one table would and broadcasts the batch; every shard then applies the
// picks of its own items.
func (d *DistTable) centralDraw(ctx context.Context, g *globalState, b *Batch) error {
	t := d.t
	cctx := ctx
	mineBytes := make([]byte, 0, int(g.shards[d.rank].size)*itemBytes)
	for slot, ok := range t.live {
		if ok {
			it := &t.items[slot]
			var e [itemBytes]byte
			le.PutUint64(e[0:], uint64(slot))
			le.PutUint64(e[8:], it.Key)
			le.PutUint64(e[16:], math.Float64bits(it.Priority))
			le.PutUint64(e[24:], uint64(it.TimesSampled))
			le.PutUint64(e[32:], uint64(it.Inserted))
			le.PutUint64(e[40:], it.Seq)
			mineBytes = append(mineBytes, e[:]...)
		}
	}
	n := len(b.Items)
	out := make([]byte, 8+n*pickBytes)
	if d.rank != d.root {
		if err := collective.Send(cctx, d.comm, mineBytes, d.root, tagCentral); err != nil {
			return fmt.Errorf("sample: distributed table %q: centralized draw: %w", t.name, err)
		}
	}
	var rootErr error
	if d.rank == d.root {
		var got int
		got, rootErr = d.rootDraw(cctx, g, mineBytes, b.Items)
		if rootErr != nil {
			le.PutUint64(out, ^uint64(0)) // tells the others
		} else {
			le.PutUint64(out, uint64(got))
			for i := range got {
				encodePick(out[8+i*pickBytes:], &b.Items[i])
			}
		}
	}
	if err := collective.Broadcast(cctx, d.comm, out, d.root); err != nil {
		return fmt.Errorf("sample: distributed table %q: centralized draw: %w", t.name, err)
	}
	if le.Uint64(out) == ^uint64(0) {
		if rootErr != nil {
			return rootErr
		}
		return fmt.Errorf("sample: distributed table %q: centralized draw: the draw at root %d failed", t.name, d.root)
	}
	got := int(le.Uint64(out))
	b.Items = b.Items[:got]
	hook := d.onDeleted(b)
	for i := range got {
		s := &b.Items[i]
		decodePick(out[8+i*pickBytes:], s)
		if s.Index/d.capacity == d.rank {
			t.applyPickLocked(s.Index%d.capacity, hook)
		}
	}
	return nil
}

// rootDraw receives every shard's items and samples from them with a table of
// the same configuration, whose slots are the global indices.
func (d *DistTable) rootDraw(ctx context.Context, g *globalState, mine []byte, dst []Sampled) (int, error) {
	t := d.t
	var sampler Selector = NewUniform()
	if d.kind == KindPrioritized {
		p, err := NewPrioritized(d.exponent)
		if err != nil {
			return 0, err
		}
		sampler = p
	}
	tmp, err := NewTable(Config{Name: t.name, MaxSize: int(max(g.size, 1)), Sampler: sampler, Remover: NewFIFO(),
		MaxTimesSampled: d.maxTimes, RateLimit: d.rl, Source: rand.NewPCG(d.seed, d.calls*0x9e3779b97f4a7c15+1),
		Selection: t.selection})
	if err != nil {
		return 0, err
	}
	defer tmp.Close()
	tmp.rows = true
	slot := 0
	for r := range d.size {
		buf := mine
		if r != d.rank {
			buf = make([]byte, int(g.shards[r].size)*itemBytes)
			if err := collective.Recv(ctx, d.comm, buf, r, tagCentral); err != nil {
				return 0, fmt.Errorf("sample: distributed table %q: centralized draw: items of rank %d: %w", t.name, r, err)
			}
		}
		for o := 0; o+itemBytes <= len(buf); o += itemBytes {
			e := buf[o:]
			tmp.load(slot, Item{Index: r*d.capacity + int(le.Uint64(e[0:])), Key: le.Uint64(e[8:]),
				Priority: math.Float64frombits(le.Uint64(e[16:])), TimesSampled: int64(le.Uint64(e[24:])),
				Inserted: int64(le.Uint64(e[32:])), Seq: le.Uint64(e[40:])})
			slot++
		}
	}
	tmp.limiter = g.lim
	// The global limiter allowed len(dst) samples, so the temporary table takes
	// them without waiting; ctx is for a device selection's draws.
	if !tmp.limiter.CanSample(1) {
		return 0, fmt.Errorf("sample: distributed table %q: centralized draw at the root: internal error: the limiter refuses the batch it allowed", t.name)
	}
	got, err := tmp.sampleInto(ctx, dst, nil)
	if err != nil {
		return 0, fmt.Errorf("sample: distributed table %q: centralized draw at the root: %w", t.name, err)
	}
	for i := range got {
		dst[i].TableSize = int(g.size)
		dst[i].Ref = dst[i].Key
	}
	return got, nil
}

// load puts it into the table at slot without the rate limiter, counts or the key
// index (for a root's temporary table, whose keys may repeat).
func (t *Table) load(slot int, it Item) {
	t.ensureSlot(slot)
	t.items[slot] = it
	t.live[slot] = true
	_ = t.sampler.Insert(slot, it.Priority)
	_ = t.remover.Insert(slot, it.Priority)
}

// mergeDraw: every shard offers the head of its order, enough of it to fill the
// batch; every rank merges the heads the same way.
func (d *DistTable) mergeDraw(ctx context.Context, g *globalState, b *Batch) error {
	t := d.t
	n := len(b.Items)
	k := n
	if d.maxTimes == 0 {
		k = 1 // the first item takes every pick
	}
	var bestErr error
	d.slots, bestErr = t.bestLocked(ctx, k, d.slots[:0])
	send := make([]byte, 8+n*candidateBytes)
	var budgets int64
	count := 0
	for _, slot := range d.slots {
		if budgets >= int64(n) {
			break
		}
		it := &t.items[slot]
		c := candidate{Shard: int32(d.rank), Slot: int32(slot), Key: it.Key, Priority: it.Priority,
			Inserted: it.Inserted, TimesSampled: it.TimesSampled, Seq: it.Seq, Budget: math.MaxInt64}
		if d.maxTimes > 0 {
			c.Budget = d.maxTimes - it.TimesSampled
		}
		budgets += min(c.Budget, int64(n))
		c.encode(send[8+count*candidateBytes:])
		count++
	}
	le.PutUint64(send, uint64(count))
	if bestErr != nil {
		le.PutUint64(send, badCount)
	}
	all := make([]byte, len(send)*d.size)
	if err := collective.AllGather(ctx, d.comm, send, all); err != nil {
		return fmt.Errorf("sample: distributed table %q: decentralized draw: %w", t.name, err)
	}
	if err := d.candidatesFailed(all, len(send), "decentralized draw", bestErr); err != nil {
		return err
	}
	lists := decodeLists(all, len(send), d.size)
	lim := g.lim
	picks := mergeOrdered(d.kind, lists, n, &lim, nil)
	b.Items = b.Items[:len(picks)]
	hook := d.onDeleted(b)
	used := make([]int64, d.size)
	for i, p := range picks {
		c := &lists[p.List][p.Index]
		used[p.List]++
		s := &b.Items[i]
		*s = Sampled{Item: Item{Key: c.Key, Ref: c.Key, Priority: c.Priority, TimesSampled: c.TimesSampled + used[p.List],
			Inserted: c.Inserted, Seq: c.Seq, Index: int(c.Shard)*d.capacity + int(c.Slot)}, Probability: 1, TableSize: int(g.size), Deleted: p.Deleted}
		if p.Deleted {
			used[p.List] = 0
		}
		if int(c.Shard) == d.rank {
			t.applyPickLocked(int(c.Slot), hook)
		}
	}
	return nil
}

// Top is a collective call that returns, on every rank, the first k distinct items
// of the global order (GEAR's decentralized top-k for a MaxHeap sampler): every
// shard offers its first k, and every rank merges them the same way. It samples
// nothing: no counts, no rate limiter, no times sampled. Items' Index fields are
// global indices.
//
// Errors: a sampler without an order; ErrClosed; the communicator's errors.
func (d *DistTable) Top(ctx context.Context, k int) ([]Item, error) {
	if !d.ordered() || k < 1 {
		return nil, fmt.Errorf("sample: distributed table %q: top %d: want k >= 1 and a FIFO, LIFO or heap sampler (have %v)", d.t.name, k, d.kind)
	}
	d.opMu.Lock()
	defer d.opMu.Unlock()
	t := d.t
	t.mu.Lock()
	if d.closed || t.closed {
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: top on distributed table %q", ErrClosed, t.name)
	}
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	var bestErr error
	d.slots, bestErr = t.bestLocked(ctx, k, d.slots[:0])
	send := make([]byte, 8+k*candidateBytes)
	le.PutUint64(send, uint64(len(d.slots)))
	if bestErr != nil {
		le.PutUint64(send, badCount)
	}
	for i, slot := range d.slots {
		it := &t.items[slot]
		c := candidate{Shard: int32(d.rank), Slot: int32(slot), Key: it.Key, Priority: it.Priority,
			Inserted: it.Inserted, TimesSampled: it.TimesSampled, Seq: it.Seq, Budget: 1}
		c.encode(send[8+i*candidateBytes:])
	}
	t.mu.Unlock()
	all := make([]byte, len(send)*d.size)
	if err := collective.AllGather(cctx, d.comm, send, all); err != nil {
		return nil, fmt.Errorf("sample: distributed table %q: top: %w", t.name, err)
	}
	if err := d.candidatesFailed(all, len(send), "top", bestErr); err != nil {
		return nil, err
	}
	lists := decodeLists(all, len(send), d.size)
	picks := mergeOrdered(d.kind, lists, k, nil, nil)
	out := make([]Item, len(picks))
	for i, p := range picks {
		c := &lists[p.List][p.Index]
		out[i] = Item{Key: c.Key, Ref: c.Key, Priority: c.Priority, TimesSampled: c.TimesSampled,
			Inserted: c.Inserted, Seq: c.Seq, Index: int(c.Shard)*d.capacity + int(c.Slot)}
	}
	return out, nil
}

// badCount, as a candidate block's count, says that the rank could not list its
// candidates.
const badCount = ^uint64(0)

// candidatesFailed returns an error, the same decision on every rank, when a
// rank's candidate block says it could not list its candidates; mine is this
// rank's own failure.
func (d *DistTable) candidatesFailed(all []byte, block int, op string, mine error) error {
	for r := range d.size {
		if le.Uint64(all[r*block:]) != badCount {
			continue
		}
		if r == d.rank && mine != nil {
			return fmt.Errorf("sample: distributed table %q: %s: %w", d.t.name, op, mine)
		}
		return fmt.Errorf("sample: distributed table %q: %s: rank %d could not list its candidates", d.t.name, op, r)
	}
	return nil
}

// decodeLists reads every rank's candidate block (a count, then candidates).
func decodeLists(all []byte, block, ranks int) [][]candidate {
	lists := make([][]candidate, ranks)
	for r := range ranks {
		blk := all[r*block:]
		c := int(le.Uint64(blk))
		lists[r] = make([]candidate, c)
		for i := range c {
			lists[r][i].decode(blk[8+i*candidateBytes:])
		}
	}
	return lists
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
