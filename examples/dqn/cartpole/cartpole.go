package cartpole

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Physical constants and episode rules of Gym's CartPole-v1.
const (
	Gravity   = 9.8
	MassCart  = 1.0
	MassPole  = 0.1
	TotalMass = MassCart + MassPole
	// Length is half the pole's length.
	Length         = 0.5
	PoleMassLength = MassPole * Length
	ForceMag       = 10.0
	// Tau is the time step of the explicit Euler integration, in seconds.
	Tau = 0.02
	// ThetaThreshold is the pole angle (radians, 12 degrees) past which the
	// episode terminates.
	ThetaThreshold = 12 * 2 * math.Pi / 360
	// XThreshold is the cart position past which the episode terminates.
	XThreshold = 2.4
	// MaxSteps is CartPole-v1's step limit; reaching it truncates the episode.
	MaxSteps = 500
	// InitBound is the half-width of the uniform distribution of the initial state.
	InitBound = 0.05
)

// ObsSize is the length of an observation: x, x_dot, theta, theta_dot.
const ObsSize = 4

// NumActions is the number of discrete actions: 0 pushes left, 1 pushes right.
const NumActions = 2

// ErrNeedsReset is returned by Step before the first Reset and after an episode ended.
var ErrNeedsReset = errors.New("cartpole: episode ended or not started; call Reset")

// State is the physical state of the system.
type State struct {
	X, XDot, Theta, ThetaDot float64
}

// Env is one cart-pole environment.
type Env struct {
	state   State
	steps   int
	limit   int
	running bool
}

// New returns an environment with CartPole-v1's 500-step limit. Call Reset before Step.
func New() *Env { return NewWithLimit(MaxSteps) }

// NewWithLimit returns an environment that truncates episodes after limit steps
// (limit <= 0 means no limit).
func NewWithLimit(limit int) *Env { return &Env{limit: limit} }

// ObsSize returns the observation length, 4.
func (e *Env) ObsSize() int { return ObsSize }

// NumActions returns the number of discrete actions, 2.
func (e *Env) NumActions() int { return NumActions }

// State returns the current physical state.
func (e *Env) State() State { return e.state }

// Steps returns the number of steps taken in the current episode.
func (e *Env) Steps() int { return e.steps }

// SetState starts an episode from s (for tests and for replaying recorded states).
func (e *Env) SetState(s State) {
	e.state = s
	e.steps = 0
	e.running = true
}

// Reset starts an episode from a state drawn uniformly in [-0.05, 0.05]^4 and
// writes the first observation into obs, which must have length ObsSize.
func (e *Env) Reset(rng *rand.Rand, obs []float32) {
	u := func() float64 { return -InitBound + 2*InitBound*rng.Float64() }
	e.SetState(State{X: u(), XDot: u(), Theta: u(), ThetaDot: u()})
	e.observe(obs)
}

// Step applies action (0: push left, 1: push right), advances the system by Tau
// seconds, and writes the next observation into obs. The reward is 1. terminated
// is true when the pole angle or the cart position left its bounds; truncated is
// true when the episode reached its step limit. Both can be true together; a
// learner bootstraps only when terminated is false. After either, Step returns
// ErrNeedsReset until Reset.
func (e *Env) Step(action int, obs []float32) (reward float64, terminated, truncated bool, err error) {
	if !e.running {
		return 0, false, false, ErrNeedsReset
	}
	if action != 0 && action != 1 {
		return 0, false, false, fmt.Errorf("cartpole: invalid action %d, want 0 or 1", action)
	}
	e.state = Next(e.state, action)
	e.steps++
	s := e.state
	terminated = s.X < -XThreshold || s.X > XThreshold ||
		s.Theta < -ThetaThreshold || s.Theta > ThetaThreshold
	truncated = e.limit > 0 && e.steps >= e.limit
	if terminated || truncated {
		e.running = false
	}
	e.observe(obs)
	return 1, terminated, truncated, nil
}

// Next is the dynamics: the state one Euler step of Tau seconds after s under action.
func Next(s State, action int) State {
	force := ForceMag
	if action == 0 {
		force = -ForceMag
	}
	cos, sin := math.Cos(s.Theta), math.Sin(s.Theta)
	temp := (force + PoleMassLength*s.ThetaDot*s.ThetaDot*sin) / TotalMass
	thetaAcc := (Gravity*sin - cos*temp) / (Length * (4.0/3.0 - MassPole*cos*cos/TotalMass))
	xAcc := temp - PoleMassLength*thetaAcc*cos/TotalMass
	return State{
		X:        s.X + Tau*s.XDot,
		XDot:     s.XDot + Tau*xAcc,
		Theta:    s.Theta + Tau*s.ThetaDot,
		ThetaDot: s.ThetaDot + Tau*thetaAcc,
	}
}

func (e *Env) observe(obs []float32) {
	obs = obs[:ObsSize]
	obs[0] = float32(e.state.X)
	obs[1] = float32(e.state.XDot)
	obs[2] = float32(e.state.Theta)
	obs[3] = float32(e.state.ThetaDot)
}
