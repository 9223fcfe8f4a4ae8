package agent

import (
	"errors"
	"fmt"
)

// Config holds the hyperparameters of the learner, the actor and the schedules.
type Config struct {
	// Hidden lists the widths of the hidden layers of the Q network.
	Hidden []int
	// LR is Adam's learning rate; when LREnd is positive it anneals linearly
	// from LR to LREnd over LRFrames environment frames.
	LR, LREnd float64
	LRFrames  int
	// Gamma is the discount factor.
	Gamma float64
	// NStep is the number of environment steps summed into one transition.
	NStep int
	// BatchSize is the number of transitions per gradient step.
	BatchSize int
	// TargetUpdate is the number of gradient steps between copies of the online
	// network into the target network; 0 selects soft updates with Tau.
	TargetUpdate int
	// Tau is the soft target update rate, used when TargetUpdate is 0.
	Tau float64
	// GradClip bounds the global norm of the gradient; 0 disables clipping.
	GradClip float64
	// HuberDelta is the threshold of the Huber loss.
	HuberDelta float64
	// PriorityExponent is α: items are sampled with probability p^α / Σ p^α.
	PriorityExponent float64
	// PriorityEps is added to |δ| to form a priority, so no item starves.
	PriorityEps float64
	// BetaStart and BetaEnd bound the importance-sampling exponent, annealed
	// linearly over BetaFrames environment frames.
	BetaStart, BetaEnd float64
	BetaFrames         int
	// EpsStart and EpsEnd bound the exploration rate, annealed linearly over
	// EpsFrames environment frames.
	EpsStart, EpsEnd float64
	EpsFrames        int
	// ReplayCapacity is the number of transitions the replay holds.
	ReplayCapacity int
	// LearningStarts is the number of frames collected before the first gradient step.
	LearningStarts int
	// TrainEvery is the number of frames between training rounds, and GradSteps
	// the number of gradient steps per round.
	TrainEvery, GradSteps int
}

// DefaultConfig returns the recipe that solves CartPole-v1 (a mean return of 475
// over 100 episodes) in 100,000 to 150,000 frames and half as many gradient
// steps.
//
// The replay holds every transition of such a run: with a replay that forgets
// the early, failing episodes (50,000 transitions are the last 100 episodes of
// 500 steps) the agent loses the values of the states near failure and its
// return collapses after it first reaches 500, on some seeds for good.
func DefaultConfig() Config {
	return Config{
		Hidden:           []int{64, 64},
		LR:               5e-4,
		Gamma:            0.99,
		NStep:            3,
		BatchSize:        64,
		TargetUpdate:     500,
		GradClip:         10,
		HuberDelta:       1,
		PriorityExponent: 0.6,
		PriorityEps:      1e-3,
		BetaStart:        0.4,
		BetaEnd:          1,
		BetaFrames:       100_000,
		EpsStart:         1,
		EpsEnd:           0.05,
		EpsFrames:        10_000,
		ReplayCapacity:   200_000,
		LearningStarts:   1_000,
		TrainEvery:       2,
		GradSteps:        1,
	}
}

// QuickConfig returns a recipe that lifts the mean return well above a random
// policy's within about 5,000 frames (the CI run): one gradient step per frame,
// a larger learning rate, faster schedules, more frequent target copies.
func QuickConfig() Config {
	c := DefaultConfig()
	c.LR = 1e-3
	c.TargetUpdate = 250
	c.EpsFrames = 5_000
	c.BetaFrames = 20_000
	c.ReplayCapacity = 50_000
	c.LearningStarts = 500
	c.TrainEvery = 1
	return c
}

// Validate reports the first field that is out of range.
func (c *Config) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("agent: config: %s = %v, want %s", field, v, want)
	}
	for _, h := range c.Hidden {
		if h < 1 {
			return bad("Hidden", c.Hidden, "positive widths")
		}
	}
	switch {
	case !(c.LR > 0):
		return bad("LR", c.LR, "> 0")
	case c.LREnd < 0 || c.LRFrames < 0:
		return bad("LREnd/LRFrames", [2]float64{c.LREnd, float64(c.LRFrames)}, ">= 0")
	case !(c.Gamma >= 0 && c.Gamma <= 1):
		return bad("Gamma", c.Gamma, "in [0, 1]")
	case c.NStep < 1:
		return bad("NStep", c.NStep, ">= 1")
	case c.BatchSize < 1:
		return bad("BatchSize", c.BatchSize, ">= 1")
	case c.TargetUpdate < 0:
		return bad("TargetUpdate", c.TargetUpdate, ">= 0")
	case c.TargetUpdate == 0 && !(c.Tau > 0 && c.Tau <= 1):
		return bad("Tau", c.Tau, "in (0, 1] when TargetUpdate is 0")
	case c.GradClip < 0:
		return bad("GradClip", c.GradClip, ">= 0")
	case !(c.HuberDelta > 0):
		return bad("HuberDelta", c.HuberDelta, "> 0")
	case !(c.PriorityExponent >= 0):
		return bad("PriorityExponent", c.PriorityExponent, ">= 0")
	case !(c.PriorityEps > 0):
		return bad("PriorityEps", c.PriorityEps, "> 0")
	case !(c.BetaStart >= 0 && c.BetaEnd >= 0 && c.BetaStart <= 1 && c.BetaEnd <= 1):
		return bad("BetaStart/BetaEnd", [2]float64{c.BetaStart, c.BetaEnd}, "in [0, 1]")
	case !(c.EpsStart >= 0 && c.EpsEnd >= 0 && c.EpsStart <= 1 && c.EpsEnd <= 1):
		return bad("EpsStart/EpsEnd", [2]float64{c.EpsStart, c.EpsEnd}, "in [0, 1]")
	case c.BetaFrames < 0 || c.EpsFrames < 0:
		return bad("BetaFrames/EpsFrames", [2]int{c.BetaFrames, c.EpsFrames}, ">= 0")
	case c.ReplayCapacity < 1:
		return bad("ReplayCapacity", c.ReplayCapacity, ">= 1")
	case c.LearningStarts < 0:
		return bad("LearningStarts", c.LearningStarts, ">= 0")
	case c.TrainEvery < 1 || c.GradSteps < 1:
		return bad("TrainEvery/GradSteps", [2]int{c.TrainEvery, c.GradSteps}, ">= 1")
	}
	return nil
}

// LearningRate returns the learning rate after frames environment frames.
func (c *Config) LearningRate(frames int64) float64 {
	if c.LREnd <= 0 {
		return c.LR
	}
	return Linear(c.LR, c.LREnd, c.LRFrames, frames)
}

// Linear interpolates from start to end over n units and stays at end after.
func Linear(start, end float64, n int, t int64) float64 {
	if n <= 0 || t >= int64(n) {
		return end
	}
	return start + (end-start)*float64(t)/float64(n)
}

var errNoForward = errors.New("agent: ApplyGradients without ComputeGradients")
