package sample

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/gear-rl/gear/store"
)

// ShardTable is a Table whose items are the committed rows of a store shard. Any
// process on the host writes trajectories into the shard (Allocate, write in
// place, Commit); the table admits every commit as an insert, in commit order,
// waiting on its rate limiter; an item's Index is its row. When the table deletes an
// item (remover, max_times_sampled, MutatePriorities, Reset) it releases the row,
// and writers may reuse it.
//
// The table decides evictions, so the shard must have no remover of its own
// (store.RemoverNone): a writer's Allocate then waits while every row is in use,
// which is how the rate limiter holds writers back.
type ShardTable struct {
	t     *Table
	shard *store.Shard
	poll  time.Duration
	hook  func(Item) // the caller's OnDelete

	mu      sync.Mutex
	held    map[int32]store.View // rows deleted by a sample, pinned until the batch is released
	next    uint64               // the commit sequence to admit next
	refused int64
	lastErr error
	// progress is closed when next advances and a waiter made it (nil while
	// nobody waits: admission makes no channel per commit).
	progress chan struct{}
	closed   bool
	gpu      *deviceTables
	// reattached counts the rows admitted at construction (admitExisting).
	reattached int // the registration with a device, if any

	devMu sync.Mutex // serialises RegisterDevice, UnregisterDevice and Close's unregistration

	// While ingest admits a pass of commits, the items the table deletes
	// (its evictions, and any other deletion meanwhile) wait in freed, under
	// the table's lock, and their rows go back to the shard in the order of
	// their rows, freedRun at a time and at the end of the pass
	// (flushFreedLocked). Evictions come in commit order, which interleaves
	// the writers' rows: given back so, each writer's next rows would lie
	// between the other's, and two writers would share the cache lines of
	// every packed column (16 rows of a float32 to a line). In row order the
	// rows that writers take next are runs again.
	deferring bool
	freed     []store.Ref // the rows
	freedIts  []Item      // the items, for the caller's OnDelete (only when there is one)
	freedRows rowOrder    // flushFreedLocked's scratch: the rows' order
	freedRefs []store.Ref // and the rows in it
	passNext  uint64      // during an ingest pass: the commit sequence admitted up to (0: none yet)

	nap    *nap
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// ShardInfo is a shard table's state.
type ShardInfo struct {
	Info
	// Admitted is the commit sequence the table has read up to: every commit
	// before it was admitted (or refused, or dropped as a duplicate key).
	Admitted uint64
	// Waiting counts the rows writers committed that the table has not
	// admitted yet: held back by the rate limiter (a writer's commit does not
	// wait for it; admission does), or not read yet.
	Waiting uint64
	// Held counts rows deleted by samples whose batches are not released yet.
	Held int
	// Refused counts commits whose priority the sampler or remover refused; their
	// rows were released. LastRefusal says why the last one was, or why admission
	// stopped (the shard closed under the table).
	Refused     int64
	LastRefusal error
	// Existing counts the rows the shard held when the table was built, admitted
	// at once.
	Existing int
}

// ShardOption tunes NewShardTable.
type ShardOption func(*ShardTable)

// WithPollInterval sets the longest pause between two looks at the shard's commit
// log when it is idle (default 1ms; while commits come the table looks as often
// as its shard's rows beyond the table's size need, at the rate they come).
func WithPollInterval(d time.Duration) ShardOption {
	return func(st *ShardTable) { st.poll = d }
}

// NewShardTable builds a table over shard, which the caller keeps and closes after
// the table. cfg.MaxSize must be below the shard's capacity and defaults to
// capacity - 1: the rows beyond it are for writers in flight (an insert into a full
// table takes a row before the remover frees one) and for rows held by unreleased
// batches. cfg.OnDelete, if set, is called after the table releases an item's row.
// Rows already committed (a restored shard) are admitted first.
func NewShardTable(shard *store.Shard, cfg Config, opts ...ShardOption) (*ShardTable, error) {
	if shard.Remover() != nil {
		return nil, fmt.Errorf("sample: table %q over shard %q: the shard evicts with remover %q; create it with Remover %q so that the table alone removes rows",
			cfg.Name, shard.Name(), shard.Remover().Name(), store.RemoverNone)
	}
	if cfg.MaxSize == 0 {
		cfg.MaxSize = shard.Capacity() - 1
	}
	if cfg.MaxSize >= shard.Capacity() {
		return nil, fmt.Errorf("sample: table %q: max size %d leaves no row of shard %q (capacity %d) for a writer: an insert into a full table needs a row before the remover frees one",
			cfg.Name, cfg.MaxSize, shard.Name(), shard.Capacity())
	}
	st := &ShardTable{
		shard: shard,
		poll:  time.Millisecond,
		hook:  cfg.OnDelete,
		held:  make(map[int32]store.View),
		done:  make(chan struct{}),
	}
	for _, o := range opts {
		o(st)
	}
	if st.poll <= 0 {
		return nil, fmt.Errorf("sample: table %q: poll interval %v: want > 0", cfg.Name, st.poll)
	}
	cfg.OnDelete = st.release
	t, err := NewTable(cfg)
	if err != nil {
		return nil, err
	}
	t.rows = true
	t.touchRows = shard.PrefetchStatus
	// A priority changed by MutatePriorities or by a commit of a key the
	// table holds goes into the item's row at once, under the table's lock,
	// so that the row never keeps an older one: re-attached or restored,
	// the shard gives the table its items' last priorities.
	t.onPriority = func(it Item) { _ = shard.SetPriority(store.Ref{Index: it.Index, Seq: it.Seq}, it.Priority) }
	t.beforeWait = st.beforeWaitLocked
	t.m.SetShard(shard.Name())
	st.t = t
	st.reattached = st.admitExisting()
	st.ctx, st.cancel = context.WithCancel(context.Background())
	st.nap = newNap()
	go st.ingest()
	return st, nil
}

// Name is the table's name.
func (st *ShardTable) Name() string { return st.t.Name() }

// CheckPriority is Table.CheckPriority of the table.
func (st *ShardTable) CheckPriority(key uint64, p float64) error { return st.t.checkPriority(key, p) }

// Shard is the shard under the table.
func (st *ShardTable) Shard() *store.Shard { return st.shard }

// release gives an item's row back to the shard (the table's OnDelete, called
// with the table's lock held), at once or, during an ingest pass, with the
// next run of freed rows.
func (st *ShardTable) release(it Item) {
	if st.deferring {
		st.freed = append(st.freed, store.Ref{Index: it.Index, Seq: it.Seq})
		if st.hook != nil {
			st.freedIts = append(st.freedIts, it)
		}
		if len(st.freed) == freedRun {
			st.flushFreedLocked()
		}
		return
	}
	_ = st.shard.Release(store.Ref{Index: it.Index, Seq: it.Seq})
	if st.hook != nil {
		st.hook(it)
	}
}

// freedRun is how many freed rows a pass holds back at most: sorted, they are
// a run of neighbouring rows (two writers' rows, evicted in turn, cover the
// same stretch of rows), and a pass's end then has at most this many left to
// give back before it parks, while a WaitAdmitted it woke waits to run.
const freedRun = 64

// flushFreedLocked gives the rows of the items deleted so far in this pass
// back to the shard, in the order of their rows (the table's lock held). The
// table also calls it before any of its calls waits, so that no row stays out
// of the shard while admission waits on the rate limiter.
func (st *ShardTable) flushFreedLocked() {
	if len(st.freed) == 0 {
		return
	}
	order := st.freedRows.order(st.freed)
	refs := st.freedRefs[:0]
	for _, i := range order {
		refs = append(refs, st.freed[i])
	}
	st.shard.ReleaseAll(refs)
	if st.hook != nil {
		for _, i := range order {
			st.hook(st.freedIts[i])
		}
	}
	clear(st.freedIts)
	st.freed, st.freedIts, st.freedRefs = st.freed[:0], st.freedIts[:0], refs[:0]
}

// admitPass admits rows, one ingest pass, under one hold of the table's lock
// (which an admission waiting on the rate limiter gives up while it waits),
// with their evictions' rows given back at its end (see freed). It returns
// false when the table is closing.
func (st *ShardTable) admitPass(rows []store.RowStatus) bool {
	if len(rows) == 0 {
		return true
	}
	st.t.mu.Lock()
	defer st.t.mu.Unlock()
	if len(rows) > 1 {
		st.t.touchKeysLocked(rows)
	}
	st.beginPassLocked()
	defer st.endPassLocked()
	for _, r := range rows {
		if !st.admitLocked(r) {
			return false
		}
		st.passNext = r.Seq + 1
	}
	return true
}

// beginPassLocked starts a pass (the table's lock held): from now on the
// rows of deleted items wait in freed.
func (st *ShardTable) beginPassLocked() { st.deferring, st.passNext = true, 0 }

// endPassLocked ends a pass (the table's lock held): what it held back goes
// out, and deletions release their rows at once again.
func (st *ShardTable) endPassLocked() {
	st.flushPassLocked()
	st.deferring, st.passNext = false, 0
}

// beforeWaitLocked is the table's beforeWait (its lock held): the pass
// under way, if any, gives out what it holds back, and a call of another
// goroutine that waits on the rate limiter while commits wait for
// admission wakes the ingest, which may be napping for a few milliseconds
// (streamNap).
func (st *ShardTable) beforeWaitLocked() {
	if st.deferring {
		st.flushPassLocked()
		return
	}
	if st.pending() {
		st.nap.wake()
	}
}

// flushPassLocked ends what a pass holds back so far (the table's lock held):
// the commit sequence it admitted up to is published to WaitAdmitted, and its
// freed rows go back to the shard. The table calls it before any of its calls
// waits, so that nothing is held back while admission waits on the rate
// limiter.
func (st *ShardTable) flushPassLocked() {
	if st.passNext != 0 { // first: a WaitAdmitted need not wait for the releases
		st.advance(st.passNext)
	}
	st.flushFreedLocked()
}

// ingest admits the shard's commits into the table, in commit order, until Close.
//
// Once it has caught up it naps (nap). While commits come it naps for as
// long as they take, at the rate of its last cycle, to use half the rows
// the shard has beyond the table's size (the rows a full table's writers
// take while their rows' evictions wait for this goroutine), between minNap
// and streamNap (or the poll interval, if longer); when none came it doubles
// its last nap, up to the poll interval. Calls of this process that wait
// for commits wake it (WaitAdmitted, beforeWaitLocked).
func (st *ShardTable) ingest() {
	defer close(st.done)
	defer st.nap.close()
	buf := make([]store.RowStatus, 0, 256)
	spare := float64(st.shard.Capacity() - st.t.maxSize)
	d := minNap
	cycle, admitted := time.Now(), uint64(0) // since the last nap began
	for st.ctx.Err() == nil {
		seen := st.nap.mark()
		st.mu.Lock()
		from := st.next
		st.mu.Unlock()
		rows, next, err := st.shard.ReadCommits(from, buf[:0], cap(buf))
		switch {
		case errors.Is(err, store.ErrMissed):
			st.rescan()
			continue
		case err != nil:
			st.fail(err)
			return
		}
		if !st.admitPass(rows) {
			return
		}
		st.advance(next)
		if next != from {
			admitted += next - from
			continue
		}
		now := time.Now()
		if admitted > 0 {
			d = time.Duration(float64(now.Sub(cycle)) * spare / 2 / float64(admitted))
			d = min(max(d, minNap), max(st.poll, streamNap))
		} else {
			d = min(max(2*d, minNap), st.poll)
		}
		st.nap.sleep(seen, d)
		cycle, admitted = now, 0
	}
}

// minNap is the shortest nap of ingest.
const minNap = 20 * time.Microsecond

// streamNap is the longest nap of ingest while commits come (or the poll
// interval, if longer): how long a committed row may wait for admission
// while no call of this process waits for it (WaitAdmitted, and every
// call that waits on the rate limiter, wake the ingest). Each look costs
// the owner a wake, and beside writers that keep the machine's cores busy
// it also takes a core from one of them: two Python row writers inserted
// about 1.65x one with looks a millisecond apart and about 1.75x with
// looks this far apart, given the spare rows to cover them
// (docs/benchmarks.md, "Fewer looks while commits come").
const streamNap = 8 * time.Millisecond

// touchKeysLocked reads the key index's cells of the rows' keys (t.mu held),
// so that their admissions, one after another, find them in the cache: each
// admission's look-up would otherwise wait for its own miss.
func (t *Table) touchKeysLocked(rows []store.RowStatus) {
	var x uint64
	for i := range rows {
		x += uint64(t.index.touch(rows[i].Key))
	}
	loadSink.Add(x)
}

// admit inserts one committed row, waiting on the rate limiter. It returns false
// when the table is closing.
func (st *ShardTable) admit(r store.RowStatus) bool {
	st.t.mu.Lock()
	defer st.t.mu.Unlock()
	return st.admitLocked(r)
}

// admitLocked is admit with the table's lock held.
func (st *ShardTable) admitLocked(r store.RowStatus) bool {
	it := Item{Key: r.Key, Ref: r.Seq, Priority: r.Priority, TimesSampled: int64(r.TimesSampled),
		Seq: r.Seq, Inserted: r.InsertedAt, Index: r.Index}
	added, err := st.t.insertLocked(st.ctx, it, true)
	if err != nil {
		if st.ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return false
		}
		_ = st.shard.Release(r.Ref())
		st.mu.Lock()
		st.refused++
		st.lastErr = err
		st.mu.Unlock()
		return true
	}
	if !added { // an existing key: its priority was set; this row is not needed
		_ = st.shard.Release(r.Ref())
	}
	return true
}

