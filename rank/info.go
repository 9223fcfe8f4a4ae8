package rank

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

// Source says where a process learned its place in the world.
type Source string

const (
	// SourceGear: the GEAR_* variables that gearrun sets.
	SourceGear Source = "gear"
	// SourceSlurm: SLURM's variables, when the GEAR_* ones are absent.
	SourceSlurm Source = "slurm"
	// SourceSingle: none of them; the process is a world of one.
	SourceSingle Source = "single"
)

// DefaultRdzvTimeout bounds how long the world may take to assemble, counted from
// the first rank's arrival, when GEAR_RDZV_TIMEOUT does not say.
const DefaultRdzvTimeout = 60 * time.Second

// MaxWorldSize is the most ranks one job may have. A launcher refuses larger
// jobs before it starts anything, and a rank refuses a GEAR_WORLD_SIZE above
// it; jobs of more ranks are better split into several jobs.
const MaxWorldSize = 1 << 16

// SlurmRdzvPortBase is the first port of the range [base, base+1000) from which a
// SLURM job without GEAR_RDZV_ADDR picks its coordinator's port (by job ID).
const SlurmRdzvPortBase = 29500

// Info is a process's place in the world, as the launcher described it. It is
// plain data; Init turns it into a World.
type Info struct {
	Rank      int // index in the world
	Size      int // number of ranks in the world
	LocalRank int // index among the ranks of this node
	LocalSize int // number of ranks on this node
	NodeRank  int // index of this node among the job's nodes
	NumNodes  int // number of nodes
	Role      string
	RoleRank  int // index within the role

	RdzvAddr    string        // coordinator host:port; "" for a world of one
	RdzvTimeout time.Duration // how long the world may take to assemble
	JobID       string        // UUID under gearrun, "slurm-<id>" under SLURM, "local-<pid>" alone
	Token       string        // per-job secret; never printed

	// Restart is the world's generation: how many times the launcher restarted
	// the job before this world (GEAR_RESTART_COUNT, else
	// TORCHELASTIC_RESTART_COUNT; 0 for the first world).
	Restart int
	// CheckpointDir is the job's checkpoint directory (GEAR_CHECKPOINT_DIR),
	// "" when the job has none.
	CheckpointDir string
	// HeartbeatInterval and HeartbeatTimeout are the job's heartbeat
	// (GEAR_HEARTBEAT_INTERVAL, GEAR_HEARTBEAT_TIMEOUT): how often the
	// coordinator pings, and how long either side waits for a word from the
	// other. 0 means DefaultHeartbeat and DefaultHeartbeatTimeout.
	HeartbeatInterval, HeartbeatTimeout time.Duration

	Source Source
	// ServeRdzv is set when this process must run the coordinator itself: rank 0
	// of a SLURM job that no launcher coordinates.
	ServeRdzv bool
}

// String prints the facts, never the token.
func (i Info) String() string {
	return fmt.Sprintf("rank %d/%d local %d/%d node %d/%d role %q/%d job %s restart %d rdzv %s (%s)",
		i.Rank, i.Size, i.LocalRank, i.LocalSize, i.NodeRank, i.NumNodes, i.Role, i.RoleRank,
		i.JobID, i.Restart, i.RdzvAddr, i.Source)
}

// LogValue keeps the token out of logs.
func (i Info) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("rank", i.Rank), slog.Int("size", i.Size),
		slog.Int("local_rank", i.LocalRank), slog.Int("local_size", i.LocalSize),
		slog.Int("node", i.NodeRank), slog.Int("num_nodes", i.NumNodes),
		slog.String("role", i.Role), slog.Int("role_rank", i.RoleRank),
		slog.String("job", i.JobID), slog.Int("restart", i.Restart), slog.String("rdzv", i.RdzvAddr),
		slog.String("source", string(i.Source)))
}

// Single is the Info of a process started outside any launcher: a world of one.
func Single() Info {
	return Info{Size: 1, LocalSize: 1, NumNodes: 1, JobID: LocalJobID(),
		RdzvTimeout: DefaultRdzvTimeout, Source: SourceSingle}
}

// FromEnv reads the process's place in the world from the environment: the GEAR_*
// variables when GEAR_RANK is set, else SLURM's when SLURM_PROCID is set, else a
// world of one. The error names the variable that is malformed or inconsistent.
func FromEnv() (Info, error) { return FromLookup(os.LookupEnv) }

