package cuda

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// DType is an element type, numbered as NCCL numbers them (ncclDataType_t). The
// selection kernels take Float32 and Float64.
type DType int32

// Element types.
const (
	Int8     DType = 0
	Uint8    DType = 1
	Int32    DType = 2
	Uint32   DType = 3
	Int64    DType = 4
	Uint64   DType = 5
	Float16  DType = 6
	Float32  DType = 7
	Float64  DType = 8
	BFloat16 DType = 9
)

// Size is the element size in bytes.
func (t DType) Size() int {
	switch t {
	case Int8, Uint8:
		return 1
	case Float16, BFloat16:
		return 2
	case Int32, Uint32, Float32:
		return 4
	}
	return 8
}

// String returns the Go name of the type.
func (t DType) String() string {
	names := [...]string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"}
	if t >= 0 && int(t) < len(names) {
		return names[t]
	}
	return fmt.Sprintf("dtype(%d)", int32(t))
}

// floatIndex is 0 for Float32 and 1 for Float64, the kernels' variants.
func floatIndex(t DType) (int, error) {
	switch t {
	case Float32:
		return 0, nil
	case Float64:
		return 1, nil
	}
	return 0, fmt.Errorf("cuda: weights must be float32 or float64, not %v", t)
}

// Errors of weighted sampling, on the GPU and in the CPU twin alike.
var (
	ErrBadWeight = errors.New("cuda: weighted sample: a weight is negative, NaN or infinite")
	ErrZeroTotal = errors.New("cuda: weighted sample: every weight is zero")
	ErrBadTotal  = errors.New("cuda: weighted sample: the sum of the weights overflows")
	ErrBadDraw   = errors.New("cuda: weighted sample: a draw is outside [0, 1)")
)

// Status bits of the selection kernels (common.cuh).
const (
	statusBadWeight = 1
	statusZeroTotal = 2
	statusBadTotal  = 4
	statusBadDraw   = 8
	statusInternal  = 16
)

func statusError(st int32) error {
	switch {
	case st == 0:
		return nil
	case st&statusBadWeight != 0:
		return ErrBadWeight
	case st&statusZeroTotal != 0:
		return ErrZeroTotal
	case st&statusBadTotal != 0:
		return ErrBadTotal
	case st&statusBadDraw != 0:
		return ErrBadDraw
	}
	return fmt.Errorf("cuda: weighted sample: internal error (status %#x)", st)
}

// The shape of the weighted-sampling kernels (wsample.cuh).
const (
	wsThreads     = 256
	wsTile        = 8192
	wsScanThreads = 1024
	wsLaneChunk   = 256
)

// UniformDraws returns n draws in [0, 1) from a splitmix64 sequence started at
// seed: the same seed gives the same draws on every rank and for both the GPU and
// the CPU path. Each draw is the top 53 bits of a splitmix64 output times 2^-53.
func UniformDraws(seed uint64, n int) []float64 {
	out := make([]float64, n)
	x := seed
	for i := range out {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		out[i] = float64(z>>11) * (1.0 / (1 << 53))
	}
	return out
}

// WeightedSampleCPU is the CPU twin of the weighted-sampling kernels: for each
// draw u in [0, 1) it writes to out the index whose interval of the cumulative
// weights holds u times their total. It evaluates every sum in the kernels' order
// (wsample.cuh), so for the same weights and draws it returns the same indices as
// Sampler.WeightedSample, bit for bit. An index of weight zero is never chosen.
// len(out) must equal len(draws).
func WeightedSampleCPU[W float32 | float64](weights []W, draws []float64, out []int64) error {
	if len(out) != len(draws) {
		return fmt.Errorf("cuda: weighted sample: %d outputs for %d draws", len(out), len(draws))
	}
	if len(weights) == 0 {
		return ErrZeroTotal
	}
	a, bad := wsTileSums(weights)
	if bad {
		return ErrBadWeight
	}
	p := wsScan(a)
	total := p[len(a)]
	switch {
	case total == 0:
		return ErrZeroTotal
	case !(total <= math.MaxFloat64):
		return ErrBadTotal
	}
	for _, u := range draws {
		if !(u >= 0 && u < 1) {
			return ErrBadDraw
		}
	}
	for i, u := range draws {
		out[i] = wsDraw(weights, p, u, total)
		if out[i] < 0 {
			return fmt.Errorf("cuda: weighted sample: internal error (draw %d)", i)
		}
	}
	return nil
}

