package agent

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/gear-rl/gear/examples/dqn/cartpole"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

// BenchmarkGradientStep is one full learner step on a filled replay: sample,
// compute gradients, apply them, update priorities.
func BenchmarkGradientStep(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  Config
	}{{"default", DefaultConfig()}, {"quick", QuickConfig()}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 1))
			l, err := NewLearner(c.cfg, cartpole.ObsSize, cartpole.NumActions, rng)
			if err != nil {
				b.Fatal(err)
			}
			table, _ := replay.NewPrioritized(c.cfg.ReplayCapacity, cartpole.ObsSize, c.cfg.PriorityExponent, rng)
			env := cartpole.New()
			obs, next := make([]float32, 4), make([]float32, 4)
			env.Reset(rng, obs)
			for i := 0; i < 20000; i++ {
				a := rng.IntN(2)
				r, term, trunc, _ := env.Step(a, next)
				d := float32(c.cfg.Gamma)
				if term {
					d = 0
				}
				_, _ = table.Insert(ctx, replay.Transition{Obs: obs, Action: int32(a), Reward: float32(r), Discount: d, NextObs: next}, 1)
				copy(obs, next)
				if term || trunc {
					env.Reset(rng, obs)
				}
			}
			batch := replay.NewBatch(c.cfg.BatchSize, cartpole.ObsSize)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				_ = table.Sample(ctx, batch)
				if _, err := l.ComputeGradients(batch, 0.5); err != nil {
					b.Fatal(err)
				}
				if _, err := l.ApplyGradients(); err != nil {
					b.Fatal(err)
				}
				_ = table.UpdatePriorities(ctx, batch.Keys, l.Priorities())
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
		})
	}
}
