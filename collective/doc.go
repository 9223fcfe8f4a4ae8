// Package collective implements communicators and their blocking collectives
// (AllReduce, Reduce, Broadcast, AllGather, Gather, Scatter, ReduceScatter,
// AllToAll, Barrier, Send/Recv) over three transports: in-process (Loopback),
// shared memory between ranks of one host, and TCP between hosts.
//
// What a caller does, in order:
//
//  1. Get a Bootstrap: the world a launcher assembled (rank.Init returns one,
//     *rank.World), or collectivetest.NewWorld in tests.
//  2. Call New on every rank of the world, with the same options; it returns the
//     world communicator once the transports to every peer are up. Ranks with
//     the same Bootstrap.Host talk through shared memory, others over TCP;
//     WithTransport(TransportTCP) (what GEAR_TRANSPORT=tcp asks for) forces TCP.
//  3. Call collectives with a context, in the same order on every rank:
//     AllReduce(ctx, c, buf, Sum) and the other generic functions over float32,
//     float64, int32, int64 (and byte where nothing is reduced). They block until
//     this rank's part is done; buffers are the caller's again when they return.
//  4. Split the communicator (Split(ctx, color, key)) for groups of ranks, each
//     with transports of its own, so that it may be used while the parent is.
//  5. Close every communicator (split ones first or not; Close does not wait
//     for the other ranks).
//
// Errors. A call fails with the context's error (wrapped, naming the call), or
// with *MismatchError when ranks made different calls (errors.Is ErrMismatch),
// *LostError when a rank died (ErrRankLost), *AbortError when another rank's
// communicator failed for a reason of its own (ErrAborted), or ErrClosed. The
// first error makes the communicator fail: the other ranks hear of it within
// moments, and every later call returns the same error. A rank whose part of a
// mismatched call needs nothing from the others (a broadcast root) may finish
// that call; its next call fails.
//
// Concurrency. A Comm's calls are serialized; calls from several goroutines on one
// Comm would reach the ranks in different orders. Give each goroutine its own
// communicator (Split).
//
// GMI layouts. When ranks share GPUs as GMIs, NewLayout (or LayoutFromEnv, from
// GEAR_GMI_LAYOUT) builds a Layout over a communicator: GMI-DRL's layout-aware
// reductions (multi-process, multi-ring, hierarchical), chosen by its
// Algorithm 1 from the mapping or forced. LayoutAllReduce reduces host buffers
// over the host path; Layout.AllReduceDevice reduces device buffers with NCCL
// between GPUs where present (WithDevice(nccl.ForLayout(dev))) and through host copies among the
// GMIs of one GPU.
//
// Device buffers. Package github.com/gear-rl/gear/collective/nccl builds NCCL communicators
// (nccl.New for the world, nccl.FromComm for the ranks of a communicator),
// whose calls take cuda.DevicePtr buffers and keep the errors above: an ended
// context or a lost rank aborts the NCCL communicator instead of hanging, and
// the first error sticks. It is a package of its own so that this one, and
// every program that uses it, links no GPU binding (and stays a static
// binary that starts fast).
//
// Tuning (chunk size, ring size, the sizes where algorithms switch) has measured
// defaults; docs/collectives.md describes the protocols and the measurements.
package collective
