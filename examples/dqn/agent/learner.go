package agent

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gear-rl/gear/examples/dqn/nn"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

// Stats describes one gradient computation.
type Stats struct {
	// Loss is the importance-weighted mean Huber loss of the batch.
	Loss float64
	// MeanQ is the mean Q(s, a) of the sampled transitions.
	MeanQ float64
	// MeanAbsTD is the mean |δ| of the batch.
	MeanAbsTD float64
}

// Learner is the trainer's side of Double DQN, on the CPU (CPULearner) or on a
// GPU (package gpulearn); both compute the same losses for the same batches.
// A caller does, per gradient step: ComputeGradients, ApplyGradients, then
// hands Priorities to the replay. A Learner is not safe for concurrent use.
type Learner interface {
	// ComputeGradients computes the gradients of batch b's loss (see
	// CPULearner.ComputeGradients) and the batch's new priorities.
	ComputeGradients(b *replay.Batch, beta float64) (Stats, error)
	// ApplyGradients clips, takes an Adam step and updates the target
	// network; it returns the gradient norm before clipping.
	ApplyGradients() (float64, error)
	// Priorities are the last batch's new priorities, in batch order.
	Priorities() []float64
	// MaxPriority is the largest priority so far (at least 1).
	MaxPriority() float64
	// SetLearningRate sets Adam's learning rate for the next steps.
	SetLearningRate(lr float64)
	// GradSteps is the number of gradient steps applied.
	GradSteps() int64
	// OnlineParams returns the online network's parameters on the host, in
	// nn's layout, for actors. The slice is the learner's: read it before the
	// next step.
	OnlineParams() ([]float32, error)
	// Close releases what the learner holds (device memory).
	Close() error
}

var _ Learner = (*CPULearner)(nil)

// CPULearner is the trainer's side of Double DQN on the CPU: an online and a
// target Q network and the Adam state.
type CPULearner struct {
	cfg        Config
	obsSize    int
	numActions int
	online     *nn.MLP
	target     *nn.MLP
	opt        *nn.Adam

	x          []float32 // 2B×obsSize: observations, then next observations
	dout       []float32 // B×numActions
	priorities []float64
	maxPrio    float64
	ready      bool
	gradSteps  int64
}

// NewLearner returns a CPU learner with freshly initialized networks (the target a
// copy of the online one) for batches of cfg.BatchSize transitions.
func NewLearner(cfg Config, obsSize, numActions int, rng *rand.Rand) (*CPULearner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if obsSize < 1 || numActions < 1 {
		return nil, fmt.Errorf("agent: observation size %d and action count %d must be positive", obsSize, numActions)
	}
	sizes := LayerSizes(cfg, obsSize, numActions)
	b := cfg.BatchSize
	l := &CPULearner{
		cfg:        cfg,
		obsSize:    obsSize,
		numActions: numActions,
		online:     nn.NewMLP(sizes, 2*b, rng),
		target:     nn.NewMLP(sizes, b, rng),
		x:          make([]float32, 2*b*obsSize),
		dout:       make([]float32, b*numActions),
		priorities: make([]float64, b),
		maxPrio:    1,
	}
	l.opt = nn.NewAdam(len(l.online.Params()), cfg.LR)
	if err := l.target.CopyFrom(l.online); err != nil {
		return nil, err
	}
	return l, nil
}

// LearnerState is what a CPULearner carries from one gradient step to the
// next beyond its online parameters: the target network, Adam's moments and
// step count, the gradient steps taken and the largest priority seen. A
// restarted trainer restores it (SetState) to continue the same learning.
type LearnerState struct {
	Target    []float32
	Adam      nn.AdamState
	GradSteps int64
	MaxPrio   float64
}

// State returns a copy of the learner's state.
func (l *CPULearner) State() LearnerState {
	return LearnerState{Target: append([]float32(nil), l.target.Params()...), Adam: l.opt.State(),
		GradSteps: l.gradSteps, MaxPrio: l.maxPrio}
}

// SetState restores a state that State returned, from a learner of the same
// configuration: the target network, the optimizer and the counts. The
// online parameters are the caller's to set (Online().SetParams).
func (l *CPULearner) SetState(s LearnerState) error {
	if err := l.target.SetParams(s.Target); err != nil {
		return fmt.Errorf("agent: learner state: target: %w", err)
	}
	if err := l.opt.SetState(s.Adam); err != nil {
		return fmt.Errorf("agent: learner state: %w", err)
	}
	if s.GradSteps < 0 || !(s.MaxPrio > 0) {
		return fmt.Errorf("agent: learner state: %d gradient steps, max priority %v: want >= 0 and > 0", s.GradSteps, s.MaxPrio)
	}
	l.gradSteps, l.maxPrio = s.GradSteps, s.MaxPrio
	return nil
}

// LayerSizes returns the Q network's layer sizes for cfg.
func LayerSizes(cfg Config, obsSize, numActions int) []int {
	s := append([]int{obsSize}, cfg.Hidden...)
	return append(s, numActions)
}

