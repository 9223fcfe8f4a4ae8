package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/gear-rl/gear/examples/dqn/replay"
	"github.com/gear-rl/gear/internal/clock"
)

// RunConfig describes a single-process training run.
type RunConfig struct {
	Agent Config
	// Seed fixes every random choice: initial weights, exploration, environment
	// resets and replay sampling.
	Seed uint64
	// MaxFrames stops the run after this many environment frames (0: no limit).
	MaxFrames int64
	// TargetReturn stops the run once the mean return of the last Window
	// episodes reaches it (0: never).
	TargetReturn float64
	// Window is the number of episodes the mean return is taken over.
	Window int
	// Table replaces the local prioritized replay when not nil. Its priority
	// exponent must then be set by whoever made it.
	Table replay.Table
	// OnEpisode, when not nil, is called after every episode.
	OnEpisode func(Progress)
	// Clock is the clock (the wall clock when nil).
	Clock clock.Clock
	// NewLearner makes the learner (NewLearner, the CPU learner, when nil);
	// package gpulearn's New is the GPU one. Run closes it.
	NewLearner func(cfg Config, obsSize, numActions int, rng *rand.Rand) (Learner, error)
	// NewDeviceReplay, when not nil, makes a replay that feeds the learner
	// itself (DeviceReplay) in place of the local prioritized replay; Table
	// must then be nil. Run closes it.
	NewDeviceReplay func(l Learner, cfg Config, rng *rand.Rand) (DeviceReplay, error)
}

// DeviceReplay is a replay that samples, collects a batch and runs the
// learner's ComputeGradients itself, where the learner's memory is (package
// gpulearn's Replay: sampling on the GPU, a zero-copy gather into device
// memory, priorities written back on the device).
type DeviceReplay interface {
	// Insert adds a transition with the given priority.
	Insert(ctx context.Context, t replay.Transition, priority float64) error
	// Learn samples a batch and computes the learner's gradients on it
	// (replay.ErrEmpty while empty); the caller then applies them.
	Learn(ctx context.Context, beta float64) (Stats, error)
	// Size is the number of transitions held.
	Size() int
	// Close releases the replay, before the learner is closed.
	Close() error
}

// Progress is the state of a run after an episode.
type Progress struct {
	Episodes  int
	Frames    int64
	GradSteps int64
	Elapsed   time.Duration
	// Return and Length describe the last episode.
	Return float64
	Length int
	// MeanReturn is the mean return of the last Window episodes (or of all, if fewer).
	MeanReturn float64
	TableSize  int
	// Inserts and Samples count transitions inserted and sampled so far.
	Inserts, Samples int64
	Epsilon, Beta    float64
	// Loss and MeanQ are exponential moving averages over gradient steps.
	Loss, MeanQ float64
}

// SamplesPerInsert returns Samples/Inserts, the replay ratio.
func (p Progress) SamplesPerInsert() float64 {
	if p.Inserts == 0 {
		return 0
	}
	return float64(p.Samples) / float64(p.Inserts)
}

// FramesPerSecond returns the environment frames per second of wall time.
func (p Progress) FramesPerSecond() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Frames) / p.Elapsed.Seconds()
}

// Result is the outcome of Run.
type Result struct {
	Progress
	// Solved is true when the run stopped because it reached TargetReturn.
	Solved bool
	// SolvedEpisodes is the number of episodes when it was solved.
	SolvedEpisodes int
}

