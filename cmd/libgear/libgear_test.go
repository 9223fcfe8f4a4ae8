package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/gear-rl/gear/internal/errmark"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// benchSpec is python/bench.py's table: 400 B rows.
const benchSpec = `
[table]
name = "bench"
capacity = 100000
trajectory_length = 1
sampler = "uniform"
remover = "fifo"
[[table.columns]]
name = "obs"
dtype = "float32"
shape = [96]
[[table.columns]]
name = "action"
dtype = "int32"
[[table.columns]]
name = "reward"
dtype = "float32"
[[table.columns]]
name = "discount"
dtype = "float32"
[[table.columns]]
name = "flags"
dtype = "int32"
`

// newBenchTable builds benchSpec's table over a fresh shard, as
// gear_table_create does, and returns its handle.
func newBenchTable(tb testing.TB) (h uint64, sh *shardHandle) {
	tb.Helper()
	return newSpecTable(tb, benchSpec, -1)
}

// newSpecTable builds spec's table with extra rows over a fresh shard, as
// gear_table_create does, and returns its handle, closed at the end of the
// test.
func newSpecTable(tb testing.TB, spec string, extra int) (h uint64, sh *shardHandle) {
	tb.Helper()
	ss, cfg, _, err := buildTable(spec, extra)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := store.Create(storetest.Name(tb, tb.Name()), ss)
	if err != nil {
		tb.Fatal(err)
	}
	t, err := sample.NewShardTable(s, cfg)
	if err != nil {
		s.Close()
		tb.Fatal(err)
	}
	sh = newShardHandle(s, t)
	hc := register(sh)
	tb.Cleanup(func() {
		if st := gear_close(hc); st != statusOK {
			tb.Errorf("gear_close: status %d", st)
		}
	})
	return uint64(hc), sh
}

// TestShardPut inserts staged rows one a call and reads them back through
// the table's collection.
func TestShardPut(t *testing.T) {
	h, sh := newBenchTable(t)
	o := register(&op{}) // an unrelated handle: put refuses it
	defer func() {
		handlesMu.Lock()
		delete(handles, uint64(o))
		handlesMu.Unlock()
	}()
	if _, err := shardPut(uint64(o), 0, false, 0, 1); statusOf(err) != statusInvalid {
		t.Fatalf("put on an operation's handle: %v, want an invalid argument", err)
	}
	obs := unsafe.Slice((*float32)(unsafe.Add(sh.stage, sh.stageOff[0])), 96)
	act := (*int32)(unsafe.Add(sh.stage, sh.stageOff[1]))
	for i := range 10 {
		for j := range obs {
			obs[j] = float32(i*1000 + j)
		}
		*act = int32(i)
		ref, err := shardPut(h, 0, true, uint64(100+i), 2)
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if ref.Seq != uint64(i) {
			t.Fatalf("put %d: sequence %d", i, ref.Seq)
		}
	}
	if err := sh.st.WaitAdmitted(t.Context(), sh.shard.CommitSeq()); err != nil {
		t.Fatal(err)
	}
	if got := sh.st.Info().Size; got != 10 {
		t.Fatalf("table size %d after 10 puts", got)
	}
	var b sample.Batch
	if err := sh.st.SampleInto(t.Context(), &b, 10); err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	for _, it := range b.Items {
		out, err := sh.st.Collect(t.Context(), []int{it.Index}, []string{"obs", "action"}, sample.Window{})
		if err != nil {
			t.Fatal(err)
		}
		i := int(it.Key) - 100
		if i < 0 || i >= 10 || it.Priority != 2 {
			t.Fatalf("item key %d priority %v", it.Key, it.Priority)
		}
		o := unsafe.Slice((*float32)(unsafe.Pointer(&out[0][0])), 96)
		if o[0] != float32(i*1000) || o[95] != float32(i*1000+95) || *(*int32)(unsafe.Pointer(&out[1][0])) != int32(i) {
			t.Fatalf("row of key %d: obs[0] %v obs[95] %v action %d", it.Key, o[0], o[95], *(*int32)(unsafe.Pointer(&out[1][0])))
		}
	}
}

