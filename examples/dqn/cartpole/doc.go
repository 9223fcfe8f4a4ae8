// Package cartpole is the classic cart-pole balancing task (Barto, Sutton and
// Anderson, 1983) with the equations, constants and episode rules of Gym's
// CartPole-v1, written in Go so that actors need no Python.
//
// A caller does, in order:
//
//  1. e := cartpole.New() (or NewWithLimit for a different step limit);
//  2. e.Reset(rng, obs) to start an episode, obs of length ObsSize;
//  3. e.Step(action, obs) until it reports terminated or truncated, then Reset.
//
// Terminated means the pole fell or the cart left the track: the episode has no
// future and a learner must not bootstrap. Truncated means the step limit (500)
// cut the episode: the state is an ordinary one and a learner must bootstrap from
// it. The reward is 1 for every step, including the last.
//
// An Env is not safe for concurrent use; each actor owns its own. Step allocates
// nothing.
package cartpole
