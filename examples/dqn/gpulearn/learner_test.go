package gpulearn_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"go.uber.org/goleak"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/cuda/cudatest"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/gpulearn"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDevice is device 0 of package cudatest's fake driver, which runs gear's
// kernels from their CUDA C source on the CPU: the kernels' CPU twins.
func fakeDevice(t *testing.T) *cuda.Device {
	t.Helper()
	libs := cudatest.Build(t, cudatest.Options{})
	drv, err := cuda.OpenDriver(cuda.WithLibrary(libs.CUDA))
	if err != nil {
		t.Fatal(err)
	}
	return cudatest.OpenDevice(t, drv, 0)
}

// onDevices runs fn on the fake device and on a real GPU (skipped without one).
func onDevices(t *testing.T, fn func(t *testing.T, dev *cuda.Device)) {
	t.Run("fake", func(t *testing.T) { fn(t, fakeDevice(t)) })
	t.Run("gpu", func(t *testing.T) { fn(t, cudatest.OpenGPU(t)) })
}

// randomBatch fills b with CartPole-like transitions drawn from rng.
func randomBatch(rng *rand.Rand, b *replay.Batch, tableSize int) {
	b.TableSize = tableSize
	for i := range b.Len() {
		for k := range b.ObsSize {
			b.Obs[i*b.ObsSize+k] = float32(rng.NormFloat64())
			b.NextObs[i*b.ObsSize+k] = float32(rng.NormFloat64())
		}
		b.Actions[i] = int32(rng.IntN(2))
		b.Rewards[i] = float32(1 + 0.5*rng.Float64())
		b.Discounts[i] = 0.970299
		if rng.IntN(20) == 0 {
			b.Discounts[i] = 0
		}
		b.Probabilities[i] = (0.5 + rng.Float64()) / float64(tableSize)
	}
}

func relDiff(a, b float64) float64 {
	return math.Abs(a-b) / max(math.Abs(b), 1e-12)
}

// TestTwinOfCPULearner: with the same seed and the same batches, the GPU
// learner's losses, priorities and gradient norms agree with the CPU
// learner's to within 1e-4 relative over 100 steps (priorities relative to
// the batch's mean Q when that is larger), with target copies and with soft
// target updates.
func TestTwinOfCPULearner(t *testing.T) {
	onDevices(t, func(t *testing.T, dev *cuda.Device) {
		for _, c := range []struct {
			name   string
			hidden []int
			target int
			clip   float64
		}{
			{"copies", []int{64, 64}, 20, 10},
			{"soft-clipped", []int{32, 48, 16}, 0, 0.5},
		} {
			t.Run(c.name, func(t *testing.T) {
				cfg := agent.DefaultConfig()
				cfg.Hidden, cfg.TargetUpdate, cfg.Tau, cfg.GradClip, cfg.LR = c.hidden, c.target, 0.01, c.clip, 1e-3
				cpu, err := agent.NewLearner(cfg, 4, 2, rand.New(rand.NewPCG(7, 8)))
				if err != nil {
					t.Fatal(err)
				}
				gpu, err := gpulearn.New(dev, cfg, 4, 2, rand.New(rand.NewPCG(7, 8)))
				if err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := gpu.Close(); err != nil {
						t.Error(err)
					}
				}()
				rng := rand.New(rand.NewPCG(9, 10))
				b := replay.NewBatch(cfg.BatchSize, 4)
				var worstLoss, worstPrio, worstNorm float64
				for step := range 100 {
					randomBatch(rng, b, 1000+step)
					beta := 0.4 + 0.006*float64(step)
					sc, err := cpu.ComputeGradients(b, beta)
					if err != nil {
						t.Fatal(err)
					}
					sg, err := gpu.ComputeGradients(b, beta)
					if err != nil {
						t.Fatal(err)
					}
					worstLoss = max(worstLoss, relDiff(sg.Loss, sc.Loss), relDiff(sg.MeanQ, sc.MeanQ), relDiff(sg.MeanAbsTD, sc.MeanAbsTD))
					// A priority |δ|+ε near ε differs in its float32 rounding of
					// Q: measure it against the batch's scale of Q.
					for i, p := range cpu.Priorities() {
						worstPrio = max(worstPrio, math.Abs(gpu.Priorities()[i]-p)/max(p, math.Abs(sc.MeanQ)))
					}
					nc, err := cpu.ApplyGradients()
					if err != nil {
						t.Fatal(err)
					}
					ng, err := gpu.ApplyGradients()
					if err != nil {
						t.Fatal(err)
					}
					worstNorm = max(worstNorm, relDiff(ng, nc))
					if worstLoss > 1e-4 || worstPrio > 1e-4 || worstNorm > 1e-4 {
						t.Fatalf("step %d: loss %g (CPU %g): relative differences: statistics %.3g, priorities %.3g, norms %.3g",
							step, sg.Loss, sc.Loss, worstLoss, worstPrio, worstNorm)
					}
				}
				if gpu.MaxPriority() != cpu.MaxPriority() && relDiff(gpu.MaxPriority(), cpu.MaxPriority()) > 1e-4 {
					t.Errorf("max priority %g, CPU %g", gpu.MaxPriority(), cpu.MaxPriority())
				}
				pg, err := gpu.OnlineParams()
				if err != nil {
					t.Fatal(err)
				}
				var worstParam float64
				for i, p := range cpu.Online().Params() {
					worstParam = max(worstParam, math.Abs(float64(pg[i]-p)))
				}
				if worstParam > 1e-3 {
					t.Errorf("parameters differ by up to %g after 100 steps", worstParam)
				}
				t.Logf("100 steps: largest relative differences: statistics %.3g, priorities %.3g, gradient norms %.3g; parameters differ by at most %.3g",
					worstLoss, worstPrio, worstNorm, worstParam)
			})
		}
	})
}