// FromLookup is FromEnv over any lookup function (os.LookupEnv, or a map in tests).
func FromLookup(lookup func(string) (string, bool)) (Info, error) {
	get := func(name string) string { v, _ := lookup(name); return v }
	info := Single()
	info.Role = get(EnvRole)
	if d := get(EnvRdzvTimeout); d != "" {
		t, err := time.ParseDuration(d)
		if err != nil || t <= 0 {
			return Info{}, fmt.Errorf("rank: %s=%q: want a positive duration such as 30s", EnvRdzvTimeout, d)
		}
		info.RdzvTimeout = t
	}
	for _, hb := range []struct {
		name string
		d    *time.Duration
	}{{EnvHeartbeatInterval, &info.HeartbeatInterval}, {EnvHeartbeatTimeout, &info.HeartbeatTimeout}} {
		if d := get(hb.name); d != "" {
			t, err := time.ParseDuration(d)
			if err != nil || t <= 0 {
				return Info{}, fmt.Errorf("rank: %s=%q: want a positive duration such as 5s", hb.name, d)
			}
			*hb.d = t
		}
	}
	if err := CheckHeartbeat(info.HeartbeatInterval, info.HeartbeatTimeout); err != nil {
		return Info{}, err
	}
	p := envParser{lookup: lookup}
	info.CheckpointDir = get(EnvCheckpointDir)
	if _, ok := lookup(EnvRestartCount); ok {
		info.Restart = p.int(EnvRestartCount, 0)
	} else {
		info.Restart = p.int(EnvTorchRestartCount, 0)
	}
	switch {
	case get(EnvRank) != "":
		info.Source = SourceGear
		info.Rank = p.int(EnvRank, -1)
		info.Size = p.int(EnvWorldSize, -1)
		info.LocalRank = p.int(EnvLocalRank, info.Rank)
		info.LocalSize = p.int(EnvLocalSize, info.Size)
		info.NodeRank = p.int(EnvNodeRank, 0)
		info.NumNodes = p.int(EnvNumNodes, 1)
		info.RoleRank = p.int(EnvRoleRank, info.Rank)
		info.RdzvAddr = get(EnvRdzvAddr)
		info.JobID = get(EnvJobID)
		info.Token = get(EnvJobToken)
		if p.err == nil && info.Size > 1 && info.RdzvAddr == "" {
			p.err = fmt.Errorf("rank: %s=%d but %s is not set", EnvWorldSize, info.Size, EnvRdzvAddr)
		}
		if p.err == nil && info.JobID == "" {
			p.err = fmt.Errorf("rank: %s is set but %s is not", EnvRank, EnvJobID)
		}
	case get(EnvSlurmProcID) != "":
		info.Source = SourceSlurm
		info.Rank = p.int(EnvSlurmProcID, -1)
		info.Size = p.int(EnvSlurmNTasks, -1)
		info.LocalRank = p.int(EnvSlurmLocalID, 0)
		info.NodeRank = p.int(EnvSlurmNodeID, 0)
		info.RoleRank = p.int(EnvRoleRank, info.Rank)
		info.JobID = get(EnvJobID)
		slurmJob := get(EnvSlurmJobID)
		if info.JobID == "" {
			info.JobID = "slurm-" + slurmJob
		}
		info.Token = get(EnvJobToken)
		// A step's own variables, where srun sets them, before the
		// allocation's: a step may run on some of its nodes (a job that
		// went on without a lost node).
		nodeList, numNodes, perNode := EnvSlurmNodeList, EnvSlurmNNodes, EnvSlurmTasksPerNode
		if get(EnvSlurmStepNodeList) != "" {
			nodeList = EnvSlurmStepNodeList
		}
		if get(EnvSlurmStepNNodes) != "" {
			numNodes = EnvSlurmStepNNodes
		}
		if get(EnvSlurmStepTasksPerNode) != "" {
			perNode = EnvSlurmStepTasksPerNode
		}
		var hosts []string
		if nl := get(nodeList); nl != "" && p.err == nil {
			var err error
			if hosts, err = ParseHostlist(nl); err != nil {
				p.err = fmt.Errorf("rank: %s: %w", nodeList, err)
			}
		}
		info.NumNodes = p.int(numNodes, max(len(hosts), 1))
		info.LocalSize = info.Size
		if tpn := get(perNode); tpn != "" && p.err == nil {
			n, err := tasksOnNode(tpn, info.NodeRank)
			if err != nil {
				p.err = fmt.Errorf("rank: %s=%q: %w", perNode, tpn, err)
			}
			info.LocalSize = n
		}
		info.RdzvAddr = get(EnvRdzvAddr)
		if info.RdzvAddr == "" && info.Size > 1 && p.err == nil {
			if len(hosts) == 0 {
				p.err = fmt.Errorf("rank: SLURM job of %d tasks: neither %s nor %s is set", info.Size, EnvRdzvAddr, EnvSlurmNodeList)
			} else {
				id, _ := strconv.Atoi(slurmJob)
				info.RdzvAddr = fmt.Sprintf("%s:%d", hosts[0], SlurmRdzvPortBase+id%1000)
				info.ServeRdzv = info.Rank == 0
			}
		}
	default:
		return info, nil
	}
	if p.err != nil {
		return Info{}, p.err
	}
	return info, info.validate()
}

