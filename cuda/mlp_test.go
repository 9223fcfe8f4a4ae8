package cuda_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
)

// The learner's kernels against their CPU twins, bit for bit, on the fake
// driver (which runs the kernels' CUDA C source) and on a real GPU.

func randF32(rng *rand.Rand, n int, zeroFrac float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		if rng.Float64() >= zeroFrac {
			x[i] = float32(rng.NormFloat64())
		}
	}
	return x
}

func sameBits32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, twin %v", what, i, got[i], want[i])
		}
	}
}

func sameBits64(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for i := range want {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			t.Fatalf("%s[%d] = %v, twin %v", what, i, got[i], want[i])
		}
	}
}

func fromDev[T any](t *testing.T, dev *cuda.Device, p cuda.DevicePtr, n int) []T {
	t.Helper()
	if err := dev.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	out, err := cudatest.FromDevice[T](dev, p, n)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMatMulTwin(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		rng := rand.New(rand.NewPCG(1, 2))
		n, in, nout, ldx := 37, 45, 19, 48 // odd shapes: partial tiles; strided rows
		x := randF32(rng, n*ldx, 0.3)
		w := randF32(rng, nout*in, 0)
		b := randF32(rng, nout, 0)
		g := randF32(rng, n*nout, 0.5)
		mask := randF32(rng, n*in, 0.4)
		dx, dw, db, dg, dm := cudatest.ToDevice(t, dev, x), cudatest.ToDevice(t, dev, w), cudatest.ToDevice(t, dev, b),
			cudatest.ToDevice(t, dev, g), cudatest.ToDevice(t, dev, mask)
		for _, c := range []struct {
			name       string
			mm         cuda.MatMul
			a, bb      []float32
			da, dbb    cuda.DevicePtr
			bias, mask bool
			out        int
		}{
			{"forward", cuda.Forward(n, in, nout, ldx, false), x, w, dx, dw, true, false, n * nout},
			{"forward-relu", cuda.Forward(n, in, nout, ldx, true), x, w, dx, dw, true, false, n * nout},
			{"input-grad", cuda.InputGrad(n, in, nout), g, w, dg, dw, false, true, n * in},
			{"weight-grad", cuda.WeightGrad(n, in, nout, ldx), g, x, dg, dx, false, false, nout * in},
		} {
			want := make([]float32, c.out)
			var bias, msk []float32
			var dbias, dmask cuda.DevicePtr
			if c.bias {
				bias, dbias = b, db
			}
			if c.mask {
				msk, dmask = mask, dm
			}
			if err := cuda.MatMulCPU(want, c.a, c.bb, bias, msk, c.mm); err != nil {
				t.Fatal(err)
			}
			out := cudatest.ToDevice(t, dev, make([]float32, c.out))
			if err := dev.LaunchMatMul(0, out, c.da, c.dbb, dbias, dmask, c.mm); err != nil {
				t.Fatal(err)
			}
			sameBits32(t, c.name, fromDev[float32](t, dev, out, c.out), want)
		}
		// Column sums (bias gradients).
		want := make([]float32, nout)
		cuda.ColSumCPU(want, g, n, nout)
		out := cudatest.ToDevice(t, dev, make([]float32, nout))
		if err := dev.LaunchColSum(0, out, dg, n, nout); err != nil {
			t.Fatal(err)
		}
		sameBits32(t, "colsum", fromDev[float32](t, dev, out, nout), want)
	})
}

