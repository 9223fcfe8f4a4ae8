package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Linear is one fully connected layer; W and B are views into the network's
// parameter vector, DW and DB views into its gradient vector.
type Linear struct {
	In, Out int
	W       []float32 // Out×In, row j holds the weights of output unit j
	B       []float32 // Out
	DW      []float32
	DB      []float32
}

// MLP is a multilayer perceptron: Linear layers with ReLU after every layer
// except the last.
type MLP struct {
	Layers   []Linear
	sizes    []int
	params   []float32
	grads    []float32
	maxBatch int
	input    []float32   // the last Forward's input (not owned)
	acts     [][]float32 // acts[l]: output of layer l, maxBatch×Out
	deltas   [][]float32 // deltas[l]: dLoss/d(output of layer l), for hidden layers
	wt       [][]float32 // wt[l]: layer l's weights transposed (In×Out), for sparse inputs
	idx      []int       // scratch: indices of nonzero inputs or deltas
}

// Forward transposes a layer's weights to skip the zeros that ReLU leaves in its
// input when the batch has at least sparseMinRows rows and the layer at least
// sparseMinOut outputs; below that the dense kernel is faster.
const (
	sparseMinRows = 8
	sparseMinOut  = 16
)

// NumParams returns the number of parameters of an MLP with the given layer sizes.
func NumParams(sizes []int) int {
	n := 0
	for i := 0; i+1 < len(sizes); i++ {
		n += sizes[i]*sizes[i+1] + sizes[i+1]
	}
	return n
}

// NewMLP returns a network with the given layer sizes (input first, output last)
// and buffers for batches of up to maxBatch rows. Weights and biases are drawn
// uniformly from [-1/sqrt(in), 1/sqrt(in)], the default of common frameworks.
// It panics if sizes has fewer than two entries or any size or maxBatch is not
// positive (programming errors).
func NewMLP(sizes []int, maxBatch int, rng *rand.Rand) *MLP {
	if len(sizes) < 2 || maxBatch < 1 {
		panic(fmt.Sprintf("nn: NewMLP(%v, %d): need at least two sizes and a positive batch", sizes, maxBatch))
	}
	for _, s := range sizes {
		if s < 1 {
			panic(fmt.Sprintf("nn: NewMLP(%v): sizes must be positive", sizes))
		}
	}
	n := NumParams(sizes)
	width := maxBatch
	for _, s := range sizes {
		width = max(width, s)
	}
	m := &MLP{
		idx:      make([]int, width),
		sizes:    append([]int(nil), sizes...),
		params:   make([]float32, n),
		grads:    make([]float32, n),
		maxBatch: maxBatch,
	}
	off := 0
	for i := 0; i+1 < len(sizes); i++ {
		in, out := sizes[i], sizes[i+1]
		l := Linear{In: in, Out: out}
		l.W, l.DW = m.params[off:off+in*out:off+in*out], m.grads[off:off+in*out:off+in*out]
		off += in * out
		l.B, l.DB = m.params[off:off+out:off+out], m.grads[off:off+out:off+out]
		off += out
		bound := 1 / math.Sqrt(float64(in))
		for k := range l.W {
			l.W[k] = float32((2*rng.Float64() - 1) * bound)
		}
		for k := range l.B {
			l.B[k] = float32((2*rng.Float64() - 1) * bound)
		}
		m.Layers = append(m.Layers, l)
		m.acts = append(m.acts, make([]float32, maxBatch*out))
		m.deltas = append(m.deltas, make([]float32, maxBatch*out))
		var wt []float32
		if i > 0 && out >= sparseMinOut {
			wt = make([]float32, in*out)
		}
		m.wt = append(m.wt, wt)
	}
	return m
}

// Sizes returns the layer sizes, input first.
func (m *MLP) Sizes() []int { return append([]int(nil), m.sizes...) }

// InSize returns the input width.
func (m *MLP) InSize() int { return m.sizes[0] }

// OutSize returns the output width.
func (m *MLP) OutSize() int { return m.sizes[len(m.sizes)-1] }

// MaxBatch returns the largest batch Forward accepts.
func (m *MLP) MaxBatch() int { return m.maxBatch }

// Params returns the parameter vector. It aliases the network: writes change the network.
func (m *MLP) Params() []float32 { return m.params }

// Grads returns the gradient vector, in the layout of Params. It aliases the network.
func (m *MLP) Grads() []float32 { return m.grads }

// SetParams copies p into the network's parameters.
func (m *MLP) SetParams(p []float32) error {
	if len(p) != len(m.params) {
		return fmt.Errorf("nn: SetParams: got %d values, want %d", len(p), len(m.params))
	}
	copy(m.params, p)
	return nil
}

