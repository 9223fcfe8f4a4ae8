package sample

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
	"github.com/gear-rl/gear/sample/sampletest"
)

// selections runs fn with a selection on the fake device, on the real GPU
// (skipped without a driver) and with the CPU twins.
func selections(t *testing.T, fn func(t *testing.T, sel *DeviceSelection, gpu bool)) {
	open := func(t *testing.T, dev *cuda.Device) *DeviceSelection {
		sel, err := NewDeviceSelection(dev)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := sel.Close(); err != nil {
				t.Error(err)
			}
		})
		return sel
	}
	t.Run("fake", func(t *testing.T) { fn(t, open(t, openFakeGPU(t).device(t, 0)), false) })
	t.Run("gpu", func(t *testing.T) { fn(t, open(t, realGPU(t)), true) })
	t.Run("twin", func(t *testing.T) { fn(t, NewTwinSelection(), false) })
}

// checkMirror brings a selector's mirror up to date, as a draw does first, and
// compares it, on the device or in the twin's memory, with the selector's array.
func checkMirror(sel *DeviceSelection, m mirrored) error {
	sel.mu.Lock()
	defer sel.mu.Unlock()
	if sel.arrays[m] == nil {
		return errors.New("no mirror")
	}
	mi, err := sel.sync(context.Background(), m)
	if err != nil {
		return err
	}
	if sel.dev != nil {
		if err := sel.dev.StreamSynchronize(context.Background(), sel.stream); err != nil {
			return err
		}
	}
	want := make([]float64, m.mirrorLen())
	m.fillMirror(0, want)
	if mi.n != len(want) {
		return fmt.Errorf("mirror of %d slots, selector has %d", mi.n, len(want))
	}
	got := mi.host[:mi.n]
	if sel.dev != nil {
		b := make([]byte, 8*mi.n)
		if err := sel.dev.CopyDtoH(b, mi.dev); err != nil {
			return err
		}
		got = unsafe.Slice((*float64)(unsafe.Pointer(&b[0])), mi.n)
	}
	for i := range want {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			return fmt.Errorf("slot %d: mirror has %v, selector %v", i, got[i], want[i])
		}
	}
	return nil
}

// prioritizedTable makes a table with a prioritized sampler of exponent exp.
func prioritizedTable(t *testing.T, exp float64, maxTimes int64, seed uint64, sel *DeviceSelection) (*Table, *Prioritized) {
	t.Helper()
	p, err := NewPrioritized(exp)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := NewTable(Config{Name: "sel", MaxSize: 1 << 20, Sampler: p, Remover: NewFIFO(), MaxTimesSampled: maxTimes,
		Seed: seed, Clock: func() time.Time { return time.Unix(0, 0) }, Selection: sel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Close() })
	return tb, p
}

// churn runs the same random inserts, priority updates and deletes on every
// table; prio draws a priority.
func churn(t *testing.T, r *rand.Rand, tables []*Table, keys *uint64, inserts, updates, deletes int, prio func() float64) {
	t.Helper()
	for range inserts {
		p := prio()
		for _, tb := range tables {
			mustInsert(t, tb, *keys, p)
		}
		*keys++
	}
	var ups []Update
	var dels []uint64
	for range updates {
		ups = append(ups, Update{Key: r.Uint64N(*keys), Priority: prio()})
	}
	for range deletes {
		dels = append(dels, r.Uint64N(*keys))
	}
	for _, tb := range tables {
		if err := tb.MutatePriorities(ups, dels); err != nil {
			t.Fatal(err)
		}
	}
}

// sameBatches samples n from every table and compares the batches.
func sameBatches(t *testing.T, tables []*Table, n int, names ...string) []Sampled {
	t.Helper()
	var first []Sampled
	for i, tb := range tables {
		got, err := tb.Sample(context.Background(), n)
		if err != nil {
			t.Fatalf("%s: %v", names[i], err)
		}
		if i == 0 {
			first = got
			continue
		}
		if len(got) != len(first) {
			t.Fatalf("%s: %d items, %s %d", names[i], len(got), names[0], len(first))
		}
		for k := range got {
			a, b := first[k], got[k]
			if a.Key != b.Key || a.Index != b.Index || a.Deleted != b.Deleted || a.TimesSampled != b.TimesSampled ||
				math.Float64bits(a.Probability) != math.Float64bits(b.Probability) {
				t.Fatalf("pick %d: %s has %+v, %s %+v", k, names[0], a, names[i], b)
			}
		}
	}
	return first
}