// rescan admits every committed row the table does not hold, after the commit log
// lost track (a restored shard, or a table that fell a log's length behind).
func (st *ShardTable) rescan() {
	seq := st.shard.CommitSeq()
	for r := range st.shard.Rows() {
		if r.Seq >= seq {
			continue // ReadCommits will bring it
		}
		if it, ok := st.t.itemAt(r.Index); ok && it.Seq == r.Seq {
			continue
		}
		if !st.admit(r) {
			return
		}
	}
	st.advance(seq)
}

func (st *ShardTable) advance(next uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if next > st.next {
		st.next = next
		if st.progress != nil {
			close(st.progress)
			st.progress = nil
		}
	}
}

func (st *ShardTable) fail(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.closed {
		st.lastErr = fmt.Errorf("sample: table %q: reading the commits of shard %q: %w", st.t.name, st.shard.Name(), err)
	}
}

// pending reports whether commits wait for admission.
func (st *ShardTable) pending() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.shard.CommitSeq() > st.next
}

// Insert writes one trajectory from this process: it allocates a row (waiting,
// until ctx is done, while the shard is full), lets write fill its blocks, commits
// it with key and priority, and waits until the table has admitted it, which the
// rate limiter may delay. A write error aborts the row and is returned.
//
// Errors: ErrClosed; store errors; the context's error (the row stays committed
// and is admitted later).
func (st *ShardTable) Insert(ctx context.Context, key uint64, priority float64, write func(store.Pending) error) (store.Ref, error) {
	defer st.t.m.EndInsert(st.t.m.Begin())
	if err := st.t.checkPriority(key, priority); err != nil {
		return store.Ref{}, err
	}
	p, err := st.shard.Allocate(ctx)
	if err != nil {
		return store.Ref{}, fmt.Errorf("sample: table %q: insert of key %d: %w", st.t.name, key, err)
	}
	if err := write(p); err != nil {
		_ = p.Abort()
		return store.Ref{}, fmt.Errorf("sample: table %q: insert of key %d: writing the row: %w", st.t.name, key, err)
	}
	ref, err := p.CommitKey(key, priority)
	if err != nil {
		return store.Ref{}, fmt.Errorf("sample: table %q: insert of key %d: %w", st.t.name, key, err)
	}
	return ref, st.WaitAdmitted(ctx, ref.Seq+1) // which wakes the ingest
}

