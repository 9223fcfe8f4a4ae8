package cuda_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/gear-rl/gear/cuda"
)

// naiveGather writes each row byte by byte from the definition.
func naiveGather(table []byte, idx []int64, offs []int, s cuda.GatherSpec) []byte {
	frame := s.FrameBytes
	if frame == 0 {
		frame = s.BlockBytes
	}
	length := s.Length
	if length == 0 {
		length = s.BlockBytes/frame - s.Offset
	}
	rowFrames := s.HeadPad + length + s.TailPad
	var out []byte
	for r, ix := range idx {
		off := s.Offset
		if offs != nil {
			off = offs[r]
		}
		for f := range rowFrames {
			for b := range frame {
				v := byte(0)
				if d := f - s.HeadPad; d >= 0 && d < length {
					v = table[int(ix)*s.BlockBytes+(off+d)*frame+b]
				}
				out = append(out, v)
			}
		}
	}
	return out
}

func TestGatherCPUMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for trial := range 200 {
		frame := 1 + r.IntN(40)
		frames := 1 + r.IntN(12)
		s := cuda.GatherSpec{BlockBytes: frame * frames, Capacity: 1 + r.IntN(20), FrameBytes: frame}
		if r.IntN(4) == 0 {
			s.FrameBytes = 0
			frames = 1 // one frame: the whole block
		}
		s.Offset = r.IntN(frames)
		if r.IntN(2) == 0 {
			s.Length = 1 + r.IntN(frames-s.Offset)
		}
		s.HeadPad, s.TailPad = r.IntN(3), r.IntN(3)
		table := make([]byte, s.Capacity*s.BlockBytes)
		for i := range table {
			table[i] = byte(r.Uint32())
		}
		idx := make([]int64, r.IntN(30))
		for i := range idx {
			idx[i] = r.Int64N(int64(s.Capacity))
		}
		var offs []int
		if s.Length > 0 && r.IntN(2) == 0 {
			offs = make([]int, len(idx))
			for i := range offs {
				offs[i] = r.IntN(frames - s.Length + 1)
			}
		}
		want := naiveGather(table, idx, offs, s)
		got := make([]byte, len(want))
		for i := range got {
			got[i] = 0xcc
		}
		if err := cuda.GatherCPU(got, table, idx, offs, s); err != nil {
			t.Fatalf("trial %d %+v: %v", trial, s, err)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("trial %d %+v: byte %d differs", trial, s, i)
		}
	}
}