// TestDeviceSelectionMatchesTwin: a prioritized table selecting on the device
// picks what the same table with the CPU twins picks, pick for pick, through
// inserts (and growth past pages and kernel tiles), updates, deletes and
// max_times_sampled; and the device's mirror always equals the weights.
func TestDeviceSelectionMatchesTwin(t *testing.T) {
	selections(t, func(t *testing.T, sel *DeviceSelection, gpu bool) {
		twin := NewTwinSelection()
		defer twin.Close()
		r := rand.New(rand.NewPCG(1, 2))
		prio := func() float64 {
			if r.IntN(10) == 0 {
				return 0
			}
			return math.Exp(r.NormFloat64())
		}
		a, pa := prioritizedTable(t, 0.7, 5, 11, sel)
		b, _ := prioritizedTable(t, 0.7, 5, 11, twin)
		tables := []*Table{a, b}
		var keys uint64
		rounds, grow := 12, 900
		if gpu {
			rounds, grow = 30, 40000
		}
		for i := range rounds {
			churn(t, r, tables, &keys, grow*(i%3)+200, 200, 50, prio)
			sameBatches(t, tables, 300, "device", "twin")
			if err := checkMirror(sel, pa); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			// Updates alone, and a draw that deletes at most one item.
			churn(t, r, tables, &keys, 0, 40, 0, prio)
			sameBatches(t, tables, 1, "device", "twin")
			if err := checkMirror(sel, pa); err != nil {
				t.Fatalf("round %d, after updates: %v", i, err)
			}
		}
		// Reset clears every weight; the mirror follows.
		for _, tb := range tables {
			if err := tb.Reset(); err != nil {
				t.Fatal(err)
			}
		}
		churn(t, r, tables, &keys, 20, 0, 0, prio)
		sameBatches(t, tables, 64, "device", "twin")
		if err := checkMirror(sel, pa); err != nil {
			t.Fatal(err)
		}
	})
}

// TestDeviceSelectionEqualsSumTree: with weights whose partial sums are exact
// (small integers, exponent 1), the device's picks are the sum tree's, pick for
// pick and probability for probability, deletions by max_times_sampled and the
// all-zero fallback included.
func TestDeviceSelectionEqualsSumTree(t *testing.T) {
	selections(t, func(t *testing.T, sel *DeviceSelection, gpu bool) {
		r := rand.New(rand.NewPCG(3, 4))
		prio := func() float64 { return float64(r.IntN(8)) }
		a, _ := prioritizedTable(t, 1, 3, 5, sel)
		b, _ := prioritizedTable(t, 1, 3, 5, nil)
		tables := []*Table{a, b}
		var keys uint64
		for i := range 10 {
			churn(t, r, tables, &keys, 150+50*i, 100, 20, prio)
			sameBatches(t, tables, 200, "device", "sum tree")
		}
		// Every priority zero: the uniform fallback, the same on both.
		var ups []Update
		for k := range keys {
			ups = append(ups, Update{Key: k})
		}
		for _, tb := range tables {
			if err := tb.MutatePriorities(ups, nil); err != nil {
				t.Fatal(err)
			}
		}
		sameBatches(t, tables, 50, "device", "sum tree")
	})
}

