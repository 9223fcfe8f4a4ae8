package cuda

import (
	"fmt"
	"math"
)

// The learner's kernels (internal/kernels/mlp.cuh) and their CPU twins. Each
// Launch method enqueues one kernel on a stream and returns; the twin of the
// same name with suffix CPU computes bit for bit what the kernel computes, in
// the same order of operations, with every product and sum rounded on its own.
// A learner written against the Launch methods is thus checked without a GPU
// against the twins (and on the fake driver, which runs the kernels' source).

// MatMul is the shape of C = epilogue(A·B): C is M×N with row stride LDC, and
// A(i,t) = a[i·AI + t·AK], B(t,j) = b[t·BK + j·BJ] for t < K. The epilogue adds
// bias[j] when there is a bias, clamps at 0 with ReLU, and zeroes C(i,j) where
// mask[i·LDM + j] is not positive when there is a mask.
type MatMul struct {
	M, N, K        int
	AI, AK, BK, BJ int
	LDC, LDM       int
	ReLU           bool
}

// Forward is the MatMul of a linear layer's forward pass: out (n×nout) =
// x·wᵀ + b for x of n rows of width in with row stride ldx (in for dense rows),
// and w nout×in.
func Forward(n, in, nout, ldx int, relu bool) MatMul {
	return MatMul{M: n, N: nout, K: in, AI: ldx, AK: 1, BK: 1, BJ: in, LDC: nout, ReLU: relu}
}

// InputGrad is the MatMul of a layer's input gradient: din (n×in) = g·w, for g
// n×nout and w nout×in, masked by the layer input's ReLU (LDM = in).
func InputGrad(n, in, nout int) MatMul {
	return MatMul{M: n, N: in, K: nout, AI: nout, AK: 1, BK: in, BJ: 1, LDC: in, LDM: in}
}

// WeightGrad is the MatMul of a layer's weight gradient: dw (nout×in) = gᵀ·x,
// for g n×nout and x of n rows with stride ldx.
func WeightGrad(n, in, nout, ldx int) MatMul {
	return MatMul{M: nout, N: in, K: n, AI: 1, AK: nout, BK: ldx, BJ: 1, LDC: in}
}

func (mm MatMul) check() error {
	if mm.M < 1 || mm.N < 1 || mm.K < 1 || mm.LDC < mm.N {
		return fmt.Errorf("cuda: matmul %dx%dx%d with row stride %d", mm.M, mm.N, mm.K, mm.LDC)
	}
	return nil
}

const (
	mmTile       = 16
	sumsqThreads = 256
	// SumSqBlock is the number of gradient elements each partial sum of the
	// clipping norm covers.
	SumSqBlock = 4096
)

