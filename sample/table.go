package sample

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/gear-rl/gear/internal/clock"
	"github.com/gear-rl/gear/internal/errmark"
	"github.com/gear-rl/gear/internal/metrics"
)

// Item is one entry of a table.
type Item struct {
	// Key identifies the item in the table.
	Key uint64
	// Ref is the caller's opaque reference to the item's data.
	Ref uint64
	// Priority is the item's current priority.
	Priority float64
	// TimesSampled counts the samples of the item (in a Sampled, including that
	// sample).
	TimesSampled int64
	// Seq is the item's insertion order in its table: 0, 1, 2, ...
	Seq uint64
	// Inserted is the time of the insert by the table's clock, in unix
	// nanoseconds. It orders FIFO and LIFO across shards.
	Inserted int64
	// Index is the item's place in its table: its row in a shard-backed table
	// (the local index that Collect reads), a slot number otherwise.
	Index int
}

// Sampled is one item of a sampled batch.
type Sampled struct {
	Item
	// Probability is the probability with which the sampler chose the item.
	Probability float64
	// TableSize is the number of items in the table when it was chosen.
	TableSize int
	// Deleted reports that this sample reached max_times_sampled and removed the
	// item from the table.
	Deleted bool
}

// Update sets the priority of the item with Key.
type Update struct {
	Key      uint64
	Priority float64
}

// Config describes a table.
type Config struct {
	// Name appears in errors and Info.
	Name string
	// MaxSize is the most items the table holds (>= 1). An insert into a full
	// table inserts first, then lets the remover delete one item, possibly the
	// new one.
	MaxSize int
	// Sampler chooses sampled items; Remover chooses the victim on overflow. They
	// must be two distinct, empty selectors, and the table owns them from now on.
	Sampler, Remover Selector
	// MaxTimesSampled deletes an item once it has been sampled that many times,
	// after the sample that reached the limit is returned; 0 is unlimited.
	MaxTimesSampled int64
	// RateLimit governs inserts and samples; the zero value means MinSize(1).
	RateLimit RateLimit
	// Seed seeds the random source of the sampler and remover.
	Seed uint64
	// Source, when set, replaces the source seeded from Seed.
	Source rand.Source
	// Clock, when set, stamps inserts (Item.Inserted) instead of the wall
	// clock. It should not go backwards.
	Clock clock.Clock
	// OnDelete, when set, is called for every item that leaves the table (remover,
	// max_times_sampled, explicit deletes, Reset), with the table's lock held: it
	// must be quick and must not call the table.
	OnDelete func(Item)
	// Selection, when set, runs a prioritized sampler's draws (and, in a
	// distributed table, a heap sampler's top-k) with GEAR's selection kernels,
	// on a GPU or with their CPU twins; see DeviceSelection for what its picks
	// share with the sampler's own. The table does not own it; close the table
	// first.
	Selection *DeviceSelection
}

// Info is a table's state at one moment.
type Info struct {
	Name             string
	Size, MaxSize    int
	MaxTimesSampled  int64
	Sampler, Remover Kind
	// Inserts, Samples and Deletes are counted as the rate limiter counts them.
	Inserts, Samples, Deletes int64
	// UniqueSamples counts items sampled at least once.
	UniqueSamples int64
	// BlockedInserts and BlockedSamples count the calls waiting on the rate
	// limiter now.
	BlockedInserts, BlockedSamples int
	Limiter                        LimiterInfo
}