// CopyFrom copies the parameters of src, which must have the same sizes.
func (m *MLP) CopyFrom(src *MLP) error { return m.SetParams(src.params) }

// ZeroGrad sets every gradient to zero.
func (m *MLP) ZeroGrad() { clear(m.grads) }

// Forward computes the outputs for the n rows of x (n×InSize, row-major) and
// returns them as an n×OutSize slice owned by the network. It panics if n is out
// of range or x is short.
func (m *MLP) Forward(x []float32, n int) []float32 {
	if n < 0 || n > m.maxBatch || len(x) < n*m.sizes[0] {
		panic(fmt.Sprintf("nn: Forward: %d rows of %d with %d values, max batch %d", n, m.sizes[0], len(x), m.maxBatch))
	}
	m.input = x[:n*m.sizes[0]]
	in := m.input
	last := len(m.Layers) - 1
	for li := range m.Layers {
		l := &m.Layers[li]
		out := m.acts[li][:n*l.Out]
		if li > 0 && n >= sparseMinRows && l.Out >= sparseMinOut {
			transpose(m.wt[li], l.W, l.Out, l.In)
			linearForwardSparse(out, in, m.wt[li], l.B, n, l.In, l.Out, li != last, m.idx)
		} else {
			linearForward(out, in, l.W, l.B, n, l.In, l.Out, li != last)
		}
		in = out
	}
	return in
}

// Backward accumulates into Grads the gradient of a loss whose derivative with
// respect to the last Forward's outputs is dout (n×OutSize). n must equal the
// last Forward's n, or be smaller to backpropagate only its first n rows.
func (m *MLP) Backward(dout []float32, n int) {
	if m.input == nil || n*m.sizes[0] > len(m.input) || len(dout) < n*m.OutSize() {
		panic(fmt.Sprintf("nn: Backward of %d rows without a matching Forward", n))
	}
	g := dout[:n*m.OutSize()]
	for li := len(m.Layers) - 1; li >= 0; li-- {
		l := &m.Layers[li]
		var in, din []float32
		if li == 0 {
			in = m.input[:n*l.In]
		} else {
			in = m.acts[li-1][:n*l.In]
			din = m.deltas[li-1][:n*l.In]
			clear(din)
		}
		linearBackward(g, in, din, l.W, l.DW, l.DB, n, l.In, l.Out, m.idx)
		if din != nil {
			reluBackward(din, in)
		}
		g = din
	}
}

// linearForward sets out[s][j] = b[j] + sum_k w[j][k] x[s][k], followed by
// ReLU when relu is set. Four rows of x are processed together so that each
// weight loaded serves four products.
func linearForward(out, x, w, b []float32, n, in, nout int, relu bool) {
	var lo float32 = -math.MaxFloat32
	if relu {
		lo = 0
	}
	b = b[:nout]
	s := 0
	for ; s+4 <= n; s += 4 {
		x0 := x[(s+0)*in : (s+1)*in]
		x1 := x[(s+1)*in : (s+2)*in]
		x2 := x[(s+2)*in : (s+3)*in]
		x3 := x[(s+3)*in : (s+4)*in]
		o0 := out[(s+0)*nout : (s+1)*nout]
		o1 := out[(s+1)*nout : (s+2)*nout]
		o2 := out[(s+2)*nout : (s+3)*nout]
		o3 := out[(s+3)*nout : (s+4)*nout]
		for j, bj := range b {
			a0, a1, a2, a3 := dot4(w[j*in:(j+1)*in], x0, x1, x2, x3)
			o0[j] = max(a0+bj, lo)
			o1[j] = max(a1+bj, lo)
			o2[j] = max(a2+bj, lo)
			o3[j] = max(a3+bj, lo)
		}
	}
	for ; s < n; s++ {
		xs := x[s*in : (s+1)*in]
		os := out[s*nout : (s+1)*nout]
		for j, bj := range b {
			os[j] = max(dot(w[j*in:(j+1)*in], xs)+bj, lo)
		}
	}
}

// linearForwardSparse computes what linearForward does from the transposed
// weights wt (in×out): out[s] = b + Σ_k x[s][k]·wt[k], over the nonzero x[s][k]
// only, four at a time. Behind a ReLU about half the inputs are zero, and this
// does half the work of the dense kernel.
func linearForwardSparse(out, x, wt, b []float32, n, in, nout int, relu bool, idx []int) {
	row := func(v []float32, r, width int) []float32 { return v[r*width : (r+1)*width] }
	for s := 0; s < n; s++ {
		xs := row(x, s, in)
		os := row(out, s, nout)
		copy(os, b)
		m := 0
		for k, v := range xs {
			idx[m] = k // branch-free: keep k only when v != 0
			if v != 0 {
				m++
			}
		}
		k := 0
		for ; k+4 <= m; k += 4 {
			k0, k1, k2, k3 := idx[k], idx[k+1], idx[k+2], idx[k+3]
			axpy4(os, xs[k0], row(wt, k0, nout), xs[k1], row(wt, k1, nout), xs[k2], row(wt, k2, nout), xs[k3], row(wt, k3, nout))
		}
		for ; k < m; k++ {
			axpy(os, xs[idx[k]], row(wt, idx[k], nout))
		}
		if relu {
			for j, v := range os {
				os[j] = max(v, 0)
			}
		}
	}
}