// WaitAdmitted waits until the table has admitted every commit before seq (take seq
// from store.Shard.CommitSeq after committing).
//
// Errors: ErrClosed; the context's error.
func (st *ShardTable) WaitAdmitted(ctx context.Context, seq uint64) error {
	for {
		st.mu.Lock()
		next, closed := st.next, st.closed
		if closed {
			st.mu.Unlock()
			return st.t.errClosed("wait for admission")
		}
		if next >= seq {
			st.mu.Unlock()
			return nil
		}
		if st.progress == nil {
			st.progress = make(chan struct{})
		}
		ch := st.progress
		st.mu.Unlock()
		st.nap.wake() // the commits waited for may be in the log already
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("sample: table %q: waiting for commit %d to be admitted (at %d): %w", st.t.name, seq-1, next, ctx.Err())
		case <-st.ctx.Done():
			return st.t.errClosed("wait for admission")
		}
	}
}

// Batch is a sampled batch of a shard-backed (or distributed) table. Items whose
// sample deleted them (Deleted, from max_times_sampled) keep their rows pinned, so
// that they can still be collected, until Release.
type Batch struct {
	Items []Sampled
	st    *ShardTable
	held  []int32
}

// Release unpins the rows this batch holds. Call it once the batch's data has
// been collected; it is idempotent. Collect must not run on the batch meanwhile.
func (b *Batch) Release() {
	if b.st == nil || len(b.held) == 0 {
		return
	}
	b.st.mu.Lock()
	for _, r := range b.held {
		if v, ok := b.st.held[r]; ok {
			v.Done()
			delete(b.st.held, r)
		}
	}
	b.st.mu.Unlock()
	b.held = b.held[:0]
}