// Table is a single-process replay table with Reverb's semantics: items with keys
// and priorities, a sampler and a remover, max_times_sampled, and a rate limiter on
// which Insert and Sample block. It is safe for concurrent use.
type Table struct {
	name      string
	maxSize   int
	maxTimes  int64
	sampler   Selector
	remover   Selector
	rng       *rand.Rand
	clock     clock.Clock
	onDelete  func(Item)
	selection *DeviceSelection
	m         *metrics.Table // the table's slot in its rank's metrics; nil: none

	mu            sync.Mutex
	limiter       RateLimiter
	items         []Item   // by slot
	live          []bool   // by slot
	index         keyIndex // key -> slot
	free          []int32  // free slots, reused last-freed first
	seq           uint64
	uniqueSamples int64
	picks         []Pick
	one           [1]Pick
	touch         int64         // keeps the prefetching loop in SampleInto
	slots         []int         // scratch for Top
	rows          bool          // slots are shard rows, given by the caller
	distributed   bool          // a distributed table's shard: inserts use share
	share         int64         // inserts allowed until the next global sync
	room          distRoom      // what this shard's own deletes add to share
	wake          chan struct{} // closed and replaced when the state changes and someone waits
	waiters       int
	blockedIns    int
	blockedSmp    int
	closed        bool
	done          chan struct{}
	evictions     uint64            // by trimLocked, for touchVictims
	ahead         [victimsAhead]int // touchVictims' scratch
	touchRows     func([]int)       // asks for what deleting the slots will write outside the table; nil: nothing
	beforeWait    func()            // called with mu held before a call waits (ShardTable: beforeWaitLocked); may be nil
	onPriority    func(Item)        // called with mu held after an item's priority changed (ShardTable: the row's); may be nil
	restoredFrac  float64           // the fraction of a sample that restoredSamples carries to its next rows
}

// NewTable checks cfg and returns an empty table.
func NewTable(cfg Config) (*Table, error) {
	t, err := newTable(cfg)
	if err != nil {
		return nil, err
	}
	t.m = metrics.Current().Table(cfg.Name, cfg.MaxSize)
	return t, nil
}

// newTable is NewTable for a table that the rank's metrics do not show (a
// distributed table's scratch tables).
func newTable(cfg Config) (*Table, error) {
	rl := cfg.RateLimit
	if rl == (RateLimit{}) {
		rl = MinSize(1)
	}
	lim, err := NewRateLimiter(rl)
	if err != nil {
		return nil, fmt.Errorf("sample: table %q: %w", cfg.Name, err)
	}
	switch {
	case cfg.MaxSize < 1:
		return nil, fmt.Errorf("sample: table %q: max size %d: want >= 1", cfg.Name, cfg.MaxSize)
	case cfg.Sampler == nil || cfg.Remover == nil:
		return nil, fmt.Errorf("sample: table %q: sampler and remover are both required", cfg.Name)
	case cfg.Sampler == cfg.Remover:
		return nil, fmt.Errorf("sample: table %q: sampler and remover are the same selector; each keeps its own state, so pass two", cfg.Name)
	case cfg.Sampler.Len() != 0 || cfg.Remover.Len() != 0:
		return nil, fmt.Errorf("sample: table %q: sampler and remover must start empty", cfg.Name)
	case cfg.MaxTimesSampled < 0:
		return nil, fmt.Errorf("sample: table %q: max_times_sampled %d: want >= 0", cfg.Name, cfg.MaxTimesSampled)
	}
	src := cfg.Source
	if src == nil {
		src = rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15)
	}
	return &Table{
		name:      cfg.Name,
		maxSize:   cfg.MaxSize,
		maxTimes:  cfg.MaxTimesSampled,
		sampler:   cfg.Sampler,
		remover:   cfg.Remover,
		rng:       rand.New(src),
		clock:     cfg.Clock,
		onDelete:  cfg.OnDelete,
		selection: cfg.Selection,
		limiter:   *lim,
		wake:      make(chan struct{}),
		done:      make(chan struct{}),
	}, nil
}

// Name is the table's name.
func (t *Table) Name() string { return t.name }

