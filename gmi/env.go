package gmi

// Environment variables that gmi reads or that its plans and benchmark runs set.
// The names shared with the launcher-to-rank contract (package rank) are spelled
// the same there; gmi keeps its own copy so that it imports nothing from gear
// and the collective package can import gmi without a cycle.
const (
	// EnvTopology names a TOML topology file that stands in for NVML.
	EnvTopology = "GEAR_TOPOLOGY"
	// EnvGMILayout carries the job's mapping list ("[[0,1,2],[3,4,5]]") to every
	// rank; see Mapping.String and ParseMapping.
	EnvGMILayout = "GEAR_GMI_LAYOUT"

	// EnvGMIPerGPU tells a benchmark run by the profiling search how many GMIs
	// share each GPU in the configuration being measured.
	EnvGMIPerGPU = "GEAR_GMI_PER_GPU"
	// EnvNumEnv tells a benchmark run by the profiling search how many
	// environments one GMI simulates.
	EnvNumEnv = "GEAR_NUM_ENV"
)

// CUDA and MPS variables of a rank's device binding.
const (
	// EnvCUDAVisibleDevices is a GPU index or a MIG UUID.
	EnvCUDAVisibleDevices = "CUDA_VISIBLE_DEVICES"
	// EnvCUDADeviceOrder is set to PCI_BUS_ID whenever a GPU is bound by
	// index, so that CUDA numbers GPUs as NVML does (CUDA's default order,
	// FASTEST_FIRST, may differ).
	EnvCUDADeviceOrder = "CUDA_DEVICE_ORDER"
	// EnvMPSThreadPercent is an MPS client's share of the GPU's SMs, in percent.
	EnvMPSThreadPercent = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	// EnvMPSPinnedMemLimit caps an MPS client's device memory ("0=4096M").
	EnvMPSPinnedMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvMPSPipeDirectory is where the MPS control daemon keeps its pipes and
	// sockets; DefaultMPSPipeDirectory when unset.
	EnvMPSPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"
)

// DefaultMPSPipeDirectory is the MPS control daemon's pipe directory when
// CUDA_MPS_PIPE_DIRECTORY is unset.
const DefaultMPSPipeDirectory = "/tmp/nvidia-mps"

// MPSControlCommand is the program that starts and controls the MPS daemon.
const MPSControlCommand = "nvidia-cuda-mps-control"