// wsTileSums is phase 1 (gear_ws_tiles): per tile, 256 thread sums in the
// kernel's element order, reduced by the warp tree and then the block tree. bad
// reports a negative, NaN or infinite weight.
func wsTileSums[W float32 | float64](w []W) (a []float64, bad bool) {
	n := len(w)
	nt := (n + wsTile - 1) / wsTile
	a = make([]float64, nt)
	var zero W
	vec := 4
	limit := float64(math.MaxFloat32)
	if _, is64 := any(zero).(float64); is64 {
		vec, limit = 2, math.MaxFloat64
	}
	units := wsTile / (wsThreads * vec)
	var part [wsThreads]float64
	for t := range nt {
		start := t * wsTile
		clear(part[:])
		if start+wsTile <= n {
			tile := w[start : start+wsTile]
			for m := range units {
				for j := range wsThreads {
					base := (m*wsThreads + j) * vec
					acc := part[j]
					for q := range vec {
						d := float64(tile[base+q])
						if !(d >= 0 && d <= limit) {
							bad = true
						}
						acc = acc + d
					}
					part[j] = acc
				}
			}
		} else {
			for m := range units {
				for j := range wsThreads {
					base := start + (m*wsThreads+j)*vec
					acc := part[j]
					for q := range vec {
						d := 0.0
						if base+q < n {
							d = float64(w[base+q])
						}
						if !(d >= 0 && d <= limit) {
							bad = true
						}
						acc = acc + d
					}
					part[j] = acc
				}
			}
		}
		var warps [wsThreads / 32]float64
		for wi := range warps {
			x := part[wi*32 : wi*32+32]
			for off := 16; off > 0; off >>= 1 {
				for k := range off {
					x[k] = x[k] + x[k+off]
				}
			}
			warps[wi] = x[0]
		}
		for off := wsThreads / 64; off > 0; off >>= 1 {
			for k := range off {
				warps[k] = warps[k] + warps[k+off]
			}
		}
		a[t] = warps[0]
	}
	return a, bad
}

// warpSumScan is gear_warp_sum_scan on 32 values, in place.
func warpSumScan(x []float64) {
	for d := 1; d < 32; d <<= 1 {
		for l := 31; l >= d; l-- {
			x[l] = x[l-d] + x[l]
		}
	}
}

// wsScan is phase 2 (gear_ws_scan): the tile sums' prefix P[0..nt] in the
// kernel's order, made monotone by the masked max-scan.
func wsScan(a []float64) []float64 {
	nt := len(a)
	p := make([]float64, nt+1)
	chunk := (nt + wsScanThreads - 1) / wsScanThreads
	bounds := func(j int) (int, int) {
		lo := min(j*chunk, nt)
		return lo, min(lo+chunk, nt)
	}
	var x [wsScanThreads]float64
	for j := range x {
		lo, hi := bounds(j)
		c := 0.0
		for t := lo; t < hi; t++ {
			c = c + a[t]
		}
		x[j] = c
	}
	var wt [32]float64
	for w := range 32 {
		warpSumScan(x[w*32 : w*32+32])
		wt[w] = x[w*32+31]
	}
	warpSumScan(wt[:])
	var X [wsScanThreads]float64
	for j := range X {
		if w := j / 32; w > 0 {
			X[j] = wt[w-1] + x[j]
		} else {
			X[j] = x[j]
		}
	}
	for j := range wsScanThreads {
		lo, hi := bounds(j)
		if lo == hi {
			continue
		}
		var run float64
		switch w, lane := j/32, j%32; {
		case lane > 0:
			run = X[j-1]
		case w > 0:
			run = wt[w-1]
		}
		for t := lo; t < hi; t++ {
			run = run + a[t]
			p[t+1] = run
		}
	}
	// The masked max-scan is exact, so its order does not matter.
	m := 0.0
	for t := range nt {
		if a[t] > 0 {
			m = math.Max(m, p[t+1])
		}
		p[t+1] = m
	}
	p[0] = 0
	return p
}

// wsDraw is phase 3 (gear_ws_draws) for one draw; -1 if the kernel would report
// an internal error.
func wsDraw[W float32 | float64](w []W, p []float64, u, total float64) int64 {
	n := len(w)
	nt := len(p) - 1
	target := float64(u * total) // never fused: the kernel uses __dmul_rn
	t := sort.Search(nt, func(i int) bool { return p[i+1] > target })
	if t == nt {
		t = sort.Search(nt, func(i int) bool { return p[i+1] >= total })
	}
	r := target - p[t]
	var c, xm [32]float64
	var cs, ce [32]int
	for l := range 32 {
		cs[l] = min(t*wsTile+l*wsLaneChunk, n)
		ce[l] = min(cs[l]+wsLaneChunk, n)
		s := 0.0
		for e := cs[l]; e < ce[l]; e++ {
			s = s + float64(w[e])
		}
		c[l] = s
	}
	X := c
	warpSumScan(X[:])
	m := 0.0
	for l := range 32 {
		if c[l] > 0 {
			m = math.Max(m, X[l])
		}
		xm[l] = m
	}
	chosen := -1
	for l := range 32 {
		if xm[l] > r {
			chosen = l
			break
		}
	}
	if chosen < 0 {
		for l := 31; l >= 0; l-- {
			if c[l] > 0 {
				chosen = l
				break
			}
		}
	}
	if chosen < 0 {
		return -1
	}
	run := 0.0
	if chosen > 0 {
		run = xm[chosen-1]
	}
	last := int64(-1)
	for e := cs[chosen]; e < ce[chosen]; e++ {
		x := float64(w[e])
		if x > 0 {
			last = int64(e)
			run = run + x
			if run > r {
				return int64(e)
			}
		}
	}
	return last
}