// BenchmarkShardPut is gear_shard_put's Go side: one staged 400 B row a
// call into a table with room, as python/bench.py's one-row inserts.
func BenchmarkShardPut(b *testing.B) {
	h, sh := newBenchTable(b)
	b.SetBytes(400)
	n := 0
	for b.Loop() {
		if _, err := shardPut(h, 0, false, 0, 1); err != nil {
			b.Fatal(err)
		}
		n++
		if n%50000 == 0 { // keep the table from filling: the benchmark is the put
			b.StopTimer()
			if err := sh.st.WaitAdmitted(b.Context(), sh.shard.CommitSeq()); err != nil {
				b.Fatal(err)
			}
			if err := sh.st.Reset(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
}

// BenchmarkShardPutFull is BenchmarkShardPut into a full table: every put
// waits for the table's admission to evict the oldest item and free its row
// (python/bench.py's "full table" case).
func BenchmarkShardPutFull(b *testing.B) {
	h, sh := newBenchTable(b)
	for range 100000 {
		if _, err := shardPut(h, -1, false, 0, 1); err != nil {
			b.Fatal(err)
		}
	}
	if err := sh.st.WaitAdmitted(b.Context(), sh.shard.CommitSeq()); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(400)
	for b.Loop() {
		if _, err := shardPut(h, -1, false, 0, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// TestTableSampleCollect samples through gear_table_sample's Go side with
// columns to collect, twice with the same columns (the plan reused) and once
// with others, and checks each item's collected obs and action against what
// was put for its key.
func TestTableSampleCollect(t *testing.T) {
	h, sh := newBenchTable(t)
	obs := unsafe.Slice((*float32)(unsafe.Add(sh.stage, sh.stageOff[0])), 96)
	act := (*int32)(unsafe.Add(sh.stage, sh.stageOff[1]))
	for i := range 300 {
		for j := range obs {
			obs[j] = float32(i*1000 + j)
		}
		*act = int32(i)
		if _, err := shardPut(h, 0, true, uint64(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := sh.st.WaitAdmitted(t.Context(), sh.shard.CommitSeq()); err != nil {
		t.Fatal(err)
	}
	const n = 64
	keys, rows, prios := make([]uint64, n), make([]int64, n), make([]float64, n)
	o, a := make([]float32, n*96), make([]int32, n)
	for round, cols := range [][]int32{{0, 1}, {0, 1}, {1, 0}} {
		dst := []unsafe.Pointer{unsafe.Pointer(&o[0]), unsafe.Pointer(&a[0])}
		if cols[0] == 1 {
			dst[0], dst[1] = dst[1], dst[0]
		}
		got, st := tableSample(h, n, 1000, keys, prios, rows, cols, dst)
		if st != statusOK || got != n {
			t.Fatalf("round %d: sample: %d items, status %d", round, got, st)
		}
		for k := range got {
			i := int(keys[k])
			if o[k*96] != float32(i*1000) || o[k*96+95] != float32(i*1000+95) || a[k] != int32(i) || prios[k] != 1 {
				t.Fatalf("round %d: item %d (key %d, row %d): obs[0] %v obs[95] %v action %d priority %v",
					round, k, i, rows[k], o[k*96], o[k*96+95], a[k], prios[k])
			}
		}
	}
	if _, st := tableSample(h, n, 1000, keys, prios, rows, []int32{7}, []unsafe.Pointer{unsafe.Pointer(&a[0])}); st != statusInvalid {
		t.Fatalf("collect of column 7 of 5: status %d, want invalid", st)
	}
}

// BenchmarkTableSampleCollect is gear_table_sample's Go side as python/bench.py's
// sample+collect calls it: batches of 256 items of 400 B, every column
// gathered into the caller's buffers, from a full table of 100,000 rows.
func BenchmarkTableSampleCollect(b *testing.B) {
	h, sh := newBenchTable(b)
	for range 100000 {
		if _, err := shardPut(h, -1, false, 0, 1); err != nil {
			b.Fatal(err)
		}
	}
	if err := sh.st.WaitAdmitted(b.Context(), sh.shard.CommitSeq()); err != nil {
		b.Fatal(err)
	}
	const n = 256
	keys, rows, prios := make([]uint64, n), make([]int64, n), make([]float64, n)
	cols := []int32{0, 1, 2, 3, 4}
	var dst []unsafe.Pointer
	for c := range cols {
		buf := make([]byte, n*sh.bytes[c])
		dst = append(dst, unsafe.Pointer(&buf[0]))
	}
	b.SetBytes(n * 400)
	for b.Loop() {
		if got, st := tableSample(h, n, -1, keys, prios, rows, cols, dst); st != statusOK || got != n {
			b.Fatalf("sample: %d items, status %d", got, st)
		}
	}
	b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "rows/s")
}

// TestShardPutRefusesBadPriorities: a priority that the commit or the
// owner's selectors would refuse is refused before a row is taken for it,
// as an invalid argument, so that no row of the shard is lost to it (a
// NaN's row stayed allocated: two of them wedged a shard of two rows) and
// nothing is refused later, at admission, after the put returned.
func TestShardPutRefusesBadPriorities(t *testing.T) {
	h, sh := newSpecTable(t, `
[table]
name = "prio"
capacity = 2
trajectory_length = 1
sampler = "prioritized"
priority_exponent = 1.0
remover = "fifo"
[[table.columns]]
name = "x"
dtype = "float32"
`, 0)
	st, s := sh.st, sh.shard
	for _, p := range []float64{math.NaN(), math.NaN(), math.NaN(), -1, math.Inf(1)} {
		_, err := shardPut(h, 100, true, 1, p)
		if statusOf(err) != statusInvalid {
			t.Fatalf("put with priority %v: %v (status %d), want an invalid argument", p, err, statusOf(err))
		}
	}
	for i := range 4 {
		if _, err := shardPut(h, 1000, true, uint64(10+i), 1); err != nil {
			t.Fatalf("put %d after the refusals: %v", i, err)
		}
	}
	if err := st.WaitAdmitted(t.Context(), s.CommitSeq()); err != nil {
		t.Fatal(err)
	}
	if info := st.Info(); info.Size != 2 || info.Refused != 0 {
		t.Fatalf("size %d, refused %d; want 2, 0", info.Size, info.Refused)
	}
	err := st.MutatePriorities([]sample.Update{{Key: 13, Priority: -2}}, nil)
	if !errors.Is(err, sample.ErrPriority) || statusOf(err) != statusInvalid {
		t.Fatalf("update to a negative priority: %v, want ErrPriority, an invalid argument", err)
	}
}

// TestBuildTableExtraRows: -1 asks for the default extra rows, the table's
// capacity or 8 MiB of rows, whichever is fewer, from 1024 to 16384; other
// counts are taken as given, and a negative one other than -1 is refused.
func TestBuildTableExtraRows(t *testing.T) {
	spec := func(capacity, floats int) string {
		return fmt.Sprintf("[table]\nname = \"t\"\ncapacity = %d\ntrajectory_length = 1\n[[table.columns]]\nname = \"x\"\ndtype = \"float32\"\nshape = [%d]\n",
			capacity, floats)
	}
	for _, c := range []struct {
		spec         string
		extra, added int
	}{
		{benchSpec, -1, 16384},          // 400 B rows: 8 MiB holds 20971
		{spec(100000, 256), -1, 8192},   // 1 KiB rows
		{spec(100000, 7056), -1, 1024},  // 28,224 B rows (84x84 frames): 297
		{spec(3000, 100), -1, 3000},     // the capacity
		{spec(16, 2), -1, 1024},         // a small table keeps 1024
		{spec(100000, 100), 0, 0},       // as given
		{spec(100000, 100), 5000, 5000}, // as given
	} {
		ss, cfg, added, err := buildTable(c.spec, c.extra)
		if err != nil {
			t.Fatal(err)
		}
		if added != c.added || ss.Capacity != cfg.MaxSize+1+c.added {
			row := 0
			for _, col := range ss.Columns {
				row += col.BlockBytes()
			}
			t.Errorf("extra %d over capacity %d, rows of %d B: added %d rows (shard of %d), want %d",
				c.extra, cfg.MaxSize, row, added, ss.Capacity, c.added)
		}
	}
	if _, _, _, err := buildTable(spec(16, 2), -2); statusOf(err) != statusInvalid {
		t.Errorf("extra rows -2: err %v, want an invalid argument", err)
	}
}

// TestStatusOf: the errors of the packages libgear exposes map onto the
// statuses Python turns into gear.Closed, gear.Timeout and
// gear.InvalidArgument, wrapped or not.
func TestStatusOf(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("outer: %w", err) }
	for _, c := range []struct {
		err  error
		want int32
	}{
		{nil, statusOK},
		{errors.New("something else"), statusError},
		{wrap(roles.ErrPeerClosed), statusClosed},
		{wrap(roles.ErrClosed), statusClosed},
		{wrap(sample.ErrClosed), statusClosed},
		{wrap(store.ErrClosed), statusClosed},
		{wrap(context.DeadlineExceeded), statusTimeout},
		{wrap(roles.ErrInvalid), statusInvalid},
		{wrap(roles.ErrStaleVersion), statusInvalid},
		{wrap(store.ErrName), statusInvalid},
		{wrap(sample.ErrPriority), statusInvalid},
		{errmark.Mark(errors.New("jobs: line 1: bad"), errInvalid), statusInvalid},
		{invalidf("bad %d", 1), statusInvalid},
	} {
		if got := int32(statusOf(c.err)); got != c.want {
			t.Errorf("statusOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// pace yields once per paceEvery of calls, at the first call that looks at
// the clock after it (every paceCheck calls), and never twice for one
// period, even with many threads calling.
func TestPaceYieldsOncePerPeriod(t *testing.T) {
	var now atomic.Int64
	clock := paceClock
	paceClock = now.Load
	t.Cleanup(func() { paceClock = clock })
	paceCalls.Store(0)
	paceLast.Store(0)
	due := func(calls int) (yields int) {
		for range calls {
			if paceDue() {
				yields++
			}
		}
		return yields
	}
	if n := due(10 * paceCheck); n != 0 {
		t.Errorf("%d calls before a period passed: %d yields, want 0", 10*paceCheck, n)
	}
	now.Add(int64(paceEvery))
	if n := due(paceCheck - 1); n != 0 {
		t.Errorf("a period passed, %d calls that do not look at the clock: %d yields, want 0", paceCheck-1, n)
	}
	if n := due(1); n != 1 {
		t.Errorf("a period passed, the call that looks at the clock: %d yields, want 1", n)
	}
	if n := due(100 * paceCheck); n != 0 {
		t.Errorf("%d calls more in the same period: %d yields, want 0", 100*paceCheck, n)
	}
	now.Add(int64(paceEvery) - 1)
	if n := due(100 * paceCheck); n != 0 {
		t.Errorf("1 ns short of the next period: %d yields, want 0", n)
	}

	// Many threads at once, over several periods: one yield a period.
	var yields atomic.Int64
	for period := range 5 {
		now.Add(int64(paceEvery))
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { yields.Add(int64(due(10 * paceCheck))) })
		}
		wg.Wait()
		if got := yields.Load(); got != int64(period+1) {
			t.Fatalf("after %d periods with 8 threads calling: %d yields, want %d", period+1, got, period+1)
		}
	}
}