func boolInt(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// LaunchMatMul enqueues C = epilogue(A·B) (gear_mm_f32); bias and mask may be 0.
func (dev *Device) LaunchMatMul(s Stream, c, a, b, bias, mask DevicePtr, mm MatMul) error {
	if err := mm.check(); err != nil {
		return err
	}
	k, err := dev.gear()
	if err != nil {
		return err
	}
	grid := Dim3{X: (mm.N + mmTile - 1) / mmTile, Y: (mm.M + mmTile - 1) / mmTile}
	if grid.Y > 65535 {
		return fmt.Errorf("cuda: matmul of %d rows: at most %d", mm.M, 65535*mmTile)
	}
	return dev.Launch(k.mm, LaunchConfig{Grid: grid, Block: Dim3{X: mmTile, Y: mmTile}, Stream: s},
		c, a, b, bias, mask, int64(mm.M), int64(mm.N), int64(mm.K), int64(mm.AI), int64(mm.AK),
		int64(mm.BK), int64(mm.BJ), int64(mm.LDC), int64(mm.LDM), boolInt(mm.ReLU))
}

// MatMulCPU is gear_mm_f32's twin; bias and mask may be nil.
func MatMulCPU(c, a, b, bias, mask []float32, mm MatMul) error {
	if err := mm.check(); err != nil {
		return err
	}
	for i := 0; i < mm.M; i++ {
		for j := 0; j < mm.N; j++ {
			var acc float32
			for t := 0; t < mm.K; t++ {
				acc = acc + float32(a[i*mm.AI+t*mm.AK]*b[t*mm.BK+j*mm.BJ])
			}
			v := acc
			if bias != nil {
				v = v + bias[j]
			}
			if mm.ReLU && !(v > 0) {
				v = 0
			}
			if mask != nil && !(mask[i*mm.LDM+j] > 0) {
				v = 0
			}
			c[i*mm.LDC+j] = v
		}
	}
	return nil
}

// LaunchColSum enqueues out[j] = Σ_s g[s][j] for g rows×cols (gear_colsum_f32).
func (dev *Device) LaunchColSum(s Stream, out, g DevicePtr, rows, cols int) error {
	k, err := dev.gear()
	if err != nil {
		return err
	}
	return dev.Launch(k.colsum, LaunchConfig{Grid: Dim3{X: (cols + 255) / 256}, Block: Dim3{X: 256}, Stream: s},
		out, g, int64(rows), int64(cols))
}

// ColSumCPU is gear_colsum_f32's twin.
func ColSumCPU(out, g []float32, rows, cols int) {
	for j := 0; j < cols; j++ {
		var acc float32
		for s := 0; s < rows; s++ {
			acc = acc + g[s*cols+j]
		}
		out[j] = acc
	}
}

// TD describes a batch for gear_dqn_td: N items, NA actions, rows of RowWords
// 4-byte words holding the action (int32) at word ActionOff, and the reward and
// discount (float32) at words RewardOff and DiscountOff.
type TD struct {
	N, NA                             int
	RowWords                          int
	ActionOff, RewardOff, DiscountOff int
	Huber, Eps                        float64
}

// TDItemWords is the number of float64 per item that gear_dqn_td writes: the
// weighted loss over N, Q(s,a) over N, |δ| over N, and the priority |δ|+ε.
const TDItemWords = 4

// TDStatusBadAction is the status bit of an action outside [0, NA).
const TDStatusBadAction = 1

// LaunchTD enqueues gear_dqn_td: from Q_online(s) in q, Q_online(s') in qn,
// Q_target(s') in qt (N×NA each), the batch rows and the normalized importance
// weights w (N float64), it writes dout (N×NA), item (N×TDItemWords float64)
// and ORs status (an int32) with TDStatusBadAction for a bad action.
func (dev *Device) LaunchTD(s Stream, dout, item, status, q, qn, qt, rows, w DevicePtr, td TD) error {
	k, err := dev.gear()
	if err != nil {
		return err
	}
	return dev.Launch(k.td, LaunchConfig{Grid: Dim3{X: (td.N + 255) / 256}, Block: Dim3{X: 256}, Stream: s},
		dout, item, status, q, qn, qt, rows, w, int64(td.N), int64(td.NA), int64(td.RowWords),
		int64(td.ActionOff), int64(td.RewardOff), int64(td.DiscountOff), td.Huber, td.Eps)
}

// TDCPU is gear_dqn_td's twin; rows are the batch rows as 4-byte words.
func TDCPU(dout []float32, item []float64, q, qn, qt []float32, rows []uint32, w []float64, td TD) (status int32) {
	na := td.NA
	invN := 1 / float64(td.N)
	for i := 0; i < td.N; i++ {
		next := qn[i*na : (i+1)*na]
		best := 0
		for x := 1; x < na; x++ {
			if next[x] > next[best] {
				best = x
			}
		}
		row := rows[i*td.RowWords:]
		a := int32(row[td.ActionOff])
		r := float64(math.Float32frombits(row[td.RewardOff]))
		d := float64(math.Float32frombits(row[td.DiscountOff]))
		y := r + float64(d*float64(qt[i*na+best]))
		clear(dout[i*na : (i+1)*na])
		it := item[TDItemWords*i : TDItemWords*(i+1)]
		if a < 0 || int(a) >= na {
			status |= TDStatusBadAction
			clear(it)
			continue
		}
		qa := float64(q[i*na+int(a)])
		delta := qa - y
		loss, g := huberTwin(delta, td.Huber)
		ad := math.Abs(delta)
		dout[i*na+int(a)] = float32(float64(w[i]*g) * invN)
		it[0] = float64(w[i]*loss) * invN
		it[1] = qa * invN
		it[2] = ad * invN
		it[3] = ad + td.Eps
	}
	return status
}

// huberTwin is the Huber loss as gear_dqn_td computes it (and nn.Huber).
func huberTwin(d, delta float64) (loss, grad float64) {
	switch {
	case d > delta:
		return delta * (d - float64(0.5*delta)), delta
	case d < -delta:
		return delta * (-d - float64(0.5*delta)), -delta
	}
	return float64(0.5*d) * d, d
}

// LaunchTDSum enqueues gear_dqn_td_sum: stats[0..2] = the items' sums (loss,
// mean Q, mean |δ|) in item order, and stats[3] = max(stats[3], priorities).
func (dev *Device) LaunchTDSum(s Stream, stats, item DevicePtr, n int) error {
	k, err := dev.gear()
	if err != nil {
		return err
	}
	return dev.Launch(k.tdSum, LaunchConfig{Grid: Dim3{X: 1}, Block: Dim3{X: 32}, Stream: s}, stats, item, int64(n))
}

// TDSumCPU is gear_dqn_td_sum's twin.
func TDSumCPU(stats *[4]float64, item []float64, n int) {
	var l, q, t float64
	mp := stats[3]
	for i := 0; i < n; i++ {
		it := item[TDItemWords*i:]
		l, q, t = l+it[0], q+it[1], t+it[2]
		if it[3] > mp {
			mp = it[3]
		}
	}
	stats[0], stats[1], stats[2], stats[3] = l, q, t, mp
}

// SumSqBlocks is the number of partial sums LaunchClipNorm needs for n
// gradient elements.
func SumSqBlocks(n int) int { return (n + SumSqBlock - 1) / SumSqBlock }

// LaunchClipNorm enqueues the global norm of the n gradients g and the factor
// that clips it to maxNorm: partial (SumSqBlocks(n) float64) gets each block's
// sum of squares, norm (a float64) the norm, and scale (a float32)
// maxNorm/(norm+1e-6) when maxNorm > 0 and the norm exceeds it, else 1.
func (dev *Device) LaunchClipNorm(s Stream, norm, scale, partial, g DevicePtr, n int, maxNorm float64) error {
	k, err := dev.gear()
	if err != nil {
		return err
	}
	nb := SumSqBlocks(n)
	if err := dev.Launch(k.sumsq, LaunchConfig{Grid: Dim3{X: nb}, Block: Dim3{X: sumsqThreads}, Stream: s}, partial, g, int64(n)); err != nil {
		return err
	}
	return dev.Launch(k.clipScale, LaunchConfig{Grid: Dim3{X: 1}, Block: Dim3{X: 32}, Stream: s}, norm, scale, partial, int64(nb), maxNorm)
}

// ClipNormCPU is the twin of LaunchClipNorm: the norm of g and the clipping factor.
func ClipNormCPU(g []float32, maxNorm float64) (norm float64, scale float32) {
	var ss float64
	var s [sumsqThreads]float64
	for base := 0; base < len(g); base += SumSqBlock {
		for t := range s {
			var acc float64
			for r := 0; r < SumSqBlock/sumsqThreads; r++ {
				if e := base + t + r*sumsqThreads; e < len(g) {
					x := float64(g[e])
					acc = acc + float64(x*x)
				}
			}
			s[t] = acc
		}
		for stride := sumsqThreads / 2; stride > 0; stride >>= 1 {
			for t := 0; t < stride; t++ {
				s[t] = s[t] + s[t+stride]
			}
		}
		ss = ss + s[0]
	}
	norm = math.Sqrt(ss)
	scale = 1
	if maxNorm > 0 && norm > maxNorm {
		scale = float32(maxNorm / (norm + 1e-6))
	}
	return norm, scale
}

// Adam holds the constants of one Adam step, rounded to float32 as the kernel
// takes them.
type Adam struct {
	Beta1, Beta2, OneMinusBeta1, OneMinusBeta2 float32
	LR, C1, C2, Eps                            float32
}

// AdamStep returns the constants of step t (from 1) of Adam with the given
// hyperparameters, computed as nn.Adam computes them.
func AdamStep(lr, beta1, beta2, eps float64, t int) Adam {
	b1, b2 := float32(beta1), float32(beta2)
	return Adam{
		Beta1: b1, Beta2: b2, OneMinusBeta1: 1 - b1, OneMinusBeta2: 1 - b2,
		LR: float32(lr), Eps: float32(eps),
		C1: float32(1 - math.Pow(beta1, float64(t))),
		C2: float32(1 - math.Pow(beta2, float64(t))),
	}
}

// LaunchAdam enqueues one Adam step (gear_adam_f32) of the n parameters p with
// moments m and v, from the gradients g times *scale (a float32 in device
// memory, as LaunchClipNorm leaves it).
func (dev *Device) LaunchAdam(s Stream, p, m, v, g, scale DevicePtr, n int, h Adam) error {
	k, err := dev.gear()
	if err != nil {
		return err
	}
	return dev.Launch(k.adam, LaunchConfig{Grid: Dim3{X: (n + 255) / 256}, Block: Dim3{X: 256}, Stream: s},
		p, m, v, g, scale, int64(n), h.Beta1, h.Beta2, h.OneMinusBeta1, h.OneMinusBeta2, h.LR, h.C1, h.C2, h.Eps)
}

// AdamCPU is gear_adam_f32's twin.
func AdamCPU(p, m, v, g []float32, scale float32, h Adam) {
	for i := range p {
		gi := g[i] * scale
		mi := float32(h.Beta1*m[i]) + float32(h.OneMinusBeta1*gi)
		vi := float32(h.Beta2*v[i]) + float32(float32(h.OneMinusBeta2*gi)*gi)
		m[i], v[i] = mi, vi
		den := float32(math.Sqrt(float64(vi/h.C2))) + h.Eps
		p[i] = p[i] - float32(h.LR*float32(mi/h.C1))/den
	}
}

// LaunchSoftUpdate enqueues tp += tau·(p − tp) over n parameters.
func (dev *Device) LaunchSoftUpdate(s Stream, tp, p DevicePtr, n int, tau float32) error {
	k, err := dev.gear()
	if err != nil {
		return err
	}
	return dev.Launch(k.soft, LaunchConfig{Grid: Dim3{X: (n + 255) / 256}, Block: Dim3{X: 256}, Stream: s}, tp, p, int64(n), tau)
}

// SoftUpdateCPU is gear_soft_update_f32's twin.
func SoftUpdateCPU(tp, p []float32, tau float32) {
	for i := range tp {
		tp[i] = tp[i] + float32(tau*(p[i]-tp[i]))
	}
}

// LaunchPrioScatter enqueues weights[idx[i]] = priority_i^alpha for the n
// items gear_dqn_td wrote to item: the priorities go back to the sampling
// weights (float32, in device memory) without leaving the device.
func (dev *Device) LaunchPrioScatter(s Stream, weights, idx, item DevicePtr, n int, alpha float64) error {
	k, err := dev.gear()
	if err != nil {
		return err
	}
	return dev.Launch(k.prioScatter, LaunchConfig{Grid: Dim3{X: (n + 255) / 256}, Block: Dim3{X: 256}, Stream: s}, weights, idx, item, int64(n), alpha)
}

// PrioScatterCPU is gear_prio_scatter's twin. The kernel's pow and Go's
// math.Pow may differ in the last bit.
func PrioScatterCPU(weights []float32, idx []int64, item []float64, alpha float64) {
	for i, x := range idx {
		weights[x] = float32(math.Pow(item[TDItemWords*i+3], alpha))
	}
}

// LaunchISWeights enqueues the normalized importance weights of n sampled
// items (gear_is_weights): out[i] (float64) = x_i / max_j x_j with x_i =
// (size · weights[idx[i]] / *total)^−β, from float32 sampling weights, int64
// indices and the weights' float64 total (Sampler.Total) in device memory.
func (dev *Device) LaunchISWeights(s Stream, out, weights, idx DevicePtr, n, size int, total DevicePtr, beta float64) error {
	k, err := dev.gear()
	if err != nil {
		return err
	}
	return dev.Launch(k.isWeights, LaunchConfig{Grid: Dim3{X: 1}, Block: Dim3{X: 256}, Stream: s}, out, weights, idx, int64(n), float64(size), total, beta)
}

// ISWeightsCPU is gear_is_weights' twin. The kernel's pow and Go's math.Pow
// may differ in the last bit.
func ISWeightsCPU(out []float64, weights []float32, idx []int64, size int, total, beta float64) {
	wmax := 0.0
	for i, x := range idx {
		v := 1.0
		if beta != 0 {
			v = math.Pow(float64(size)*(float64(weights[x])/total), -beta)
		}
		out[i] = v
		wmax = max(wmax, v)
	}
	for i := range idx {
		out[i] = out[i] / wmax
	}
}