// Sample is Table.Sample over the shard: a flexible batch of 1 to n items.
//
// Errors: ErrClosed; the context's error when it ends before one item could be
// sampled.
func (st *ShardTable) Sample(ctx context.Context, n int) (*Batch, error) {
	b := &Batch{}
	if err := st.SampleInto(ctx, b, n); err != nil {
		return nil, err
	}
	return b, nil
}

// SampleInto is Sample reusing b (released first), allocating nothing once b has
// held a batch of n.
func (st *ShardTable) SampleInto(ctx context.Context, b *Batch, n int) error {
	if n < 1 {
		return fmt.Errorf("sample: table %q: sample of %d items: want n >= 1", st.t.name, n)
	}
	b.Release()
	b.st = st
	if cap(b.Items) < n {
		b.Items = make([]Sampled, n)
	}
	span := st.t.m.Begin()
	got, err := st.t.sampleInto(ctx, b.Items[:n], func(it Item) { st.holdAndRelease(b, it) })
	st.t.m.EndSample(span, got)
	b.Items = b.Items[:got]
	return err
}

// holdAndRelease pins the row of an item a sample deleted, then releases it: the
// row is freed when the batch lets go.
func (st *ShardTable) holdAndRelease(b *Batch, it Item) {
	ref := store.Ref{Index: it.Index, Seq: it.Seq}
	if v, err := st.shard.Read(ref); err == nil {
		st.mu.Lock()
		st.held[int32(it.Index)] = v
		st.mu.Unlock()
		b.held = append(b.held, int32(it.Index))
	}
	st.release(it)
}

