package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// halfSquare is 0.5·Σ(out−target)² in float64, and its gradient dout.
func halfSquare(out, target, dout []float32) float64 {
	var l float64
	for i := range out {
		d := float64(out[i]) - float64(target[i])
		l += 0.5 * d * d
		if dout != nil {
			dout[i] = float32(d)
		}
	}
	return l
}

// naiveForward is the dumb reference: it returns the outputs and the smallest
// |pre-activation| of a hidden unit over all rows.
func naiveForward(m *MLP, x []float32, n int) (out []float64, minPre float64) {
	minPre = math.Inf(1)
	in := make([]float64, len(x[:n*m.InSize()]))
	for i, v := range x[:n*m.InSize()] {
		in[i] = float64(v)
	}
	for li, l := range m.Layers {
		next := make([]float64, n*l.Out)
		for s := 0; s < n; s++ {
			for j := 0; j < l.Out; j++ {
				a := float64(l.B[j])
				for k := 0; k < l.In; k++ {
					a += float64(l.W[j*l.In+k]) * in[s*l.In+k]
				}
				if li < len(m.Layers)-1 {
					minPre = math.Min(minPre, math.Abs(a))
					a = math.Max(a, 0)
				}
				next[s*l.Out+j] = a
			}
		}
		in = next
	}
	return in, minPre
}

// The analytic gradient of every parameter matches a central finite difference.
// Six rows use the dense forward kernel (four rows at a time and a remainder),
// eleven rows the sparse one (for the 17-wide layer). The seeds are such that no hidden unit is within
// reach of its ReLU kink, which the test checks, so the comparison is exact up
// to rounding.
func TestBackwardMatchesFiniteDifferences(t *testing.T) {
	for _, c := range []struct {
		n, seed int
		sizes   []int
	}{{6, 2, []int{3, 7, 5, 2}}, {11, 16, []int{3, 9, 17, 2}}} {
		n, sizes := c.n, c.sizes
		rng := rand.New(rand.NewPCG(uint64(c.seed), uint64(n)))
		m := NewMLP(sizes, n, rng)
		x := make([]float32, n*sizes[0])
		target := make([]float32, n*sizes[len(sizes)-1])
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for i := range target {
			target[i] = float32(rng.NormFloat64())
		}
		ref, minPre := naiveForward(m, x, n)
		if minPre < 0.01 {
			t.Fatalf("%d rows, seed %d: a hidden pre-activation is %.4f from its kink; pick another seed", n, c.seed, minPre)
		}
		dout := make([]float32, len(target))
		m.ZeroGrad()
		out := m.Forward(x, n)
		for i, v := range ref {
			if math.Abs(v-float64(out[i])) > 1e-5 {
				t.Fatalf("%d rows: output %d = %v, naive %v", n, i, out[i], v)
			}
		}
		halfSquare(out, target, dout)
		m.Backward(dout, n)
		analytic := append([]float32(nil), m.Grads()...)

		const h = 1e-3
		p := m.Params()
		for i := range p {
			orig := p[i]
			p[i] = orig + h
			lp := halfSquare(m.Forward(x, n), target, nil)
			p[i] = orig - h
			lm := halfSquare(m.Forward(x, n), target, nil)
			p[i] = orig
			num := (lp - lm) / (2 * h)
			if diff := math.Abs(num - float64(analytic[i])); diff > 2e-3+2e-3*math.Abs(num) {
				t.Errorf("%d rows, param %d: analytic %.6f, finite difference %.6f", n, i, analytic[i], num)
			}
		}
	}
}

// The sparse kernel (from sparseMinRows rows on) agrees with the dense one.
func TestSparseForwardMatchesDense(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	m := NewMLP([]int{4, 33, 17, 3}, 40, rng)
	x := make([]float32, 40*4)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	all := append([]float32(nil), m.Forward(x, 40)...)
	for s := 0; s < 40; s++ {
		one := m.Forward(x[s*4:(s+1)*4], 1)
		for j := range one {
			if d := math.Abs(float64(one[j] - all[s*3+j])); d > 1e-5 {
				t.Fatalf("row %d output %d: alone %v, in a batch %v", s, j, one[j], all[s*3+j])
			}
		}
	}
}

