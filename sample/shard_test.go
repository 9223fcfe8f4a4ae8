package sample

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

var testColumns = []string{"obs", "act", "meta"}

// shardTable makes a shard of the given capacity (remover none) and a table over
// it; both are closed at the end of the test.
func shardTable(t *testing.T, capacity int, cfg Config) (*ShardTable, *store.Shard) {
	t.Helper()
	spec := storetest.Spec(capacity)
	spec.Remover = store.RemoverNone
	sh := storetest.Create(t, spec)
	if cfg.Name == "" {
		cfg.Name = "shard"
	}
	if cfg.Sampler == nil {
		cfg.Sampler = NewUniform()
	}
	if cfg.Remover == nil {
		cfg.Remover = NewFIFO()
	}
	st, err := NewShardTable(sh, cfg, WithPollInterval(200*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st, sh
}

// commitRow writes payload k into a row of sh (any handle: the owner's, or
// one standing for a writer process) and commits it with key k and
// priority p.
func commitRow(t *testing.T, ctx context.Context, sh *store.Shard, k uint64, p float64) {
	t.Helper()
	row, err := sh.Allocate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	storetest.Fill(row, k)
	if _, err := row.CommitKey(k, p); err != nil {
		t.Fatal(err)
	}
}

func fill(id uint64) func(store.Pending) error {
	return func(p store.Pending) error { storetest.Fill(p, id); return nil }
}

// checkCollected verifies that item k of whole-trajectory buffers holds payload
// want.
func checkCollected(t *testing.T, sh *store.Shard, bufs [][]byte, k int, want uint64) {
	t.Helper()
	if err := collectedItem(sh, bufs, k, want); err != nil {
		t.Fatal(err)
	}
}

// collectedItem is checkCollected's check, as an error.
func collectedItem(sh *store.Shard, bufs [][]byte, k int, want uint64) error {
	blocks := make([][]byte, len(bufs))
	for c := range bufs {
		n := sh.BlockBytes(c)
		blocks[c] = bufs[c][k*n : (k+1)*n]
	}
	id, err := storetest.Check(blocks)
	if err != nil {
		return fmt.Errorf("item %d: %v", k, err)
	}
	if id != want {
		return fmt.Errorf("item %d holds payload %d, want %d", k, id, want)
	}
	return nil
}

func TestShardTableInsertSampleCollect(t *testing.T) {
	st, sh := shardTable(t, 32, Config{MaxSize: 20, Seed: 3})
	ctx := context.Background()
	for k := range uint64(25) {
		if _, err := st.Insert(ctx, k, 1, fill(k)); err != nil {
			t.Fatal(err)
		}
	}
	// The FIFO remover kept keys 5..24 and released the other rows.
	if got := keysOf(st.Items(nil)); !slices.Equal(got, []uint64{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24}) {
		t.Fatalf("keys %v", got)
	}
	if s := sh.Stats(); s.Committed != 20 || s.Free != 12 {
		t.Fatalf("shard stats %+v", s)
	}
	b, err := st.Sample(ctx, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	idx := make([]int, len(b.Items))
	for i, s := range b.Items {
		idx[i] = s.Index
	}
	bufs, err := st.Collect(ctx, idx, testColumns, Window{})
	if err != nil {
		t.Fatal(err)
	}
	for k, s := range b.Items {
		checkCollected(t, sh, bufs, k, s.Key)
	}
}

func TestShardTableAdmitsOtherHandlesCommits(t *testing.T) {
	st, sh := shardTable(t, 16, Config{})
	ctx := context.Background()
	// A second handle stands for a writer process.
	w, err := store.Attach(ctx, sh.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for k := range uint64(5) {
		commitRow(t, ctx, w, 100+k, float64(k))
	}
	if err := st.WaitAdmitted(ctx, w.CommitSeq()); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(st.Items(nil)); !slices.Equal(got, []uint64{100, 101, 102, 103, 104}) {
		t.Fatalf("keys %v", got)
	}
	it, _ := st.Get(103)
	if it.Priority != 3 || it.Seq != 3 {
		t.Fatalf("item %+v", it)
	}
}

func TestShardTableAdmitsRowsCommittedBefore(t *testing.T) {
	spec := storetest.Spec(8)
	spec.Remover = store.RemoverNone
	sh := storetest.Create(t, spec)
	ctx := context.Background()
	for k := range uint64(3) {
		p, _ := sh.Allocate(ctx)
		storetest.Fill(p, k)
		if _, err := p.CommitKey(k, 1); err != nil {
			t.Fatal(err)
		}
	}
	st, err := NewShardTable(sh, Config{Name: "late", Sampler: NewUniform(), Remover: NewFIFO()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.WaitAdmitted(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if n := st.Info().Size; n != 3 {
		t.Fatalf("size %d, want 3", n)
	}
}

func TestShardTableQueueHoldsDeletedRows(t *testing.T) {
	st, sh := shardTable(t, 8, Config{MaxSize: 3, Sampler: NewFIFO(), Remover: NewFIFO(),
		RateLimit: Queue(3), MaxTimesSampled: 1})
	ctx := context.Background()
	for k := range uint64(3) {
		if _, err := st.Insert(ctx, k, 1, fill(k)); err != nil {
			t.Fatal(err)
		}
	}
	// The 4th commit succeeds in the shard but waits for admission.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := st.Insert(short, 3, 1, fill(3)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("4th insert: %v, want a deadline error", err)
	}
	b, err := st.Sample(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := sampledKeys(b.Items); !slices.Equal(got, []uint64{0, 1}) {
		t.Fatalf("queue gave %v", got)
	}
	if err := st.WaitAdmitted(ctx, 4); err != nil {
		t.Fatalf("the 4th row was not admitted after a sample: %v", err)
	}
	// Sampled items were deleted, but their rows are held for collection.
	if info := st.Info(); info.Held != 2 || info.Size != 2 {
		t.Fatalf("info %+v", info)
	}
	bufs, err := st.Collect(ctx, []int{b.Items[0].Index, b.Items[1].Index}, testColumns, Window{})
	if err != nil {
		t.Fatal(err)
	}
	checkCollected(t, sh, bufs, 0, 0)
	checkCollected(t, sh, bufs, 1, 1)
	free := sh.Stats().Free
	b.Release()
	b.Release()
	if s := sh.Stats(); s.Free != free+2 || st.Info().Held != 0 {
		t.Fatalf("after Release: free %d (was %d), held %d", s.Free, free, st.Info().Held)
	}
	if _, err := st.Collect(ctx, []int{b.Items[0].Index}, testColumns, Window{}); err == nil {
		t.Fatal("collected a released, deleted row")
	}
}

func TestShardTableRefusesAndDeduplicates(t *testing.T) {
	p, _ := NewPrioritized(1)
	st, sh := shardTable(t, 8, Config{Sampler: p})
	ctx := context.Background()
	if _, err := st.Insert(ctx, 1, -1, fill(1)); err == nil {
		t.Fatal("negative priority accepted")
	}
	// A writer that bypasses the check gets its row refused and released.
	pend, _ := sh.Allocate(ctx)
	storetest.Fill(pend, 2)
	if _, err := pend.CommitKey(2, -5); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Insert(ctx, 3, 2, fill(3)); err != nil {
		t.Fatal(err)
	}
	// The same key again only sets the priority; its new row is released.
	if _, err := st.Insert(ctx, 3, 7, fill(33)); err != nil {
		t.Fatal(err)
	}
	info := st.Info()
	if info.Refused != 1 || info.LastRefusal == nil || info.Size != 1 || info.Inserts != 1 {
		t.Fatalf("info %+v", info)
	}
	if it, _ := st.Get(3); it.Priority != 7 {
		t.Fatalf("key 3: %+v", it)
	}
	if s := sh.Stats(); s.Committed != 1 {
		t.Fatalf("shard holds %d committed rows, want 1", s.Committed)
	}
	if err := st.MutatePriorities([]Update{{3, 4}}, nil); err != nil {
		t.Fatal(err)
	}
	it, _ := st.Get(3)
	if rs, err := sh.Status(store.Ref{Index: it.Index, Seq: it.Seq}); err != nil || rs.Priority != 4 {
		t.Fatalf("shard status %+v %v, want priority 4", rs, err)
	}
}

func TestShardTableRefusesShardWithRemover(t *testing.T) {
	sh := storetest.Create(t, storetest.Spec(4))
	if _, err := NewShardTable(sh, Config{Name: "x", Sampler: NewUniform(), Remover: NewFIFO()}); err == nil {
		t.Fatal("a shard with its own remover accepted")
	}
	spec := storetest.Spec(4)
	spec.Remover = store.RemoverNone
	sh2 := storetest.Create(t, spec)
	if _, err := NewShardTable(sh2, Config{Name: "x", MaxSize: 5, Sampler: NewUniform(), Remover: NewFIFO()}); err == nil {
		t.Fatal("max size above capacity accepted")
	}
}

func TestCollectWindow(t *testing.T) {
	st, sh := shardTable(t, 4, Config{})
	ctx := context.Background()
	ref, err := st.Insert(ctx, 9, 1, fill(9))
	if err != nil {
		t.Fatal(err)
	}
	obs, _ := sh.Column("obs")
	fb := sh.ColumnSpec(obs).FrameBytes() // "obs" has 4 frames
	v, _ := sh.Read(ref)
	block := slices.Clone(v.Block(obs))
	v.Done()
	frame := func(i int) []byte { return block[i*fb : (i+1)*fb] }
	zero := make([]byte, fb)
	for _, c := range []struct {
		w    Window
		want [][]byte
	}{
		{Window{Offset: 1, Length: 2}, [][]byte{frame(1), frame(2)}},
		{Window{Offset: 2, Length: 4}, [][]byte{frame(2), frame(3), zero, zero}},
		{Window{Offset: 2, Length: 4, Pad: PadHead}, [][]byte{zero, zero, frame(2), frame(3)}},
		{Window{Offset: 7, Length: 1}, [][]byte{zero}},
		{Window{}, [][]byte{frame(0), frame(1), frame(2), frame(3)}},
	} {
		dst := [][]byte{slices.Repeat([]byte{0xAA}, 10*fb)} // dirty, reused buffer
		got, err := st.CollectInto(ctx, dst, []int{ref.Index, ref.Index}, []string{"obs"}, c.w)
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Concat(slices.Concat(c.want...), slices.Concat(c.want...))
		if !slices.Equal(got[0], want) {
			t.Fatalf("window %+v: wrong bytes", c.w)
		}
	}
	for _, bad := range []Window{{Offset: -1, Length: 1}, {Length: -2}, {Length: 1, Pad: 7}} {
		if _, err := st.Collect(ctx, []int{ref.Index}, []string{"obs"}, bad); err == nil {
			t.Fatalf("window %+v accepted", bad)
		}
	}
	if _, err := st.Collect(ctx, []int{ref.Index}, []string{"nope"}, Window{}); err == nil {
		t.Fatal("unknown column accepted")
	}
	if _, err := st.Collect(ctx, []int{3}, []string{"obs"}, Window{}); err == nil {
		t.Fatal("an empty row collected")
	}
}

// TestCollectParallel collects a batch big enough to be split among goroutines and
// checks every item.
func TestCollectParallel(t *testing.T) {
	spec := store.Spec{Capacity: 17, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{256, 256}, Length: 4},
		{Name: "meta", DType: store.Int64, Shape: []int{4}, Length: 1},
	}}
	sh := storetest.Create(t, spec)
	st, err := NewShardTable(sh, Config{Name: "par", Sampler: NewUniform(), Remover: NewFIFO()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	var idx []int
	var keys []uint64
	for k := range uint64(16) {
		ref, err := st.Insert(ctx, k, 1, fill(k))
		if err != nil {
			t.Fatal(err)
		}
		idx = append(idx, ref.Index)
		keys = append(keys, k)
	}
	// Every row three times: 48 x 1 MiB, over the parallel threshold.
	idx = slices.Repeat(idx, 3)
	keys = slices.Repeat(keys, 3)
	if n := len(idx) * sh.BlockBytes(0); n < parallelCopyBytes {
		t.Fatalf("%d bytes do not reach the parallel threshold", n)
	}
	bufs, err := st.Collect(ctx, idx, []string{"obs", "meta"}, Window{})
	if err != nil {
		t.Fatal(err)
	}
	n := sh.BlockBytes(0)
	for k := range idx {
		if k < 16 {
			checkCollected(t, sh, bufs, k, keys[k])
		} else if !slices.Equal(bufs[0][k*n:(k+1)*n], bufs[0][(k%16)*n:(k%16+1)*n]) {
			t.Fatalf("item %d differs from item %d, a copy of the same row", k, k%16)
		}
	}
}

func TestShardTableClose(t *testing.T) {
	st, _ := shardTable(t, 4, Config{Sampler: NewFIFO(), Remover: NewFIFO(), RateLimit: Queue(1), MaxTimesSampled: 1})
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { _, err := st.Sample(ctx, 1); done <- err }()
	waitFor(t, "a blocked sample", func() bool { return st.Info().BlockedSamples == 1 })
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked sample got %v", err)
	}
	if _, err := st.Insert(ctx, 1, 1, fill(1)); err == nil {
		t.Fatal("insert after Close accepted")
	}
}

// TestShardTableOverRestoredShard: a table over a shard restored from a checkpoint
// admits the rows the checkpoint holds.
func TestShardTableOverRestoredShard(t *testing.T) {
	st, sh := shardTable(t, 8, Config{})
	ctx := context.Background()
	for k := range uint64(5) {
		if _, err := st.Insert(ctx, k, float64(k), fill(k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.MutatePriorities([]Update{{2, 9}}, []uint64{4}); err != nil {
		t.Fatal(err)
	}
	rt := restoreTable(t, ctx, sh.Checkpoint, Config{Name: "restored", Sampler: NewUniform(), Remover: NewFIFO()})
	restored := rt.Shard()
	if err := pollUntil("four rows", func() bool { return rt.Info().Size == 4 }); err != nil {
		t.Fatal(err)
	}
	if it, ok := rt.Get(2); !ok || it.Priority != 9 {
		t.Fatalf("key 2: %+v %v, want priority 9", it, ok)
	}
	b, err := rt.Sample(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	idx := make([]int, len(b.Items))
	for i, x := range b.Items {
		idx[i] = x.Index
	}
	bufs, err := rt.Collect(ctx, idx, testColumns, Window{})
	if err != nil {
		t.Fatal(err)
	}
	for k, x := range b.Items {
		checkCollected(t, restored, bufs, k, x.Key)
	}
}

// restoreTable writes a checkpoint with save (a shard's or a table's
// Checkpoint), restores it into a fresh shard and builds a table with cfg
// over it; both are closed at the end of the test.
func restoreTable(t *testing.T, ctx context.Context, save func(context.Context, string, ...store.Option) error, cfg Config) *ShardTable {
	t.Helper()
	path := t.TempDir() + "/shard.ckpt"
	if err := save(ctx, path); err != nil {
		t.Fatal(err)
	}
	restored, err := store.Restore(ctx, path, storetest.Name(t, "restored"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restored.Close() })
	rt, err := NewShardTable(restored, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// TestShardTableCheckpointKeepsCounts: ShardTable.Checkpoint writes the
// times each item was sampled into its row, so that a table over the
// restored shard goes on toward max_times_sampled where the first was; and
// a restored queue (an item leaves at its first sample) gives one sample per
// row it holds, as Reverb's checkpointed limiter does, where counting each
// row as an insert and a sample left its limiter at zero: no sample at all.
func TestShardTableCheckpointKeepsCounts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	restore := func(st *ShardTable, cfg Config) *ShardTable { return restoreTable(t, ctx, st.Checkpoint, cfg) }

	fifo3 := func() Config { return Config{Sampler: NewFIFO(), Remover: NewFIFO(), MaxTimesSampled: 3} }
	st, _ := shardTable(t, 8, fifo3())
	for k := range uint64(2) {
		if _, err := st.Insert(ctx, k, 1, fill(k)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if b, err := st.Sample(ctx, 1); err != nil || b.Items[0].Key != 0 {
			t.Fatalf("sample: %v %v", b, err)
		}
	}
	rt := restore(st, fifo3())
	if it, ok := rt.Get(0); !ok || it.TimesSampled != 2 {
		t.Fatalf("restored key 0: %+v %v, want sampled twice", it, ok)
	}
	b, err := rt.Sample(ctx, 1)
	if err != nil || b.Items[0].Key != 0 || b.Items[0].TimesSampled != 3 {
		t.Fatalf("third sample of key 0: %+v %v", b, err)
	}
	if _, ok := rt.Get(0); ok {
		t.Fatal("key 0 still held after its third sample")
	}

	queue := func() Config {
		return Config{Sampler: NewFIFO(), Remover: NewFIFO(), RateLimit: Queue(8), MaxTimesSampled: 1}
	}
	qt, _ := shardTable(t, 8, queue())
	for k := range uint64(4) {
		if _, err := qt.Insert(ctx, k, 1, fill(k)); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := qt.Sample(ctx, 1); err != nil || b.Items[0].Key != 0 {
		t.Fatalf("queue sample: %v %v", b, err)
	}
	rq := restore(qt, queue())
	for k := uint64(1); k < 4; k++ {
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		b, err := rq.Sample(sctx, 1)
		scancel()
		if err != nil || b.Items[0].Key != k {
			t.Fatalf("restored queue, sample %d: %+v %v (info %+v)", k, b, err, rq.Info())
		}
	}
	sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer scancel()
	if b, err := rq.Sample(sctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sample of an empty restored queue: %+v %v", b, err)
	}
}

// TestShardInfoWaiting: a writer's commits do not wait for the rate limiter,
// admission does; Info().Waiting counts the rows it holds back.
func TestShardInfoWaiting(t *testing.T) {
	st, sh := shardTable(t, 8, Config{Sampler: NewFIFO(), Remover: NewFIFO(), RateLimit: Queue(2), MaxTimesSampled: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for k := range uint64(5) {
		p, err := sh.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.CommitKey(k, 1); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "two admitted, three waiting", func() bool {
		i := st.Info()
		return i.Size == 2 && i.Waiting == 3
	})
	if _, err := st.Sample(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "one more admitted", func() bool { return st.Info().Waiting == 2 })
}

// TestShardTableKeepsWritersGoing: with the default max size (capacity - 1) a
// writer always finds a row, however many trajectories it writes.
func TestShardTableKeepsWritersGoing(t *testing.T) {
	st, sh := shardTable(t, 4, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for k := range uint64(12) {
		if _, err := st.Insert(ctx, k, 1, fill(k)); err != nil {
			t.Fatalf("insert %d: %v", k, err)
		}
	}
	if got := keysOf(st.Items(nil)); !slices.Equal(got, []uint64{9, 10, 11}) {
		t.Fatalf("keys %v", got)
	}
	if s := sh.Stats(); s.Committed != 3 || s.Free != 1 {
		t.Fatalf("shard stats %+v", s)
	}
}

// TestShardTableFreesEvictedRowsInRowOrder: the rows that one ingest pass
// evicts go back to the shard's free queue in the order of their rows, not
// in the order of their commits, so that writers taking rows next get runs
// of neighbouring rows rather than rows between each other's (which share
// the cache lines of packed columns).
func TestShardTableFreesEvictedRowsInRowOrder(t *testing.T) {
	const capacity, maxSize, burst = 128, 16, 48
	st, sh := shardTable(t, capacity, Config{MaxSize: maxSize})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	commit := func(p store.Pending, k uint64) {
		t.Helper()
		storetest.Fill(p, k)
		if _, err := p.CommitKey(k, 1); err != nil {
			t.Fatal(err)
		}
	}
	for k := range uint64(maxSize) {
		p, err := sh.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		commit(p, k)
	}
	if err := st.WaitAdmitted(ctx, sh.CommitSeq()); err != nil {
		t.Fatal(err)
	}
	order := map[int]bool{} // every row committed
	for r := range sh.Rows() {
		order[r.Index] = true
	}
	pend := make([]store.Pending, burst)
	for i := range pend {
		p, err := sh.Allocate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pend[i] = p
		order[p.Index()] = true
	}
	// Holding the table's lock keeps ingest from admitting anything while
	// the burst is committed, highest row first: the burst then reaches the
	// table in at most two passes (the rows ingest read before it waited on
	// the lock, and the rest), and evicts the first 48 commits.
	st.t.mu.Lock()
	for i := len(pend) - 1; i >= 0; i-- {
		commit(pend[i], uint64(100+i))
	}
	st.t.mu.Unlock()
	if err := st.WaitAdmitted(ctx, sh.CommitSeq()); err != nil {
		t.Fatal(err)
	}
	for sh.Removals() < burst {
		if ctx.Err() != nil {
			t.Fatalf("%d rows released, want %d", sh.Removals(), burst)
		}
		time.Sleep(time.Millisecond)
	}
	for r := range sh.Rows() {
		delete(order, r.Index) // still in the table
	}
	if len(order) != burst {
		t.Fatalf("%d rows evicted, want %d", len(order), burst)
	}
	// Take every free row (and keep it: the shard's Close ends them): the
	// rows never used come first, then the evicted ones in the order they
	// went back.
	var freed []int
	for {
		short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
		p, err := sh.Allocate(short)
		stop()
		if err != nil {
			break
		}
		if _, ok := order[p.Index()]; ok {
			freed = append(freed, p.Index())
		}
	}
	if len(freed) != burst {
		t.Fatalf("took %d of the %d evicted rows back: %v", len(freed), burst, freed)
	}
	descents := 0
	for i := 1; i < len(freed); i++ {
		if freed[i] < freed[i-1] {
			descents++
		}
	}
	if descents > 1 {
		t.Fatalf("evicted rows went back as %v: %d descents, want at most 1 (two passes, each in row order)", freed, descents)
	}
}

// TestShardTablePassWaitingOnLimiter: an ingest pass admits its rows under
// one hold of the table's lock and gives back its evictions' rows at its
// end; when an admission in the middle waits on the rate limiter, what the
// pass did before it (the rows admitted, the rows evicted) is published
// first, so that neither a WaitAdmitted nor a writer waits on the sampler.
func TestShardTablePassWaitingOnLimiter(t *testing.T) {
	st, sh := shardTable(t, 32, Config{MaxSize: 4, RateLimit: Queue(8)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st.t.mu.Lock() // the ten commits reach ingest in at most two passes
	for k := range uint64(10) {
		p, err := sh.Allocate(ctx)
		if err != nil {
			st.t.mu.Unlock()
			t.Fatal(err)
		}
		storetest.Fill(p, k)
		if _, err := p.CommitKey(k, 1); err != nil {
			st.t.mu.Unlock()
			t.Fatal(err)
		}
	}
	st.t.mu.Unlock()
	// The queue of 8 lets 8 inserts in; the ninth waits for a sample.
	if err := st.WaitAdmitted(ctx, 8); err != nil {
		t.Fatal(err)
	}
	for sh.Removals() < 4 {
		if ctx.Err() != nil {
			t.Fatalf("%d rows released while admission waits, want 4", sh.Removals())
		}
		time.Sleep(time.Millisecond)
	}
	if info := st.Info(); info.Admitted != 8 || info.Size != 4 || info.Waiting != 2 {
		t.Fatalf("admitted %d, size %d, waiting %d: want 8, 4, 2", info.Admitted, info.Size, info.Waiting)
	}
	for range 2 {
		b, err := st.Sample(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		b.Release()
	}
	if err := st.WaitAdmitted(ctx, 10); err != nil {
		t.Fatal(err)
	}
}

// TestShardTableOnDeleteAfterRelease: the caller's OnDelete sees every item
// the table evicts, once, after its row went back to the shard, also when
// an ingest pass holds its evictions back to give them back in row order.
func TestShardTableOnDeleteAfterRelease(t *testing.T) {
	spec := storetest.Spec(256)
	spec.Remover = store.RemoverNone
	sh := storetest.Create(t, spec)
	var deleted []uint64
	var stale int
	st, err := NewShardTable(sh, Config{Name: "hook", Sampler: NewUniform(), Remover: NewFIFO(), MaxSize: 8,
		OnDelete: func(it Item) {
			deleted = append(deleted, it.Key)
			if _, err := sh.Status(store.Ref{Index: it.Index, Seq: it.Seq}); errors.Is(err, store.ErrStale) {
				stale++
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 200
	for k := range uint64(n) {
		commitRow(t, ctx, sh, k, 1)
	}
	if err := st.WaitAdmitted(ctx, n); err != nil {
		t.Fatal(err)
	}
	st.t.mu.Lock() // OnDelete runs under the table's lock: the pass is over
	got, released := slices.Clone(deleted), stale
	st.t.mu.Unlock()
	slices.Sort(got)
	want := make([]uint64, n-8)
	for i := range want {
		want[i] = uint64(i)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("OnDelete saw keys %v, want 0 to %d once each", got, n-9)
	}
	if released != len(got) {
		t.Fatalf("OnDelete saw %d of %d items before their rows were released", len(got)-released, len(got))
	}
}

// TestShardTableWaitsWakeTheIngest: while commits come the ingest naps for
// up to a few milliseconds (streamNap), and when they stop for up to the
// poll interval; a call of the owner's process that waits for commits
// wakes it instead of waiting out the nap: WaitAdmitted, and a call that
// waits on the rate limiter while commits wait for admission. A call that
// waits with nothing in the log, and the ingest's own waits on the limiter
// in a pass, leave the nap alone.
func TestShardTableWaitsWakeTheIngest(t *testing.T) {
	spec := storetest.Spec(16)
	spec.Remover = store.RemoverNone
	sh := storetest.Create(t, spec)
	st, err := NewShardTable(sh, Config{Name: "wake", Sampler: NewUniform(), Remover: NewFIFO(), RateLimit: MinSize(2)},
		WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := store.Attach(ctx, sh.Name()) // a writer process
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	woke := func(what string, want bool, f func()) {
		t.Helper()
		before := st.nap.mark()
		f()
		if got := st.nap.mark() != before; got != want {
			t.Errorf("%s: woke the ingest %v, want %v", what, got, want)
		}
	}

	// Waits that wake it.
	woke("WaitAdmitted of a commit to come", true, func() {
		short, stop := context.WithTimeout(ctx, 20*time.Millisecond)
		defer stop()
		if err := st.WaitAdmitted(short, w.CommitSeq()+1); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitAdmitted of a commit never made: %v, want the deadline", err)
		}
	})
	st.t.mu.Lock()
	commitRow(t, ctx, w, 1, 1)
	woke("a wait on the limiter with a commit in the log", true, st.beforeWaitLocked)
	st.t.mu.Unlock()

	// Waits that do not.
	if err := st.WaitAdmitted(ctx, w.CommitSeq()); err != nil {
		t.Fatal(err)
	}
	woke("a sample waiting for a second item with none in the log", false, func() {
		short, stop := context.WithTimeout(ctx, 20*time.Millisecond)
		defer stop()
		if _, err := st.Sample(short, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("sample of a table of one item under MinSize(2): %v, want the deadline", err)
		}
	})
	st.t.mu.Lock()
	commitRow(t, ctx, w, 2, 1)
	st.beginPassLocked()
	woke("the ingest's own wait on the limiter in a pass", false, st.beforeWaitLocked)
	st.deferring = false
	st.t.mu.Unlock()

	// The poll interval is an hour: the second item comes in through the
	// wake of a sample waiting for it, or of WaitAdmitted.
	b, err := st.Sample(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
	if err := st.WaitAdmitted(ctx, w.CommitSeq()); err != nil {
		t.Fatal(err)
	}
	if n := st.Info().Size; n != 2 {
		t.Fatalf("size %d, want 2", n)
	}
}
