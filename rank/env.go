package rank

// The launcher-to-rank contract. Every variable that gearrun (or the SLURM batch
// script it writes) sets for a rank is named here, and nowhere else. The facts
// of an Info are encoded by Info.Environ and decoded by FromLookup, under the
// names that ContractEnv lists; LauncherEnv lists these with the per-rank
// extras (EnvNodeName, EnvJobSpec, DeviceEnv's binding), which a job spec may
// not set.
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
	// EnvRdzvTimeout bounds how long a rank waits for the world to assemble (a
	// Go duration such as "30s"); unset, DefaultRdzvTimeout.
	EnvRdzvTimeout = "GEAR_RDZV_TIMEOUT"
	// EnvJobID is the job's UUID.
	EnvJobID = "GEAR_JOB_ID"
	// EnvJobToken is the per-job secret a rank proves to the coordinator.
	EnvJobToken = "GEAR_JOB_TOKEN"
	// EnvRestartCount is the world's generation: how many times the launcher
	// restarted the job's world before this one (0 for the first). The
	// rendezvous refuses a rank of another generation.
	EnvRestartCount = "GEAR_RESTART_COUNT"
	// EnvCheckpointDir is the job's checkpoint directory, one per job ID,
	// readable by every host of the job: where trainers checkpoint their
	// shards and the parameter service its latest version, so that a restarted
	// world finds them. Unset when the job has none.
	EnvCheckpointDir = "GEAR_CHECKPOINT_DIR"
	// EnvHeartbeatInterval is how often the coordinator pings each rank (a Go
	// duration such as "500ms"); unset, DefaultHeartbeat. A rank reads it
	// only when it serves the rendezvous itself (SLURM without gearrun).
	EnvHeartbeatInterval = "GEAR_HEARTBEAT_INTERVAL"
	// EnvHeartbeatTimeout is how long a rank waits for a word from the
	// coordinator before it takes it for gone (a Go duration such as "5s");
	// unset, DefaultHeartbeatTimeout. The launcher's coordinator waits as
	// long for the rank's.
	EnvHeartbeatTimeout = "GEAR_HEARTBEAT_TIMEOUT"
)

// Optional settings a rank reads; the launcher sets some of them when asked
// (EnvNodeName, EnvJobSpec and EnvGMILayout are in LauncherEnv).
const (
	// EnvHostID overrides the host identity: ranks with equal host identity share
	// memory. The default is derived from the machine and its namespaces.
	EnvHostID = "GEAR_HOST_ID"
	// EnvNodeName names the rank's node in host identities and in messages
	// about lost hosts: what a host list called it (-H, a hostfile). Under SLURM,
	// SLURMD_NODENAME does; the default is the host name.
	EnvNodeName = "GEAR_NODE_NAME"
	// EnvSlurmdNodeName is the name of the SLURM node a task runs on.
	EnvSlurmdNodeName = "SLURMD_NODENAME"
	// EnvTransport forces a collective transport ("tcp").
	EnvTransport = "GEAR_TRANSPORT"
	// EnvJobSpec is the path of the TOML job spec the job was launched from.
	EnvJobSpec = "GEAR_JOB_SPEC"
	// EnvGMILayout is the GMI-to-GPU mapping list of the job ("[[0,1],[2,3]]").
	EnvGMILayout = "GEAR_GMI_LAYOUT"
	// EnvTopology names a TOML topology file that stands in for NVML.
	EnvTopology = "GEAR_TOPOLOGY"
	// EnvGMIPerGPU tells a benchmark run by the GMI profiling search (gearrun
	// gmi search) how many GMIs share each GPU in the configuration measured.
	EnvGMIPerGPU = "GEAR_GMI_PER_GPU"
	// EnvNumEnv tells a benchmark run by the GMI profiling search how many
	// environments one GMI simulates.
	EnvNumEnv = "GEAR_NUM_ENV"
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
	// EnvTraceEvents asks every rank to keep a trace of its last N events
	// (collective calls, table inserts and samples, rate-limiter waits) for
	// the job's trace (gearrun --trace, a job spec's launch.trace); unset or
	// 0: none. The launcher sets it for every rank when asked.
	EnvTraceEvents = "GEAR_TRACE_EVENTS"
	// EnvMetricsDir is the directory in which a rank makes its metrics
	// segment: the launcher's shared-memory directory (gearrun --shm-dir),
	// where the launcher reads and removes the job's segments; unset: /dev/shm.
	// The launcher sets it for every rank.
	EnvMetricsDir = "GEAR_METRICS_DIR"
	// EnvTestRank is set by package launchtest when it re-executes a test binary
	// as a rank: it names the test whose rank function the process runs.
	EnvTestRank = "GEAR_TEST_RANK"
)