// Backward over the first k rows of a larger Forward equals Forward and Backward
// over those k rows alone; gradients accumulate across calls.
func TestBackwardPrefixAndAccumulation(t *testing.T) {
	sizes := []int{4, 16, 16, 2}
	m := NewMLP(sizes, 10, rand.New(rand.NewPCG(2, 2)))
	rng := rand.New(rand.NewPCG(3, 3))
	x := make([]float32, 10*4)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	dout := make([]float32, 10*2)
	for i := range dout {
		dout[i] = float32(rng.NormFloat64())
	}
	m.ZeroGrad()
	m.Forward(x, 10)
	m.Backward(dout, 5)
	a := append([]float32(nil), m.Grads()...)
	m.ZeroGrad()
	m.Forward(x, 5)
	m.Backward(dout, 5)
	m.Forward(x, 5)
	m.Backward(dout, 5)
	for i, g := range m.Grads() {
		if math.Abs(float64(g-2*a[i])) > 1e-5*(1+math.Abs(float64(g))) {
			t.Fatalf("grad %d: twice the prefix gradient %v, accumulated %v", i, 2*a[i], g)
		}
	}
}

func TestForwardByHand(t *testing.T) {
	m := NewMLP([]int{2, 2, 1}, 1, rand.New(rand.NewPCG(0, 0)))
	copy(m.Params(), []float32{
		1, -1, // hidden unit 0
		2, 3, // hidden unit 1
		0.5, -10, // hidden biases
		1, 2, // output weights
		0.25, // output bias
	})
	out := m.Forward([]float32{3, 1}, 1)
	// hidden: relu(3-1+0.5)=2.5, relu(6+3-10)=relu(-1)=0; out = 2.5 + 0 + 0.25.
	if out[0] != 2.75 {
		t.Fatalf("out = %v, want 2.75", out[0])
	}
}

func TestParamLayout(t *testing.T) {
	sizes := []int{4, 128, 128, 2}
	m := NewMLP(sizes, 1, rand.New(rand.NewPCG(0, 0)))
	if got, want := len(m.Params()), 4*128+128+128*128+128+128*2+2; got != want || NumParams(sizes) != want {
		t.Fatalf("params = %d, NumParams = %d, want %d", got, NumParams(sizes), want)
	}
	m.Layers[1].B[0] = 42
	if m.Params()[4*128+128+128*128] != 42 {
		t.Fatal("layer 1 bias is not right after its weights")
	}
	o := NewMLP(sizes, 1, rand.New(rand.NewPCG(9, 9)))
	if err := o.CopyFrom(m); err != nil {
		t.Fatal(err)
	}
	x := []float32{0.1, -0.2, 0.3, -0.4}
	a, b := m.Forward(x, 1), o.Forward(x, 1)
	if a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("copied network differs: %v vs %v", a, b)
	}
	if err := o.SetParams(make([]float32, 3)); err == nil {
		t.Fatal("SetParams accepted a short vector")
	}
}

