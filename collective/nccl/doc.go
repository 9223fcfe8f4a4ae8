// Package nccl gives ranks communicators for device buffers, carried by NCCL
// (through package cuda's dlopen binding), with the error semantics of
// package collective; and the device side of collective.Layout.
//
// It is a package of its own so that package collective, and every program
// that uses it (the launcher, rank programs), links no GPU binding: only
// programs that import this package do.
//
// What a caller does, in order:
//
//  1. Open a device (cuda.OpenDriver, then Driver.Device), one per rank on
//     different GPUs: NCCL refuses two ranks on one GPU.
//  2. Build the communicator on every rank, with the same options: New(ctx,
//     boot, dev) for every rank of the world a collective.Bootstrap describes
//     (a *rank.World), or FromComm(ctx, c, dev) for the ranks of a host
//     communicator (a Split group), ranked as c. WithName tells two
//     communicators of one world apart; WithLibrary and WithStream give a
//     loaded NCCL and the caller's stream.
//  3. Call AllReduce, Reduce, Broadcast, AllGather, ReduceScatter, Send and
//     Recv with cuda.DevicePtr buffers, in the same order on every rank. Each
//     call waits until the work is done on the device.
//  4. Close the communicator (it does not wait for the other ranks).
//
// Errors are collective's: a call whose context ends aborts the NCCL
// communicator and returns the context's error naming the call; a lost rank
// gives *collective.LostError, another rank's failure *collective.AbortError,
// and after Close every call returns collective.ErrClosed. The first error
// sticks.
//
// Layouts. ForLayout(dev, opts...) is the collective.Device that
// collective.WithDevice takes, so that Layout.AllReduceDevice reduces device
// buffers with NCCL between GPUs and through host copies among the GMIs of
// one GPU:
//
//	l, err := collective.NewLayout(ctx, c, mapping, collective.WithDevice(nccl.ForLayout(dev)))
//	err = l.AllReduceDevice(ctx, collective.DevicePtr(p), n, collective.Float32, collective.Sum)
//
// docs/collectives.md describes both.
package nccl