// Insert adds an item, waiting while the rate limiter refuses inserts. When key is
// already present it only sets the item's priority, without waiting and without
// counting an insert (ref is then ignored). A full table then lets its remover
// delete one item, possibly the new one.
//
// Errors: a priority the sampler or remover refuses; ErrClosed; the context's
// error when it ends before the insert was allowed.
func (t *Table) Insert(ctx context.Context, key uint64, priority float64, ref uint64) error {
	span := t.m.Begin()
	_, err := t.insert(ctx, Item{Key: key, Priority: priority, Ref: ref}, false)
	t.m.EndInsert(span)
	return err
}

// insert adds it, or sets the priority of the item with its key. With atRow, the
// item goes to slot it.Index and keeps its Seq, Inserted and TimesSampled (a
// shard row); otherwise the table assigns them. It reports whether it added it.
func (t *Table) insert(ctx context.Context, it Item, atRow bool) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.insertLocked(ctx, it, atRow)
}

// insertLocked is insert with t.mu held (released while it waits).
func (t *Table) insertLocked(ctx context.Context, it Item, atRow bool) (bool, error) {
	if t.closed {
		return false, t.errClosed("insert")
	}
	if err := t.checkPriority(it.Key, it.Priority); err != nil {
		return false, err
	}
	if slot, ok := t.index.get(it.Key); ok {
		t.setPriority(int(slot), it.Priority)
		return false, nil
	}
	if !t.canInsert() {
		if err := t.waitLocked(ctx, "insert", &t.blockedIns, t.canInsert); err != nil {
			return false, err
		}
		if slot, ok := t.index.get(it.Key); ok { // inserted by another caller while we waited
			t.setPriority(int(slot), it.Priority)
			return false, nil
		}
	}
	var slot int
	if atRow {
		slot = it.Index
		t.ensureSlot(slot)
		if t.live[slot] {
			return false, fmt.Errorf("sample: table %q: row %d already holds key %d", t.name, slot, t.items[slot].Key)
		}
	} else {
		slot = t.allocSlot()
		it.Index, it.Seq, it.Inserted, it.TimesSampled = slot, t.seq, t.clock.Now().UnixNano(), 0
		t.seq++
	}
	t.placeLocked(slot, it)
	if t.distributed {
		t.share--
	}
	t.trimLocked()
	return true, nil
}

// placeLocked puts it at the free row slot, in the index and both selectors
// (its priority checked for both, so neither can fail), and counts the insert.
func (t *Table) placeLocked(slot int, it Item) {
	t.items[slot] = it
	t.live[slot] = true
	t.index.set(it.Key, int32(slot))
	_ = t.sampler.Insert(slot, it.Priority)
	_ = t.remover.Insert(slot, it.Priority)
	t.limiter.Insert(1)
	t.m.Inserted(t.sampler.Len())
}

// trimLocked deletes the remover's pick when an insert took the table past its
// max size, and wakes the waiters.
func (t *Table) trimLocked() {
	if t.sampler.Len() > t.maxSize {
		t.remover.Sample(t.rng, t.one[:])
		t.deleteSlot(t.one[0].Slot, nil)
		t.touchVictims()
	}
	t.notify()
}

// Sample returns between 1 and n sampled items: it waits until the rate limiter
// allows one sample, then takes as many more as it allows at once, up to n (a
// flexible batch). Items are chosen one after another as Reverb does: a pick may
// repeat an item, and an item that reaches max_times_sampled is deleted before the
// next pick.
//
// Errors: ErrClosed; the context's error when it ends before one item could be
// sampled; with a Config.Selection, its errors (the device's, or the context's
// while the device draws), returned with the items picked before.
func (t *Table) Sample(ctx context.Context, n int) ([]Sampled, error) {
	if n < 1 {
		return nil, fmt.Errorf("sample: table %q: sample of %d items: want n >= 1", t.name, n)
	}
	dst := make([]Sampled, n)
	got, err := t.SampleInto(ctx, dst)
	return dst[:got], err
}

