package nn

import (
	"fmt"
	"math"
)

// Adam is the Adam optimizer (Kingma and Ba, 2015) with bias correction, over a
// flat parameter vector.
type Adam struct {
	LR, Beta1, Beta2, Eps float64
	m, v                  []float32
	t                     int
}

// NewAdam returns an optimizer for n parameters with the usual defaults
// (beta1 0.9, beta2 0.999, eps 1e-8) and learning rate lr.
func NewAdam(n int, lr float64) *Adam {
	return &Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, m: make([]float32, n), v: make([]float32, n)}
}

// AdamState is what Adam carries from one step to the next: the first and
// second moments and the step count, which a restarted trainer restores
// (Adam.SetState) so that its steps continue the same optimisation.
type AdamState struct {
	M, V  []float32
	Steps int
}

// State returns a copy of the optimizer's moments and step count.
func (a *Adam) State() AdamState {
	return AdamState{M: append([]float32(nil), a.m...), V: append([]float32(nil), a.v...), Steps: a.t}
}

// SetState restores moments and a step count that State returned, for the
// same number of parameters; it copies them.
func (a *Adam) SetState(s AdamState) error {
	if len(s.M) != len(a.m) || len(s.V) != len(a.m) || s.Steps < 0 {
		return fmt.Errorf("nn: Adam.SetState: %d and %d moments, %d steps; want %d each and steps >= 0", len(s.M), len(s.V), s.Steps, len(a.m))
	}
	copy(a.m, s.M)
	copy(a.v, s.V)
	a.t = s.Steps
	return nil
}

// Steps returns the number of steps taken.
func (a *Adam) Steps() int { return a.t }

// Step updates params in place from grads:
//
//	m ← β1 m + (1−β1) g,  v ← β2 v + (1−β2) g²,
//	p ← p − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε).
func (a *Adam) Step(params, grads []float32) error {
	if len(params) != len(a.m) || len(grads) != len(a.m) {
		return fmt.Errorf("nn: Adam.Step: %d params and %d grads, want %d", len(params), len(grads), len(a.m))
	}
	a.t++
	b1, b2 := float32(a.Beta1), float32(a.Beta2)
	c1 := float32(1 - math.Pow(a.Beta1, float64(a.t)))
	c2 := float32(1 - math.Pow(a.Beta2, float64(a.t)))
	lr, eps := float32(a.LR), float32(a.Eps)
	m, v := a.m, a.v[:len(a.m)]
	grads = grads[:len(m)]
	params = params[:len(m)]
	for i, g := range grads {
		mi := b1*m[i] + (1-b1)*g
		vi := b2*v[i] + (1-b2)*g*g
		m[i], v[i] = mi, vi
		params[i] -= lr * (mi / c1) / (float32(math.Sqrt(float64(vi/c2))) + eps)
	}
	return nil
}

// ClipGradNorm scales grads so that their Euclidean norm is at most maxNorm and
// returns the norm before scaling. maxNorm <= 0 leaves grads unchanged.
func ClipGradNorm(grads []float32, maxNorm float64) float64 {
	var ss float64
	for _, g := range grads {
		ss += float64(g) * float64(g)
	}
	norm := math.Sqrt(ss)
	if maxNorm > 0 && norm > maxNorm {
		s := float32(maxNorm / (norm + 1e-6))
		for i := range grads {
			grads[i] *= s
		}
	}
	return norm
}

// Huber returns the Huber loss of the error d with threshold delta and its
// derivative: 0.5·d² inside [−delta, delta], delta·(|d| − 0.5·delta) outside.
func Huber(d, delta float64) (loss, grad float64) {
	if d > delta {
		return delta * (d - 0.5*delta), delta
	}
	if d < -delta {
		return delta * (-d - 0.5*delta), -delta
	}
	return 0.5 * d * d, d
}
