package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gear-rl/gear/examples/dqn/cartpole"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

func linearConfig() Config {
	c := DefaultConfig()
	c.Hidden = nil
	c.BatchSize = 2
	c.TargetUpdate = 3
	c.GradClip = 0
	return c
}

// A batch worked by hand on linear Q networks, which shows the Double DQN rule
// (the online network picks the next action, the target network values it), the
// importance weights, the Huber gradient and the priorities.
func TestDoubleDQNByHand(t *testing.T) {
	c := linearConfig()
	l, err := NewLearner(c, 2, 2, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	// Online Q(s) = s (identity), target Q(s) = (5 s0, s1).
	copy(l.Online().Params(), []float32{1, 0, 0, 1, 0, 0})
	copy(l.Target().Params(), []float32{5, 0, 0, 1, 0, 0})

	b := replay.NewBatch(2, 2)
	b.TableSize = 4
	b.Probabilities[0], b.Probabilities[1] = 0.5, 0.125
	// Item 0: Q(s, 0) = 0.5; s' = (1, 2): online picks action 1, the target
	// values it at 2 (a max over the target would give 5); y = 1 + 0.5·2 = 2.
	copy(b.Obs[0:2], []float32{0.5, 0.25})
	b.Actions[0], b.Rewards[0], b.Discounts[0] = 0, 1, 0.5
	copy(b.NextObs[0:2], []float32{1, 2})
	// Item 1: Q(s, 1) = 1; terminal, y = 0.
	copy(b.Obs[2:4], []float32{1, 1})
	b.Actions[1], b.Rewards[1], b.Discounts[1] = 1, 0, 0
	copy(b.NextObs[2:4], []float32{7, 7})

	st, err := l.ComputeGradients(b, 1)
	if err != nil {
		t.Fatal(err)
	}
	// δ = (−1.5, 1); w ∝ (4·P)^−1 = (0.5, 2) → (0.25, 1);
	// loss = (0.25·Huber(−1.5) + 1·Huber(1)) / 2 = (0.25·1 + 0.5) / 2.
	if math.Abs(st.Loss-0.375) > 1e-7 || math.Abs(st.MeanQ-0.75) > 1e-7 || math.Abs(st.MeanAbsTD-1.25) > 1e-7 {
		t.Fatalf("stats = %+v, want loss 0.375, mean Q 0.75, mean |δ| 1.25", st)
	}
	// dL/dQ = (0.25·(−1)/2, 1·1/2) on the taken actions; dW = dQ ⊗ s, db = dQ.
	want := []float32{-0.0625, -0.03125, 0.5, 0.5, -0.125, 0.5}
	for i, g := range l.Online().Grads() {
		if math.Abs(float64(g-want[i])) > 1e-7 {
			t.Fatalf("grads = %v, want %v", l.Online().Grads(), want)
		}
	}
	eps := c.PriorityEps
	if p := l.Priorities(); math.Abs(p[0]-(1.5+eps)) > 1e-7 || math.Abs(p[1]-(1+eps)) > 1e-7 {
		t.Fatalf("priorities = %v, want [%v %v]", p, 1.5+eps, 1+eps)
	}
	if l.MaxPriority() < 1.5 {
		t.Fatalf("MaxPriority = %v, want >= 1.5", l.MaxPriority())
	}
	// β = 0: uniform weights.
	st, _ = l.ComputeGradients(b, 0)
	if math.Abs(st.Loss-(1+0.5)/2) > 1e-7 {
		t.Fatalf("β=0: loss %v, want 0.75", st.Loss)
	}
}

func TestTargetUpdates(t *testing.T) {
	c := linearConfig()
	l, _ := NewLearner(c, 2, 2, rand.New(rand.NewPCG(1, 1)))
	if _, err := l.ApplyGradients(); !errors.Is(err, errNoForward) {
		t.Fatalf("ApplyGradients first: err = %v", err)
	}
	b := replay.NewBatch(2, 2)
	b.TableSize = 2
	b.Probabilities[0], b.Probabilities[1] = 0.5, 0.5
	b.Rewards[0], b.Rewards[1] = 1, 1
	b.Obs[0], b.Obs[3] = 1, 1
	same := func() bool {
		for i, p := range l.Online().Params() {
			if p != l.Target().Params()[i] {
				return false
			}
		}
		return true
	}
	for step := 1; step <= 6; step++ {
		if _, err := l.ComputeGradients(b, 0.5); err != nil {
			t.Fatal(err)
		}
		if _, err := l.ApplyGradients(); err != nil {
			t.Fatal(err)
		}
		if got, want := same(), step%3 == 0; got != want {
			t.Fatalf("after step %d: target equals online = %v, want %v", step, got, want)
		}
	}

	c.TargetUpdate, c.Tau = 0, 0.25
	l, _ = NewLearner(c, 2, 2, rand.New(rand.NewPCG(1, 1)))
	before := append([]float32(nil), l.Target().Params()...)
	if _, err := l.ComputeGradients(b, 0.5); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ApplyGradients(); err != nil {
		t.Fatal(err)
	}
	for i, p := range l.Online().Params() {
		want := before[i] + 0.25*(p-before[i])
		if math.Abs(float64(l.Target().Params()[i]-want)) > 1e-6 {
			t.Fatalf("soft update: target[%d] = %v, want %v", i, l.Target().Params()[i], want)
		}
	}
}

// With the target network held fixed, repeated steps on one batch are a
// regression and the loss falls.
func TestLossFallsOnAFixedBatch(t *testing.T) {
	c := DefaultConfig()
	c.Hidden = []int{32, 32}
	c.BatchSize = 32
	c.TargetUpdate = 1 << 30
	c.LR = 1e-3
	rng := rand.New(rand.NewPCG(4, 4))
	l, _ := NewLearner(c, 4, 2, rng)
	b := replay.NewBatch(32, 4)
	b.TableSize = 32
	for i := 0; i < 32; i++ {
		for k := 0; k < 4; k++ {
			b.Obs[i*4+k] = float32(rng.NormFloat64() * 0.1)
			b.NextObs[i*4+k] = float32(rng.NormFloat64() * 0.1)
		}
		b.Actions[i] = int32(i % 2)
		b.Rewards[i] = 1
		b.Discounts[i] = 0.97
		b.Probabilities[i] = 1.0 / 32
	}
	first, err := l.ComputeGradients(b, 1)
	if err != nil {
		t.Fatal(err)
	}
	var last Stats
	for i := 0; i < 300; i++ {
		if _, err := l.ApplyGradients(); err != nil {
			t.Fatal(err)
		}
		last, _ = l.ComputeGradients(b, 1)
	}
	if !(last.Loss < first.Loss/20) {
		t.Fatalf("loss %v after 300 steps, from %v: want a twentieth or less", last.Loss, first.Loss)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{DefaultConfig(), QuickConfig()} {
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	for field, mutate := range map[string]func(*Config){
		"LR":           func(c *Config) { c.LR = 0 },
		"Gamma":        func(c *Config) { c.Gamma = 1.5 },
		"NStep":        func(c *Config) { c.NStep = 0 },
		"BatchSize":    func(c *Config) { c.BatchSize = 0 },
		"Tau":          func(c *Config) { c.TargetUpdate = 0 },
		"Hidden":       func(c *Config) { c.Hidden = []int{0} },
		"PriorityEps":  func(c *Config) { c.PriorityEps = 0 },
		"TrainEvery":   func(c *Config) { c.TrainEvery = 0 },
		"EpsStart":     func(c *Config) { c.EpsStart = 2 },
		"ReplayCapaci": func(c *Config) { c.ReplayCapacity = 0 },
	} {
		c := DefaultConfig()
		mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), field) || !strings.HasPrefix(err.Error(), "agent: ") {
			t.Errorf("%s: err = %v", field, err)
		}
	}
}

func TestActor(t *testing.T) {
	env := cartpole.New()
	rng := rand.New(rand.NewPCG(2, 2))
	a, err := NewActor(env, []int{4, 8, 2}, 3, 0.9, rng)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewActor(env, []int{3, 8, 2}, 3, 0.9, rng); err == nil {
		t.Fatal("a network of the wrong input size accepted")
	}
	// A policy whose second output is always larger pushes right every step:
	// the pole falls within a few dozen steps.
	p := make([]float32, 4*8+8+8*2+2)
	p[len(p)-1] = 1
	if err := a.SetParams(p); err != nil {
		t.Fatal(err)
	}
	frames, emitted := 0, 0
	var ep Episode
	for {
		e, ended, err := a.Step(0, func(tr replay.Transition) error {
			if tr.Action != 1 {
				t.Fatalf("greedy action %d, want 1", tr.Action)
			}
			emitted++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		frames++
		if ended {
			ep = e
			break
		}
	}
	if ep.Truncated || ep.Length != frames || ep.Return != float64(frames) || frames > 100 || emitted != frames {
		t.Fatalf("episode %+v after %d frames, %d transitions", ep, frames, emitted)
	}
	// ε = 1: both actions appear.
	seen := [2]int{}
	for i := 0; i < 200; i++ {
		seen[a.Act(make([]float32, 4), 1)]++
	}
	if seen[0] < 50 || seen[1] < 50 {
		t.Fatalf("ε=1 actions %v, want both often", seen)
	}
}

// A short run lifts the Q values off zero and the returns off a random
// policy's, and is reproducible for a seed.
func TestRunLearnsAndIsReproducible(t *testing.T) {
	cfg := RunConfig{Agent: QuickConfig(), Seed: 3, MaxFrames: 4000, Window: 20}
	var returns []float64
	cfg.OnEpisode = func(p Progress) { returns = append(returns, p.Return) }
	res, err := Run(context.Background(), cartpole.New(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := res.Progress
	t.Logf("%d episodes, %d frames, %d gradient steps, mean%d %.1f, Q %.2f, loss %.4f",
		p.Episodes, p.Frames, p.GradSteps, cfg.Window, p.MeanReturn, p.MeanQ, p.Loss)
	if p.Frames != 4000 || p.GradSteps != 4000-int64(cfg.Agent.LearningStarts)+1 {
		t.Fatalf("frames %d, gradient steps %d", p.Frames, p.GradSteps)
	}
	if p.Inserts > p.Frames || p.Inserts < p.Frames-int64(cfg.Agent.NStep) || p.Samples != p.GradSteps*int64(cfg.Agent.BatchSize) {
		t.Fatalf("inserts %d, samples %d for %d frames", p.Inserts, p.Samples, p.Frames)
	}
	if !(p.MeanQ > 5) {
		t.Errorf("mean Q %.2f after %d gradient steps, want > 5", p.MeanQ, p.GradSteps)
	}
	if !(p.MeanReturn > 60) {
		t.Errorf("mean return %.1f over the last %d episodes, want > 60 (random: about 20)", p.MeanReturn, cfg.Window)
	}

	cfg.MaxFrames = 1000
	var a, b []float64
	cfg.OnEpisode = func(p Progress) { a = append(a, p.Return, p.Loss) }
	if _, err := Run(context.Background(), cartpole.New(), cfg); err != nil {
		t.Fatal(err)
	}
	cfg.OnEpisode = func(p Progress) { b = append(b, p.Return, p.Loss) }
	if _, err := Run(context.Background(), cartpole.New(), cfg); err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) {
		t.Fatalf("same seed, %d and %d episodes", len(a)/2, len(b)/2)
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, different runs at %d: %v vs %v", i, a[i], b[i])
		}
	}
}

func TestRunStopsAtTarget(t *testing.T) {
	cfg := RunConfig{Agent: QuickConfig(), Seed: 1, MaxFrames: 20000, Window: 10, TargetReturn: 80}
	res, err := Run(context.Background(), cartpole.New(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Solved || res.MeanReturn < 80 || res.SolvedEpisodes != res.Episodes {
		t.Fatalf("result %+v, want solved with mean >= 80", res)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, cartpole.New(), cfg); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: err = %v", err)
	}
}

func TestSchedules(t *testing.T) {
	for _, c := range []struct {
		t    int64
		want float64
	}{{0, 1}, {50, 0.55}, {100, 0.1}, {1000, 0.1}} {
		if got := Linear(1, 0.1, 100, c.t); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Linear(1, 0.1, 100, %d) = %v, want %v", c.t, got, c.want)
		}
	}
	c := DefaultConfig()
	c.LR, c.LREnd, c.LRFrames = 1e-3, 0, 100
	if c.LearningRate(50) != 1e-3 {
		t.Errorf("constant learning rate changed: %v", c.LearningRate(50))
	}
	c.LREnd = 1e-4
	if got := c.LearningRate(50); math.Abs(got-5.5e-4) > 1e-12 {
		t.Errorf("LearningRate(50) = %v, want 5.5e-4", got)
	}
	if got := c.LearningRate(500); got != 1e-4 {
		t.Errorf("LearningRate(500) = %v, want 1e-4", got)
	}
}

// StepAction takes actions chosen elsewhere (a policy worker): the same
// actions give the same episode as Step, and an action out of range is an
// error.
func TestStepActionMatchesStep(t *testing.T) {
	sizes := []int{4, 8, 2}
	newActor := func() *Actor {
		a, err := NewActor(cartpole.New(), sizes, 3, 0.99, rand.New(rand.NewPCG(5, 6)))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a, b := newActor(), newActor()
	var ta, tb []replay.Transition
	keep := func(dst *[]replay.Transition) func(replay.Transition) error {
		return func(tr replay.Transition) error {
			tr.Obs, tr.NextObs = append([]float32(nil), tr.Obs...), append([]float32(nil), tr.NextObs...)
			*dst = append(*dst, tr)
			return nil
		}
	}
	for {
		epA, endA, errA := a.Step(0.3, keep(&ta))
		action := b.Act(b.Observe(), 0.3)
		epB, endB, errB := b.StepAction(action, keep(&tb))
		if errA != nil || errB != nil || endA != endB || epA != epB {
			t.Fatalf("Step %+v %v %v, StepAction %+v %v %v", epA, endA, errA, epB, endB, errB)
		}
		if endA {
			break
		}
	}
	if fmt.Sprint(ta) != fmt.Sprint(tb) || len(ta) == 0 {
		t.Fatalf("transitions differ:\n%v\n%v", ta, tb)
	}
	if _, _, err := a.StepAction(2, keep(&ta)); err == nil || !strings.Contains(err.Error(), "action 2") {
		t.Fatalf("action 2: %v", err)
	}
}
