package cuda

import (
	"fmt"
	"math"
	"slices"
)

// topkKey maps a priority to an unsigned key that sorts as the float does (the
// transform of topk.cuh): -0 sorts below +0, and a positive NaN above +Inf.
func topkKey[W float32 | float64](v W) uint64 {
	switch x := any(v).(type) {
	case float32:
		b := math.Float32bits(x)
		if b&0x80000000 != 0 {
			return uint64(^b)
		}
		return uint64(b | 0x80000000)
	case float64:
		b := math.Float64bits(x)
		if b&0x8000000000000000 != 0 {
			return ^b
		}
		return b | 0x8000000000000000
	}
	panic("unreachable")
}

// ranked is a candidate of top-k: its key and index.
type ranked struct {
	key uint64
	idx int64
}

// before reports whether a ranks ahead of b: larger key, or equal key and
// smaller index.
func (a ranked) before(b ranked) bool {
	return a.key > b.key || (a.key == b.key && a.idx < b.idx)
}

// sortRanked orders candidates best first.
func sortRanked(r []ranked) {
	slices.SortFunc(r, func(a, b ranked) int {
		switch {
		case a.before(b):
			return -1
		case b.before(a):
			return 1
		}
		return 0
	})
}

func checkTopK(n, k, nout int) error {
	if k < 0 || k > n {
		return fmt.Errorf("cuda: top-k: k=%d with %d priorities", k, n)
	}
	if nout != k {
		return fmt.Errorf("cuda: top-k: %d outputs for k=%d", nout, k)
	}
	return nil
}

// TopKCPU is the CPU twin of the top-k kernels: it writes to out the indices of
// the k largest priorities, largest first, ties broken by the smaller index (the
// order of Sampler.TopK, exactly). len(out) must be k, and k at most
// len(priorities).
func TopKCPU[W float32 | float64](priorities []W, k int, out []int64) error {
	if err := checkTopK(len(priorities), k, len(out)); err != nil {
		return err
	}
	if k == 0 {
		return nil
	}
	// A heap of the k best so far, the worst of them at the root.
	h := make([]ranked, 0, k)
	worse := func(i, j int) bool { return h[j].before(h[i]) }
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(h) {
				return
			}
			m := l
			if r := l + 1; r < len(h) && worse(r, l) {
				m = r
			}
			if !worse(m, i) {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for e, v := range priorities {
		c := ranked{key: topkKey(v), idx: int64(e)}
		if len(h) < k {
			h = append(h, c)
			for i := len(h) - 1; i > 0; {
				p := (i - 1) / 2
				if !worse(i, p) {
					break
				}
				h[i], h[p] = h[p], h[i]
				i = p
			}
			continue
		}
		if c.before(h[0]) {
			h[0] = c
			down(0)
		}
	}
	sortRanked(h)
	for i, c := range h {
		out[i] = c.idx
	}
	return nil
}
