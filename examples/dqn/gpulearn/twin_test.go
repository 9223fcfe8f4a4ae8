package gpulearn_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/gpulearn"
	"github.com/gear-rl/gear/examples/dqn/nn"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

// twinLearner is gpulearn.Learner's step written with the kernels' CPU twins
// (cuda.MatMulCPU, cuda.TDCPU, ...), in host memory: what the device must
// compute, bit for bit.
type twinLearner struct {
	cfg                   agent.Config
	sizes                 []int
	lay                   gpulearn.Layout
	online, target, grads []float32
	m, v                  []float32
	acts, next, tgt, dlt  [][]float32
	dout                  []float32
	item                  []float64
	stats                 [4]float64
	rows                  []uint32
	w                     []float64
	t                     int
	steps                 int64
}

func newTwin(cfg agent.Config, obs, na int, rng *rand.Rand) *twinLearner {
	sizes := agent.LayerSizes(cfg, obs, na)
	online := nn.NewMLP(sizes, 1, rng)
	_ = nn.NewMLP(sizes, 1, rng)
	np := len(online.Params())
	b := cfg.BatchSize
	t := &twinLearner{cfg: cfg, sizes: sizes, lay: gpulearn.Layout{ObsSize: obs},
		online: append([]float32(nil), online.Params()...), target: append([]float32(nil), online.Params()...),
		grads: make([]float32, np), m: make([]float32, np), v: make([]float32, np),
		dout: make([]float32, b*na), item: make([]float64, cuda.TDItemWords*b), stats: [4]float64{0, 0, 0, 1}, w: make([]float64, b)}
	t.rows = make([]uint32, b*t.lay.Words())
	for _, out := range sizes[1:] {
		t.acts = append(t.acts, make([]float32, b*out))
		t.next = append(t.next, make([]float32, b*out))
		t.tgt = append(t.tgt, make([]float32, b*out))
		t.dlt = append(t.dlt, make([]float32, b*out))
	}
	return t
}

func (t *twinLearner) offsets(li int) (w, b int) {
	off := 0
	for i := 0; i < li; i++ {
		off += t.sizes[i]*t.sizes[i+1] + t.sizes[i+1]
	}
	return off, off + t.sizes[li]*t.sizes[li+1]
}

func (t *twinLearner) forward(net, x []float32, ldx int, acts [][]float32) {
	last := len(t.sizes) - 2
	for li := 0; li <= last; li++ {
		wo, bo := t.offsets(li)
		mm := cuda.Forward(t.cfg.BatchSize, t.sizes[li], t.sizes[li+1], ldx, li != last)
		_ = cuda.MatMulCPU(acts[li], x, net[wo:], net[bo:], nil, mm)
		x, ldx = acts[li], t.sizes[li+1]
	}
}