// Device binding, set per rank by the launcher when it binds GPUs (gearrun
// --bind gpu or --gmi-per-gpu K, a job spec's gpus_per_rank), together with
// EnvGMILayout: the names DeviceEnv lists.
const (
	// EnvCUDAVisibleDevices is the rank's GPU index, its GPU indices
	// ("0,1"), or its MIG instance's UUID ("MIG-...").
	EnvCUDAVisibleDevices = "CUDA_VISIBLE_DEVICES"
	// EnvCUDADeviceOrder is "PCI_BUS_ID" whenever GPUs are bound by index, so
	// that CUDA numbers them as NVML does.
	EnvCUDADeviceOrder = "CUDA_DEVICE_ORDER"
	// EnvMPSThreadPercent is an MPS client's share of its GPU's SMs, 100/K.
	EnvMPSThreadPercent = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	// EnvMPSPinnedMemLimit caps an MPS client's device memory ("0=4096M").
	EnvMPSPinnedMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// EnvMPSPipeDirectory is where the MPS control daemon keeps its pipes; the
// GMI discovery probes it (default /tmp/nvidia-mps). The launcher reads it and
// never sets it.
const EnvMPSPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"

// torchrun's names (torch.distributed.run), set for every rank beside the GEAR_*
// contract unless it is turned off (gearrun --torch-env=false, [launch]
// torch_env = false), so that torch.distributed.init_process_group's default
// env:// init works in a rank that gearrun starts. See TorchEnv.
const (
	// EnvTorchRank is the rank's index in the world (GEAR_RANK).
	EnvTorchRank = "RANK"
	// EnvTorchWorldSize is the number of ranks (GEAR_WORLD_SIZE).
	EnvTorchWorldSize = "WORLD_SIZE"
	// EnvTorchLocalRank is the rank's index on its node (GEAR_LOCAL_RANK).
	EnvTorchLocalRank = "LOCAL_RANK"
	// EnvTorchLocalWorldSize is the number of ranks on the node (GEAR_LOCAL_SIZE).
	EnvTorchLocalWorldSize = "LOCAL_WORLD_SIZE"
	// EnvTorchGroupRank is the node's index (GEAR_NODE_RANK): torchrun's
	// agent, one per node, leads a worker group.
	EnvTorchGroupRank = "GROUP_RANK"
	// EnvTorchGroupWorldSize is the number of nodes (GEAR_NUM_NODES).
	EnvTorchGroupWorldSize = "GROUP_WORLD_SIZE"
	// EnvTorchRoleName is the rank's role (GEAR_ROLE), "default" for an SPMD
	// job, as torchrun names its one role.
	EnvTorchRoleName = "ROLE_NAME"
	// EnvTorchRoleRank is the rank's index within its role (GEAR_ROLE_RANK).
	EnvTorchRoleRank = "ROLE_RANK"
	// EnvTorchRoleWorldSize is the number of ranks of the rank's role.
	EnvTorchRoleWorldSize = "ROLE_WORLD_SIZE"
	// EnvTorchMasterAddr is the host of rank 0, where torch's TCPStore
	// listens.
	EnvTorchMasterAddr = "MASTER_ADDR"
	// EnvTorchMasterPort is a free port that the launcher reserved on rank
	// 0's host for the TCPStore: never the rendezvous coordinator's port.
	EnvTorchMasterPort = "MASTER_PORT"
	// EnvTorchRestartCount is how many times the job's world was restarted.
	EnvTorchRestartCount = "TORCHELASTIC_RESTART_COUNT"
	// EnvTorchMaxRestarts is how many restarts the job allows.
	EnvTorchMaxRestarts = "TORCHELASTIC_MAX_RESTARTS"
	// EnvTorchRunID is the job's ID (GEAR_JOB_ID).
	EnvTorchRunID = "TORCHELASTIC_RUN_ID"
	// EnvOMPNumThreads is set to 1 for ranks that share a node with others,
	// unless the rank's environment sets it, as torchrun does, so that the
	// ranks' thread pools do not oversubscribe the node's cores.
	EnvOMPNumThreads = "OMP_NUM_THREADS"
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
	// The step's nodes and tasks, which srun sets for its tasks; they differ
	// from the allocation's when a step runs on some of its nodes.
	EnvSlurmStepNodeList     = "SLURM_STEP_NODELIST"
	EnvSlurmStepNNodes       = "SLURM_STEP_NUM_NODES"
	EnvSlurmStepTasksPerNode = "SLURM_STEP_TASKS_PER_NODE"
)
