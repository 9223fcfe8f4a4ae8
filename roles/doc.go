// Package roles joins the worker roles of an SRL job: actors, policy workers and
// trainers. It provides the three connections between them, built on a
// collective.Bootstrap (a rank.World in a job, an in-process world in tests):
//
//   - the inference stream: actors send observations to a policy worker, which
//     answers them in batches (InferenceServer, InferenceClient);
//   - the parameter service: a trainer publishes versioned parameters that
//     policy workers (or inline actors) read (Publisher, Reader);
//   - the sample stream: actors push finished trajectories to a trainer, which
//     inserts them into its replay table (SampleSender, SampleReceiver, Sink).
//
// Each stream end that serves (policy worker, trainer, publisher) publishes an
// endpoint through the Bootstrap's key-value exchange ("roles/infer/<name>/<rank>",
// "roles/sample/<name>/<rank>", "roles/param/<name>"); clients wait for it. A
// client on the server's host (equal Bootstrap.Host) uses the server's
// shared-memory segment ("gear.<job>.roles.*"), others TCP; WithTransport forces
// one. A dead server is an error for its clients, naming its rank (*LostError):
// the world's news of the loss (OnLost), a broken connection, or a segment whose
// owner's lock fell away all end a waiting call at once.
//
// # What a rank does, in order
//
// Every rank computes the same wiring from the world's roles:
//
//	plan, err := roles.Plan(roles.TableOf(world.Roles()), roles.DefaultNames)
//
// A trainer (plan.Trainers; trainer plan.Publisher publishes parameters):
//
//  1. NewPublisher(ctx, world, "theta", n) if it is plan.Publisher, and
//     NewSampleReceiver(ctx, world, "traj", cfg).
//  2. Loops: Serve (or Recv) the sample stream into its replay table, train,
//     Publish(ctx, version, params) with growing versions.
//  3. Closes the receiver and the publisher.
//
// A policy worker (plan.Policies):
//
//  1. NewReader(ctx, world, "theta", k), Wait(ctx, 1) for the first version, and
//     NewInferenceServer(ctx, world, "pi", cfg).
//  2. Loops: Next(ctx) for a batch; MaybeRefresh(ctx, step) the parameters;
//     run the policy on the batch's observations (Obs, or Gather for one
//     matrix); Reply(actions, reader.Version()), or write each action into
//     its Action view and Send(reader.Version()).
//  3. Closes the server and the reader.
//
// An actor (plan.Actors):
//
//  1. DialInference(ctx, world, "pi", policy) with policy from plan.PolicyOf,
//     and DialSamples(ctx, world, "traj", trainer) with trainer from
//     plan.TrainerOf.
//  2. Loops: version, err := Infer(ctx, obs, act); step the environment; when a
//     trajectory is done, Push(ctx, Record{Version: version, Data: traj}) (Push
//     blocks while the trainer's queue for it is full). An actor stepping a
//     ring of K environments sends their K observations in one request,
//     InferMany(ctx, obs, K, acts), and steps each with its action.
//  3. Closes both.
//
// In inline mode (plan.Inline: a job with no policy workers) an actor runs the
// policy itself: it needs no inference stream; it opens a Reader, calls
// MaybeRefresh every step, calls its policy directly with reader.Params(), and
// records reader.Version() with its trajectories.
//
// An actor on the host of its trainer's replay shard may write into the shard
// directly instead of pushing: anything with Insert(ctx, Record) is a Sink, and
// actors should be written against Sink.
//
// # Buffers
//
// A batch has one row per observation: a request of K observations is K rows,
// in order, and MaxBatch counts rows. Batch.Obs and Batch.Action views point
// into the stream (the shared-memory slot of a local actor, so observations
// are read and actions written in place): Obs is read-only, both are valid
// until Reply or Send. Batch.Reply copies the actions into the Action views.
// Infer and InferMany copy obs in and the actions out; the caller keeps its
// buffers.
// Reader.Params belongs to the reader and is valid until the next call that
// takes a newer version. Publish copies params. Push copies rec.Data.
// SampleReceiver.Recv returns a view (shared memory for a local actor) valid
// until the next Recv or Close; the record's room in the actor's queue is given
// back only then, so a Sink must copy what it keeps.
//
// Each Close is idempotent, wakes the calls of its object that are waiting
// (they return ErrClosed) and joins the object's goroutines. A client waits
// for ctx, its own Close, and the server's death or Close.
package roles
