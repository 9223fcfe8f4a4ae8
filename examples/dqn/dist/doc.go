// Package dist runs the Double DQN of package agent as an SRL job: trainers,
// actors and policy workers as ranks of one world (MPMD groups under
// gearrun), joined by package roles' streams and by gear's replay store.
//
//   - A trainer owns a store shard (Remover "none") under a sample.ShardTable
//     with a prioritized sampler and a FIFO remover (Config.Sampler and
//     Config.Remover, which a job spec's [table] may change) and a
//     SampleToInsertRatio rate limiter. It samples full batches (importance weights from the
//     returned probabilities), computes gradients, averages them with the
//     other trainers by AllReduce over the trainers' communicator, applies
//     them, updates priorities from the TD errors, and publishes parameters
//     ("theta", the first trainer) and a small status of its own (admitted
//     commits, frames, max priority, stop).
//   - An actor steps its environment; it takes actions from its own copy of
//     the network, refreshed at most every ParamEvery steps (inline), or from
//     a policy worker over the inference stream. Every n-step transition,
//     with the parameter version that chose its action, goes to its trainer's
//     table: on the trainer's host it attaches the shard by name and
//     allocates, writes and commits the row in place, inserting with the
//     trainer's max priority; elsewhere it pushes chunks through the sample
//     stream and the trainer inserts them. Finished episodes go to the first
//     trainer, which keeps the score and decides when the run is over.
//   - A policy worker answers its actors' observations in batches (flushed
//     on size, on a deadline, or when every actor waits) with the greedy
//     actions of the newest parameters it has, and their version.
//
// The rate limiter paces both sides. Samples wait while the trainer is
// ahead of the ratio. Inserts wait while the actors are: the table admits
// committed rows only as the limiter allows, an actor writing into the shard
// waits while more than Backlog of its commits are unadmitted (it reads the
// admitted sequence from its trainer's status), and one pushing through the
// sample stream waits on the stream's bounded queue, which the trainer stops
// draining.
//
// The run ends when the first trainer says so (target return, frame budget,
// or the end of a measurement): the trainers agree through the all-reduce,
// publish a status that says stop and close their services; actors and
// policy workers take a closed stream, a closed shard or the stop status
// as the end. A rank that dies is an error for its peers that names it.
//
// In order, every rank of a world calls Run(ctx, bootstrap, role, config,
// hooks); Run exchanges the roles through the bootstrap's key-value store,
// wires them with roles.Plan, and takes the first trainer's Config.
package dist
