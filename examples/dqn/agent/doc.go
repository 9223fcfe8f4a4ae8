// Package agent is a Double DQN learner (van Hasselt et al., 2016) with a target
// network, prioritized replay (Schaul et al., 2016) and optional n-step returns,
// split along the worker roles of SRL so that the same pieces run in one process
// (Run) and as separate ranks (package dist):
//
//   - an Actor steps one environment with an ε-greedy policy and turns its steps
//     into n-step transitions (bootstrapping through truncation, not through
//     termination);
//   - a replay.Table stores the transitions with priorities and returns, with each
//     sample, the probability it was drawn with;
//   - a Learner computes the importance-weighted Huber loss and its gradient into
//     one flat vector (which data-parallel trainers all-reduce), applies Adam, keeps
//     the target network, and returns new priorities |δ| + ε.
//
// Run wires the three together in one process, synchronously and reproducibly for
// a seed. A caller that runs the roles itself does, per gradient step:
//
//  1. table.Sample(ctx, batch);
//  2. learner.ComputeGradients(batch, beta);
//  3. optionally all-reduce (average) learner.Online().Grads() across trainers;
//  4. learner.ApplyGradients();
//  5. table.UpdatePriorities(ctx, batch.Keys, learner.Priorities());
//  6. publish learner.Online().Params() to actors (Actor.SetParams).
//
// No type here is safe for concurrent use: each goroutine owns its own.
package agent
