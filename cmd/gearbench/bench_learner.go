package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/cartpole"
	"github.com/gear-rl/gear/examples/dqn/gpulearn"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

// learnerConfig is the configuration of `gearbench learner`.
type learnerConfig struct {
	json     bool
	hidden   []int
	batch    int
	device   string
	steps    int
	warmup   int
	actors   int
	perStep  int // frames each actor steps per gradient step
	capacity int
	ordinal  int
	seed     uint64
}

func parseLearnerFlags(args []string, out io.Writer) (learnerConfig, error) {
	c := learnerConfig{}
	fs := flag.NewFlagSet("gearbench learner", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&c.json, "json", false, "print one JSON object per line")
	hidden := fs.String("hidden", "1024", "hidden layer width H (two layers of H), or comma-separated widths")
	fs.IntVar(&c.batch, "batch", 1024, "transitions per gradient step")
	fs.StringVar(&c.device, "device", "cpu", "cpu or gpu")
	fs.IntVar(&c.steps, "steps", 50, "timed gradient steps")
	fs.IntVar(&c.warmup, "warmup", 3, "gradient steps before timing")
	fs.IntVar(&c.actors, "actors", 2, "actors stepping CartPole into the shard during the frames measurement (0 skips it)")
	fs.IntVar(&c.perStep, "frames-per-step", 16, "frames each actor steps per gradient step")
	fs.IntVar(&c.capacity, "capacity", 100000, "transitions the replay holds")
	fs.IntVar(&c.ordinal, "gpu", 0, "CUDA device ordinal")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the weights, transitions and samples")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, f := range strings.Split(*hidden, ",") {
		h, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || h < 1 {
			return c, fmt.Errorf("bad width %q in --hidden", f)
		}
		c.hidden = append(c.hidden, h)
	}
	if len(c.hidden) == 1 {
		c.hidden = append(c.hidden, c.hidden[0])
	}
	if c.device != "cpu" && c.device != "gpu" {
		return c, fmt.Errorf("--device %q: want cpu or gpu", c.device)
	}
	if c.batch < 1 || c.steps < 1 || c.warmup < 0 || c.actors < 0 || c.perStep < 1 || c.capacity < c.batch {
		return c, fmt.Errorf("need batch >= 1, steps >= 1, warmup >= 0, actors >= 0, frames-per-step >= 1, capacity >= batch")
	}
	return c, nil
}

// learnerRig is a learner with its replay: the CPU learner with the CPU
// prioritized replay, or the GPU learner fed the GEAR way (gpulearn.Replay).
type learnerRig struct {
	learner agent.Learner
	table   replay.Table     // CPU
	dr      *gpulearn.Replay // GPU
	batch   *replay.Batch    // CPU
	dev     *cuda.Device     // GPU
}

func newLearnerRig(c learnerConfig) (*learnerRig, error) {
	cfg := agent.DefaultConfig()
	cfg.Hidden, cfg.BatchSize, cfg.ReplayCapacity = c.hidden, c.batch, c.capacity
	rng := rand.New(rand.NewPCG(c.seed, 1))
	r := &learnerRig{}
	if c.device == "cpu" {
		l, err := agent.NewLearner(cfg, cartpole.ObsSize, cartpole.NumActions, rng)
		if err != nil {
			return nil, err
		}
		r.learner = l
		if r.table, err = replay.NewPrioritized(c.capacity, cartpole.ObsSize, cfg.PriorityExponent, rng); err != nil {
			return nil, err
		}
		r.batch = replay.NewBatch(c.batch, cartpole.ObsSize)
		return r, nil
	}
	drv, err := cuda.OpenDriver()
	if err != nil {
		return nil, err
	}
	if r.dev, err = drv.Device(c.ordinal); err != nil {
		return nil, err
	}
	l, err := gpulearn.New(r.dev, cfg, cartpole.ObsSize, cartpole.NumActions, rng)
	if err != nil {
		_ = r.dev.Close()
		return nil, err
	}
	r.learner = l
	if r.dr, err = gpulearn.NewReplay(l, c.capacity, cfg.PriorityExponent, rng); err != nil {
		_ = r.close()
		return nil, err
	}
	return r, nil
}

