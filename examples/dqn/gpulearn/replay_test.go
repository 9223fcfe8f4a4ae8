package gpulearn_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/gpulearn"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

// TestReplayFeedsLearner: a step of the device path (sampling on the GPU, a
// zero-copy gather from the registered shard, importance weights on the
// device) computes what the host path computes for the same transitions and
// probabilities, and the new priorities land in the sampling weights.
func TestReplayFeedsLearner(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device) {
		ctx := context.Background()
		cfg := agent.DefaultConfig()
		cfg.Hidden, cfg.BatchSize = []int{32, 32}, 48
		viaDevice, err := gpulearn.New(dev, cfg, 4, 2, rand.New(rand.NewPCG(1, 2)))
		if err != nil {
			t.Fatal(err)
		}
		defer viaDevice.Close()
		viaHost, err := gpulearn.New(dev, cfg, 4, 2, rand.New(rand.NewPCG(1, 2)))
		if err != nil {
			t.Fatal(err)
		}
		defer viaHost.Close()
		const capacity = 500
		r, err := gpulearn.NewReplay(viaDevice, capacity, cfg.PriorityExponent, rand.New(rand.NewPCG(3, 4)))
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := r.Close(); err != nil {
				t.Error(err)
			}
		}()
		if _, err := r.Learn(ctx, 0.4); err != replay.ErrEmpty {
			t.Fatalf("Learn on an empty replay: %v", err)
		}
		rng := rand.New(rand.NewPCG(5, 6))
		var held []replay.Transition
		insert := func(n int) {
			for range n {
				tr := replay.Transition{Obs: make([]float32, 4), NextObs: make([]float32, 4),
					Action: int32(rng.IntN(2)), Reward: 1, Discount: 0.970299}
				for k := range 4 {
					tr.Obs[k], tr.NextObs[k] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
				}
				if rng.IntN(10) == 0 {
					tr.Discount = 0
				}
				if err := r.Insert(ctx, tr, viaDevice.MaxPriority()); err != nil {
					t.Fatal(err)
				}
				held = append(held, tr) // the test stays below capacity

			}
		}
		insert(300)
		b := replay.NewBatch(cfg.BatchSize, 4)
		for step := range 20 {
			insert(5)
			w, err := r.Weights()
			if err != nil {
				t.Fatal(err)
			}
			var total float64
			for _, x := range w {
				total += float64(x)
			}
			beta := 0.4 + 0.02*float64(step)
			sd, err := r.Learn(ctx, beta)
			if err != nil {
				t.Fatal(err)
			}
			for i, x := range r.Indices() {
				tr := held[x]
				copy(b.Obs[i*4:], tr.Obs)
				copy(b.NextObs[i*4:], tr.NextObs)
				b.Actions[i], b.Rewards[i], b.Discounts[i] = tr.Action, tr.Reward, tr.Discount
				b.Probabilities[i] = float64(w[x]) / total
			}
			b.TableSize = r.Size()
			sh, err := viaHost.ComputeGradients(b, beta)
			if err != nil {
				t.Fatal(err)
			}
			if relDiff(sd.Loss, sh.Loss) > 1e-9 || relDiff(sd.MeanQ, sh.MeanQ) > 1e-9 || relDiff(sd.MeanAbsTD, sh.MeanAbsTD) > 1e-9 {
				t.Fatalf("step %d: device path %+v, host path %+v", step, sd, sh)
			}
			w, err = r.Weights()
			if err != nil {
				t.Fatal(err)
			}
			for i, x := range r.Indices() {
				want := float32(math.Pow(viaHost.Priorities()[i], cfg.PriorityExponent))
				if math.Abs(float64(w[x]-want)) > 1e-6*float64(want) {
					t.Fatalf("step %d: weight of item %d = %v, want priority^alpha %v", step, x, w[x], want)
				}
			}
			for _, l := range []*gpulearn.Learner{viaDevice, viaHost} {
				if _, err := l.ApplyGradients(); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