func TestGatherCPURejectsBadInput(t *testing.T) {
	table := make([]byte, 10*64)
	dst := make([]byte, 1024)
	s := cuda.GatherSpec{BlockBytes: 64, Capacity: 10, FrameBytes: 8, Offset: 2, Length: 4}
	for _, c := range []struct {
		name string
		s    cuda.GatherSpec
		idx  []int64
		offs []int
	}{
		{"index past capacity", s, []int64{10}, nil},
		{"negative index", s, []int64{-1}, nil},
		{"window past the block", cuda.GatherSpec{BlockBytes: 64, Capacity: 10, FrameBytes: 8, Offset: 5, Length: 4}, []int64{0}, nil},
		{"frame not dividing block", cuda.GatherSpec{BlockBytes: 64, Capacity: 10, FrameBytes: 7}, []int64{0}, nil},
		{"per-row offset past the block", s, []int64{0, 1}, []int{0, 5}},
		{"offsets of another length", s, []int64{0, 1}, []int{0}},
		{"per-row offsets without a length", cuda.GatherSpec{BlockBytes: 64, Capacity: 10, FrameBytes: 8}, []int64{0}, []int{0}},
	} {
		if err := cuda.GatherCPU(dst, table, c.idx, c.offs, c.s); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if err := cuda.GatherCPU(make([]byte, 10), table, []int64{0}, nil, s); err == nil {
		t.Error("short destination accepted")
	}
}

// naiveWeighted draws from the cumulative sums taken left to right.
func naiveWeighted[W float32 | float64](w []W, draws []float64) []int64 {
	cdf := make([]float64, len(w))
	sum := 0.0
	for i, x := range w {
		sum += float64(x)
		cdf[i] = sum
	}
	out := make([]int64, len(draws))
	for i, u := range draws {
		out[i] = int64(sort.Search(len(cdf), func(j int) bool { return cdf[j] > u*sum }))
	}
	return out
}

func TestWeightedSampleCPUMatchesNaiveExactly(t *testing.T) {
	// Small integer weights sum exactly in any order, so the twin's fixed order
	// and the naive left-to-right sum agree on every draw.
	r := rand.New(rand.NewPCG(2, 2))
	for _, n := range []int{1, 2, 100, 8191, 8192, 8193, 40000, 300000} {
		w := make([]float32, n)
		for i := range w {
			if r.IntN(3) > 0 {
				w[i] = float32(r.IntN(1000))
			}
		}
		w[r.IntN(n)] = 7
		draws := cuda.UniformDraws(uint64(n), 2000)
		got := make([]int64, len(draws))
		if err := cuda.WeightedSampleCPU(w, draws, got); err != nil {
			t.Fatal(err)
		}
		if want := naiveWeighted(w, draws); !slices.Equal(got, want) {
			t.Fatalf("n=%d: twin and naive differ", n)
		}
	}
}

func TestWeightedSampleCPUMatchesNaiveAwayFromBoundaries(t *testing.T) {
	// Real-valued weights: rounding may differ between orders, but only for
	// draws within rounding error of an interval's edge.
	w := weights[float64](100000, 5)
	draws := cuda.UniformDraws(7, 20000)
	got := make([]int64, len(draws))
	if err := cuda.WeightedSampleCPU(w, draws, got); err != nil {
		t.Fatal(err)
	}
	want := naiveWeighted(w, draws)
	cdf := make([]float64, len(w)+1)
	for i, x := range w {
		cdf[i+1] = cdf[i] + x
	}
	total := cdf[len(w)]
	checked := 0
	for i, u := range draws {
		edge := math.Min(math.Abs(u*total-cdf[want[i]]), math.Abs(cdf[want[i]+1]-u*total))
		if edge < 1e-9*total {
			continue
		}
		checked++
		if got[i] != want[i] {
			t.Fatalf("draw %d (%v): twin %d, naive %d", i, u, got[i], want[i])
		}
	}
	if checked < len(draws)*99/100 {
		t.Fatalf("only %d of %d draws checked", checked, len(draws))
	}
}

func TestWeightedSampleCPUFrequencies(t *testing.T) {
	w := []float64{1, 0, 2, 0, 0, 7}
	draws := cuda.UniformDraws(11, 100000)
	got := make([]int64, len(draws))
	if err := cuda.WeightedSampleCPU(w, draws, got); err != nil {
		t.Fatal(err)
	}
	count := make([]int, len(w))
	for _, i := range got {
		count[i]++
	}
	for i, x := range w {
		p := x / 10
		want := p * float64(len(draws))
		sd := math.Sqrt(float64(len(draws)) * p * (1 - p))
		if math.Abs(float64(count[i])-want) > 5*sd+0.5 {
			t.Errorf("index %d chosen %d times, want %.0f±%.0f", i, count[i], want, sd)
		}
	}
}

func TestWeightedSampleCPUNeverPicksZeroWeights(t *testing.T) {
	// Draws at the very edges and weights whose sum absorbs the small ones.
	w := make([]float64, 20000)
	w[0] = 1e300
	w[9000] = 1e-300
	w[19999] = 1e300
	draws := []float64{0, math.Nextafter(1, 0), 0.5, math.Nextafter(0.5, 0), math.Nextafter(0.5, 1)}
	got := make([]int64, len(draws))
	if err := cuda.WeightedSampleCPU(w, draws, got); err != nil {
		t.Fatal(err)
	}
	for i, ix := range got {
		if w[ix] == 0 {
			t.Errorf("draw %v picked index %d of weight zero", draws[i], ix)
		}
	}
	if err := cuda.WeightedSampleCPU([]float64{math.MaxFloat64, math.MaxFloat64}, []float64{0.5}, got[:1]); !errors.Is(err, cuda.ErrBadTotal) {
		t.Errorf("overflowing total: %v", err)
	}
}

func TestUniformDraws(t *testing.T) {
	a, b := cuda.UniformDraws(42, 1000), cuda.UniformDraws(42, 1000)
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different draws")
	}
	if slices.Equal(a, cuda.UniformDraws(43, 1000)) {
		t.Fatal("different seeds, same draws")
	}
	sum := 0.0
	for _, u := range a {
		if u < 0 || u >= 1 {
			t.Fatalf("draw %v outside [0, 1)", u)
		}
		sum += u
	}
	if mean := sum / 1000; math.Abs(mean-0.5) > 0.05 {
		t.Errorf("mean %v", mean)
	}
}

// naiveTopK sorts every index by (priority descending, index ascending), with
// floats ordered as their bits order them (NaN above +Inf, -0 below +0).
func naiveTopK[W float32 | float64](p []W, k int) []int64 {
	idx := make([]int64, len(p))
	for i := range idx {
		idx[i] = int64(i)
	}
	less := func(a, b W) bool {
		if a == b && a == 0 {
			return math.Signbit(float64(a)) && !math.Signbit(float64(b))
		}
		na, nb := a != a, b != b
		switch {
		case na && nb:
			return false
		case na:
			return false
		case nb:
			return true
		}
		return a < b
	}
	sort.SliceStable(idx, func(i, j int) bool { return less(p[idx[j]], p[idx[i]]) })
	return idx[:k]
}

func TestTopKCPUMatchesNaive(t *testing.T) {
	for _, n := range []int{1, 2, 17, 1000, 50000} {
		p := priorities[float64](n, uint64(n))
		p[n/2] = math.NaN()
		p[n-1] = math.Inf(1)
		for _, k := range []int{0, 1, n / 3, n} {
			got := make([]int64, k)
			if err := cuda.TopKCPU(p, k, got); err != nil {
				t.Fatal(err)
			}
			if want := naiveTopK(p, k); !slices.Equal(got, want) {
				t.Fatalf("n=%d k=%d: twin %v, naive %v", n, k, got[:min(k, 8)], want[:min(k, 8)])
			}
		}
		p32 := priorities[float32](n, uint64(n)+9)
		got := make([]int64, n/2)
		if err := cuda.TopKCPU(p32, n/2, got); err != nil {
			t.Fatal(err)
		}
		if want := naiveTopK(p32, n/2); !slices.Equal(got, want) {
			t.Fatalf("float32 n=%d: twin and naive differ", n)
		}
	}
	if err := cuda.TopKCPU([]float32{1}, 2, make([]int64, 2)); err == nil {
		t.Error("k > n accepted")
	}
}