// Online returns the online network. Its Params are what actors act with and
// its Grads what data-parallel trainers all-reduce.
func (l *CPULearner) Online() *nn.MLP { return l.online }

// OnlineParams returns the online network's parameters (they alias it).
func (l *CPULearner) OnlineParams() ([]float32, error) { return l.online.Params(), nil }

// Close does nothing: a CPULearner holds only Go memory.
func (l *CPULearner) Close() error { return nil }

// Target returns the target network.
func (l *CPULearner) Target() *nn.MLP { return l.target }

// SetLearningRate sets Adam's learning rate for the next steps.
func (l *CPULearner) SetLearningRate(lr float64) { l.opt.LR = lr }

// GradSteps returns the number of gradient steps applied.
func (l *CPULearner) GradSteps() int64 { return l.gradSteps }

// Priorities returns the new priorities |δ| + ε of the last batch passed to
// ComputeGradients, in batch order; the slice is overwritten by the next call.
func (l *CPULearner) Priorities() []float64 { return l.priorities }

// MaxPriority returns the largest priority computed so far (at least 1): the
// priority that new transitions are inserted with, so each is sampled soon.
func (l *CPULearner) MaxPriority() float64 { return l.maxPrio }

// ComputeGradients sets the online network's gradients to those of the
// importance-weighted Huber loss of batch b:
//
//	y_i = r_i + d_i · Q_target(s'_i, argmax_a Q_online(s'_i, a))   (Double DQN)
//	w_i = (N · P_i)^−β / max_j w_j                                (N = table size)
//	L   = (1/B) Σ_i w_i · Huber(Q_online(s_i, a_i) − y_i)
//
// where d_i is the transition's discount (0 after termination). It also records
// the new priorities |δ_i| + ε. b.Len() must equal the configured batch size.
func (l *CPULearner) ComputeGradients(b *replay.Batch, beta float64) (Stats, error) {
	n, d, na := l.cfg.BatchSize, l.obsSize, l.numActions
	if b.Len() != n || b.ObsSize != d {
		return Stats{}, fmt.Errorf("agent: batch of %d×%d, want %d×%d", b.Len(), b.ObsSize, n, d)
	}
	copy(l.x[:n*d], b.Obs)
	copy(l.x[n*d:], b.NextObs)
	qt := l.target.Forward(b.NextObs, n)
	q := l.online.Forward(l.x, 2*n) // rows [0,n): Q(s), rows [n,2n): Q(s')

	// Importance weights, normalized by the largest in the batch.
	wmax := 0.0
	for i, p := range b.Probabilities {
		w := 1.0
		if beta != 0 {
			w = math.Pow(float64(b.TableSize)*p, -beta)
		}
		l.priorities[i] = w // temporarily holds the weight
		wmax = max(wmax, w)
	}
	clear(l.dout)
	var st Stats
	invN := 1 / float64(n)
	for i := 0; i < n; i++ {
		next := q[(n+i)*na : (n+i+1)*na]
		y := float64(b.Rewards[i]) + float64(b.Discounts[i])*float64(qt[i*na+Argmax(next)])
		a := int(b.Actions[i])
		if a < 0 || a >= na {
			return Stats{}, fmt.Errorf("agent: batch item %d has action %d, want [0, %d)", i, a, na)
		}
		qa := float64(q[i*na+a])
		delta := qa - y
		w := l.priorities[i] / wmax
		loss, g := nn.Huber(delta, l.cfg.HuberDelta)
		st.Loss += w * loss * invN
		st.MeanQ += qa * invN
		st.MeanAbsTD += math.Abs(delta) * invN
		l.dout[i*na+a] = float32(w * g * invN)
		p := math.Abs(delta) + l.cfg.PriorityEps
		l.priorities[i] = p
		l.maxPrio = max(l.maxPrio, p)
	}
	l.online.ZeroGrad()
	l.online.Backward(l.dout, n)
	l.ready = true
	return st, nil
}

// ApplyGradients clips the online network's gradients to the configured global
// norm, takes an Adam step, and updates the target network (a copy every
// TargetUpdate steps, or a soft update). It returns the norm before clipping.
func (l *CPULearner) ApplyGradients() (float64, error) {
	if !l.ready {
		return 0, errNoForward
	}
	l.ready = false
	norm := nn.ClipGradNorm(l.online.Grads(), l.cfg.GradClip)
	if err := l.opt.Step(l.online.Params(), l.online.Grads()); err != nil {
		return norm, err
	}
	l.gradSteps++
	if k := l.cfg.TargetUpdate; k > 0 {
		if l.gradSteps%int64(k) == 0 {
			return norm, l.target.CopyFrom(l.online)
		}
		return norm, nil
	}
	tau := float32(l.cfg.Tau)
	tp := l.target.Params()
	for i, p := range l.online.Params() {
		tp[i] += tau * (p - tp[i])
	}
	return norm, nil
}

// Argmax returns the index of the largest value (the first one on ties).
func Argmax(q []float32) int {
	best := 0
	for i, v := range q {
		if v > q[best] {
			best = i
		}
	}
	return best
}
