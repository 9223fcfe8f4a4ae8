package sample

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"
)

// tableOf builds a table whose sampler and remover are of the given kinds.
func tableOf(t *testing.T, sampler, remover Kind, maxSize int, rl RateLimit, maxTimes int64) *Table {
	t.Helper()
	tb, err := NewTable(Config{
		Name: "t", MaxSize: maxSize, Sampler: newSelector(t, sampler, 1), Remover: newSelector(t, remover, 1),
		RateLimit: rl, MaxTimesSampled: maxTimes, Seed: 1, Clock: counterClock(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Close() })
	return tb
}

// counterClock is a fake clock that ticks once per reading.
func counterClock() func() time.Time {
	var mu sync.Mutex
	var now int64
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now++
		return time.Unix(0, now)
	}
}

func keysOf(items []Item) []uint64 {
	var k []uint64
	for _, it := range items {
		k = append(k, it.Key)
	}
	return k
}

func sampledKeys(s []Sampled) []uint64 {
	var k []uint64
	for _, it := range s {
		k = append(k, it.Key)
	}
	return k
}

func mustInsert(t *testing.T, tb *Table, key uint64, prio float64) {
	t.Helper()
	if err := tb.Insert(context.Background(), key, prio, key*10); err != nil {
		t.Fatalf("insert %d: %v", key, err)
	}
}

