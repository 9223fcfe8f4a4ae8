package agent

import (
	"fmt"

	"github.com/gear-rl/gear/examples/dqn/replay"
)

// NStep turns single environment steps into n-step transitions: the reward of a
// transition is r_t + γ r_{t+1} + … + γ^{k−1} r_{t+k−1} and its discount γ^k,
// with k = n in mid-episode. When the episode terminates, the pending steps are
// emitted with discount 0 (no bootstrap); when it is truncated, they are emitted
// with discount γ^k and the last observation, so the learner bootstraps from it.
type NStep struct {
	n       int
	gamma   float64
	obsSize int
	obs     []float32 // ring of n observations
	actions []int
	rewards []float64
	head    int // index of the oldest pending step
	count   int
	scratch replay.Transition
}

// NewNStep returns an accumulator for n-step transitions of observations of obsSize values.
func NewNStep(n int, gamma float64, obsSize int) *NStep {
	if n < 1 || obsSize < 1 {
		panic(fmt.Sprintf("agent: NewNStep(%d, %v, %d)", n, gamma, obsSize))
	}
	return &NStep{
		n: n, gamma: gamma, obsSize: obsSize,
		obs: make([]float32, n*obsSize), actions: make([]int, n), rewards: make([]float64, n),
	}
}

// Pending returns the number of steps not yet emitted.
func (s *NStep) Pending() int { return s.count }

// Reset drops the pending steps (for an episode abandoned midway).
func (s *NStep) Reset() { s.head, s.count = 0, 0 }

// Add records the step (obs, action, reward) that led to next and passes every
// transition it completes to emit, oldest first. The Transition passed to emit
// refers to buffers that the next call overwrites: emit must copy what it keeps
// (replay tables do).
func (s *NStep) Add(obs []float32, action int, reward float64, next []float32, terminated, truncated bool, emit func(replay.Transition) error) error {
	i := (s.head + s.count) % s.n
	copy(s.obs[i*s.obsSize:(i+1)*s.obsSize], obs)
	s.actions[i] = action
	s.rewards[i] = reward
	s.count++
	if terminated || truncated {
		for s.count > 0 {
			if err := s.emitOldest(next, terminated, emit); err != nil {
				return err
			}
		}
		s.head = 0
		return nil
	}
	if s.count == s.n {
		return s.emitOldest(next, false, emit)
	}
	return nil
}

// emitOldest emits the oldest pending step with the rewards of all pending
// steps and drops it.
func (s *NStep) emitOldest(next []float32, terminated bool, emit func(replay.Transition) error) error {
	var ret float64
	disc := 1.0
	for k := 0; k < s.count; k++ {
		ret += disc * s.rewards[(s.head+k)%s.n]
		disc *= s.gamma
	}
	if terminated {
		disc = 0
	}
	h := s.head
	t := &s.scratch
	t.Obs = s.obs[h*s.obsSize : (h+1)*s.obsSize]
	t.Action = int32(s.actions[h])
	t.Reward = float32(ret)
	t.Discount = float32(disc)
	t.NextObs = next
	s.head = (s.head + 1) % s.n
	s.count--
	return emit(*t)
}
