// Package gpulearn is the Double DQN learner on a GPU: the online and target
// networks, their gradients and Adam's moments live in device memory, and a
// gradient step is a sequence of gear's PTX kernels (package cuda's
// LaunchMatMul, LaunchTD, LaunchClipNorm, LaunchAdam, ...) on one stream. It
// computes what agent.CPULearner computes for the same batches: the kernels
// round every product and sum on their own, in a fixed order, and only the
// order of some sums differs from the CPU learner's, so losses agree to about
// 1e-6 relative (the twin test asks for 1e-4 over 100 steps).
//
// A batch reaches the device one of two ways:
//
//   - ComputeGradients(b, beta) takes a replay.Batch from the host: it is
//     packed into pinned memory in the row layout (Layout) and copied once;
//     this is the path of the twin test and of agent.Run with a host replay.
//   - ComputeGradientsDevice(rows, weights, n) takes rows already in device
//     memory, in the row layout, with their importance weights: what a device
//     replay (Replay, in this package) gathers zero-copy from its shard after
//     sampling on the GPU. Its priorities then go back to the sampling weights
//     on the device (Replay.WriteBack), without a host copy.
//
// A caller does, in order: New (or NewOnDevice), then per step ComputeGradients
// or ComputeGradientsDevice, ApplyGradients, Priorities; OnlineParams when the
// actors need parameters; Close before the device is closed. A Learner is not
// safe for concurrent use.
package gpulearn