// SampleInto is Sample writing into dst (n = len(dst)); it returns how many items
// it wrote. It allocates nothing once the table has sampled a batch of that size.
func (t *Table) SampleInto(ctx context.Context, dst []Sampled) (int, error) {
	span := t.m.Begin()
	n, err := t.sampleInto(ctx, dst, nil)
	t.m.EndSample(span, n)
	return n, err
}

// sampleInto is SampleInto; onDeleted, when set, replaces OnDelete for the items
// this call deletes.
func (t *Table) sampleInto(ctx context.Context, dst []Sampled, onDeleted func(Item)) (int, error) {
	if len(dst) < 1 {
		return 0, fmt.Errorf("sample: table %q: sample into an empty batch", t.name)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, t.errClosed("sample")
	}
	if t.distributed {
		return 0, fmt.Errorf("sample: table %q is a shard of a distributed table: sample through the distributed table", t.name)
	}
	if err := t.waitLocked(ctx, "sample", &t.blockedSmp, func() bool { return t.limiter.CanSample(1) }); err != nil {
		return 0, err
	}
	got, chunk := 0, len(dst)
	for got < len(dst) {
		allowed := int(t.limiter.MaxSamples(int64(min(chunk, len(dst)-got))))
		if allowed == 0 {
			break
		}
		if cap(t.picks) < allowed {
			t.picks = make([]Pick, allowed)
		}
		picks := t.picks[:allowed]
		size := t.sampler.Len()
		if err := t.drawLocked(ctx, t.rng, picks); err != nil {
			t.notify()
			return got, fmt.Errorf("sample: table %q: sample: %w", t.name, err)
		}
		// The picks were drawn from one state; they stay valid until a pick
		// deletes its item, and the rest of the chunk is then drawn again.
		// Touch every picked item first: these loads are independent, so their
		// cache misses overlap, and the loop below finds the items in cache.
		var touch int64
		for _, p := range picks {
			touch += t.items[p.Slot].TimesSampled
		}
		t.touch = touch
		accepted, deleted := 0, false
		for _, p := range picks {
			it := &t.items[p.Slot]
			it.TimesSampled++
			if it.TimesSampled == 1 {
				t.uniqueSamples++
			}
			t.limiter.Sample(1)
			dst[got] = Sampled{Item: *it, Probability: p.Probability, TableSize: size}
			got++
			accepted++
			if t.maxTimes > 0 && it.TimesSampled >= t.maxTimes {
				dst[got-1].Deleted = true
				t.deleteSlot(p.Slot, onDeleted)
				deleted = true
				break
			}
		}
		if deleted {
			chunk = accepted
		} else {
			chunk *= 2
		}
	}
	t.m.Sampled(got, t.sampler.Len())
	t.notify()
	return got, nil
}

// MutatePriorities deletes the items with the given keys, then sets the given
// priorities; unknown keys are ignored. It never waits.
//
// Errors: ErrClosed; a priority that the sampler or remover refuses, in which case
// nothing changed.
func (t *Table) MutatePriorities(updates []Update, deletes []uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return t.errClosed("mutate priorities")
	}
	for _, u := range updates {
		if err := t.checkPriority(u.Key, u.Priority); err != nil {
			return err
		}
	}
	changed := false
	for _, k := range deletes {
		if slot, ok := t.index.get(k); ok {
			t.deleteSlot(int(slot), nil)
			changed = true
		}
	}
	for _, u := range updates {
		if slot, ok := t.index.get(u.Key); ok {
			t.setPriority(int(slot), u.Priority)
		}
	}
	if changed {
		t.notify()
	}
	return nil
}

// Get returns the item with key.
func (t *Table) Get(key uint64) (Item, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	slot, ok := t.index.get(key)
	if !ok {
		return Item{}, false
	}
	return t.items[slot], true
}

