package rank

// The launcher-to-rank contract. Every variable that gearrun (or the SLURM batch
// script it writes) sets for a rank is named here, and nowhere else.
const (
	// EnvRank is the rank's index in the world, 0 <= rank < world size.
	EnvRank = "GEAR_RANK"
	// EnvWorldSize is the number of ranks in the job.
	EnvWorldSize = "GEAR_WORLD_SIZE"
	// EnvLocalRank is the rank's index among the ranks of its node.
	EnvLocalRank = "GEAR_LOCAL_RANK"
	// EnvLocalSize is the number of ranks on the rank's node.
	EnvLocalSize = "GEAR_LOCAL_SIZE"
	// EnvNodeRank is the node's index among the job's nodes.
	EnvNodeRank = "GEAR_NODE_RANK"
	// EnvNumNodes is the number of nodes of the job.
	EnvNumNodes = "GEAR_NUM_NODES"
	// EnvRole is the rank's MPMD group ("actor", "trainer"); "" for SPMD jobs.
	EnvRole = "GEAR_ROLE"
	// EnvRoleRank is the rank's index within its role.
	EnvRoleRank = "GEAR_ROLE_RANK"
	// EnvRdzvAddr is the coordinator's host:port.
	EnvRdzvAddr = "GEAR_RDZV_ADDR"
	// EnvJobID is the job's UUID.
	EnvJobID = "GEAR_JOB_ID"
	// EnvJobToken is the per-job secret a rank proves to the coordinator.
	EnvJobToken = "GEAR_JOB_TOKEN"
)

// Optional settings a rank reads; the launcher sets them when asked.
const (
	// EnvRdzvTimeout bounds how long a rank waits for the world to assemble (a Go
	// duration such as "30s").
	EnvRdzvTimeout = "GEAR_RDZV_TIMEOUT"
	// EnvHostID overrides the host identity: ranks with equal host identity share
	// memory. The default is derived from the machine and its namespaces.
	EnvHostID = "GEAR_HOST_ID"
	// EnvTransport forces a collective transport ("tcp").
	EnvTransport = "GEAR_TRANSPORT"
	// EnvJobSpec is the path of the TOML job spec the job was launched from.
	EnvJobSpec = "GEAR_JOB_SPEC"
	// EnvGMILayout is the GMI-to-GPU mapping list of the job ("[[0,1],[2,3]]").
	EnvGMILayout = "GEAR_GMI_LAYOUT"
	// EnvTopology names a TOML topology file that stands in for NVML.
	EnvTopology = "GEAR_TOPOLOGY"
	// EnvNCCLLib is an explicit path to libnccl.so.2.
	EnvNCCLLib = "GEAR_NCCL_LIB"
	// EnvCUDALib is an explicit path to libcuda.so.1.
	EnvCUDALib = "GEAR_CUDA_LIB"
	// EnvStateDir is where gearrun keeps its records of submitted jobs.
	EnvStateDir = "GEAR_STATE_DIR"
	// EnvRuntimeDir is where running jobs keep their lock files (one per job,
	// "<jobID>.lock", held with flock while the job lives). The default is
	// $XDG_RUNTIME_DIR/gear, else gear-<uid> in the temporary directory.
	EnvRuntimeDir = "GEAR_RUNTIME_DIR"
	// EnvTestRank is set by package launchtest when it re-executes a test binary
	// as a rank: it names the test whose rank function the process runs.
	EnvTestRank = "GEAR_TEST_RANK"
)

// Device binding, set per rank by the launcher.
const (
	EnvCUDAVisibleDevices = "CUDA_VISIBLE_DEVICES"
	EnvMPSThreadPercent   = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPinnedMemLimit  = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// SLURM's names for the same facts, read when the GEAR_* ones are absent.
const (
	EnvSlurmProcID       = "SLURM_PROCID"
	EnvSlurmNTasks       = "SLURM_NTASKS"
	EnvSlurmLocalID      = "SLURM_LOCALID"
	EnvSlurmNodeID       = "SLURM_NODEID"
	EnvSlurmNodeList     = "SLURM_JOB_NODELIST"
	EnvSlurmNNodes       = "SLURM_JOB_NUM_NODES"
	EnvSlurmJobID        = "SLURM_JOB_ID"
	EnvSlurmTasksPerNode = "SLURM_TASKS_PER_NODE"
)