func (r *learnerRig) close() error {
	var err error
	if r.dr != nil {
		err = r.dr.Close()
	}
	if cerr := r.learner.Close(); err == nil {
		err = cerr
	}
	if r.dev != nil {
		if cerr := r.dev.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

func (r *learnerRig) insert(ctx context.Context, t replay.Transition) error {
	if r.dr != nil {
		return r.dr.Insert(ctx, t, r.learner.MaxPriority())
	}
	_, err := r.table.Insert(ctx, t, r.learner.MaxPriority())
	return err
}

// step is one gradient step: sample, gradients, Adam, priorities.
func (r *learnerRig) step(ctx context.Context) error {
	if r.dr != nil {
		if _, err := r.dr.Learn(ctx, 0.4); err != nil {
			return err
		}
		_, err := r.learner.ApplyGradients()
		return err
	}
	if err := r.table.Sample(ctx, r.batch); err != nil {
		return err
	}
	if _, err := r.learner.ComputeGradients(r.batch, 0.4); err != nil {
		return err
	}
	if _, err := r.learner.ApplyGradients(); err != nil {
		return err
	}
	return r.table.UpdatePriorities(ctx, r.batch.Keys, r.learner.Priorities())
}

// benchLearner measures gradient steps per second of the DQN learner on the
// CPU or the GPU at a given width and batch (the GPU learner fed the GEAR way:
// GPU sampling, zero-copy gather, priorities written back on the device), then
// frames per second with actors stepping CartPole and writing into the replay
// between gradient steps.
func benchLearner(args []string, out io.Writer) error {
	c, err := parseLearnerFlags(args, out)
	if err != nil {
		return err
	}
	e := emitter{w: out, json: c.json}
	ctx := context.Background()
	r, err := newLearnerRig(c)
	if err != nil {
		return err
	}
	defer r.close()
	name := "cpu"
	if r.dev != nil {
		n, _ := r.dev.Name()
		name = "gpu " + strconv.Itoa(c.ordinal) + " (" + n + ")"
	}
	// Fill the replay with random CartPole-like transitions.
	rng := rand.New(rand.NewPCG(c.seed, 2))
	fill := min(c.capacity, max(4*c.batch, 10000))
	for range fill {
		t := replay.Transition{Obs: make([]float32, 4), NextObs: make([]float32, 4), Action: int32(rng.IntN(2)), Reward: 1, Discount: 0.970299}
		for k := range 4 {
			t.Obs[k], t.NextObs[k] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		if err := r.insert(ctx, t); err != nil {
			return err
		}
	}
	for range c.warmup {
		if err := r.step(ctx); err != nil {
			return err
		}
	}
	start := time.Now()
	for range c.steps {
		if err := r.step(ctx); err != nil {
			return err
		}
	}
	secs := time.Since(start).Seconds()
	sizes := agent.LayerSizes(agent.Config{Hidden: c.hidden}, cartpole.ObsSize, cartpole.NumActions)
	if err := e.emit(kv{"bench", "learner"}, kv{"op", "gradient_steps"}, kv{"device", name}, kv{"network", fmt.Sprint(sizes)},
		kv{"batch", c.batch}, kv{"steps", c.steps}, kv{"seconds", round3(secs)}, kv{"steps_per_s", round3(float64(c.steps) / secs)}); err != nil {
		return err
	}
	if c.actors == 0 {
		return nil
	}
	return benchLearnerFrames(ctx, e, c, r, name)
}

// benchLearnerFrames runs c.actors actors, each stepping c.perStep frames with
// the current parameters between gradient steps, and reports frames and
// gradient steps per second.
func benchLearnerFrames(ctx context.Context, e emitter, c learnerConfig, r *learnerRig, name string) error {
	sizes := agent.LayerSizes(agent.Config{Hidden: c.hidden}, cartpole.ObsSize, cartpole.NumActions)
	actors := make([]*agent.Actor, c.actors)
	for i := range actors {
		a, err := agent.NewActor(cartpole.New(), sizes, 3, 0.99, rand.New(rand.NewPCG(c.seed, uint64(10+i))))
		if err != nil {
			return err
		}
		actors[i] = a
	}
	buf := make([][]replay.Transition, c.actors)
	start := time.Now()
	frames := 0
	for range c.steps {
		params, err := r.learner.OnlineParams()
		if err != nil {
			return err
		}
		errs := make([]error, c.actors)
		var wg sync.WaitGroup
		for i, a := range actors {
			wg.Go(func() {
				if errs[i] = a.SetParams(params); errs[i] != nil {
					return
				}
				buf[i] = buf[i][:0]
				for range c.perStep {
					if _, _, err := a.Step(0.1, func(t replay.Transition) error {
						buf[i] = append(buf[i], cloneTransition(t))
						return nil
					}); err != nil {
						errs[i] = err
						return
					}
				}
			})
		}
		wg.Wait()
		for i := range actors {
			if errs[i] != nil {
				return errs[i]
			}
			for _, t := range buf[i] {
				if err := r.insert(ctx, t); err != nil {
					return err
				}
			}
		}
		frames += c.actors * c.perStep
		if err := r.step(ctx); err != nil {
			return err
		}
	}
	secs := time.Since(start).Seconds()
	return e.emit(kv{"bench", "learner"}, kv{"op", "frames"}, kv{"device", name}, kv{"actors", c.actors},
		kv{"frames", frames}, kv{"seconds", round3(secs)}, kv{"frames_per_s", round3(float64(frames) / secs)},
		kv{"steps_per_s", round3(float64(c.steps) / secs)})
}

func cloneTransition(t replay.Transition) replay.Transition {
	t.Obs = append([]float32(nil), t.Obs...)
	t.NextObs = append([]float32(nil), t.NextObs...)
	return t
}

func round3(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 4, 64), 64)
	return v
}