// Top appends to dst the first k distinct items in the sampler's order: the item a
// sample would return, then the one it would return were that one deleted, and so
// on (GEAR's top-k selection for a MaxHeap sampler). It samples nothing: no count,
// no rate limiter, no times sampled.
//
// Errors: ErrClosed; a sampler that has no order (Uniform, Prioritized).
func (t *Table) Top(k int, dst []Item) ([]Item, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return dst, t.errClosed("top")
	}
	o, ok := t.sampler.(Ordered)
	if !ok {
		return dst, fmt.Errorf("sample: table %q: top %d: the %v sampler has no order", t.name, k, t.sampler.Kind())
	}
	t.slots = o.Best(k, t.slots[:0])
	for _, s := range t.slots {
		dst = append(dst, t.items[s])
	}
	return dst, nil
}

// Items appends every item to dst, in insertion order.
func (t *Table) Items(dst []Item) []Item {
	t.mu.Lock()
	defer t.mu.Unlock()
	start := len(dst)
	for s, ok := range t.live {
		if ok {
			dst = append(dst, t.items[s])
		}
	}
	slices.SortFunc(dst[start:], func(a, b Item) int { return cmp.Compare(a.Seq, b.Seq) })
	return dst
}

// Info reports the table's state.
func (t *Table) Info() Info {
	t.mu.Lock()
	defer t.mu.Unlock()
	ins, smp, del := t.limiter.Counts()
	return Info{
		Name: t.name, Size: t.sampler.Len(), MaxSize: t.maxSize, MaxTimesSampled: t.maxTimes,
		Sampler: t.sampler.Kind(), Remover: t.remover.Kind(),
		Inserts: ins, Samples: smp, Deletes: del, UniqueSamples: t.uniqueSamples,
		BlockedInserts: t.blockedIns, BlockedSamples: t.blockedSmp,
		Limiter: t.limiter.Info(),
	}
}

// Reset deletes every item and zeroes the counts; the configuration stays.
//
// Errors: ErrClosed.
func (t *Table) Reset() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return t.errClosed("reset")
	}
	for s, ok := range t.live {
		if ok && t.onDelete != nil {
			t.onDelete(t.items[s])
		}
	}
	t.sampler.Clear()
	t.remover.Clear()
	t.index.reset()
	t.items, t.live, t.free = t.items[:0], t.live[:0], t.free[:0]
	t.limiter.Reset()
	t.uniqueSamples = 0
	t.m.Resized(0)
	t.notify()
	return nil
}

// Close wakes every waiting call with ErrClosed and refuses later calls. It is
// idempotent and keeps the items (Info and Get still answer).
func (t *Table) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		t.m.Close()
		close(t.done)
		if t.selection != nil {
			t.selection.forget(t.sampler)
		}
	}
	return nil
}

func (t *Table) errClosed(op string) error {
	return fmt.Errorf("%w: %s on table %q", ErrClosed, op, t.name)
}

// CheckPriority returns the error an insert or update of key with priority p
// would meet, matching ErrPriority, or nil if the table's selectors accept p;
// so that a writer can refuse a priority before it takes a row for it.
func (t *Table) CheckPriority(key uint64, p float64) error { return t.checkPriority(key, p) }

func (t *Table) checkPriority(key uint64, p float64) error {
	if err := t.sampler.Check(p); err != nil {
		return errmark.Errorf(ErrPriority, "sample: table %q: key %d: %w", t.name, key, err)
	}
	if err := t.remover.Check(p); err != nil {
		return errmark.Errorf(ErrPriority, "sample: table %q: key %d: %w", t.name, key, err)
	}
	return nil
}

// setPriority updates a live slot whose priority both selectors accept.
func (t *Table) setPriority(slot int, p float64) {
	t.items[slot].Priority = p
	_ = t.sampler.Update(slot, p)
	_ = t.remover.Update(slot, p)
	if t.onPriority != nil {
		t.onPriority(t.items[slot])
	}
}

