// Package cuda binds the CUDA driver and NCCL at run time (dlopen, no cgo and no
// CUDA headers at build time), embeds the PTX kernels of collection and
// selection, and holds their CPU reference twins. One binary runs everywhere:
// without a driver, OpenDriver returns an error wrapping ErrNoDriver ("cuda: no
// CUDA driver: ...") and every CPU path (GatherCPU, WeightedSampleCPU, TopKCPU)
// still works.
//
// # What a caller does, in order
//
//  1. OpenDriver loads libcuda.so.1 (GEAR_CUDA_LIB, else the loader's path and the
//     usual directories) and calls cuInit. On ErrNoDriver, use the CPU twins.
//  2. Driver.Device(i) retains device i's primary context; Close releases it, last.
//     Every Device method makes that context current on the calling OS thread for
//     the call, so a Device is used from any goroutine.
//  3. Memory: Alloc/Free for device memory; AllocHost/FreeHost for pinned, mapped
//     host memory; RegisterHost/UnregisterHost to pin and map memory that already
//     exists (a shard's column tables) and get its device pointer.
//  4. Streams and events: NewStream, Record, StreamSynchronize(ctx, s),
//     EventSynchronize(ctx, e), Elapsed.
//  5. Collection: NewGatherer, then Gatherer.Gather(ctx, s, dst, table, indices,
//     offsets, spec) enqueues the zero-copy gather of the selected blocks through
//     a window; synchronize s before reading dst (Device.LaunchGatherHost is the
//     same kernel without a Gatherer: the indices ride in the launch's
//     parameters). Gatherer.GatherCopies does the same through the copy
//     engines, one batched copy (CopyBatchAsync, drivers of CUDA 12.8 and
//     later).
//  6. Selection: NewSampler, then Sampler.WeightedSample (draws from UniformDraws)
//     and Sampler.TopK over weights already in device memory; both return when
//     the host slice holds the result, and match the CPU twins bit for bit.
//  7. NCCL: OpenNCCL (GEAR_NCCL_LIB, the loader, Python's nvidia/nccl/lib), then on
//     every rank NCCL.ShareUniqueID(ctx, world, key) and NCCL.NewComm(ctx, dev,
//     id, size, rank); register NCCLComm.AbortOnLost with the world's OnLost;
//     call the collectives with a context; Close(ctx) at the end.
//  8. Learning: LaunchMatMul (Forward, InputGrad, WeightGrad shapes),
//     LaunchColSum, LaunchTD and LaunchTDSum, LaunchClipNorm, LaunchAdam,
//     LaunchSoftUpdate and LaunchPrioScatter enqueue a learner's steps; each has
//     a CPU twin (MatMulCPU, ...) that computes the same bits.
//  9. Experience between processes on one GPU (GMIs): the consumer's NewRing and
//     Handle, the producer's OpenRing (CUDA IPC: IPCHandle, OpenIPC, CloseIPC)
//     and Put; the consumer's Take.
//  10. Close Samplers, Gatherers and streams, free memory, then Device.Close.
//
// # Buffer ownership
//
// Device memory from Alloc and host memory from AllocHost belong to the caller
// until Free or FreeHost. Memory passed to RegisterHost must stay mapped, and
// must not be Go-heap memory, until UnregisterHost; no kernel may read it after.
// Anything passed to an asynchronous call (CopyHtoDAsync, Gather, Launch, the
// NCCL collectives' buffers) is in use by the device until the stream has passed
// that work: the caller must not change, reuse or free it before a
// synchronization (StreamSynchronize, EventSynchronize, or the return of a call
// that waits, such as WeightedSample or NCCLComm.AllReduce) succeeds. A wait that
// returns a context error leaves the work running: the buffers stay in use.
// Gatherer and Sampler own their scratch buffers; the host slices a caller passes
// to them are copied before the call returns.
//
// # Kernels
//
// The kernels are CUDA C in internal/kernels, compiled to PTX for compute_80 by
// `make ptx` and embedded; the driver compiles the PTX for the device when the
// module loads (sm_80, sm_90 and later). Their sums are evaluated in a fixed order
// so that the Go twins reproduce them exactly. Package cudatest builds fake
// libcuda.so.1 and libnccl.so.2 libraries that run these same kernels on the CPU,
// for tests without a GPU.
package cuda
