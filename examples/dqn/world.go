package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/cartpole"
	"github.com/gear-rl/gear/examples/dqn/dist"
	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/rank"
)

// runWorld joins the world gearrun describes (a world of one without it) and
// runs this rank's role; a world of one trains in one process.
func runWorld(ctx context.Context, o *options, stdout, stderr io.Writer) int {
	w, err := rank.Init(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "dqn: %v\n", err)
		return 1
	}
	defer w.Close()
	if w.Size() == 1 {
		if o.role != "" {
			fmt.Fprintf(stderr, "dqn: --role %s needs the other roles: start it under gearrun (alone, dqn runs every role in one process)\n", o.role)
			return 2
		}
		return runSingle(ctx, o, stdout, stderr)
	}
	if o.device == "gpu" {
		fmt.Fprintln(stderr, "dqn: --device gpu: distributed trainers learn on the CPU; the GPU learner runs in a world of one")
		return 2
	}
	role := rankRole(o.role, w)
	if spec, err := jobs.FromEnv(); err == nil && spec.Table != nil {
		if err := dist.ApplyTable(&o.dist, spec.Table, spec.WorldSize(), cartpole.ObsSize); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	} else if err != nil && !errors.Is(err, jobs.ErrNoSpec) {
		fmt.Fprintf(stderr, "dqn: %v\n", err)
		return 2
	}

	var (
		mu     sync.Mutex // OnEpisode and the end of the run
		curve  *curveWriter
		status *statusLine
		window int
		policy int
		envs   int
	)
	hooks := dist.Hooks{
		Logf: func(format string, args ...any) { fmt.Fprintf(stdout, "dqn: "+format+"\n", args...) },
		OnStart: func(s dist.Start) error {
			c := s.Config
			a := c.Agent
			fmt.Fprintf(stdout, "dqn: CartPole-v1, seed %d, network %v, batch %d, lr %g, %d-step, target every %d, alpha %g, %s\n",
				c.Seed, agent.LayerSizes(a, cartpole.ObsSize, cartpole.NumActions), a.BatchSize, a.LR, a.NStep, a.TargetUpdate,
				a.PriorityExponent, goal(c))
			actors := count(s.Actors, "actor")
			if c.EnvsPerActor > 1 {
				actors += fmt.Sprintf(" of %d environments each", c.EnvsPerActor)
			}
			fmt.Fprintf(stdout, "dqn: %s, %s, %s; transitions %s; replay %d per trainer, %s\n",
				count(s.Trainers, "trainer"), actors, inference(s.Policies), handover(c), a.ReplayCapacity, limiter(c))
			var err error
			mu.Lock()
			defer mu.Unlock()
			curve, err = openCurve(o.curve, w.RestartCount() > 0)
			status = newStatus(stdout, isTerminal(stdout), o.report)
			window, policy, envs = c.Window, s.Policies, c.EnvsPerActor
			return err
		},
		OnEpisode: func(p dist.Progress) {
			mu.Lock()
			defer mu.Unlock()
			curve.add(p.Progress)
			status.update(p.Progress, fmt.Sprintf("  lag %.1f", p.Lag))
		},
	}
	res, err := dist.Run(ctx, w, role, o.dist, hooks)
	mu.Lock()
	defer mu.Unlock()
	if status != nil {
		status.finish()
	}
	if cerr := curve.close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(stderr, "dqn: %s rank %d: %v\n", role, w.Rank(), err)
		return 1
	}
	if status == nil { // not the trainer that reports
		return 0
	}
	p := res.Progress
	if res.BenchElapsed > 0 {
		gps := float64(p.GradSteps) / p.Elapsed.Seconds()
		fmt.Fprintf(stdout, "dqn: bench: %s, %s: %.0f frames/s (%d frames in %.1fs), %.0f gradient steps/s, %s per actor\n",
			count(p.Actors, "actor"), inference(policy), res.BenchFramesPerSecond(), res.BenchFrames, res.BenchElapsed.Seconds(), gps, count(envs, "environment"))
		return 0
	}
	summary := summarize(p.Progress, window)
	if res.Solved {
		fmt.Fprintf(stdout, "dqn: solved: %s, lag %.1f\n", summary, p.Lag)
		return 0
	}
	fmt.Fprintf(stdout, "dqn: not solved: %s\n", summary)
	return 1
}

// rankRole is this rank's role: --role, else gearrun's when it names one of
// dqn's, else (a job without roles) trainer for rank 0 and actor for the rest.
func rankRole(flagRole string, w *rank.World) string {
	switch {
	case flagRole != "":
		return flagRole
	case w.Role() == dist.RoleTrainer || w.Role() == dist.RoleActor || w.Role() == dist.RolePolicy:
		return w.Role()
	case w.Rank() == 0:
		return dist.RoleTrainer
	}
	return dist.RoleActor
}

func goal(c dist.Config) string {
	if c.Bench > 0 {
		return fmt.Sprintf("measuring frames/s for %v after %v", c.Bench, c.BenchWarmup)
	}
	return fmt.Sprintf("until mean%d >= %g or %d frames", c.Window, c.TargetReturn, c.MaxFrames)
}

func inference(policies int) string {
	if policies <= 0 {
		return "inline inference"
	}
	return count(policies, "policy worker")
}

// count says "1 actor", "2 actors".
func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func handover(c dist.Config) string {
	if c.Samples == dist.SamplesStream || c.TCP {
		return "through the sample stream"
	}
	return "straight into the trainer's shard (same host)"
}

func limiter(c dist.Config) string {
	if c.Bench > 0 {
		return "no rate limit"
	}
	spi, eb := c.RateLimit()
	return fmt.Sprintf("%g samples per insert ± %g", spi, eb)
}
