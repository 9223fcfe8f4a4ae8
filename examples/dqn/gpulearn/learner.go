package gpulearn

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"unsafe"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/nn"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

// Learner is agent.Learner on a GPU. See the package documentation.
type Learner struct {
	dev    *cuda.Device
	st     cuda.Stream
	cfg    agent.Config
	sizes  []int
	layout Layout
	batch  int
	np     int // parameters

	// Device memory.
	online, target, grads, adamM, adamV cuda.DevicePtr
	acts, nextActs, tgtActs, deltas     []cuda.DevicePtr // per layer, batch×out
	rows                                cuda.DevicePtr   // batch rows (the host path's copy)
	weights                             cuda.DevicePtr   // batch float64 importance weights
	dout, item, status, stats           cuda.DevicePtr
	partial, norm, scale                cuda.DevicePtr
	allocs                              []cuda.DevicePtr

	// Pinned host memory: the host path's rows and weights, and what comes back.
	pinned                        []byte
	hostRows                      []uint32
	hostW                         []float64
	backItem, backStats, backNorm []float64
	backStatus                    []int32

	hostParams []float32
	paramsOld  bool
	prio       []float64
	maxPrio    float64
	ready      bool
	gradSteps  int64
	adamT      int
	lr         float64
	closed     bool
}

var _ agent.Learner = (*Learner)(nil)

// Opener returns agent.RunConfig's NewLearner for device dev: the learner
// draws its initial weights from rng exactly as agent.NewLearner does.
func Opener(dev *cuda.Device) func(cfg agent.Config, obsSize, numActions int, rng *rand.Rand) (agent.Learner, error) {
	return func(cfg agent.Config, obsSize, numActions int, rng *rand.Rand) (agent.Learner, error) {
		return New(dev, cfg, obsSize, numActions, rng)
	}
}

// ReplayOpener returns agent.RunConfig's NewDeviceReplay: a Replay of
// cfg.ReplayCapacity transitions for a Learner of this package.
func ReplayOpener() func(l agent.Learner, cfg agent.Config, rng *rand.Rand) (agent.DeviceReplay, error) {
	return func(l agent.Learner, cfg agent.Config, rng *rand.Rand) (agent.DeviceReplay, error) {
		gl, ok := l.(*Learner)
		if !ok {
			return nil, fmt.Errorf("gpulearn: a device replay needs gpulearn's learner, not %T", l)
		}
		return NewReplay(gl, cfg.ReplayCapacity, cfg.PriorityExponent, rng)
	}
}