// Two Adam steps computed by hand: p=1, g=0.5 then g=−1, lr=0.1.
func TestAdamByHand(t *testing.T) {
	a := NewAdam(1, 0.1)
	p := []float32{1}
	if err := a.Step(p, []float32{0.5}); err != nil {
		t.Fatal(err)
	}
	// m=0.05, v=0.00025; m̂=0.5, v̂=0.25; p = 1 − 0.1·0.5/0.5 = 0.9.
	if math.Abs(float64(p[0])-0.9) > 1e-6 {
		t.Fatalf("after step 1: p = %v, want 0.9", p[0])
	}
	if err := a.Step(p, []float32{-1}); err != nil {
		t.Fatal(err)
	}
	// m = 0.9·0.05 − 0.1 = −0.055, v = 0.999·0.00025 + 0.001 = 0.00124975,
	// m̂ = −0.055/0.19, v̂ = 0.00124975/0.001999,
	// p = 0.9 − 0.1·m̂/sqrt(v̂) = 0.93661035...
	if math.Abs(float64(p[0])-0.9366103522) > 1e-6 {
		t.Fatalf("after step 2: p = %.9f, want 0.936610352", p[0])
	}
	if a.Steps() != 2 {
		t.Fatalf("Steps = %d", a.Steps())
	}
	if err := a.Step(make([]float32, 2), make([]float32, 2)); err == nil {
		t.Fatal("Step accepted vectors of the wrong length")
	}
}

func TestClipAndHuber(t *testing.T) {
	g := []float32{3, 4}
	if n := ClipGradNorm(g, 10); n != 5 || g[0] != 3 {
		t.Fatalf("norm %v, g %v: clipping below the limit changed g", n, g)
	}
	if n := ClipGradNorm(g, 1); n != 5 || math.Abs(float64(g[0])-0.6) > 1e-6 || math.Abs(float64(g[1])-0.8) > 1e-6 {
		t.Fatalf("norm %v, g %v, want 5 and [0.6 0.8]", n, g)
	}
	for _, c := range []struct{ d, l, g float64 }{
		{0.5, 0.125, 0.5}, {-0.5, 0.125, -0.5}, {3, 2.5, 1}, {-3, 2.5, -1}, {0, 0, 0},
	} {
		l, gr := Huber(c.d, 1)
		if l != c.l || gr != c.g {
			t.Errorf("Huber(%v) = %v, %v; want %v, %v", c.d, l, gr, c.l, c.g)
		}
	}
}

func TestForwardBackwardAllocateNothing(t *testing.T) {
	m := NewMLP([]int{4, 64, 64, 2}, 32, rand.New(rand.NewPCG(0, 0)))
	x := make([]float32, 32*4)
	d := make([]float32, 32*2)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	for i := range d {
		d[i] = 0.1
	}
	opt := NewAdam(len(m.Params()), 1e-3)
	allocs := testing.AllocsPerRun(20, func() {
		m.ZeroGrad()
		m.Forward(x, 32)
		m.Backward(d, 32)
		ClipGradNorm(m.Grads(), 10)
		_ = opt.Step(m.Params(), m.Grads())
	})
	if allocs != 0 {
		t.Fatalf("a training step allocates %v times", allocs)
	}
}

// BenchmarkTrainStep is one Double DQN-shaped step: a forward pass over 2B rows
// (observations and next observations), a target forward over B rows, a
// backward pass over B rows with one nonzero output per row, and Adam.
func BenchmarkTrainStep(b *testing.B) {
	for _, c := range []struct {
		name  string
		sizes []int
		batch int
	}{
		{"4-64-64-2/B=64", []int{4, 64, 64, 2}, 64},
		{"4-128-128-2/B=64", []int{4, 128, 128, 2}, 64},
		{"4-128-128-2/B=128", []int{4, 128, 128, 2}, 128},
	} {
		b.Run(c.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(0, 0))
			m := NewMLP(c.sizes, 2*c.batch, rng)
			tg := NewMLP(c.sizes, c.batch, rng)
			x := make([]float32, 2*c.batch*4)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			d := make([]float32, c.batch*2)
			for s := 0; s < c.batch; s++ {
				d[2*s+s%2] = 0.01
			}
			opt := NewAdam(len(m.Params()), 1e-3)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tg.Forward(x[c.batch*4:], c.batch)
				m.ZeroGrad()
				m.Forward(x, 2*c.batch)
				m.Backward(d, c.batch)
				ClipGradNorm(m.Grads(), 10)
				_ = opt.Step(m.Params(), m.Grads())
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
		})
	}
}