// TestDeviceSelectionDistribution: the device's picks follow p^c / sum p^c.
func TestDeviceSelectionDistribution(t *testing.T) {
	sel := NewTwinSelection()
	tb, _ := prioritizedTable(t, 0.5, 0, 9, sel)
	prios := []float64{0, 1, 2, 3, 4, 0.5, 9, 16}
	for k, p := range prios {
		mustInsert(t, tb, uint64(k), p)
	}
	counts := make([]int, len(prios))
	for range 100 {
		got, err := tb.Sample(context.Background(), 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range got {
			counts[s.Key]++
		}
	}
	want := make([]float64, len(prios))
	for i, p := range prios {
		want[i] = math.Sqrt(p)
	}
	if stat, dof, pv, err := sampletest.ChiSquare(counts, want); err != nil || pv < 0.001 {
		t.Fatalf("counts %v: chi-square %.1f with %d degrees of freedom, p = %.2g (%v)", counts, stat, dof, pv, err)
	}
}

// TestDeviceSelectionAbandoned: a draw whose context ends while the device
// works returns the context's error; the next draw waits for the device.
func TestDeviceSelectionAbandoned(t *testing.T) {
	f := openFakeGPU(t)
	sel, err := NewDeviceSelection(f.device(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer sel.Close()
	a, _ := prioritizedTable(t, 1, 0, 1, sel)
	b, _ := prioritizedTable(t, 1, 0, 1, NewTwinSelection())
	for k := range uint64(50) {
		mustInsert(t, a, k, float64(k%7))
		mustInsert(t, b, k, float64(k%7))
	}
	f.cu.Hold(uintptr(sel.stream), +1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := a.Sample(ctx, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the deadline", err)
	}
	f.cu.Hold(uintptr(sel.stream), -1)
	// The abandoned draw consumed its draws from the table's source; so does a
	// draw of the twin's (which counts its picks, unlike the abandoned one).
	if _, err := b.Sample(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{20, 7} {
		got, err := a.Sample(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		want, err := b.Sample(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, want, func(x, y Sampled) bool { return x.Key == y.Key && x.Probability == y.Probability }) {
			t.Fatalf("after an abandoned draw the device picks %v, the twin %v", keysOfSampled(got), keysOfSampled(want))
		}
	}
}

func keysOfSampled(s []Sampled) []uint64 {
	var k []uint64
	for _, x := range s {
		k = append(k, x.Key)
	}
	return k
}

// TestDeviceSelectionReleases: closing the tables and the selection frees every
// buffer.
func TestDeviceSelectionReleases(t *testing.T) {
	f := openFakeGPU(t)
	dev := f.device(t, 0)
	allocs, hosts := f.cu.Live(cudatest.LiveDeviceAllocs), f.cu.Live(cudatest.LiveHostAllocs)
	sel, err := NewDeviceSelection(dev)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		tb, _ := prioritizedTable(t, 1, 0, uint64(i), sel)
		for k := range uint64(100 * (i + 1)) {
			mustInsert(t, tb, k, 1)
		}
		if _, err := tb.Sample(context.Background(), 5); err != nil {
			t.Fatal(err)
		}
		if err := tb.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(sel.arrays); got != 0 || sel.spare == nil {
		t.Fatalf("%d mirrors held and spare %v after the tables closed", got, sel.spare)
	}
	if err := sel.Close(); err != nil {
		t.Fatal(err)
	}
	if got := f.cu.Live(cudatest.LiveDeviceAllocs); got != allocs {
		t.Errorf("%d device allocations after Close, want %d", got, allocs)
	}
	if got := f.cu.Live(cudatest.LiveHostAllocs); got != hosts {
		t.Errorf("%d host allocations after Close, want %d", got, hosts)
	}
	tb, _ := prioritizedTable(t, 1, 0, 1, sel)
	mustInsert(t, tb, 1, 1)
	if _, err := tb.Sample(context.Background(), 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("sample through a closed selection: %v", err)
	}
}

// heapKeys is the heap's order as the kernel sees it, computed from the items.
func heapKeys(items []Item, slots int, minHeap bool) []float64 {
	keys := make([]float64, slots)
	for i := range keys {
		keys[i] = absentKey
	}
	for _, it := range items {
		k := it.Priority
		if minHeap {
			k = -k
		}
		if k == 0 {
			k = 0
		}
		keys[it.Index] = k
	}
	return keys
}

// TestDeviceTopMatchesHeap: a distributed table's Top and decentralized samples
// through the top-k kernel equal the heap's when priorities are distinct, and
// follow the kernel's tie rule (the lower slot first) when they are not.
func TestDeviceTopMatchesHeap(t *testing.T) {
	selections(t, func(t *testing.T, sel *DeviceSelection, gpu bool) {
		for _, minHeap := range []bool{false, true} {
			mk := func() (Selector, Selector) {
				if minHeap {
					return NewMinHeap(), NewFIFO()
				}
				return NewMaxHeap(), NewFIFO()
			}
			r := rand.New(rand.NewPCG(5, 6))
			var items []distItem
			for k := range 300 {
				items = append(items, distItem{k % 2, uint64(k), r.NormFloat64()})
			}
			withSel := localTables(t, 2, items, mk, 2, RateLimit{}, nil)
			plain := localTables(t, 2, items, mk, 2, RateLimit{}, nil)
			for _, l := range withSel {
				l.(*Table).selection = sel // as Config.Selection would
			}
			var tops [2][][]Item
			var batches [2][][]Sampled
			for v, locals := range [][]Local{withSel, plain} {
				tops[v] = make([][]Item, 2)
				batches[v] = make([][]Sampled, 2)
				runDist(t, locals, nil, func(ctx context.Context, rk int, d *DistTable) error {
					top, err := d.Top(ctx, 40)
					if err != nil {
						return err
					}
					b, err := d.Sample(ctx, 60)
					if err != nil {
						return err
					}
					tops[v][rk], batches[v][rk] = top, b.Items
					return nil
				})
			}
			for rk := range 2 {
				if !slices.EqualFunc(tops[0][rk], tops[1][rk], func(a, b Item) bool { return a.Key == b.Key && a.Index == b.Index }) {
					t.Fatalf("min %v, rank %d: Top differs from the heap's", minHeap, rk)
				}
				if !slices.EqualFunc(batches[0][rk], batches[1][rk], func(a, b Sampled) bool { return a.Key == b.Key && a.Deleted == b.Deleted }) {
					t.Fatalf("min %v, rank %d: decentralized sample differs from the heap's", minHeap, rk)
				}
			}
		}
		// Ties: five priorities over 1500 items (three pages), one shard.
		tb, err := NewTable(Config{Name: "ties", MaxSize: 2000, Sampler: NewMaxHeap(), Remover: NewFIFO(), Selection: sel})
		if err != nil {
			t.Fatal(err)
		}
		defer tb.Close()
		for k := range uint64(1500) {
			mustInsert(t, tb, 1499-k, float64(k%5))
		}
		if err := tb.MutatePriorities([]Update{{Key: 3, Priority: 4}}, []uint64{7, 8}); err != nil {
			t.Fatal(err)
		}
		runDist(t, []Local{tb}, nil, func(ctx context.Context, _ int, d *DistTable) error {
			for round := range 3 {
				top, err := d.Top(ctx, 50)
				if err != nil {
					return err
				}
				want := make([]int64, 50)
				if err := cuda.TopKCPU(heapKeys(tb.Items(nil), len(tb.sampler.(*Heap).pos), false), 50, want); err != nil {
					return err
				}
				for i, it := range top {
					if int64(it.Index) != want[i] {
						return fmt.Errorf("round %d, top %d: slot %d, want %d", round, i, it.Index, want[i])
					}
				}
				// Raise the priorities of a few items in every page; then
				// delete some.
				var ups []Update
				for k := uint64(round); k < 1500; k += 97 {
					ups = append(ups, Update{Key: k, Priority: float64(5 + round)})
				}
				var dels []uint64
				if round == 1 {
					dels = []uint64{uint64(20 + round), uint64(1000 + round)}
				}
				if err := tb.MutatePriorities(ups, dels); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// TestDistributedDeviceSelection: split and centralized draws with the device
// selection on every rank give the twins' batches, and with exact weights the
// sum trees' batches.
func TestDistributedDeviceSelection(t *testing.T) {
	f := openFakeGPU(t)
	devSels := make([]*DeviceSelection, 3)
	for r := range devSels {
		s, err := NewDeviceSelection(f.device(t, r%2))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		devSels[r] = s
	}
	r := rand.New(rand.NewPCG(8, 8))
	var items []distItem
	for k := range 400 {
		items = append(items, distItem{[]int{0, 0, 2, 1}[k%4], uint64(k), float64(r.IntN(6))})
	}
	for _, c := range []struct {
		mode     Mode
		maxTimes int64
	}{{ModeSplit, 0}, {ModeCentralized, 2}} {
		var got [][][]Sampled
		for _, sels := range [][]*DeviceSelection{devSels, {NewTwinSelection(), NewTwinSelection(), NewTwinSelection()}, nil} {
			locals := localTables(t, 3, items, prioritizedPair(1), c.maxTimes, RateLimit{}, func() time.Time { return time.Unix(0, 0) })
			for i, l := range locals {
				if sels != nil {
					l.(*Table).selection = sels[i]
				}
			}
			res := make([][]Sampled, 3)
			runDist(t, locals, []DistOption{WithMode(c.mode), WithSeed(3)}, func(ctx context.Context, rk int, d *DistTable) error {
				for range 4 {
					b, err := d.Sample(ctx, 100)
					if err != nil {
						return err
					}
					res[rk] = append(res[rk], b.Items...)
				}
				return nil
			})
			for _, l := range locals {
				_ = l.(*Table).Close()
			}
			got = append(got, res)
		}
		for v, name := range []string{"twin", "sum tree"} {
			for rk := range 3 {
				if !slices.EqualFunc(got[0][rk], got[v+1][rk], func(a, b Sampled) bool {
					return a.Key == b.Key && a.Index == b.Index && a.Deleted == b.Deleted && a.Probability == b.Probability
				}) {
					t.Fatalf("%v, rank %d: the device's batches differ from the %s's", c.mode, rk, name)
				}
			}
		}
	}
}