func (t *twinLearner) step(b *replay.Batch, beta float64, lr float64) (agent.Stats, float64) {
	n, d, words := t.cfg.BatchSize, t.lay.ObsSize, t.lay.Words()
	for i := 0; i < n; i++ {
		row := t.rows[i*words : (i+1)*words]
		for k := 0; k < d; k++ {
			row[k] = math.Float32bits(b.Obs[i*d+k])
			row[t.lay.Next()+k] = math.Float32bits(b.NextObs[i*d+k])
		}
		row[t.lay.Action()] = uint32(b.Actions[i])
		row[t.lay.Reward()] = math.Float32bits(b.Rewards[i])
		row[t.lay.Discount()] = math.Float32bits(b.Discounts[i])
	}
	gpulearn.ImportanceWeights(t.w, b.Probabilities, b.TableSize, beta)
	x := unsafe.Slice((*float32)(unsafe.Pointer(&t.rows[0])), len(t.rows))
	t.forward(t.online, x, words, t.acts)
	t.forward(t.online, x[d:], words, t.next)
	t.forward(t.target, x[d:], words, t.tgt)
	last := len(t.sizes) - 2
	td := cuda.TD{N: n, NA: t.sizes[last+1], RowWords: words, ActionOff: t.lay.Action(), RewardOff: t.lay.Reward(),
		DiscountOff: t.lay.Discount(), Huber: t.cfg.HuberDelta, Eps: t.cfg.PriorityEps}
	cuda.TDCPU(t.dout, t.item, t.acts[last], t.next[last], t.tgt[last], t.rows, t.w, td)
	cuda.TDSumCPU(&t.stats, t.item, n)
	g := t.dout
	for li := last; li >= 0; li-- {
		in, out := t.sizes[li], t.sizes[li+1]
		xin, ldx := x, words
		if li > 0 {
			xin, ldx = t.acts[li-1], in
		}
		wo, bo := t.offsets(li)
		_ = cuda.MatMulCPU(t.grads[wo:], g, xin, nil, nil, cuda.WeightGrad(n, in, out, ldx))
		cuda.ColSumCPU(t.grads[bo:], g, n, out)
		if li > 0 {
			_ = cuda.MatMulCPU(t.dlt[li-1], g, t.online[wo:], nil, t.acts[li-1], cuda.InputGrad(n, in, out))
			g = t.dlt[li-1]
		}
	}
	norm, scale := cuda.ClipNormCPU(t.grads, t.cfg.GradClip)
	t.t++
	cuda.AdamCPU(t.online, t.m, t.v, t.grads, scale, cuda.AdamStep(lr, 0.9, 0.999, 1e-8, t.t))
	t.steps++
	if k := t.cfg.TargetUpdate; k > 0 {
		if t.steps%int64(k) == 0 {
			copy(t.target, t.online)
		}
	} else {
		cuda.SoftUpdateCPU(t.target, t.online, float32(t.cfg.Tau))
	}
	return agent.Stats{Loss: t.stats[0], MeanQ: t.stats[1], MeanAbsTD: t.stats[2]}, norm
}

// TestLearnerEqualsKernelTwins: the GPU learner computes, bit for bit, what
// the composition of its kernels' CPU twins computes: losses, priorities,
// norms and, after 30 steps, every parameter.
func TestLearnerEqualsKernelTwins(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device) {
		for _, target := range []int{7, 0} {
			cfg := agent.DefaultConfig()
			cfg.Hidden, cfg.BatchSize, cfg.TargetUpdate, cfg.Tau, cfg.GradClip = []int{24, 40}, 33, target, 0.05, 1
			twin := newTwin(cfg, 4, 3, rand.New(rand.NewPCG(4, 4)))
			gpu, err := gpulearn.New(dev, cfg, 4, 3, rand.New(rand.NewPCG(4, 4)))
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(5, 5))
			b := replay.NewBatch(cfg.BatchSize, 4)
			for step := range 30 {
				randomBatch(rng, b, 500)
				for i := range b.Actions {
					b.Actions[i] = int32(rng.IntN(3))
				}
				want, wantNorm := twin.step(b, 0.5, cfg.LR)
				got, err := gpu.ComputeGradients(b, 0.5)
				if err != nil {
					t.Fatal(err)
				}
				norm, err := gpu.ApplyGradients()
				if err != nil {
					t.Fatal(err)
				}
				if got != want || norm != wantNorm {
					t.Fatalf("target %d, step %d: %+v norm %v, twins %+v norm %v", target, step, got, norm, want, wantNorm)
				}
				for i, p := range gpu.Priorities() {
					if p != twin.item[cuda.TDItemWords*i+3] {
						t.Fatalf("step %d: priority %d = %v, twins %v", step, i, p, twin.item[cuda.TDItemWords*i+3])
					}
				}
			}
			params, err := gpu.OnlineParams()
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range params {
				if math.Float32bits(p) != math.Float32bits(twin.online[i]) {
					t.Fatalf("target %d: parameter %d = %v, twins %v", target, i, p, twin.online[i])
				}
			}
			if err := gpu.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
}