func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond; it fails the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestOverflowFIFORemoverKeepsNewest(t *testing.T) {
	tb := tableOf(t, KindUniform, KindFIFO, 10, MinSize(1), 0)
	for k := range uint64(15) {
		mustInsert(t, tb, k, 1)
	}
	want := []uint64{5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	if got := keysOf(tb.Items(nil)); !slices.Equal(got, want) {
		t.Fatalf("keys %v, want %v", got, want)
	}
	info := tb.Info()
	if info.Size != 10 || info.Inserts != 15 || info.Deletes != 5 || info.Limiter.Inserts != 15 {
		t.Fatalf("info %+v", info)
	}
}

func TestOverflowMayRemoveTheNewItem(t *testing.T) {
	tb := tableOf(t, KindUniform, KindMinHeap, 3, MinSize(1), 0)
	for k, p := range []float64{5, 6, 7, 1} {
		mustInsert(t, tb, uint64(k), p)
	}
	if got := keysOf(tb.Items(nil)); !slices.Equal(got, []uint64{0, 1, 2}) {
		t.Fatalf("keys %v: the new lowest-priority item should have been removed", got)
	}
	if info := tb.Info(); info.Inserts != 4 || info.Deletes != 1 {
		t.Fatalf("info %+v", info)
	}
}

func TestQueueTable(t *testing.T) {
	tb := tableOf(t, KindFIFO, KindFIFO, 3, Queue(3), 1)
	ctx := context.Background()

	// A sample on the empty queue blocks until an insert.
	if _, err := tb.Sample(shortCtx(t), 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sample on an empty queue: %v, want a deadline error", err)
	}
	got := make(chan []Sampled, 1)
	go func() {
		s, err := tb.Sample(ctx, 1)
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	waitFor(t, "a blocked sample", func() bool { return tb.Info().BlockedSamples == 1 })
	mustInsert(t, tb, 100, 1)
	if s := <-got; len(s) != 1 || s[0].Key != 100 || !s[0].Deleted {
		t.Fatalf("blocked sample returned %+v", s)
	}

	// Three inserts pass, the 4th blocks until a sample.
	for k := range uint64(3) {
		mustInsert(t, tb, k, 1)
	}
	if err := tb.Insert(shortCtx(t), 3, 1, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("4th insert: %v, want a deadline error", err)
	}
	done := make(chan error, 1)
	go func() { done <- tb.Insert(ctx, 3, 1, 0) }()
	waitFor(t, "a blocked insert", func() bool { return tb.Info().BlockedInserts == 1 })
	select {
	case err := <-done:
		t.Fatalf("4th insert returned %v before a sample", err)
	default:
	}
	s, err := tb.Sample(ctx, 1)
	if err != nil || s[0].Key != 0 {
		t.Fatalf("first sample %v %v, want key 0", s, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("4th insert after a sample: %v", err)
	}

	// Items come out in insertion order, each once.
	var order []uint64
	for range 3 {
		s, err := tb.Sample(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, s[0].Key)
	}
	if !slices.Equal(order, []uint64{1, 2, 3}) {
		t.Fatalf("queue order %v, want [1 2 3]", order)
	}
	if info := tb.Info(); info.Size != 0 {
		t.Fatalf("queue not empty: %+v", info)
	}
}

func TestStackTable(t *testing.T) {
	tb := tableOf(t, KindLIFO, KindLIFO, 3, Stack(3), 1)
	for k := range uint64(3) {
		mustInsert(t, tb, k, 1)
	}
	// One flexible batch drains the stack, youngest first.
	s, err := tb.Sample(context.Background(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if got := sampledKeys(s); !slices.Equal(got, []uint64{2, 1, 0}) {
		t.Fatalf("stack order %v, want [2 1 0] (a partial flexible batch)", got)
	}
}

func TestMinSizeTable(t *testing.T) {
	tb := tableOf(t, KindUniform, KindFIFO, 100, MinSize(3), 0)
	for k := range uint64(3) {
		if _, err := tb.Sample(shortCtx(t), 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("sample at size %d: %v, want a deadline error", k, err)
		}
		mustInsert(t, tb, k, 1)
	}
	if s, err := tb.Sample(context.Background(), 50); err != nil || len(s) != 50 {
		t.Fatalf("sample at size 3: %d items, %v", len(s), err)
	}
	if err := tb.MutatePriorities(nil, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Sample(shortCtx(t), 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sample at size 2 after a delete: %v, want a deadline error", err)
	}
	mustInsert(t, tb, 9, 1)
	if _, err := tb.Sample(shortCtx(t), 1); err != nil {
		t.Fatalf("sample back at size 3: %v", err)
	}
}

func TestMaxTimesSampled(t *testing.T) {
	tb := tableOf(t, KindUniform, KindFIFO, 100, MinSize(1), 1)
	for k := range uint64(20) {
		mustInsert(t, tb, k, 1)
	}
	seen := map[uint64]bool{}
	for range 20 {
		s, err := tb.Sample(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if seen[s[0].Key] || !s[0].Deleted || s[0].TimesSampled != 1 {
			t.Fatalf("sample %+v (seen before: %v)", s[0], seen[s[0].Key])
		}
		seen[s[0].Key] = true
		if _, ok := tb.Get(s[0].Key); ok {
			t.Fatalf("key %d still present after its one sample", s[0].Key)
		}
	}
	info := tb.Info()
	if info.Size != 0 || info.Deletes != 20 || info.Samples != 20 || info.UniqueSamples != 20 {
		t.Fatalf("info %+v", info)
	}
}

// TestBatchEqualsOneAtATime: a batch follows the same sequence as single samples,
// including deletions by max_times_sampled in the middle of a batch.
func TestBatchEqualsOneAtATime(t *testing.T) {
	for _, kind := range []Kind{KindFIFO, KindLIFO, KindMaxHeap, KindMinHeap} {
		for _, maxTimes := range []int64{0, 1, 2, 3} {
			build := func() *Table {
				tb := tableOf(t, kind, KindFIFO, 100, MinSize(1), maxTimes)
				for k := range uint64(10) {
					mustInsert(t, tb, k, float64((k*7)%4))
				}
				return tb
			}
			a, b := build(), build()
			batch, err := a.Sample(context.Background(), 25)
			if err != nil {
				t.Fatal(err)
			}
			var single []Sampled
			for range len(batch) {
				s, err := b.Sample(context.Background(), 1)
				if err != nil {
					t.Fatal(err)
				}
				single = append(single, s[0])
			}
			for i := range batch {
				if batch[i].Item != single[i].Item || batch[i].Deleted != single[i].Deleted {
					t.Fatalf("%v max_times %d: pick %d: batch %+v, single %+v", kind, maxTimes, i, batch[i], single[i])
				}
			}
			if maxTimes == 2 && kind == KindFIFO {
				if got := sampledKeys(batch[:5]); !slices.Equal(got, []uint64{0, 0, 1, 1, 2}) {
					t.Fatalf("FIFO with max_times 2: %v", got)
				}
			}
		}
	}
}

func TestUniformTableWithLimitDeletesMidBatch(t *testing.T) {
	tb := tableOf(t, KindUniform, KindFIFO, 100, MinSize(1), 2)
	for k := range uint64(10) {
		mustInsert(t, tb, k, 1)
	}
	s, err := tb.Sample(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 20 {
		t.Fatalf("got %d samples from 10 items sampled at most twice, want 20", len(s))
	}
	count := map[uint64]int{}
	for _, x := range s {
		count[x.Key]++
		if x.Deleted != (count[x.Key] == 2) || x.TimesSampled != int64(count[x.Key]) {
			t.Fatalf("sample %+v after %d", x, count[x.Key])
		}
	}
	if tb.Info().Size != 0 {
		t.Fatal("items left")
	}
}

func TestInsertExistingKeyUpdatesPriority(t *testing.T) {
	tb := tableOf(t, KindMaxHeap, KindFIFO, 10, MinSize(1), 0)
	mustInsert(t, tb, 1, 5)
	mustInsert(t, tb, 2, 3)
	if err := tb.Insert(context.Background(), 2, 9, 777); err != nil {
		t.Fatal(err)
	}
	it, _ := tb.Get(2)
	if it.Priority != 9 || it.Ref != 20 {
		t.Fatalf("item %+v: want priority 9 and the original ref", it)
	}
	if info := tb.Info(); info.Inserts != 2 || info.Size != 2 {
		t.Fatalf("an update counted as an insert: %+v", info)
	}
	s, _ := tb.Sample(context.Background(), 1)
	if s[0].Key != 2 {
		t.Fatalf("max heap picked %d after the update", s[0].Key)
	}
	// A full Queue limiter does not block an update.
	q := tableOf(t, KindFIFO, KindFIFO, 10, Queue(1), 1)
	mustInsert(t, q, 1, 1)
	if err := q.Insert(shortCtx(t), 1, 2, 0); err != nil {
		t.Fatalf("update of an existing key waited: %v", err)
	}
}

func TestMutatePriorities(t *testing.T) {
	tb := tableOf(t, KindPrioritized, KindFIFO, 10, MinSize(1), 0)
	for k := range uint64(4) {
		mustInsert(t, tb, k, 1)
	}
	// Deletes first, then updates: the update of deleted key 1 is ignored,
	// and so are unknown keys.
	err := tb.MutatePriorities([]Update{{1, 7}, {2, 0}, {99, 3}}, []uint64{1, 98})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tb.Get(1); ok {
		t.Fatal("key 1 not deleted")
	}
	if it, _ := tb.Get(2); it.Priority != 0 {
		t.Fatalf("key 2 priority %v", it.Priority)
	}
	if info := tb.Info(); info.Size != 3 || info.Deletes != 1 {
		t.Fatalf("info %+v", info)
	}
	// Key 2 has priority zero: never sampled.
	s, _ := tb.Sample(context.Background(), 500)
	for _, x := range s {
		if x.Key == 2 {
			t.Fatal("zero-priority item sampled")
		}
		if math.Abs(x.Probability-0.5) > 1e-12 {
			t.Fatalf("probability %v, want 0.5", x.Probability)
		}
	}
	// A refused priority changes nothing.
	if err := tb.MutatePriorities([]Update{{0, 4}, {3, -1}}, []uint64{0}); err == nil {
		t.Fatal("negative priority accepted")
	}
	if it, ok := tb.Get(0); !ok || it.Priority != 1 {
		t.Fatalf("refused mutation changed key 0: %+v %v", it, ok)
	}
	if err := tb.Insert(context.Background(), 50, math.NaN(), 0); err == nil {
		t.Fatal("NaN priority inserted")
	}
}

func TestCloseWakesWaiters(t *testing.T) {
	tb := tableOf(t, KindFIFO, KindFIFO, 10, Queue(1), 1)
	mustInsert(t, tb, 1, 1)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- tb.Insert(context.Background(), uint64(10+i), 1, 0)
		}()
	}
	waitFor(t, "four blocked inserts", func() bool { return tb.Info().BlockedInserts == 4 })
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tb.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("waiter got %v, want ErrClosed", err)
		}
	}
	if _, err := tb.Sample(context.Background(), 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("sample after Close: %v", err)
	}
	if err := tb.Reset(); !errors.Is(err, ErrClosed) {
		t.Fatalf("reset after Close: %v", err)
	}

	// A blocked sampler is woken too.
	e := tableOf(t, KindFIFO, KindFIFO, 10, Queue(1), 1)
	done := make(chan error, 1)
	go func() { _, err := e.Sample(context.Background(), 4); done <- err }()
	waitFor(t, "a blocked sample", func() bool { return e.Info().BlockedSamples == 1 })
	_ = e.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("sampler got %v, want ErrClosed", err)
	}
}

func TestCancelWhileWaiting(t *testing.T) {
	tb := tableOf(t, KindFIFO, KindFIFO, 10, Queue(1), 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := tb.Sample(ctx, 1); done <- err }()
	waitFor(t, "a blocked sample", func() bool { return tb.Info().BlockedSamples == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if b := tb.Info().BlockedSamples; b != 0 {
		t.Fatalf("%d samples still counted as blocked", b)
	}
}

func TestResetAndOnDelete(t *testing.T) {
	var deleted []uint64
	tb, err := NewTable(Config{Name: "r", MaxSize: 3, Sampler: NewUniform(), Remover: NewFIFO(),
		OnDelete: func(it Item) { deleted = append(deleted, it.Key) }})
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	for k := range uint64(5) {
		mustInsert(t, tb, k, 1)
	}
	if _, err := tb.Sample(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	if err := tb.Reset(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []uint64{0, 1, 2, 3, 4}) {
		t.Fatalf("OnDelete saw %v", deleted)
	}
	info := tb.Info()
	if info.Size != 0 || info.Inserts != 0 || info.Samples != 0 || info.Deletes != 0 || info.UniqueSamples != 0 {
		t.Fatalf("info after Reset %+v", info)
	}
	mustInsert(t, tb, 3, 1)
	if it, ok := tb.Get(3); !ok || it.Ref != 30 {
		t.Fatalf("insert after Reset: %+v %v", it, ok)
	}
}

func TestNewTableRefusesBadConfig(t *testing.T) {
	u := NewUniform()
	for name, cfg := range map[string]Config{
		"max size 0":      {MaxSize: 0, Sampler: NewUniform(), Remover: NewFIFO()},
		"no remover":      {MaxSize: 1, Sampler: NewUniform()},
		"same selector":   {MaxSize: 1, Sampler: u, Remover: u},
		"bad limiter":     {MaxSize: 1, Sampler: NewUniform(), Remover: NewFIFO(), RateLimit: MinSize(0)},
		"negative limit":  {MaxSize: 1, Sampler: NewUniform(), Remover: NewFIFO(), MaxTimesSampled: -1},
		"non-empty input": {MaxSize: 1, Sampler: func() Selector { s := NewUniform(); _ = s.Insert(0, 1); return s }(), Remover: NewFIFO()},
	} {
		if _, err := NewTable(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestTableDeterministicForSeed(t *testing.T) {
	run := func() []uint64 {
		tb := tableOf(t, KindPrioritized, KindUniform, 50, MinSize(1), 3)
		for k := range uint64(80) {
			mustInsert(t, tb, k, float64(k%9))
		}
		s, err := tb.Sample(context.Background(), 64)
		if err != nil {
			t.Fatal(err)
		}
		return append(keysOf(tb.Items(nil)), sampledKeys(s)...)
	}
	if a, b := run(), run(); !slices.Equal(a, b) {
		t.Fatal("two runs with one seed differ")
	}
}

// TestSampleToInsertRatioConcurrent runs inserters and samplers at once and checks
// at every observation, and at the end, that the counts respect the limiter's
// bounds.
func TestSampleToInsertRatioConcurrent(t *testing.T) {
	const spi, minSize, buffer = 2.0, 10, 8.0
	rl, err := SampleToInsertRatio(spi, minSize, buffer)
	if err != nil {
		t.Fatal(err)
	}
	tb := tableOf(t, KindUniform, KindFIFO, 1000, rl, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const inserters, perInserter = 3, 700
	var ins, smp sync.WaitGroup
	for w := range inserters {
		ins.Add(1)
		go func() {
			defer ins.Done()
			for i := range perInserter {
				if err := tb.Insert(ctx, uint64(w*perInserter+i), 1, 0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 3 {
		smp.Add(1)
		go func() {
			defer smp.Done()
			for {
				if _, err := tb.Sample(ctx, 3); err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Error(err)
					}
					return
				}
			}
		}()
	}
	check := func(info Info) {
		diff := float64(info.Inserts)*spi - float64(info.Samples)
		if info.Samples > 0 && diff < rl.MinDiff {
			t.Fatalf("samples ran ahead: inserts %d samples %d: diff %v < min %v", info.Inserts, info.Samples, diff, rl.MinDiff)
		}
		if info.Inserts-info.Deletes > minSize && diff > rl.MaxDiff {
			t.Fatalf("inserts ran ahead: inserts %d samples %d: diff %v > max %v", info.Inserts, info.Samples, diff, rl.MaxDiff)
		}
	}
	finished := make(chan struct{})
	go func() { ins.Wait(); close(finished) }()
	for observing := true; observing; {
		select {
		case <-finished:
			observing = false
		default:
			check(tb.Info())
			time.Sleep(100 * time.Microsecond)
		}
	}
	// Let the samplers take what the last inserts allow, then stop them.
	waitFor(t, "samplers to reach the lower bound", func() bool {
		i := tb.Info()
		return !i.Limiter.CanSample && i.BlockedSamples == 3
	})
	cancel()
	smp.Wait()
	info := tb.Info()
	check(info)
	if info.Inserts != inserters*perInserter {
		t.Fatalf("inserts %d", info.Inserts)
	}
	ratio := float64(info.Samples) / float64(info.Inserts)
	lo := spi - rl.MaxDiff/float64(info.Inserts)
	hi := spi - rl.MinDiff/float64(info.Inserts)
	if ratio < lo || ratio > hi {
		t.Fatalf("samples/inserts %v outside [%v, %v]", ratio, lo, hi)
	}
}

func TestTop(t *testing.T) {
	tb := tableOf(t, KindMaxHeap, KindFIFO, 10, MinSize(1), 0)
	for k, p := range []float64{3, 9, 1, 9, 5} {
		mustInsert(t, tb, uint64(k), p)
	}
	top, err := tb.Top(3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(top); !slices.Equal(got, []uint64{1, 3, 4}) {
		t.Fatalf("top 3 = %v, want [1 3 4]", got)
	}
	if info := tb.Info(); info.Samples != 0 {
		t.Fatalf("Top counted samples: %+v", info)
	}
	u := tableOf(t, KindUniform, KindFIFO, 10, MinSize(1), 0)
	if _, err := u.Top(1, nil); err == nil {
		t.Fatal("Top on a uniform sampler accepted")
	}
}