func TestTDTwin(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		rng := rand.New(rand.NewPCG(3, 4))
		td := cuda.TD{N: 300, NA: 3, RowWords: 12, ActionOff: 8, RewardOff: 9, DiscountOff: 10, Huber: 1, Eps: 1e-3}
		q, qn, qt := randF32(rng, td.N*td.NA, 0), randF32(rng, td.N*td.NA, 0), randF32(rng, td.N*td.NA, 0)
		rows := make([]uint32, td.N*td.RowWords)
		w := make([]float64, td.N)
		for i := range td.N {
			a := int32(rng.IntN(td.NA))
			if i == 7 {
				a = 5 // a bad action
			}
			rows[i*td.RowWords+8] = uint32(a)
			rows[i*td.RowWords+9] = math.Float32bits(float32(rng.NormFloat64() * 2))
			rows[i*td.RowWords+10] = math.Float32bits(float32(rng.Float64()))
			w[i] = rng.Float64()
		}
		dout := make([]float32, td.N*td.NA)
		item := make([]float64, td.N*cuda.TDItemWords)
		st := cuda.TDCPU(dout, item, q, qn, qt, rows, w, td)
		if st != cuda.TDStatusBadAction {
			t.Fatalf("status %d, want the bad action's", st)
		}
		ddout := cudatest.ToDevice(t, dev, make([]float32, len(dout)))
		ditem := cudatest.ToDevice(t, dev, make([]float64, len(item)))
		dst := cudatest.ToDevice(t, dev, []int32{0})
		if err := dev.LaunchTD(0, ddout, ditem, dst, cudatest.ToDevice(t, dev, q), cudatest.ToDevice(t, dev, qn),
			cudatest.ToDevice(t, dev, qt), cudatest.ToDevice(t, dev, rows), cudatest.ToDevice(t, dev, w), td); err != nil {
			t.Fatal(err)
		}
		sameBits32(t, "dout", fromDev[float32](t, dev, ddout, len(dout)), dout)
		sameBits64(t, "item", fromDev[float64](t, dev, ditem, len(item)), item)
		if got := fromDev[int32](t, dev, dst, 1)[0]; got != st {
			t.Fatalf("device status %d, twin %d", got, st)
		}
		stats := [4]float64{0, 0, 0, 1}
		cuda.TDSumCPU(&stats, item, td.N)
		dstats := cudatest.ToDevice(t, dev, []float64{0, 0, 0, 1})
		if err := dev.LaunchTDSum(0, dstats, ditem, td.N); err != nil {
			t.Fatal(err)
		}
		sameBits64(t, "stats", fromDev[float64](t, dev, dstats, 4), stats[:])

		// Priorities back into the sampling weights. The kernel's contract:
		// an index drawn twice is one item, with one priority. Two different
		// priorities for one index race on the GPU (and on the fake, which
		// runs threads last first), so the indices are distinct but one.
		weights := randF32(rng, 1000, 0)
		idx := make([]int64, td.N)
		for i, p := range rng.Perm(len(weights))[:td.N] {
			idx[i] = int64(p)
		}
		idx[1] = idx[0] // an item drawn twice: the same priority
		copy(item[cuda.TDItemWords*1:cuda.TDItemWords*2], item[0:cuda.TDItemWords])
		if err := dev.CopyHtoD(ditem, cudatest.Bytes(item)); err != nil {
			t.Fatal(err)
		}
		dw := cudatest.ToDevice(t, dev, weights)
		cuda.PrioScatterCPU(weights, idx, item, 0.6)
		if err := dev.LaunchPrioScatter(0, dw, cudatest.ToDevice(t, dev, idx), ditem, td.N, 0.6); err != nil {
			t.Fatal(err)
		}
		for i, v := range fromDev[float32](t, dev, dw, len(weights)) {
			if d := math.Abs(float64(v - weights[i])); d > 1e-6*math.Abs(float64(weights[i])) {
				t.Fatalf("weight %d = %v, twin %v", i, v, weights[i])
			}
		}
	})
}

