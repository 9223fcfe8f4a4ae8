package sample

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/sample/sampletest"
	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// distItem is one item of a test world: its shard, key and priority.
type distItem struct {
	shard int
	key   uint64
	prio  float64
}

// unequalItems spreads items over 4 shards of sizes 7, 40, 0 (empty) and 23, with
// a few zero priorities.
func unequalItems() []distItem {
	r := newRand(42)
	var items []distItem
	key := uint64(0)
	for s, n := range []int{7, 40, 0, 23} {
		for range n {
			p := 0.05 + 4*r.Float64()
			if key%9 == 4 {
				p = 0
			}
			items = append(items, distItem{s, key, p})
			key++
		}
	}
	return items
}

// runDist builds a world of len(locals) ranks over loopback, makes a distributed
// table of each rank's local shard, and runs fn on every rank.
func runDist(t *testing.T, locals []Local, opts []DistOption, fn func(ctx context.Context, r int, d *DistTable) error) {
	t.Helper()
	runDistOver(t, collectivetest.Loopback, locals, opts, fn)
}

// runDistOver is runDist over the given transport.
func runDistOver(t *testing.T, transport string, locals []Local, opts []DistOption, fn func(ctx context.Context, r int, d *DistTable) error) {
	t.Helper()
	comms, _ := collectivetest.Comms(t, len(locals), collectivetest.Config{Transport: transport, Timeout: 120 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	errs := collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) error {
		d, err := NewDistTable(ctx, c, locals[c.Rank()], opts...)
		if err != nil {
			return err
		}
		defer d.Close()
		return fn(ctx, c.Rank(), d)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// pollUntil polls cond for up to 10 s (for goroutines that may not fail the test).
func pollUntil(what string, cond func() bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// localTables builds one plain table per shard holding items.
func localTables(t *testing.T, shards int, items []distItem, mk func() (Selector, Selector), maxTimes int64, rl RateLimit, clock func() time.Time) []Local {
	t.Helper()
	locals := make([]Local, shards)
	tables := make([]*Table, shards)
	for s := range shards {
		sampler, remover := mk()
		tb, err := NewTable(Config{Name: "dist", MaxSize: 1000, Sampler: sampler, Remover: remover,
			MaxTimesSampled: maxTimes, RateLimit: rl, Clock: clock, Seed: uint64(s)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tb.Close() })
		locals[s], tables[s] = tb, tb
	}
	for _, it := range items {
		mustInsert(t, tables[it.shard], it.key, it.prio)
	}
	return locals
}

func prioritizedPair(exp float64) func() (Selector, Selector) {
	return func() (Selector, Selector) {
		p, _ := NewPrioritized(exp)
		return p, NewFIFO()
	}
}

// TestDistributedDistribution: the split draw, the centralized draw and the
// single-process selector give the distribution p^c / sum p^c over 4 ranks with
// unequal shards (one empty).
func TestDistributedDistribution(t *testing.T) {
	const exp, batches, batch = 0.8, 40, 1024
	items := unequalItems()
	want := make([]float64, len(items))
	var total float64
	for i, it := range items {
		if it.prio > 0 {
			want[i] = math.Pow(it.prio, exp)
		}
		total += want[i]
	}
	byKey := func(counts []int, s []Sampled) {
		for _, x := range s {
			counts[x.Key]++
			if w := want[x.Key] / total; math.Abs(x.Probability-w) > 1e-9 {
				t.Fatalf("key %d: probability %v, want %v", x.Key, x.Probability, w)
			}
		}
	}
	check := func(name string, counts []int) {
		t.Helper()
		stat, dof, p, err := sampletest.ChiSquare(counts, want)
		if err != nil {
			t.Fatal(err)
		}
		if p < 0.001 {
			t.Errorf("%s: chi-square %.1f on %d dof: p = %.3g < 0.001", name, stat, dof, p)
		}
	}

	// Single process: one table holding everything.
	single := tableOf(t, KindPrioritized, KindFIFO, 1000, MinSize(1), 0)
	single.sampler.(*Prioritized).exponent = exp
	for _, it := range items {
		mustInsert(t, single, it.key, it.prio)
	}
	counts := make([]int, len(items))
	for range batches {
		s, err := single.Sample(context.Background(), batch)
		if err != nil {
			t.Fatal(err)
		}
		byKey(counts, s)
	}
	check("single process", counts)

	for _, mode := range []Mode{ModeSplit, ModeCentralized} {
		locals := localTables(t, 4, items, prioritizedPair(exp), 0, MinSize(1), nil)
		counts := make([]int, len(items))
		var first [][]uint64
		var mu sync.Mutex
		runDist(t, locals, []DistOption{WithMode(mode), WithSeed(7)}, func(ctx context.Context, r int, d *DistTable) error {
			var keys [][]uint64
			for range batches {
				b, err := d.Sample(ctx, batch)
				if err != nil {
					return err
				}
				if len(b.Items) != batch {
					return fmt.Errorf("batch of %d", len(b.Items))
				}
				keys = append(keys, sampledKeys(b.Items))
				if r == 0 {
					byKey(counts, b.Items)
				}
				for _, x := range b.Items {
					if items[x.Key].shard != x.Index/d.Capacity() {
						return fmt.Errorf("key %d has global index %d, not on shard %d", x.Key, x.Index, items[x.Key].shard)
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if first == nil {
				first = keys
			} else if !slices.EqualFunc(first, keys, slices.Equal) {
				return errors.New("ranks got different batches")
			}
			return nil
		})
		check(mode.String(), counts)
		// Every rank counted the samples of its own items; the sum is the total.
		var sampled int64
		for _, l := range locals {
			sampled += l.localTable().Info().Samples
		}
		if sampled != batches*batch {
			t.Errorf("%v: shards counted %d samples, want %d", mode, sampled, batches*batch)
		}
	}
}

// TestDistributedSameSeedSameSelection runs the split draw twice from the same
// state and seed.
func TestDistributedSameSeedSameSelection(t *testing.T) {
	items := unequalItems()
	run := func(mode Mode) []uint64 {
		locals := localTables(t, 4, items, prioritizedPair(1), 0, MinSize(1), nil)
		var out []uint64
		runDist(t, locals, []DistOption{WithMode(mode), WithSeed(99)}, func(ctx context.Context, r int, d *DistTable) error {
			for range 3 {
				b, err := d.Sample(ctx, 100)
				if err != nil {
					return err
				}
				if r == 1 {
					out = append(out, sampledKeys(b.Items)...)
				}
			}
			return nil
		})
		return out
	}
	for _, mode := range []Mode{ModeSplit, ModeCentralized} {
		if a, b := run(mode), run(mode); !slices.Equal(a, b) {
			t.Errorf("%v: two runs with one seed differ", mode)
		}
	}
}

// TestDecentralizedEqualsGlobalSort: with max_times_sampled 1 a batch is the head
// of the global order, which for top-k (MaxHeap) and FIFO is a global sort.
func TestDecentralizedEqualsGlobalSort(t *testing.T) {
	for _, kind := range []Kind{KindMaxHeap, KindFIFO, KindMinHeap, KindLIFO} {
		r := newRand(uint64(kind) + 10)
		var items []distItem
		for k := range uint64(120) {
			s := int(r.IntN(7)) % 4
			items = append(items, distItem{s, k, float64(r.IntN(6))}) // ties
		}
		clock := counterClock() // one clock: inserts are ordered across shards
		mk := func() (Selector, Selector) { return newSelector(t, kind, 1), NewFIFO() }
		locals := localTables(t, 4, items, mk, 1, MinSize(1), clock)
		// The global sort: by priority (heaps) or insertion time, ties by
		// shard, then by the shard's own order.
		type ranked struct {
			it  distItem
			ins int64
			pos int
		}
		var all []ranked
		for s, l := range locals {
			top, _ := l.localTable().Top(1000, nil)
			for pos, it := range top {
				all = append(all, ranked{distItem{s, it.Key, it.Priority}, it.Inserted, pos})
			}
		}
		slices.SortStableFunc(all, func(a, b ranked) int {
			var c int
			switch kind {
			case KindMaxHeap:
				c = cmp.Compare(b.it.prio, a.it.prio)
			case KindMinHeap:
				c = cmp.Compare(a.it.prio, b.it.prio)
			case KindFIFO:
				c = cmp.Compare(a.ins, b.ins)
			case KindLIFO:
				c = cmp.Compare(b.ins, a.ins)
			}
			if c != 0 {
				return c
			}
			if c = cmp.Compare(a.it.shard, b.it.shard); c != 0 {
				return c
			}
			return cmp.Compare(a.pos, b.pos)
		})
		var want []uint64
		for _, a := range all {
			want = append(want, a.it.key)
		}
		runDist(t, locals, nil, func(ctx context.Context, rk int, d *DistTable) error {
			if d.Mode() != ModeDecentralized {
				return fmt.Errorf("mode %v", d.Mode())
			}
			var got []uint64
			for len(got) < 100 {
				b, err := d.Sample(ctx, 25)
				if err != nil {
					return err
				}
				for _, x := range b.Items {
					if !x.Deleted || x.TimesSampled != 1 {
						return fmt.Errorf("pick %+v", x)
					}
				}
				got = append(got, sampledKeys(b.Items)...)
			}
			if !slices.Equal(got, want[:100]) {
				return fmt.Errorf("%v: got %v\nwant %v", kind, got, want[:100])
			}
			// Top lists the rest in the same order, sampling nothing.
			top, err := d.Top(ctx, 50)
			if err != nil {
				return err
			}
			if got := keysOf(top); !slices.Equal(got, want[100:]) {
				return fmt.Errorf("%v: top %v, want %v", kind, got, want[100:])
			}
			if err := d.Sync(ctx); err != nil {
				return err
			}
			if d.Info().Limiter.Samples != 100 {
				return fmt.Errorf("Top counted samples: %+v", d.Info().Limiter)
			}
			return nil
		})
	}
}

// TestDecentralizedRepeatsTheBest: without max_times_sampled, Reverb's semantics
// pick the first item of the order every time.
func TestDecentralizedRepeatsTheBest(t *testing.T) {
	items := []distItem{{0, 1, 3}, {1, 2, 9}, {2, 3, 9}, {1, 4, 1}}
	mk := func() (Selector, Selector) { return NewMaxHeap(), NewFIFO() }
	locals := localTables(t, 3, items, mk, 0, MinSize(1), nil)
	runDist(t, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
		b, err := d.Sample(ctx, 5)
		if err != nil {
			return err
		}
		for i, x := range b.Items {
			if x.Key != 2 || x.TimesSampled != int64(i+1) {
				return fmt.Errorf("pick %d: %+v, want key 2 (priority 9 on the lower shard)", i, x)
			}
		}
		return nil
	})
}

// TestCentralizedMaxTimesSampled checks the centralized draw's deletions against
// the global counts.
func TestCentralizedMaxTimesSampled(t *testing.T) {
	items := unequalItems()
	locals := localTables(t, 4, items, prioritizedPair(1), 2, MinSize(1), nil)
	positive := 0
	for _, it := range items {
		if it.prio > 0 {
			positive++
		}
	}
	runDist(t, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
		if d.Mode() != ModeCentralized {
			return fmt.Errorf("mode %v", d.Mode())
		}
		seen := map[uint64]int64{}
		for range 4 {
			b, err := d.Sample(ctx, 20)
			if err != nil {
				return err
			}
			for _, x := range b.Items {
				seen[x.Key]++
				if x.TimesSampled != seen[x.Key] || x.Deleted != (seen[x.Key] == 2) {
					return fmt.Errorf("pick %+v after %d", x, seen[x.Key])
				}
			}
		}
		if err := d.Sync(ctx); err != nil {
			return err
		}
		info := d.Info()
		var deleted int64
		for _, n := range seen {
			if n == 2 {
				deleted++
			}
		}
		if info.Limiter.Samples != 80 || info.Limiter.Deletes != deleted || info.Size != int64(len(items))-deleted {
			return fmt.Errorf("info %+v, %d deleted", info, deleted)
		}
		return nil
	})
}

// TestDistributedRateLimiter: a global MinSize blocks collective samples until the
// shards together hold enough items; a rank whose context ends stops every rank.
func TestDistributedRateLimiter(t *testing.T) {
	items := []distItem{{0, 1, 1}, {1, 2, 1}, {2, 3, 1}}
	locals := localTables(t, 3, items, func() (Selector, Selector) { return NewUniform(), NewFIFO() }, 0, MinSize(4), nil)
	runDist(t, locals, []DistOption{WithSyncInterval(time.Millisecond)}, func(ctx context.Context, r int, d *DistTable) error {
		short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		if r != 0 {
			short = ctx // only rank 0 gives up
		}
		_, err := d.Sample(short, 2)
		switch {
		case r == 0 && !errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("rank 0: %v, want a deadline error", err)
		case r != 0 && (err == nil || !strings.Contains(err.Error(), "rank 0")):
			return fmt.Errorf("rank %d: %v, want an error naming rank 0", r, err)
		}
		// A fourth item, on rank 2, lets the next sample through.
		if r == 2 {
			if err := d.Local().Insert(ctx, 4, 1, 0); err != nil {
				return err
			}
		}
		b, err := d.Sample(ctx, 2)
		if err != nil {
			return err
		}
		if len(b.Items) != 2 || d.Info().Size != 4 {
			return fmt.Errorf("batch %v, info %+v", b.Items, d.Info())
		}
		// The local table refuses samples of its own meanwhile.
		if _, err := d.Local().Sample(ctx, 1); err == nil {
			return errors.New("a shard of a distributed table sampled on its own")
		}
		return nil
	})
	// A bad batch size on one rank fails the call on every rank.
	runDist(t, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
		n := 1
		if r == 2 {
			n = 0
		}
		if _, err := d.Sample(ctx, n); err == nil || !strings.Contains(err.Error(), "want n >= 1") && !strings.Contains(err.Error(), "rank 2") {
			return fmt.Errorf("sample with a bad size on rank 2: %v", err)
		}
		return nil
	})
}

// TestDistributedInsertShares: a global Queue limiter admits only its room in
// inserts over all shards, and samples make room again.
func TestDistributedInsertShares(t *testing.T) {
	mk := func() (Selector, Selector) { return NewFIFO(), NewFIFO() }
	locals := localTables(t, 2, nil, mk, 1, Queue(4), counterClock())
	runDist(t, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
		// Only rank 1 inserts: six items, two more than a Queue(4) has room for.
		done := make(chan error, 1)
		if r == 1 {
			go func() {
				for k := range uint64(6) {
					if err := d.Local().Insert(ctx, k, 1, 0); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			// Its share of the room from NewDistTable was half; it waits.
			if err := pollUntil("a blocked insert", func() bool { return d.Local().Info().BlockedInserts == 1 }); err != nil {
				return err
			}
		}
		// A sync sees the demand and gives rank 1 the whole room.
		if err := d.Sync(ctx); err != nil {
			return err
		}
		if r == 1 {
			if err := pollUntil("four items", func() bool { return d.Local().Info().Size == 4 }); err != nil {
				return err
			}
			if b := d.Local().Info().BlockedInserts; b != 1 {
				return fmt.Errorf("%d blocked inserts with the queue full, want 1", b)
			}
		}
		if err := d.Sync(ctx); err != nil {
			return err
		}
		if got := d.Info().Size; got != 4 {
			return fmt.Errorf("%d items after the room of a Queue(4) was used, want 4", got)
		}
		b, err := d.Sample(ctx, 2)
		if err != nil {
			return err
		}
		if got := sampledKeys(b.Items); !slices.Equal(got, []uint64{0, 1}) {
			return fmt.Errorf("queue gave %v", got)
		}
		// The sample made room for the last two.
		if err := d.Sync(ctx); err != nil {
			return err
		}
		if r == 1 {
			if err := <-done; err != nil {
				return err
			}
		}
		if err := d.Sync(ctx); err != nil {
			return err
		}
		if got := d.Info().Size; got != 4 {
			return fmt.Errorf("%d items at the end, want 4", got)
		}
		return nil
	})
}

func TestDistTableRefusesMismatch(t *testing.T) {
	locals := make([]Local, 2)
	for r := range locals {
		p, _ := NewPrioritized(float64(r + 1))
		tb, err := NewTable(Config{Name: "m", MaxSize: 10, Sampler: p, Remover: NewFIFO()})
		if err != nil {
			t.Fatal(err)
		}
		defer tb.Close()
		locals[r] = tb
	}
	comms, _ := collectivetest.Comms(t, 2, collectivetest.Config{})
	errs := collectivetest.Each(context.Background(), comms, func(ctx context.Context, c *collective.Comm) error {
		_, err := NewDistTable(ctx, c, locals[c.Rank()])
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "exponent") {
			t.Errorf("rank %d: %v, want an error naming the exponent", r, err)
		}
	}
}

// TestDistributedCollect: three ranks (an odd count) with store shards; every
// rank samples the same batch and collects its own share of it, whole and through
// a window.
func TestDistributedCollect(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		t.Run(tr, func(t *testing.T) { testDistributedCollect(t, tr) })
	}
}

func testDistributedCollect(t *testing.T, transport string) {
	const ranks = 3
	locals := make([]Local, ranks)
	shards := make([]*store.Shard, ranks)
	for r := range ranks {
		spec := storetest.Spec(16)
		spec.Remover = store.RemoverNone
		shards[r] = storetest.Create(t, spec)
		st, err := NewShardTable(shards[r], Config{Name: "c", Sampler: NewUniform(), Remover: NewFIFO()}, WithPollInterval(200*time.Microsecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		for k := range uint64(5 + 3*r) {
			key := uint64(r)*100 + k
			if _, err := st.Insert(context.Background(), key, 1, fill(key)); err != nil {
				t.Fatal(err)
			}
		}
		locals[r] = st
	}
	runDistOver(t, transport, locals, []DistOption{WithSeed(5)}, func(ctx context.Context, r int, d *DistTable) error {
		b, err := d.Sample(ctx, 40)
		if err != nil {
			return err
		}
		defer b.Release()
		var idx []int
		var keys []uint64
		for i, x := range b.Items {
			if i%ranks != r && i%5 != 0 { // overlapping shares
				continue
			}
			idx = append(idx, x.Index)
			keys = append(keys, x.Key)
		}
		bufs, err := d.Collect(ctx, idx, testColumns, Window{})
		if err != nil {
			return err
		}
		for k := range idx {
			blocks := make([][]byte, len(bufs))
			for c := range bufs {
				n := shards[0].BlockBytes(c)
				blocks[c] = bufs[c][k*n : (k+1)*n]
			}
			id, err := storetest.Check(blocks)
			if err != nil {
				return fmt.Errorf("item %d (index %d): %v", k, idx[k], err)
			}
			if id != keys[k] {
				return fmt.Errorf("item %d holds payload %d, want %d", k, id, keys[k])
			}
		}
		// A window with head padding matches the local collection of the same
		// rows on their owner.
		w := Window{Offset: 2, Length: 3, Pad: PadHead}
		win, err := d.Collect(ctx, idx, []string{"act"}, w)
		if err != nil {
			return err
		}
		whole, err := d.Collect(ctx, idx, []string{"act"}, Window{})
		if err != nil {
			return err
		}
		fb := shards[0].ColumnSpec(1).FrameBytes()
		for k := range idx {
			got := win[0][k*3*fb : (k+1)*3*fb]
			want := slices.Concat(make([]byte, fb), whole[0][k*4*fb+2*fb:(k+1)*4*fb])
			if !slices.Equal(got, want) {
				return fmt.Errorf("window of item %d differs", k)
			}
		}
		// An index out of range is refused on every rank.
		bad := []int{0}
		if r == 1 {
			bad = []int{ranks * 16}
		}
		if _, err := d.Collect(ctx, bad, testColumns, Window{}); err == nil {
			return errors.New("an index out of range was collected")
		}
		// An index whose row holds nothing is an error on the rank that asked.
		empty := []int{}
		if r == 0 {
			empty = []int{2*16 + 15}
		}
		if _, err := d.Collect(ctx, empty, testColumns, Window{}); (err == nil) == (r == 0) {
			return fmt.Errorf("collect of an empty row: %v", err)
		}
		return nil
	})
}

// TestDistributedCollectLargeRows collects rows big enough to travel block by
// block, with deleted-but-held rows among them, over two ranks.
func TestDistributedCollectLargeRows(t *testing.T) {
	spec := store.Spec{Capacity: 8, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{64, 64}, Length: 4},
		{Name: "meta", DType: store.Int64, Shape: []int{4}, Length: 1},
	}}
	locals := make([]Local, 2)
	shards := make([]*store.Shard, 2)
	for r := range locals {
		shards[r] = storetest.Create(t, spec)
		st, err := NewShardTable(shards[r], Config{Name: "big", Sampler: NewFIFO(), Remover: NewFIFO(), MaxTimesSampled: 1},
			WithPollInterval(200*time.Microsecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		for k := range uint64(4) {
			key := uint64(r)*10 + k
			if _, err := st.Insert(context.Background(), key, 1, fill(key)); err != nil {
				t.Fatal(err)
			}
		}
		locals[r] = st
	}
	runDistOver(t, collectivetest.Shm, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
		b, err := d.Sample(ctx, 6)
		if err != nil {
			return err
		}
		// Every pick deleted its item; the owners hold the rows until Release.
		var idx []int
		for _, x := range b.Items {
			if !x.Deleted {
				return fmt.Errorf("pick %+v not deleted", x)
			}
			idx = append(idx, x.Index)
		}
		bufs, err := d.Collect(ctx, idx, []string{"obs", "meta"}, Window{})
		if err != nil {
			return err
		}
		for k, x := range b.Items {
			blocks := [][]byte{
				bufs[0][k*shards[0].BlockBytes(0) : (k+1)*shards[0].BlockBytes(0)],
				bufs[1][k*shards[0].BlockBytes(1) : (k+1)*shards[0].BlockBytes(1)],
			}
			id, err := storetest.Check(blocks)
			if err != nil || id != x.Key {
				return fmt.Errorf("item %d: payload %d (%v), want %d", k, id, err, x.Key)
			}
		}
		b.Release()
		if held := d.st.Info().Held; held != 0 {
			return fmt.Errorf("%d rows still held after Release", held)
		}
		return nil
	})
}

// TestDistributedCancelGrace: a rank whose peers never join a collective call
// gives up a grace period after its context ends, instead of hanging.
func TestDistributedCancelGrace(t *testing.T) {
	items := []distItem{{0, 1, 1}, {1, 2, 1}}
	locals := localTables(t, 2, items, func() (Selector, Selector) { return NewUniform(), NewFIFO() }, 0, MinSize(1), nil)
	released := make(chan struct{})
	runDist(t, locals, []DistOption{WithCancelGrace(50 * time.Millisecond)}, func(ctx context.Context, r int, d *DistTable) error {
		if r == 1 { // never joins the sample
			<-released
			return nil
		}
		defer close(released)
		short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, err := d.Sample(short, 1); err == nil {
			return errors.New("a sample without the other rank succeeded")
		}
		if el := time.Since(start); el > 30*time.Second {
			return fmt.Errorf("gave up after %v", el)
		}
		return nil
	})
}

// TestDistTableBadOptionOnOneRank: a rank with a bad option does not leave the
// others waiting.
func TestDistTableBadOptionOnOneRank(t *testing.T) {
	items := []distItem{{0, 1, 1}, {1, 2, 1}}
	locals := localTables(t, 2, items, func() (Selector, Selector) { return NewUniform(), NewFIFO() }, 0, MinSize(1), nil)
	comms, _ := collectivetest.Comms(t, 2, collectivetest.Config{})
	errs := collectivetest.Each(context.Background(), comms, func(ctx context.Context, c *collective.Comm) error {
		var opts []DistOption
		if c.Rank() == 1 {
			opts = append(opts, WithMode(ModeDecentralized)) // not for a uniform sampler
		}
		_, err := NewDistTable(ctx, c, locals[c.Rank()], opts...)
		return err
	})
	if errs == nil || !strings.Contains(errs[0].Error(), "rank 1") || !strings.Contains(errs[1].Error(), "decentralized") {
		t.Fatalf("errors %v", errs)
	}
}