// transpose writes the rows×cols matrix src into dst as cols×rows.
func transpose(dst, src []float32, rows, cols int) {
	dst = dst[:rows*cols]
	for r := 0; r < rows; r++ {
		for c, v := range src[r*cols : (r+1)*cols] {
			dst[c*rows+r] = v
		}
	}
}

// linearBackward accumulates dw += gᵀx and db += Σ_s g[s], and, when din is
// not nil, din += g·w. Zero entries of g (units that ReLU switched off, actions
// not taken) are skipped: the nonzero ones are gathered into idx first and then
// applied four at a time, so each row of dw or din is loaded and stored once per
// four products.
func linearBackward(g, x, din, w, dw, db []float32, n, in, nout int, idx []int) {
	g = g[:n*nout]
	db = db[:nout]
	for s := 0; s < n; s++ {
		for j, gj := range g[s*nout : (s+1)*nout] {
			db[j] += gj
		}
	}
	row := func(v []float32, r, width int) []float32 { return v[r*width : (r+1)*width] }
	for j := 0; j < nout; j++ {
		m := 0
		for s := 0; s < n; s++ {
			idx[m] = s
			if g[s*nout+j] != 0 {
				m++
			}
		}
		dwj := row(dw, j, in)
		k := 0
		for ; k+4 <= m; k += 4 {
			s0, s1, s2, s3 := idx[k], idx[k+1], idx[k+2], idx[k+3]
			axpy4(dwj, g[s0*nout+j], row(x, s0, in), g[s1*nout+j], row(x, s1, in),
				g[s2*nout+j], row(x, s2, in), g[s3*nout+j], row(x, s3, in))
		}
		for ; k < m; k++ {
			axpy(dwj, g[idx[k]*nout+j], row(x, idx[k], in))
		}
	}
	if din == nil {
		return
	}
	for s := 0; s < n; s++ {
		gs := row(g, s, nout)
		ds := row(din, s, in)
		m := 0
		for j, gj := range gs {
			idx[m] = j
			if gj != 0 {
				m++
			}
		}
		k := 0
		for ; k+4 <= m; k += 4 {
			j0, j1, j2, j3 := idx[k], idx[k+1], idx[k+2], idx[k+3]
			axpy4(ds, gs[j0], row(w, j0, in), gs[j1], row(w, j1, in), gs[j2], row(w, j2, in), gs[j3], row(w, j3, in))
		}
		for ; k < m; k++ {
			axpy(ds, gs[idx[k]], row(w, idx[k], in))
		}
	}
}

// reluBackward zeroes the deltas of units whose ReLU output was zero.
func reluBackward(d, act []float32) {
	act = act[:len(d)]
	for i, a := range act {
		if a <= 0 {
			d[i] = 0
		}
	}
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	for len(a) >= 4 && len(b) >= 4 {
		s0 += a[0] * b[0]
		s1 += a[1] * b[1]
		s2 += a[2] * b[2]
		s3 += a[3] * b[3]
		a, b = a[4:], b[4:]
	}
	for i, v := range a {
		s0 += v * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func dot4(w, x0, x1, x2, x3 []float32) (a0, a1, a2, a3 float32) {
	n := len(w)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	for k, wk := range w {
		a0 += wk * x0[k]
		a1 += wk * x1[k]
		a2 += wk * x2[k]
		a3 += wk * x3[k]
	}
	return
}

// axpy4 sets y += a0*x0 + a1*x1 + a2*x2 + a3*x3.
func axpy4(y []float32, a0 float32, x0 []float32, a1 float32, x1 []float32, a2 float32, x2 []float32, a3 float32, x3 []float32) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	for k := range y {
		y[k] += (a0*x0[k] + a1*x1[k]) + (a2*x2[k] + a3*x3[k])
	}
}

// axpy sets y += a*x.
func axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for len(y) >= 4 && len(x) >= 4 {
		y[0] += a * x[0]
		y[1] += a * x[1]
		y[2] += a * x[2]
		y[3] += a * x[3]
		y, x = y[4:], x[4:]
	}
	for i, v := range x {
		y[i] += a * v
	}
}
