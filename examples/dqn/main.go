// Command dqn trains a Double DQN agent with prioritized replay on CartPole-v1,
// written entirely in Go: the environment, the Q network with its forward and
// backward passes, Adam, and the replay.
//
//	go run ./examples/dqn --seed 1                 # full run: mean return 475 over 100 episodes
//	go run ./examples/dqn --quick                  # CI run: mean return 150 over 20 episodes
//	go run ./examples/dqn --seed 2 --curve run.csv # also write the learning curve
//
// It prints live progress (one refreshed status line on a terminal, periodic
// lines otherwise) and exits with status 0 when the target mean return was
// reached, 1 when the frame budget ran out first, and 2 on bad flags.
//
// This version runs every role in one process; package agent keeps the roles
// apart (actor, replay, learner) so that they can run as MPMD ranks under gearrun.
package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

	"gear/examples/dqn/agent"
	"gear/examples/dqn/cartpole"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type options struct {
	seed         uint64
	frames       int64
	targetReturn float64
	window       int
	quick        bool
	curve        string
	report       time.Duration
	cfg          agent.Config
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("dqn", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.Uint64Var(&o.seed, "seed", 1, "random seed (weights, exploration, resets, replay)")
	fs.Int64Var(&o.frames, "frames", 0, "stop after this many environment frames (default 300000, 50000 with --quick)")
	fs.Float64Var(&o.targetReturn, "target-return", 0, "stop when the mean return over the window reaches this (default 475, 150 with --quick)")
	fs.IntVar(&o.window, "episodes-window", 0, "episodes the mean return is taken over (default 100, 20 with --quick)")
	fs.BoolVar(&o.quick, "quick", false, "the short CI run: smaller network, faster schedules, lower target")
	fs.StringVar(&o.curve, "curve", "", "write the learning curve as CSV to this file")
	fs.DurationVar(&o.report, "report-every", 5*time.Second, "interval between progress lines when not on a terminal")

	// Hyperparameters; zero values keep the recipe chosen by --quick.
	hidden := fs.String("hidden", "", "hidden layer widths, comma-separated (default 64,64)")
	lr := fs.Float64("lr", 0, "Adam learning rate")
	lrEnd := fs.Float64("lr-end", -1, "final learning rate of a linear decay (0: constant)")
	lrFrames := fs.Int("lr-frames", 0, "frames over which the learning rate decays")
	batch := fs.Int("batch", 0, "batch size")
	nstep := fs.Int("nstep", 0, "n-step return length")
	targetUpdate := fs.Int("target-update", -1, "gradient steps between target copies (0: soft updates with --tau)")
	tau := fs.Float64("tau", 0, "soft target update rate")
	epsFrames := fs.Int("eps-frames", 0, "frames over which epsilon anneals")
	epsEnd := fs.Float64("eps-end", -1, "final epsilon")
	trainEvery := fs.Int("train-every", 0, "frames between training rounds")
	gradSteps := fs.Int("grad-steps", 0, "gradient steps per training round")
	replayCap := fs.Int("replay", 0, "replay capacity")
	learningStarts := fs.Int("learning-starts", -1, "frames before the first gradient step")
	alpha := fs.Float64("alpha", -1, "priority exponent (0: uniform replay)")
	betaFrames := fs.Int("beta-frames", 0, "frames over which the importance exponent anneals to 1")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("dqn: unexpected arguments %q", fs.Args())
	}
	if o.quick {
		o.cfg = agent.QuickConfig()
		o.frames = or(o.frames, 50_000)
		o.targetReturn = or(o.targetReturn, 150)
		o.window = or(o.window, 20)
	} else {
		o.cfg = agent.DefaultConfig()
		o.frames = or(o.frames, 300_000)
		o.targetReturn = or(o.targetReturn, 475)
		o.window = or(o.window, 100)
	}
	c := &o.cfg
	if *hidden != "" {
		c.Hidden = nil
		for _, f := range strings.Split(*hidden, ",") {
			h, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				return nil, fmt.Errorf("dqn: --hidden %q: %w", *hidden, err)
			}
			c.Hidden = append(c.Hidden, h)
		}
	}
	c.LR = or(*lr, c.LR)
	if *lrEnd >= 0 {
		c.LREnd = *lrEnd
	}
	c.LRFrames = or(*lrFrames, c.LRFrames)
	c.BatchSize = or(*batch, c.BatchSize)
	c.NStep = or(*nstep, c.NStep)
	if *targetUpdate >= 0 {
		c.TargetUpdate = *targetUpdate
	}
	c.Tau = or(*tau, c.Tau)
	c.EpsFrames = or(*epsFrames, c.EpsFrames)
	if *epsEnd >= 0 {
		c.EpsEnd = *epsEnd
	}
	c.TrainEvery = or(*trainEvery, c.TrainEvery)
	c.GradSteps = or(*gradSteps, c.GradSteps)
	c.ReplayCapacity = or(*replayCap, c.ReplayCapacity)
	if *learningStarts >= 0 {
		c.LearningStarts = *learningStarts
	}
	if *alpha >= 0 {
		c.PriorityExponent = *alpha
	}
	c.BetaFrames = or(*betaFrames, c.BetaFrames)
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("dqn: %w", err)
	}
	return o, nil
}

