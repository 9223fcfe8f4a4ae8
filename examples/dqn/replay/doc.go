// Package replay is a local, single-process prioritized experience replay with
// Reverb's semantics, kept behind the small Table interface so that gear's
// distributed replay table (package sample, with its Prioritized selector) can
// replace it without changes to the learner.
//
// The semantics are Reverb's: every item has a unique key; Insert takes the
// item's priority p; Sample draws items independently, with replacement, with
// probability p^α / Σ p^α (α is the priority exponent; α = 0 is uniform) and
// returns that probability and the table size with each item, so that the
// learner can compute importance weights; UpdatePriorities sets new priorities by
// key and ignores keys no longer in the table. When the table is full, the
// oldest item is removed (first in, first out).
//
// A caller does, in order:
//
//  1. t := replay.NewPrioritized(capacity, obsSize, exponent, rng);
//  2. t.Insert(ctx, transition, priority) for each transition (the table copies it);
//  3. b := replay.NewBatch(batchSize, obsSize); t.Sample(ctx, b);
//  4. after learning from b, t.UpdatePriorities(ctx, b.Keys, newPriorities).
//
// A Batch is owned by the caller and is overwritten by each Sample into it.
// Prioritized is not safe for concurrent use; SumTree is its building block and
// is exported for tests and benchmarks.
package replay