// canInsert is the insert condition: the rate limiter's, or for a shard of a
// distributed table, the share of the global room it was given at the last sync
// (or collective sample), plus the room its own deletes have freed since.
func (t *Table) canInsert() bool {
	if t.distributed {
		return t.share+t.room.freed(t.limiter.deletes) > 0
	}
	return t.limiter.CanInsert(1)
}

// waitChangeLocked waits, with t.mu held on entry and on return, until the table
// changes, d passes, the context ends, the table closes or stop is closed.
func (t *Table) waitChangeLocked(ctx context.Context, d time.Duration, stop <-chan struct{}) {
	if t.closed {
		return
	}
	wake := t.wake
	t.waiters++
	t.mu.Unlock()
	timer := time.NewTimer(d)
	select {
	case <-wake:
	case <-timer.C:
	case <-ctx.Done():
	case <-t.done:
	case <-stop:
	}
	timer.Stop()
	t.mu.Lock()
	t.waiters--
}

// ensureSlot makes room for slot in the item arrays (shard rows).
func (t *Table) ensureSlot(slot int) {
	if slot >= len(t.items) {
		n := max(slot+1, 2*len(t.items))
		t.items = append(t.items, make([]Item, n-len(t.items))...)
		t.live = append(t.live, make([]bool, n-len(t.live))...)
	}
}

// itemAt returns the live item at slot.
func (t *Table) itemAt(slot int) (Item, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot < 0 || slot >= len(t.live) || !t.live[slot] {
		return Item{}, false
	}
	return t.items[slot], true
}

func (t *Table) allocSlot() int {
	if n := len(t.free); n > 0 {
		s := t.free[n-1]
		t.free = t.free[:n-1]
		return int(s)
	}
	t.items = append(t.items, Item{})
	t.live = append(t.live, false)
	return len(t.items) - 1
}

// deleteSlot removes the item at slot and tells hook, or else OnDelete.
func (t *Table) deleteSlot(slot int, hook func(Item)) {
	it := t.items[slot]
	t.sampler.Delete(slot)
	t.remover.Delete(slot)
	t.index.remove(it.Key)
	t.live[slot] = false
	if !t.rows {
		t.free = append(t.free, int32(slot))
	}
	t.limiter.Delete(1)
	t.m.Resized(t.sampler.Len())
	if hook == nil {
		hook = t.onDelete
	}
	if hook != nil {
		hook(it)
	}
}

// notify wakes the waiters, if any, to look at the state again.
func (t *Table) notify() {
	if t.waiters > 0 {
		close(t.wake)
		t.wake = make(chan struct{})
	}
}

// waitLocked waits, with t.mu held on entry and on return, until ok holds, the
// context ends or the table closes.
func (t *Table) waitLocked(ctx context.Context, op string, blocked *int, ok func() bool) error {
	var since int64 // when the wait began (metrics), once it blocks
	for {
		if t.closed {
			t.m.Waited(blocked == &t.blockedIns, since)
			return t.errClosed(op)
		}
		if ok() {
			t.m.Waited(blocked == &t.blockedIns, since)
			return nil
		}
		if err := ctx.Err(); err != nil {
			t.m.Waited(blocked == &t.blockedIns, since)
			return t.errWait(op, err)
		}
		if since == 0 {
			since = t.m.BeginWait()
		}
		if t.beforeWait != nil {
			t.beforeWait()
		}
		wake := t.wake
		t.waiters++
		*blocked++
		t.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
		case <-t.done:
		}
		t.mu.Lock()
		t.waiters--
		*blocked--
	}
}

func (t *Table) errWait(op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("sample: table %q: %s: rate limiter did not allow it before the deadline: %w", t.name, op, err)
	}
	return fmt.Errorf("sample: table %q: %s: %w", t.name, op, err)
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
	t.m.Sampled(1, t.sampler.Len())
	it := *p
	if t.maxTimes > 0 && p.TimesSampled >= t.maxTimes {
		t.deleteSlot(slot, hook)
		return it, true
	}
	return it, false
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