// or returns v unless it is zero, and def then.
func or[T int | int64 | float64](v, def T) T {
	if v != 0 {
		return v
	}
	return def
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, err)
		}
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var curve *csv.Writer
	if o.curve != "" {
		f, err := os.Create(o.curve)
		if err != nil {
			fmt.Fprintf(stderr, "dqn: %v\n", err)
			return 2
		}
		defer f.Close()
		curve = csv.NewWriter(f)
		_ = curve.Write([]string{"episode", "frames", "wall_seconds", "return", "mean_return"})
	}

	tty := false
	if f, ok := stdout.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	c := o.cfg
	fmt.Fprintf(stdout, "dqn: CartPole-v1, seed %d, network %v, batch %d, lr %g, %d-step, target every %d, alpha %g, until mean%d >= %g or %d frames\n",
		o.seed, agent.LayerSizes(c, cartpole.ObsSize, cartpole.NumActions), c.BatchSize, c.LR, c.NStep, c.TargetUpdate,
		c.PriorityExponent, o.window, o.targetReturn, o.frames)

	status := newStatus(stdout, tty, o.report)
	res, err := agent.Run(ctx, cartpole.New(), agent.RunConfig{
		Agent:        c,
		Seed:         o.seed,
		MaxFrames:    o.frames,
		TargetReturn: o.targetReturn,
		Window:       o.window,
		OnEpisode: func(p agent.Progress) {
			if curve != nil {
				_ = curve.Write([]string{
					strconv.Itoa(p.Episodes), strconv.FormatInt(p.Frames, 10),
					strconv.FormatFloat(p.Elapsed.Seconds(), 'f', 3, 64),
					strconv.FormatFloat(p.Return, 'f', -1, 64), strconv.FormatFloat(p.MeanReturn, 'f', 2, 64),
				})
			}
			status.update(p)
		},
	})
	status.finish()
	if curve != nil {
		curve.Flush()
		if err := curve.Error(); err != nil {
			fmt.Fprintf(stderr, "dqn: curve: %v\n", err)
		}
	}
	p := res.Progress
	gps := 0.0
	if p.Elapsed > 0 {
		gps = float64(p.GradSteps) / p.Elapsed.Seconds()
	}
	summary := fmt.Sprintf("%d episodes, %d frames, %d gradient steps in %.1fs, %.1fs of CPU (%.0f frames/s, %.0f gradient steps/s), mean%d %.1f",
		p.Episodes, p.Frames, p.GradSteps, p.Elapsed.Seconds(), cpuTime().Seconds(), p.FramesPerSecond(), gps, o.window, p.MeanReturn)
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

// statusLine shows progress: one line rewritten in place on a terminal, a new
// line every interval otherwise.
type statusLine struct {
	w        io.Writer
	tty      bool
	interval time.Duration
	last     time.Time
	shown    bool
}

func newStatus(w io.Writer, tty bool, interval time.Duration) *statusLine {
	if tty {
		interval = 200 * time.Millisecond
	}
	return &statusLine{w: w, tty: tty, interval: interval, last: time.Now()}
}

func (s *statusLine) update(p agent.Progress) {
	if time.Since(s.last) < s.interval {
		return
	}
	s.last = time.Now()
	line := fmt.Sprintf("episode %5d  frames %7d  mean %6.1f  last %4.0f  eps %.3f  %5.0f frames/s  table %6d  samples/insert %5.1f  loss %.4f  Q %6.2f",
		p.Episodes, p.Frames, p.MeanReturn, p.Return, p.Epsilon, p.FramesPerSecond(), p.TableSize, p.SamplesPerInsert(), p.Loss, p.MeanQ)
	if s.tty {
		fmt.Fprintf(s.w, "\r\033[K%s", line)
		s.shown = true
		return
	}
	fmt.Fprintf(s.w, "%6.1fs %s\n", p.Elapsed.Seconds(), line)
}

func (s *statusLine) finish() {
	if s.tty && s.shown {
		fmt.Fprintln(s.w)
	}
}