// New returns a learner on dev whose networks start as agent.NewLearner's
// would with the same rng (the online network drawn first, the target a copy
// of it), for batches of cfg.BatchSize transitions.
func New(dev *cuda.Device, cfg agent.Config, obsSize, numActions int, rng *rand.Rand) (*Learner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if obsSize < 1 || numActions < 1 {
		return nil, fmt.Errorf("gpulearn: observation size %d and action count %d must be positive", obsSize, numActions)
	}
	sizes := agent.LayerSizes(cfg, obsSize, numActions)
	b := cfg.BatchSize
	online := nn.NewMLP(sizes, 1, rng)
	_ = nn.NewMLP(sizes, 1, rng) // agent.NewLearner draws a target network too, then overwrites it
	l := &Learner{
		dev: dev, cfg: cfg, sizes: sizes, layout: Layout{ObsSize: obsSize}, batch: b,
		np: len(online.Params()), maxPrio: 1, lr: cfg.LR, paramsOld: true,
		prio: make([]float64, b), hostParams: make([]float32, len(online.Params())),
	}
	if err := l.alloc(); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	p := online.Params()
	if err := dev.CopyHtoD(l.online, f32Bytes(p)); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	if err := dev.CopyHtoD(l.target, f32Bytes(p)); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	zero := make([]float32, l.np)
	for _, m := range []cuda.DevicePtr{l.adamM, l.adamV, l.grads} {
		if err := dev.CopyHtoD(m, f32Bytes(zero)); err != nil {
			return nil, errors.Join(err, l.Close())
		}
	}
	if err := dev.CopyHtoD(l.stats, f64Bytes([]float64{0, 0, 0, 1})); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

func (l *Learner) alloc() error {
	var err error
	st, err := l.dev.NewStream()
	if err != nil {
		return err
	}
	l.st = st
	get := func(bytes int) cuda.DevicePtr {
		if err != nil {
			return 0
		}
		var p cuda.DevicePtr
		p, err = l.dev.Alloc(max(bytes, 16))
		if err == nil {
			l.allocs = append(l.allocs, p)
		}
		return p
	}
	b, pb := l.batch, 4*l.np
	l.online, l.target, l.grads, l.adamM, l.adamV = get(pb), get(pb), get(pb), get(pb), get(pb)
	for _, out := range l.sizes[1:] {
		l.acts = append(l.acts, get(4*b*out))
		l.nextActs = append(l.nextActs, get(4*b*out))
		l.tgtActs = append(l.tgtActs, get(4*b*out))
		l.deltas = append(l.deltas, get(4*b*out))
	}
	na := l.sizes[len(l.sizes)-1]
	l.rows = get(b * l.layout.Bytes())
	l.weights = get(8 * b)
	l.dout = get(4 * b * na)
	l.item = get(8 * cuda.TDItemWords * b)
	l.status = get(4)
	l.stats = get(8 * 4)
	l.partial = get(8 * cuda.SumSqBlocks(l.np))
	l.norm = get(8)
	l.scale = get(4)
	if err != nil {
		return err
	}
	// Pinned: rows, weights, item, stats, norm, status.
	rowsB, wB, itemB := b*l.layout.Bytes(), 8*b, 8*cuda.TDItemWords*b
	total := rowsB + wB + itemB + 8*4 + 8 + 8
	l.pinned, err = l.dev.AllocHost(total)
	if err != nil {
		return err
	}
	base := unsafe.Pointer(unsafe.SliceData(l.pinned))
	l.hostRows = unsafe.Slice((*uint32)(base), rowsB/4)
	off := rowsB
	l.hostW = unsafe.Slice((*float64)(unsafe.Add(base, off)), b)
	off += wB
	l.backItem = unsafe.Slice((*float64)(unsafe.Add(base, off)), cuda.TDItemWords*b)
	off += itemB
	l.backStats = unsafe.Slice((*float64)(unsafe.Add(base, off)), 4)
	off += 32
	l.backNorm = unsafe.Slice((*float64)(unsafe.Add(base, off)), 1)
	off += 8
	l.backStatus = unsafe.Slice((*int32)(unsafe.Add(base, off)), 1)
	return nil
}

// Close frees the learner's device and pinned memory and its stream. It
// waits for the stream first. Close is idempotent.
func (l *Learner) Close() error {
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	if l.st != 0 {
		errs = append(errs, l.dev.StreamSynchronize(context.Background(), l.st))
	}
	for _, p := range l.allocs {
		errs = append(errs, l.dev.Free(p))
	}
	if l.pinned != nil {
		errs = append(errs, l.dev.FreeHost(l.pinned))
	}
	if l.st != 0 {
		errs = append(errs, l.dev.DestroyStream(l.st))
	}
	return errors.Join(errs...)
}

// Layout is the row layout of the batches ComputeGradientsDevice takes.
func (l *Learner) Layout() Layout { return l.layout }

// BatchSize is the number of transitions per step.
func (l *Learner) BatchSize() int { return l.batch }

// Device is the learner's device, and Stream the stream its steps run on.
func (l *Learner) Device() *cuda.Device { return l.dev }

// Stream is the stream the learner's kernels run on.
func (l *Learner) Stream() cuda.Stream { return l.st }

// SetLearningRate sets Adam's learning rate for the next steps.
func (l *Learner) SetLearningRate(lr float64) { l.lr = lr }

// GradSteps returns the number of gradient steps applied.
func (l *Learner) GradSteps() int64 { return l.gradSteps }

// Priorities returns the last batch's new priorities |δ|+ε, in batch order.
func (l *Learner) Priorities() []float64 { return l.prio }

// MaxPriority returns the largest priority so far (at least 1).
func (l *Learner) MaxPriority() float64 { return l.maxPrio }

// ImportanceWeights sets w to the normalized importance weights of a batch
// drawn with the given probabilities from a table of tableSize items, as
// agent.CPULearner computes them: (N·P_i)^−β over their largest.
func ImportanceWeights(w, probs []float64, tableSize int, beta float64) {
	wmax := 0.0
	for i, p := range probs {
		x := 1.0
		if beta != 0 {
			x = math.Pow(float64(tableSize)*p, -beta)
		}
		w[i] = x
		wmax = max(wmax, x)
	}
	for i := range probs {
		w[i] = w[i] / wmax
	}
}

// ComputeGradients is agent.Learner's: batch b comes from the host, packed
// into the row layout in pinned memory and copied to the device once.
func (l *Learner) ComputeGradients(b *replay.Batch, beta float64) (agent.Stats, error) {
	n, d := l.batch, l.layout.ObsSize
	if b.Len() != n || b.ObsSize != d {
		return agent.Stats{}, fmt.Errorf("gpulearn: batch of %d×%d, want %d×%d", b.Len(), b.ObsSize, n, d)
	}
	// The previous step's kernels may still read the staging buffers.
	if err := l.dev.StreamSynchronize(context.Background(), l.st); err != nil {
		return agent.Stats{}, err
	}
	lay, words := l.layout, l.layout.Words()
	for i := 0; i < n; i++ {
		row := l.hostRows[i*words : (i+1)*words]
		for k := 0; k < d; k++ {
			row[k] = math.Float32bits(b.Obs[i*d+k])
			row[lay.Next()+k] = math.Float32bits(b.NextObs[i*d+k])
		}
		row[lay.Action()] = uint32(b.Actions[i])
		row[lay.Reward()] = math.Float32bits(b.Rewards[i])
		row[lay.Discount()] = math.Float32bits(b.Discounts[i])
	}
	ImportanceWeights(l.hostW, b.Probabilities, b.TableSize, beta)
	if err := l.dev.CopyHtoDAsync(l.rows, u32Bytes(l.hostRows), l.st); err != nil {
		return agent.Stats{}, err
	}
	if err := l.dev.CopyHtoDAsync(l.weights, f64Bytes(l.hostW), l.st); err != nil {
		return agent.Stats{}, err
	}
	return l.compute(context.Background(), l.rows, l.weights)
}

// ComputeGradientsDevice computes the gradients of the batch whose rows (in
// Layout, BatchSize of them) are at rows in device memory, with importance
// weights (BatchSize float64, normalized) at weights in device memory. Both
// must stay unchanged until the call returns. Work queued before on other
// streams must have finished (the caller synchronizes those streams).
func (l *Learner) ComputeGradientsDevice(ctx context.Context, rows, weights cuda.DevicePtr) (agent.Stats, error) {
	return l.compute(ctx, rows, weights)
}

// Item is the device buffer of the last batch's per-item results (TDItemWords
// float64 each, the priority last), which Replay.WriteBack scatters into the
// sampling weights; it is valid until the next ComputeGradients.
func (l *Learner) Item() cuda.DevicePtr { return l.item }

func (l *Learner) layerOffsets(li int) (w, b int) {
	off := 0
	for i := 0; i < li; i++ {
		off += l.sizes[i]*l.sizes[i+1] + l.sizes[i+1]
	}
	return off, off + l.sizes[li]*l.sizes[li+1]
}

// forward runs net (online or target) on the n rows at x (row stride ldx
// words, starting at word 0) into acts.
func (l *Learner) forward(net cuda.DevicePtr, x cuda.DevicePtr, ldx int, acts []cuda.DevicePtr) error {
	last := len(l.sizes) - 2
	in := x
	for li := 0; li <= last; li++ {
		wo, bo := l.layerOffsets(li)
		mm := cuda.Forward(l.batch, l.sizes[li], l.sizes[li+1], ldx, li != last)
		if err := l.dev.LaunchMatMul(l.st, acts[li], in, net.Add(4*wo), net.Add(4*bo), 0, mm); err != nil {
			return err
		}
		in, ldx = acts[li], l.sizes[li+1]
	}
	return nil
}

func (l *Learner) compute(ctx context.Context, rows, weights cuda.DevicePtr) (agent.Stats, error) {
	n, words := l.batch, l.layout.Words()
	last := len(l.sizes) - 2
	na := l.sizes[last+1]
	steps := []func() error{
		func() error { return l.forward(l.online, rows, words, l.acts) },
		func() error { return l.forward(l.online, rows.Add(4*l.layout.Next()), words, l.nextActs) },
		func() error { return l.forward(l.target, rows.Add(4*l.layout.Next()), words, l.tgtActs) },
		func() error { return l.dev.MemsetAsync(l.status, 0, 4, l.st) },
		func() error {
			return l.dev.LaunchTD(l.st, l.dout, l.item, l.status, l.acts[last], l.nextActs[last], l.tgtActs[last], rows, weights,
				cuda.TD{N: n, NA: na, RowWords: words, ActionOff: l.layout.Action(), RewardOff: l.layout.Reward(),
					DiscountOff: l.layout.Discount(), Huber: l.cfg.HuberDelta, Eps: l.cfg.PriorityEps})
		},
		func() error { return l.dev.LaunchTDSum(l.st, l.stats, l.item, n) },
		func() error {
			g := l.dout
			for li := last; li >= 0; li-- {
				in, out := l.sizes[li], l.sizes[li+1]
				x, ldx := rows, words
				if li > 0 {
					x, ldx = l.acts[li-1], in
				}
				wo, bo := l.layerOffsets(li)
				if err := l.dev.LaunchMatMul(l.st, l.grads.Add(4*wo), g, x, 0, 0, cuda.WeightGrad(n, in, out, ldx)); err != nil {
					return err
				}
				if err := l.dev.LaunchColSum(l.st, l.grads.Add(4*bo), g, n, out); err != nil {
					return err
				}
				if li > 0 {
					if err := l.dev.LaunchMatMul(l.st, l.deltas[li-1], g, l.online.Add(4*wo), 0, l.acts[li-1], cuda.InputGrad(n, in, out)); err != nil {
						return err
					}
					g = l.deltas[li-1]
				}
			}
			return nil
		},
		func() error { return l.dev.CopyDtoHAsync(f64Bytes(l.backItem), l.item, l.st) },
		func() error { return l.dev.CopyDtoHAsync(f64Bytes(l.backStats), l.stats, l.st) },
		func() error { return l.dev.CopyDtoHAsync(i32Bytes(l.backStatus), l.status, l.st) },
		func() error { return l.dev.StreamSynchronize(ctx, l.st) },
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return agent.Stats{}, err
		}
	}
	if l.backStatus[0]&cuda.TDStatusBadAction != 0 {
		return agent.Stats{}, fmt.Errorf("gpulearn: the batch has an action outside [0, %d)", na)
	}
	for i := range l.prio {
		l.prio[i] = l.backItem[cuda.TDItemWords*i+3]
	}
	l.maxPrio = l.backStats[3]
	l.ready = true
	return agent.Stats{Loss: l.backStats[0], MeanQ: l.backStats[1], MeanAbsTD: l.backStats[2]}, nil
}

