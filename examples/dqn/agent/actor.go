package agent

import (
	"fmt"
	"math/rand/v2"

	"github.com/gear-rl/gear/examples/dqn/nn"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

// Env is an episodic environment with vector observations and discrete actions,
// such as cartpole.Env.
type Env interface {
	ObsSize() int
	NumActions() int
	// Reset starts an episode and writes the first observation into obs.
	Reset(rng *rand.Rand, obs []float32)
	// Step applies action and writes the next observation into obs.
	Step(action int, obs []float32) (reward float64, terminated, truncated bool, err error)
}

// Episode describes a finished episode.
type Episode struct {
	Return float64
	Length int
	// Truncated is true when the step limit ended the episode.
	Truncated bool
}

// Actor steps one environment with an ε-greedy policy and emits n-step transitions.
type Actor struct {
	env     Env
	policy  *nn.MLP
	rng     *rand.Rand
	nstep   *NStep
	obs     []float32
	next    []float32
	ret     float64
	length  int
	running bool
}

// NewActor returns an actor for env whose policy network has the given layer
// sizes; set its parameters with SetParams before acting greedily.
func NewActor(env Env, sizes []int, nStep int, gamma float64, rng *rand.Rand) (*Actor, error) {
	if sizes[0] != env.ObsSize() || sizes[len(sizes)-1] != env.NumActions() {
		return nil, fmt.Errorf("agent: network %v does not fit observations of %d and %d actions", sizes, env.ObsSize(), env.NumActions())
	}
	return &Actor{
		env:    env,
		policy: nn.NewMLP(sizes, 1, rng),
		rng:    rng,
		nstep:  NewNStep(nStep, gamma, env.ObsSize()),
		obs:    make([]float32, env.ObsSize()),
		next:   make([]float32, env.ObsSize()),
	}, nil
}

// SetParams copies the policy parameters p (a learner's online parameters).
func (a *Actor) SetParams(p []float32) error { return a.policy.SetParams(p) }

// Act returns the ε-greedy action for obs.
func (a *Actor) Act(obs []float32, eps float64) int {
	if eps > 0 && a.rng.Float64() < eps {
		return a.rng.IntN(a.env.NumActions())
	}
	return Argmax(a.policy.Forward(obs, 1))
}

// Step takes one environment step with the actor's own ε-greedy policy:
// StepAction(Act(Observe(), eps), emit).
func (a *Actor) Step(eps float64, emit func(replay.Transition) error) (ep Episode, ended bool, err error) {
	return a.StepAction(a.Act(a.Observe(), eps), emit)
}

// Observe returns the observation the next action is taken from, starting an
// episode first when none runs. The slice belongs to the actor: read it before
// the next StepAction.
func (a *Actor) Observe() []float32 {
	if !a.running {
		a.env.Reset(a.rng, a.obs)
		a.nstep.Reset()
		a.ret, a.length, a.running = 0, 0, true
	}
	return a.obs
}

// StepAction takes action (chosen for Observe's observation, by this actor's
// policy or by a policy worker) in the environment, passes each completed
// transition to emit (which must copy what it keeps), and returns the episode
// when this step ended it. Every step becomes the first step of exactly one
// transition, and transitions are emitted in the order of their first steps.
func (a *Actor) StepAction(action int, emit func(replay.Transition) error) (ep Episode, ended bool, err error) {
	if action < 0 || action >= a.env.NumActions() {
		return Episode{}, false, fmt.Errorf("agent: action %d, want [0, %d)", action, a.env.NumActions())
	}
	a.Observe()
	r, term, trunc, err := a.env.Step(action, a.next)
	if err != nil {
		a.running = false
		return Episode{}, false, err
	}
	a.ret += r
	a.length++
	if err := a.nstep.Add(a.obs, action, r, a.next, term, trunc, emit); err != nil {
		return Episode{}, false, err
	}
	a.obs, a.next = a.next, a.obs
	if term || trunc {
		a.running = false
		return Episode{Return: a.ret, Length: a.length, Truncated: trunc && !term}, true, nil
	}
	return Episode{}, false, nil
}
