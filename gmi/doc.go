// Package gmi discovers GPUs, MIG and MPS instances, plans ranks onto GPU
// multiplexing instances (GMIs), chooses the reduction strategy (GMI-DRL's
// Algorithm 1) and searches for the best GMIs per GPU (its Algorithm 2).
//
// A launcher binding ranks to devices does, in order:
//
//  1. Discover(ctx) the machine. It reads the topology file named by
//     GEAR_TOPOLOGY when set, else the GPUs through NVML, and probes the MPS
//     control daemon. A machine without NVML has no GPUs; that is not an
//     error.
//  2. NewPlan(topology, PlanRequest{Ranks: n, GMIPerGPU: k, Backend: b}).
//     The request fails with an error naming what does not fit: too few
//     GPUs, more ranks on a GPU than it has MIG instances, MIG asked of a GPU
//     without MIG mode (gear never changes MIG mode).
//  3. Add plan.Bindings[r].Environ() to rank r's environment: the device
//     (CUDA_VISIBLE_DEVICES, a GPU index or a MIG UUID), the MPS share and
//     memory limit, and GEAR_GMI_LAYOUT, the mapping list.
//
// A collective running a layout-aware reduction does, in order:
//
//  1. ParseMapping(os.Getenv(EnvGMILayout)).
//  2. ChooseStrategy(mapping) (or a strategy of its own), then
//     ReductionSchedule(mapping, strategy): the groups that reduce together
//     at each step. Every rank computes the same schedule.
//  3. For its own rank, schedule.ForRank(rank): one sub-communicator per
//     group, running the step's reduce, allreduce or broadcast over the link
//     the group names (host memory, or NCCL where all members sit on
//     different GPUs). Simulate is the serial reference to test against.
//
// The profiling search runs Search(ctx, SearchConfig{...}, profile) with a
// ProfileFunc; BenchCommand.Profile runs a user's benchmark program under the
// protocol described with BenchCommand.
//
// Everything but NVML discovery is plain data and pure functions. NVML needs
// cgo; a binary built without cgo sees no GPUs but plans from topology files.
package gmi
