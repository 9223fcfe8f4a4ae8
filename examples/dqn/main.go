// Command dqn trains a Double DQN agent with prioritized replay on CartPole-v1,
// written entirely in Go: the environment, the Q network with its forward and
// backward passes, Adam, and the replay.
//
// Started on its own it is a world of one and runs every role in one process,
// the fastest way to solve:
//
//	go run ./examples/dqn --seed 1                 # full run: mean return 475 over 100 episodes
//	go run ./examples/dqn --quick                  # CI run: mean return 150 over 20 episodes
//	go run ./examples/dqn --seed 2 --curve run.csv # also write the learning curve
//	go run ./examples/dqn --device gpu             # the learner on CUDA device 0
//
// Under gearrun each rank plays the role its group names (--role, or gearrun's
// --role): trainers own replay shards and learn, actors step environments,
// policy workers answer actors' observations in batches; without policy
// workers actors run the policy themselves (inline):
//
//	go run ./cmd/gearrun run examples/jobs/dqn.toml
//	go run ./cmd/gearrun -np 1 ./examples/dqn --role trainer : -np 2 ./examples/dqn --role actor
//	go run ./cmd/gearrun -np 1 ./examples/dqn --role trainer --bench 10s : -np 2 ./examples/dqn --role actor
//
// The first trainer's flags are the run's: it shares its configuration with
// every other rank. --plot turns a learning curve into a PNG.
//
// It prints live progress (one refreshed status line on a terminal, periodic
// lines otherwise) and exits with status 0 when the target mean return was
// reached (or a benchmark finished), 1 when the frame budget ran out first or
// a rank failed, and 2 on bad flags.
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
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/dist"
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
	device       string
	batches      string
	cfg          agent.Config

	// Distributed runs (under gearrun).
	role string
	dist dist.Config

	// --plot mode.
	plot, plotOut         string
	compare, compareLabel []string
	label                 string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("dqn", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{dist: dist.DefaultConfig()}
	fs.Uint64Var(&o.seed, "seed", 1, "random seed (weights, exploration, resets, replay)")
	fs.Int64Var(&o.frames, "frames", 0, "stop after this many environment frames (default 300000, 50000 with --quick)")
	fs.Float64Var(&o.targetReturn, "target-return", 0, "stop when the mean return over the window reaches this (default 475, 150 with --quick)")
	fs.IntVar(&o.window, "episodes-window", 0, "episodes the mean return is taken over (default 100, 20 with --quick)")
	fs.BoolVar(&o.quick, "quick", false, "the short CI run: smaller network, faster schedules, lower target")
	fs.StringVar(&o.curve, "curve", "", "write the learning curve as CSV to this file")
	fs.DurationVar(&o.report, "report-every", 5*time.Second, "interval between progress lines when not on a terminal")
	fs.StringVar(&o.device, "device", "cpu", "where the learner runs: cpu, gpu (CUDA device 0) or auto (the GPU when there is one)")
	fs.StringVar(&o.batches, "batches", "device", "with the GPU learner: device (sampled on the GPU, gathered zero-copy from a registered shard, priorities written back on the GPU) or host (the CPU replay, batches copied in)")

	// Hyperparameters; zero values keep the recipe chosen by --quick.
	hidden := fs.String("hidden", "", "hidden layer widths, comma-separated (default 64,64)")
	lr := fs.Float64("lr", 0, "Adam learning rate")
	lrEnd := fs.Float64("lr-end", -1, "final learning rate of a linear decay (0: constant)")
	lrFrames := fs.Int("lr-frames", 0, "frames over which the learning rate decays")
	batch := fs.Int("batch", 0, "batch size (with several trainers: the global batch)")
	nstep := fs.Int("nstep", 0, "n-step return length")
	targetUpdate := fs.Int("target-update", -1, "gradient steps between target copies (0: soft updates with --tau)")
	tau := fs.Float64("tau", 0, "soft target update rate")
	epsFrames := fs.Int("eps-frames", 0, "frames over which epsilon anneals")
	epsEnd := fs.Float64("eps-end", -1, "final epsilon")
	trainEvery := fs.Int("train-every", 0, "frames between training rounds")
	gradSteps := fs.Int("grad-steps", 0, "gradient steps per training round")
	replayCap := fs.Int("replay", 0, "replay capacity (per trainer shard)")
	learningStarts := fs.Int("learning-starts", -1, "frames before the first gradient step")
	alpha := fs.Float64("alpha", -1, "priority exponent (0: uniform replay)")
	betaFrames := fs.Int("beta-frames", 0, "frames over which the importance exponent anneals to 1")

	// Distributed runs; the first trainer's values are the run's.
	d := &o.dist
	fs.StringVar(&o.role, "role", "", "this rank's role under gearrun: trainer, actor or policy (default: gearrun's --role)")
	fs.IntVar(&d.ParamEvery, "param-every", d.ParamEvery, "actors and policy workers take new parameters at most every K steps")
	fs.IntVar(&d.PublishEvery, "publish-every", d.PublishEvery, "gradient steps between published parameter versions")
	fs.Float64Var(&d.SamplesPerInsert, "spi", 0, "rate limiter: samples per inserted frame (default batch*grad-steps/train-every)")
	fs.Float64Var(&d.ErrorBuffer, "error-buffer", 0, "rate limiter: how far, in samples, the ratio may stray (default 100*spi)")
	fs.IntVar(&d.Backlog, "backlog", d.Backlog, "commits an actor writing into its trainer's shard may have ahead of admission")
	fs.StringVar(&d.Samples, "samples", d.Samples, "how actors hand over transitions: auto (into the shard on the trainer's host) or stream")
	fs.IntVar(&d.Chunk, "chunk", d.Chunk, "transitions per sample-stream record")
	fs.BoolVar(&d.TCP, "tcp", false, "use TCP for every stream, as across hosts")
	fs.IntVar(&d.EnvsPerActor, "envs-per-actor", d.EnvsPerActor, "K: every actor steps a ring of K environments, and asks its policy worker for their K actions in one request")
	fs.IntVar(&d.InferBatch, "infer-batch", 0, "policy workers: largest batch in observations (default: one request of K per actor served)")
	fs.DurationVar(&d.InferDelay, "infer-delay", d.InferDelay, "policy workers: longest wait of a request for its batch (within it the wait follows the actors' pace)")
	fs.DurationVar(&d.Bench, "bench", 0, "measure environment frames/s for this long instead of learning to a target")
	fs.DurationVar(&d.BenchWarmup, "bench-warmup", d.BenchWarmup, "time before the --bench measurement starts")
	fs.DurationVar(&d.CheckpointEvery, "checkpoint-every", 0, "period of the trainers' shard checkpoints to the job's checkpoint directory (GEAR_CHECKPOINT_DIR; 0: none)")

	// --plot mode.
	fs.StringVar(&o.plot, "plot", "", "draw the learning curve of this CSV (written by --curve) as a PNG, and exit")
	fs.StringVar(&o.plotOut, "out", "", "the PNG --plot writes (default: the CSV's name with .png)")
	fs.Func("compare", "with --plot, also draw the running mean of this other run's CSV (repeatable, up to 5)", func(v string) error {
		o.compare = append(o.compare, v)
		return nil
	})
	fs.StringVar(&o.label, "label", "", "with --plot, the legend's name of the CSV's running mean")
	fs.Func("compare-label", "the legend's name of the running mean of the --compare of the same place (default: its file's name)", func(v string) error {
		o.compareLabel = append(o.compareLabel, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("dqn: unexpected arguments %q", fs.Args())
	}
	if o.plot != "" {
		return o, nil
	}
	if o.batches != "device" && o.batches != "host" {
		return nil, fmt.Errorf("dqn: --batches %q: want device or host", o.batches)
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
	d.Agent, d.Seed, d.MaxFrames, d.TargetReturn, d.Window = *c, o.seed, o.frames, o.targetReturn, o.window
	if d.Bench > 0 {
		d.MaxFrames, d.TargetReturn = 0, 0
	}
	if err := d.Validate(1); err != nil {
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
	if o.plot != "" {
		return plotCurve(o, stdout, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runWorld(ctx, o, stdout, stderr)
}

// curveWriter writes the learning curve: one CSV row per episode, written
// through to the file as the episode ends.
type curveWriter struct {
	f *os.File
	w *csv.Writer
}

// openCurve opens the learning curve at path (nil when path is empty).
// With resume (a restarted generation of a job), it appends to what the
// earlier generation wrote, so that the file holds the whole run; otherwise
// it starts the file afresh.
func openCurve(path string, resume bool) (*curveWriter, error) {
	if path == "" {
		return nil, nil
	}
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if resume {
		flag = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		return nil, fmt.Errorf("dqn: %w", err)
	}
	c := &curveWriter{f: f, w: csv.NewWriter(f)}
	if fi, err := f.Stat(); err == nil && fi.Size() == 0 {
		_ = c.w.Write([]string{"episode", "frames", "wall_seconds", "return", "mean_return"})
	}
	return c, nil
}

func (c *curveWriter) add(p agent.Progress) {
	if c == nil {
		return
	}
	_ = c.w.Write([]string{
		strconv.Itoa(p.Episodes), strconv.FormatInt(p.Frames, 10),
		strconv.FormatFloat(p.Elapsed.Seconds(), 'f', 3, 64),
		strconv.FormatFloat(p.Return, 'f', -1, 64), strconv.FormatFloat(p.MeanReturn, 'f', 2, 64),
	})
	// Each episode reaches the file at once: a trainer killed for a restart
	// loses no buffered part of the curve that the next generation appends to.
	c.w.Flush()
}

func (c *curveWriter) close() error {
	if c == nil {
		return nil
	}
	c.w.Flush()
	err := c.w.Error()
	if cerr := c.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("dqn: curve: %w", err)
	}
	return nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
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

// update shows p, with extra appended, if the interval has passed.
func (s *statusLine) update(p agent.Progress, extra string) {
	if time.Since(s.last) < s.interval {
		return
	}
	s.last = time.Now()
	line := fmt.Sprintf("episode %5d  frames %7d  mean %6.1f  last %4.0f  eps %.3f  %5.0f frames/s  table %6d  samples/insert %5.1f  loss %.4f  Q %6.2f%s",
		p.Episodes, p.Frames, p.MeanReturn, p.Return, p.Epsilon, p.FramesPerSecond(), p.TableSize, p.SamplesPerInsert(), p.Loss, p.MeanQ, extra)
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
