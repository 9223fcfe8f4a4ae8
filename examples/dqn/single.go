package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/cartpole"
)

// runSingle trains in one process: every role, one after the other, the
// fastest way to solve and reproducible for a seed.
func runSingle(ctx context.Context, o *options, stdout, stderr io.Writer) int {
	curve, err := openCurve(o.curve, false)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	c := o.cfg
	dev, err := openDevice(o.device)
	if err != nil {
		fmt.Fprintln(stderr, err)
		_ = curve.close()
		return 2
	}
	defer func() {
		if err := dev.Close(); err != nil {
			fmt.Fprintf(stderr, "dqn: %v\n", err)
		}
	}()
	fmt.Fprintf(stdout, "dqn: CartPole-v1, seed %d, network %v, batch %d, lr %g, %d-step, target every %d, alpha %g, learner on %s%s, until mean%d >= %g or %d frames\n",
		o.seed, agent.LayerSizes(c, cartpole.ObsSize, cartpole.NumActions), c.BatchSize, c.LR, c.NStep, c.TargetUpdate,
		c.PriorityExponent, dev.name, batchPath(dev, o.batches), o.window, o.targetReturn, o.frames)

	status := newStatus(stdout, isTerminal(stdout), o.report)
	res, err := agent.Run(ctx, cartpole.New(), agent.RunConfig{
		Agent:           c,
		Seed:            o.seed,
		MaxFrames:       o.frames,
		TargetReturn:    o.targetReturn,
		Window:          o.window,
		NewLearner:      dev.newLearner(),
		NewDeviceReplay: dev.newReplay(o.batches),
		OnEpisode: func(p agent.Progress) {
			curve.add(p)
			status.update(p, "")
		},
	})
	status.finish()
	if cerr := curve.close(); cerr != nil {
		fmt.Fprintln(stderr, cerr)
	}
	summary := summarize(res.Progress, o.window)
	if err != nil {
		fmt.Fprintf(stderr, "dqn: stopped after %s: %v\n", summary, err)
		return 1
	}
	if res.Solved {
		fmt.Fprintf(stdout, "dqn: solved: %s\n", summary)
		return 0
	}
	fmt.Fprintf(stdout, "dqn: not solved: %s\n", summary)
	return 1
}

// summarize is the closing line's account of a run.
func summarize(p agent.Progress, window int) string {
	gps := 0.0
	if p.Elapsed > 0 {
		gps = float64(p.GradSteps) / p.Elapsed.Seconds()
	}
	return fmt.Sprintf("%d episodes, %d frames, %d gradient steps in %.1fs, %.1fs of CPU (%.0f frames/s, %.0f gradient steps/s), mean%d %.1f",
		p.Episodes, p.Frames, p.GradSteps, p.Elapsed.Seconds(), cpuTime().Seconds(), p.FramesPerSecond(), gps, window, p.MeanReturn)
}

// batchPath names how batches reach a GPU learner.
func batchPath(d *learnerDevice, mode string) string {
	switch {
	case d.dev == nil:
		return ""
	case mode == "host":
		return ", batches copied from the CPU replay"
	}
	return ", batches sampled on the GPU and gathered zero-copy"
}