// Checkpoint writes the shard's committed rows to path
// (store.Shard.Checkpoint), after writing each item's times sampled, which
// the table counts, into its row, so that a table restored from the file
// goes on counting toward max_times_sampled where this one was. Priorities
// are in the rows already (MutatePriorities).
func (st *ShardTable) Checkpoint(ctx context.Context, path string, opts ...store.Option) error {
	st.writeTimesSampled()
	return st.shard.Checkpoint(ctx, path, opts...)
}

// writeTimesSampled writes each item's times sampled into its row, where the
// table's own counts are not kept as it samples: for a checkpoint, and at
// Close for the next owner of the shard.
func (st *ShardTable) writeTimesSampled() {
	for _, it := range st.t.Items(nil) {
		_ = st.shard.SetTimesSampled(store.Ref{Index: it.Index, Seq: it.Seq}, uint32(min(it.TimesSampled, math.MaxUint32)))
	}
}

// MutatePriorities is Table.MutatePriorities; the new priorities are also written
// to the shard's status table (so that checkpoints keep them).
func (st *ShardTable) MutatePriorities(updates []Update, deletes []uint64) error {
	return st.t.MutatePriorities(updates, deletes)
}

// Get returns the item with key.
func (st *ShardTable) Get(key uint64) (Item, bool) { return st.t.Get(key) }

// Items appends every item to dst, in insertion order.
func (st *ShardTable) Items(dst []Item) []Item { return st.t.Items(dst) }

// Top is Table.Top.
func (st *ShardTable) Top(k int, dst []Item) ([]Item, error) { return st.t.Top(k, dst) }

// Reset deletes every item, releasing its row, and zeroes the counts.
func (st *ShardTable) Reset() error { return st.t.Reset() }

// Info reports the table's state.
func (st *ShardTable) Info() ShardInfo {
	info := st.t.Info()
	st.mu.Lock()
	defer st.mu.Unlock()
	seq := st.shard.CommitSeq()
	return ShardInfo{Info: info, Admitted: st.next, Waiting: seq - min(seq, st.next), Held: len(st.held), Refused: st.refused,
		LastRefusal: st.lastErr, Existing: st.reattached}
}

// Close stops admitting commits, wakes every waiting call with ErrClosed, waits
// for the last collection into device memory and unregisters the device (see
// RegisterDevice), and unpins the rows still held by unreleased batches. It is
// idempotent; the shard stays open (the caller closes it after the table), and so
// does a registered device (closed after the table).
func (st *ShardTable) Close() error {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	st.mu.Unlock()
	st.cancel()
	st.nap.wake() // the nap does not watch the context
	_ = st.t.Close()
	<-st.done
	st.writeTimesSampled() // for an owner that opens the shard after this one (none if it is closed)
	// The device's last collection may still read held rows: it ends first.
	err := st.UnregisterDevice(context.Background())
	st.mu.Lock()
	for r, v := range st.held {
		v.Done()
		delete(st.held, r)
	}
	st.mu.Unlock()
	return err
}