func TestOptimizerTwins(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		rng := rand.New(rand.NewPCG(5, 6))
		n := 3*cuda.SumSqBlock + 777
		g := randF32(rng, n, 0.2)
		for _, maxNorm := range []float64{0, 10, 1e9} {
			norm, scale := cuda.ClipNormCPU(g, maxNorm)
			dnorm := cudatest.ToDevice(t, dev, []float64{0})
			dscale := cudatest.ToDevice(t, dev, []float32{0})
			partial := cudatest.ToDevice(t, dev, make([]float64, cuda.SumSqBlocks(n)))
			dg := cudatest.ToDevice(t, dev, g)
			if err := dev.LaunchClipNorm(0, dnorm, dscale, partial, dg, n, maxNorm); err != nil {
				t.Fatal(err)
			}
			sameBits64(t, "norm", fromDev[float64](t, dev, dnorm, 1), []float64{norm})
			sameBits32(t, "scale", fromDev[float32](t, dev, dscale, 1), []float32{scale})
			if (maxNorm == 10) == (scale == 1) {
				t.Fatalf("max norm %g: scale %g of norm %g", maxNorm, scale, norm)
			}

			p, m, v := randF32(rng, n, 0), randF32(rng, n, 0), randF32(rng, n, 0)
			for i := range v {
				v[i] *= v[i]
			}
			dp, dm, dv := cudatest.ToDevice(t, dev, p), cudatest.ToDevice(t, dev, m), cudatest.ToDevice(t, dev, v)
			for step := 1; step <= 3; step++ {
				h := cuda.AdamStep(1e-3, 0.9, 0.999, 1e-8, step)
				cuda.AdamCPU(p, m, v, g, scale, h)
				if err := dev.LaunchAdam(0, dp, dm, dv, dg, dscale, n, h); err != nil {
					t.Fatal(err)
				}
			}
			sameBits32(t, "adam params", fromDev[float32](t, dev, dp, n), p)
			sameBits32(t, "adam m", fromDev[float32](t, dev, dm, n), m)
			sameBits32(t, "adam v", fromDev[float32](t, dev, dv, n), v)

			tp := randF32(rng, n, 0)
			dtp := cudatest.ToDevice(t, dev, tp)
			cuda.SoftUpdateCPU(tp, p, 0.005)
			if err := dev.LaunchSoftUpdate(0, dtp, dp, n, 0.005); err != nil {
				t.Fatal(err)
			}
			sameBits32(t, "soft update", fromDev[float32](t, dev, dtp, n), tp)
		}
	})
}

// The importance weights from the sampler's total, against the twin (whose pow
// may differ in the last bit).
func TestISWeightsTwin(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device, gpu bool) {
		rng := rand.New(rand.NewPCG(11, 12))
		n := 20000
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(rng.Float64() + 0.01)
		}
		dw := cudatest.ToDevice(t, dev, w)
		s, err := dev.NewSampler()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.Total() != 0 {
			t.Fatal("Total before the first sample")
		}
		draws := cuda.UniformDraws(5, 300)
		idx := make([]int64, len(draws))
		if err := s.WeightedSample(context.Background(), 0, dw, n, cuda.Float32, draws, idx); err != nil {
			t.Fatal(err)
		}
		total := fromDev[float64](t, dev, s.Total(), 1)[0]
		var sum float64
		for _, x := range w {
			sum += float64(x)
		}
		if math.Abs(total-sum) > 1e-9*sum {
			t.Fatalf("Total %v, sum of the weights %v", total, sum)
		}
		didx := cudatest.ToDevice(t, dev, idx)
		for _, beta := range []float64{0, 0.4, 1} {
			want := make([]float64, len(idx))
			cuda.ISWeightsCPU(want, w, idx, n, total, beta)
			out := cudatest.ToDevice(t, dev, make([]float64, len(idx)))
			if err := dev.LaunchISWeights(0, out, dw, didx, len(idx), n, s.Total(), beta); err != nil {
				t.Fatal(err)
			}
			got := fromDev[float64](t, dev, out, len(idx))
			top := 0.0
			for i := range want {
				if math.Abs(got[i]-want[i]) > 1e-15*want[i] {
					t.Fatalf("beta %g: weight %d = %v, twin %v", beta, i, got[i], want[i])
				}
				top = max(top, got[i])
			}
			if top != 1 {
				t.Fatalf("beta %g: largest weight %v, want 1", beta, top)
			}
		}
	})
}