// ApplyGradients clips the gradients to the configured norm, takes an Adam
// step and updates the target network, all on the device, and returns the
// norm before clipping.
func (l *Learner) ApplyGradients() (float64, error) {
	if !l.ready {
		return 0, errors.New("gpulearn: ApplyGradients without ComputeGradients")
	}
	l.ready = false
	l.adamT++
	h := cuda.AdamStep(l.lr, 0.9, 0.999, 1e-8, l.adamT)
	if err := l.dev.LaunchClipNorm(l.st, l.norm, l.scale, l.partial, l.grads, l.np, l.cfg.GradClip); err != nil {
		return 0, err
	}
	if err := l.dev.LaunchAdam(l.st, l.online, l.adamM, l.adamV, l.grads, l.scale, l.np, h); err != nil {
		return 0, err
	}
	l.gradSteps++
	l.paramsOld = true
	if k := l.cfg.TargetUpdate; k > 0 {
		if l.gradSteps%int64(k) == 0 {
			if err := l.dev.CopyDtoDAsync(l.target, l.online, 4*l.np, l.st); err != nil {
				return 0, err
			}
		}
	} else if err := l.dev.LaunchSoftUpdate(l.st, l.target, l.online, l.np, float32(l.cfg.Tau)); err != nil {
		return 0, err
	}
	if err := l.dev.CopyDtoHAsync(f64Bytes(l.backNorm), l.norm, l.st); err != nil {
		return 0, err
	}
	if err := l.dev.StreamSynchronize(context.Background(), l.st); err != nil {
		return 0, err
	}
	return l.backNorm[0], nil
}

// OnlineParams copies the online network's parameters to the host (once per
// gradient step at most) and returns them, in nn's layout.
func (l *Learner) OnlineParams() ([]float32, error) {
	if l.paramsOld {
		if err := l.dev.StreamSynchronize(context.Background(), l.st); err != nil {
			return nil, err
		}
		if err := l.dev.CopyDtoH(f32Bytes(l.hostParams), l.online); err != nil {
			return nil, err
		}
		l.paramsOld = false
	}
	return l.hostParams, nil
}

func f32Bytes(x []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}
func u32Bytes(x []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}
func i32Bytes(x []int32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}
func f64Bytes(x []float64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 8*len(x))
}