// Run trains in one process: one actor, the replay table and one learner, one
// after the other in a loop, reproducibly for cfg.Seed. It returns when the run
// is solved, when MaxFrames is reached (Result.Solved false, error nil), or with
// ctx's error when ctx ends.
func Run(ctx context.Context, env Env, cfg RunConfig) (Result, error) {
	ac := cfg.Agent
	if err := ac.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.Window < 1 {
		return Result{}, fmt.Errorf("agent: Window = %d, want >= 1", cfg.Window)
	}
	now := cfg.Clock.Now
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))
	split := func() *rand.Rand { return rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())) }
	newLearner := cfg.NewLearner
	if newLearner == nil {
		newLearner = func(c Config, obs, na int, rng *rand.Rand) (Learner, error) { return NewLearner(c, obs, na, rng) }
	}
	learner, err := newLearner(ac, env.ObsSize(), env.NumActions(), split())
	if err != nil {
		return Result{}, err
	}
	defer learner.Close()
	onlineParams := learner.OnlineParams
	actor, err := NewActor(env, LayerSizes(ac, env.ObsSize(), env.NumActions()), ac.NStep, ac.Gamma, split())
	if err != nil {
		return Result{}, err
	}
	params, err := onlineParams()
	if err != nil {
		return Result{}, err
	}
	if err := actor.SetParams(params); err != nil {
		return Result{}, err
	}
	table := cfg.Table
	tableRNG := split()
	var dr DeviceReplay
	switch {
	case cfg.NewDeviceReplay != nil:
		if table != nil {
			return Result{}, fmt.Errorf("agent: RunConfig has both a Table and a NewDeviceReplay")
		}
		if dr, err = cfg.NewDeviceReplay(learner, ac, tableRNG); err != nil {
			return Result{}, err
		}
		defer dr.Close()
		table = deviceTable{dr}
	case table == nil:
		table, err = replay.NewPrioritized(ac.ReplayCapacity, env.ObsSize(), ac.PriorityExponent, tableRNG)
		if err != nil {
			return Result{}, err
		}
	}
	batch := replay.NewBatch(ac.BatchSize, env.ObsSize())

	var (
		p       Progress
		returns = make([]float64, cfg.Window)
		sum     float64
		emaInit bool
	)
	start := now()
	stop := func(err error) (Result, error) {
		p.TableSize = table.Size()
		p.Elapsed = now().Sub(start)
		return Result{Progress: p}, err
	}
	insert := func(t replay.Transition) error {
		_, err := table.Insert(ctx, t, learner.MaxPriority())
		if err == nil {
			p.Inserts++
		}
		return err
	}
	for cfg.MaxFrames <= 0 || p.Frames < cfg.MaxFrames {
		p.Epsilon = Linear(ac.EpsStart, ac.EpsEnd, ac.EpsFrames, p.Frames)
		ep, ended, err := actor.Step(p.Epsilon, insert)
		if err != nil {
			return stop(err)
		}
		p.Frames++

		if p.Frames >= int64(ac.LearningStarts) && p.Frames%int64(ac.TrainEvery) == 0 {
			p.Beta = Linear(ac.BetaStart, ac.BetaEnd, ac.BetaFrames, p.Frames)
			learner.SetLearningRate(ac.LearningRate(p.Frames))
			for k := 0; k < ac.GradSteps; k++ {
				var st Stats
				if dr != nil {
					// The device replay samples, gathers and writes the
					// priorities back itself.
					if st, err = dr.Learn(ctx, p.Beta); err != nil {
						if errors.Is(err, replay.ErrEmpty) {
							break
						}
						return stop(err)
					}
				} else {
					if err := table.Sample(ctx, batch); err != nil {
						if errors.Is(err, replay.ErrEmpty) {
							break
						}
						return stop(err)
					}
					if st, err = learner.ComputeGradients(batch, p.Beta); err != nil {
						return stop(err)
					}
				}
				p.Samples += int64(ac.BatchSize)
				if _, err := learner.ApplyGradients(); err != nil {
					return stop(err)
				}
				if dr == nil {
					if err := table.UpdatePriorities(ctx, batch.Keys, learner.Priorities()); err != nil {
						return stop(err)
					}
				}
				if !emaInit {
					p.Loss, p.MeanQ, emaInit = st.Loss, st.MeanQ, true
				} else {
					p.Loss += 0.01 * (st.Loss - p.Loss)
					p.MeanQ += 0.01 * (st.MeanQ - p.MeanQ)
				}
			}
			p.GradSteps = learner.GradSteps()
			params, err := onlineParams()
			if err != nil {
				return stop(err)
			}
			if err := actor.SetParams(params); err != nil {
				return stop(err)
			}
		}

		if !ended {
			continue
		}
		slot := p.Episodes % cfg.Window
		sum += ep.Return - returns[slot]
		returns[slot] = ep.Return
		p.Episodes++
		p.Return, p.Length = ep.Return, ep.Length
		p.MeanReturn = sum / float64(min(p.Episodes, cfg.Window))
		p.TableSize = table.Size()
		p.Elapsed = now().Sub(start)
		if cfg.OnEpisode != nil {
			cfg.OnEpisode(p)
		}
		if cfg.TargetReturn > 0 && p.Episodes >= cfg.Window && p.MeanReturn >= cfg.TargetReturn {
			return Result{Progress: p, Solved: true, SolvedEpisodes: p.Episodes}, nil
		}
		if err := ctx.Err(); err != nil {
			return stop(err)
		}
	}
	return stop(nil)
}

// deviceTable lets Run insert into a DeviceReplay and read its size through
// replay.Table; Run never samples it.
type deviceTable struct{ dr DeviceReplay }

func (t deviceTable) Insert(ctx context.Context, tr replay.Transition, priority float64) (uint64, error) {
	return 0, t.dr.Insert(ctx, tr, priority)
}

func (t deviceTable) Sample(context.Context, *replay.Batch) error {
	return errors.New("agent: a device replay is sampled by its Learn")
}

func (t deviceTable) UpdatePriorities(context.Context, []uint64, []float64) error {
	return errors.New("agent: a device replay writes its priorities back itself")
}

func (t deviceTable) Size() int { return t.dr.Size() }