func (i Info) validate() error {
	check := func(name string, v, lo, hi int) error {
		if v < lo || v >= hi {
			return fmt.Errorf("rank: %s=%d: want %d <= value < %d", name, v, lo, hi)
		}
		return nil
	}
	names := map[Source][4]string{
		SourceGear:  {EnvRank, EnvLocalRank, EnvNodeRank, EnvRoleRank},
		SourceSlurm: {EnvSlurmProcID, EnvSlurmLocalID, EnvSlurmNodeID, EnvRoleRank},
	}[i.Source]
	if i.Size < 1 {
		return fmt.Errorf("rank: world size %d: want at least 1", i.Size)
	}
	if i.Size > MaxWorldSize {
		return fmt.Errorf("rank: world size %d: a job has at most %d ranks (rank.MaxWorldSize)", i.Size, MaxWorldSize)
	}
	for _, err := range []error{
		check(names[0], i.Rank, 0, i.Size),
		check(names[1], i.LocalRank, 0, max(i.LocalSize, 1)),
		check(names[2], i.NodeRank, 0, max(i.NumNodes, 1)),
		check(names[3], i.RoleRank, 0, i.Size),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// envParser reads integers and keeps the first error.
type envParser struct {
	lookup func(string) (string, bool)
	err    error
}

func (p *envParser) int(name string, def int) int {
	v, ok := p.lookup(name)
	if !ok || v == "" {
		if def < 0 && p.err == nil {
			p.err = fmt.Errorf("rank: %s is not set", name)
		}
		return max(def, 0)
	}
	n, err := strconv.Atoi(v)
	if (err != nil || n < 0) && p.err == nil {
		p.err = fmt.Errorf("rank: %s=%q: want a non-negative integer", name, v)
	}
	return n
}

// TasksOnNode reads SLURM_TASKS_PER_NODE ("2(x3),1") and returns the number
// of tasks on node (counted from 0) of the allocation.
func TasksOnNode(tasksPerNode string, node int) (int, error) { return tasksOnNode(tasksPerNode, node) }

// tasksOnNode reads SLURM_TASKS_PER_NODE ("2(x3),1": two tasks on each of the first
// three nodes, one on the fourth) and returns the count for node.
func tasksOnNode(s string, node int) (int, error) {
	seen := 0
	for _, item := range strings.Split(s, ",") {
		count, reps := item, "1"
		if c, r, ok := strings.Cut(item, "(x"); ok {
			count, reps = c, strings.TrimSuffix(r, ")")
			if !strings.HasSuffix(r, ")") {
				return 0, fmt.Errorf("item %q: want N or N(xM)", item)
			}
		}
		n, err1 := strconv.Atoi(count)
		m, err2 := strconv.Atoi(reps)
		if err1 != nil || err2 != nil || n < 0 || m < 1 {
			return 0, fmt.Errorf("item %q: want N or N(xM)", item)
		}
		if node < seen+m {
			return n, nil
		}
		seen += m
	}
	return 0, fmt.Errorf("no entry for node %d", node)
}
