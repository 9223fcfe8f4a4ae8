package jobs

import (
	"maps"
	"math"
	"time"

	"github.com/gear-rl/gear/sample/reverb"
)

// Spec is a job spec: what to run, how many ranks of each role, and where. It is
// decoded from TOML by Load or Parse; the zero values of its fields are filled by
// SetDefaults and checked by Validate.
//
// An SPMD job sets [launch].np and [launch].command; an MPMD job lists [[group]]s
// instead, one per role, and keeps [launch] for what the roles share (env,
// timeout, grace, output_dir).
//
// A string field tagged jobs:"nonempty" means nothing as "": a document that
// writes it so is refused by Decode with the key's place, and one that leaves
// it out gets its default (jobs:"nonempty,default") or fails Validate.
type Spec struct {
	// Name names the job in SLURM and in gear's records; Load defaults it to the
	// spec file's base name.
	Name   string  `toml:"name" jobs:"nonempty,default"`
	Launch Launch  `toml:"launch"`
	Groups []Group `toml:"group,omitempty"`
	GMI    GMI     `toml:"gmi"`
	Slurm  Slurm   `toml:"slurm"`
	// Table describes the replay table the job's programs build; nil when the
	// spec has no [table].
	Table *Table `toml:"table,omitempty"`
}

// Launch is the [launch] section.
type Launch struct {
	// NP is the number of ranks of an SPMD job (default 1). With [[group]]s it is
	// either 0 or the sum of the groups' np.
	NP int `toml:"np,omitempty"`
	// MinNP, when set, makes the job's size elastic, as gearrun's -np
	// MIN:MAX: np is MAX, min_np MIN. Under SLURM, a generation after a node
	// was lost runs on the allocation's nodes left, as many ranks as they
	// hold (slurm.ntasks_per_node each) up to np, if that is at least
	// min_np. Only for a job of one group (no [[group]]), with restarts.
	// 0: the size is np, fixed.
	MinNP int `toml:"min_np,omitempty"`
	// Command is the program and its arguments, e.g. ["./bin/hello", "-n", "3"];
	// relative paths are relative to the directory gearrun runs in. Empty with
	// [[group]]s.
	Command []string `toml:"command,omitempty"`
	// Env is added to every rank's environment (groups can override keys).
	Env map[string]string `toml:"env,omitempty"`
	// GPUsPerRank is the number of GPUs bound to each rank of an SPMD job.
	GPUsPerRank int `toml:"gpus_per_rank,omitempty"`
	// Timeout bounds the whole run; 0 means none.
	Timeout Duration `toml:"timeout,omitempty"`
	// Grace is how long ranks have between SIGTERM and SIGKILL when the job
	// stops early (default 10s).
	Grace Duration `toml:"grace,omitempty"`
	// RdzvTimeout bounds how long ranks wait for the world to assemble; 0 leaves
	// the rank package's default.
	RdzvTimeout Duration `toml:"rdzv_timeout,omitempty"`
	// Heartbeat is how often the coordinator pings each rank, and
	// HeartbeatTimeout how long it and a rank wait for a word from each
	// other before the other is taken for lost (gearrun's --heartbeat and
	// --heartbeat-timeout); 0 leaves the rank package's defaults.
	Heartbeat        Duration `toml:"heartbeat,omitempty"`
	HeartbeatTimeout Duration `toml:"heartbeat_timeout,omitempty"`
	// OutputDir, when set, receives one output file per rank.
	OutputDir string `toml:"output_dir,omitempty"`
	// Trace, when set, is the file where gearrun writes the job's Chrome
	// trace when it ends (gearrun --trace; docs/observe.md), relative to the
	// directory gearrun runs in.
	Trace string `toml:"trace,omitempty"`
	// Restarts is how many times a failed world is stopped and started again
	// (gearrun's --max-restarts, torchrun's --max-restarts); 0, the default,
	// means none. Each new world is a new generation of the same job.
	Restarts int `toml:"restarts,omitempty"`
	// CheckpointDir is the job's checkpoint directory (GEAR_CHECKPOINT_DIR),
	// the same for every generation and kept after the job; relative to the
	// directory gearrun runs in. Empty with restarts: a directory of the job
	// under launch.CheckpointRoot(); empty without: none.
	CheckpointDir string `toml:"checkpoint_dir,omitempty"`
	// TorchEnv gives every rank torchrun's variables (RANK, WORLD_SIZE,
	// LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...; see rank.TorchEnv) beside
	// gear's; nil means true. false turns them off.
	TorchEnv *bool `toml:"torch_env,omitempty"`
}

// TorchEnvOn reports whether the ranks get torchrun's variables.
func (l Launch) TorchEnvOn() bool { return l.TorchEnv == nil || *l.TorchEnv }

// Group is one [[group]]: an MPMD role.
type Group struct {
	// Role names the role (GEAR_ROLE); unique within the spec.
	Role string `toml:"role" jobs:"nonempty"`
	// NP is the number of ranks of this role.
	NP int `toml:"np"`
	// Command is the role's program and arguments.
	Command []string `toml:"command,omitempty"`
	// Env is added to the role's ranks, over [launch].env.
	Env map[string]string `toml:"env,omitempty"`
	// GPUsPerRank is the number of GPUs bound to each rank of this role.
	GPUsPerRank int `toml:"gpus_per_rank,omitempty"`
}

// GMI is the [gmi] section: GPU multiplexing.
type GMI struct {
	// PerGPU is the number of ranks that share one GPU as GMIs (default 1).
	PerGPU int `toml:"per_gpu"`
	// Backend is how a GPU is shared: "none", "mps", "mig" or "auto" (default
	// "none" for one rank per GPU, "auto" otherwise).
	Backend string `toml:"backend" jobs:"nonempty,default"`
}

// GMI backends.
const (
	BackendNone = "none"
	BackendMPS  = "mps"
	BackendMIG  = "mig"
	BackendAuto = "auto"
)

// Slurm is the [slurm] section, used by `gearrun submit`.
type Slurm struct {
	Partition string `toml:"partition,omitempty"`
	// Nodes is the number of nodes (default 1).
	Nodes int `toml:"nodes,omitempty"`
	// NTasksPerNode fixes the number of ranks per node; 0 (the default) lets
	// SLURM spread the ranks over the nodes.
	NTasksPerNode int `toml:"ntasks_per_node,omitempty"`
	// CPUsPerTask is sbatch's --cpus-per-task (default 1).
	CPUsPerTask int `toml:"cpus_per_task,omitempty"`
	// GPUsPerNode is sbatch's --gpus-per-node; 0 asks for none.
	GPUsPerNode int `toml:"gpus_per_node,omitempty"`
	// Time is the wall-time limit in SLURM's syntax: "MM", "MM:SS", "HH:MM:SS",
	// "D-HH", "D-HH:MM" or "D-HH:MM:SS"; empty leaves the partition's default.
	Time    string `toml:"time,omitempty"`
	Account string `toml:"account,omitempty"`
	QOS     string `toml:"qos,omitempty"`
	// Extra holds further sbatch options, one per element ("--exclusive",
	// "--constraint=a100").
	Extra []string `toml:"extra,omitempty"`
	// Gearrun is the path of gearrun on the compute nodes; empty means the
	// gearrun that submits the job.
	Gearrun string `toml:"gearrun,omitempty"`
	// RdzvPort is the rendezvous port on the first node; 0 derives it from the
	// SLURM job ID (see RendezvousPort).
	RdzvPort int `toml:"rdzv_port,omitempty"`
}

// Table is the [table] section: the replay table that the job's programs build
// from the spec they were launched with (see FromEnv), through Build. One shard
// per rank holds Capacity trajectories.
//
// The names it takes are those of the packages that implement them: dtypes are
// store's (store.DTypeNames), selectors and rate limiters sample's, spelled in
// its GPU-free package reverb (reverb.SelectorNames, reverb.LimiterNames).
// Validate accepts exactly the tables that Build builds.
type Table struct {
	// Name names the table (default "replay").
	Name string `toml:"name" jobs:"nonempty,default"`
	// Columns are the fields of a trajectory step.
	Columns []Column `toml:"columns,omitempty"`
	// Capacity is the number of trajectories per shard.
	Capacity int `toml:"capacity"`
	// TrajectoryLength is the number of steps per trajectory.
	TrajectoryLength int `toml:"trajectory_length"`
	// Sampler selects items to sample: one of reverb.SelectorNames,
	// "uniform", "prioritized", "fifo", "lifo", "maxheap" or "minheap"
	// ("max_heap" and "min_heap" too) (default "uniform"; "fifo" for a
	// queue, "lifo" for a stack).
	Sampler string `toml:"sampler" jobs:"nonempty,default"`
	// PriorityExponent is the exponent of the prioritized sampler or remover
	// (default 1 when either is "prioritized"; only for them). Marshal
	// writes it even when it is 0: a prioritized table's written 0 (uniform
	// draws) is not the default, and the spec a submitted job runs from
	// must keep it.
	PriorityExponent float64 `toml:"priority_exponent"`
	// Remover selects the victim when a shard is full; the same kinds as
	// Sampler (default "fifo"; "lifo" for a stack).
	Remover string `toml:"remover" jobs:"nonempty,default"`
	// RateLimiter paces inserts against samples.
	RateLimiter RateLimiter `toml:"rate_limiter"`
	// MaxTimesSampled removes an item after it was sampled this often; 0 means
	// never (default 0; 1 for a queue or a stack).
	MaxTimesSampled int `toml:"max_times_sampled"`
	// Packed packs the shard's small columns (store.Spec.Packed): a column of
	// fewer than 64 bytes a row takes its size rounded up to a power of two,
	// not 64 (default false).
	Packed bool `toml:"packed,omitempty"`
	// CheckpointEvery is the period of each shard's checkpoint to the job's
	// checkpoint directory (GEAR_CHECKPOINT_DIR), from which a restarted job
	// restores what shared memory no longer holds; 0 means none.
	CheckpointEvery Duration `toml:"checkpoint_every,omitempty"`
}

// Column is one field of a trajectory step.
type Column struct {
	Name string `toml:"name" jobs:"nonempty"`
	// DType is one of store.DTypeNames: "float32", "float64", "float16",
	// "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
	// "uint32", "uint64" or "bool".
	DType string `toml:"dtype"`
	// Shape is the shape of one step's value; empty for a scalar.
	Shape []int `toml:"shape,omitempty"`
}

// RateLimiter is [table.rate_limiter], with Reverb's kinds (reverb.LimiterNames;
// reverb.NewLimit checks them, sample.NewRateLimit builds them).
type RateLimiter struct {
	// Kind is "min_size", "sample_to_insert_ratio", "queue" or "stack"
	// (default "min_size").
	Kind string `toml:"kind" jobs:"nonempty,default"`
	// MinSizeToSample is the number of items the table must hold before
	// sampling starts (default 1).
	MinSizeToSample int `toml:"min_size_to_sample"`
	// SamplesPerInsert is the target ratio of samples to inserts
	// (sample_to_insert_ratio only).
	SamplesPerInsert float64 `toml:"samples_per_insert,omitempty"`
	// ErrorBuffer is how far the ratio may stray, in samples
	// (sample_to_insert_ratio only).
	ErrorBuffer float64 `toml:"error_buffer,omitempty"`
}

// Rate limiter kinds: sample's names (package reverb's).
const (
	LimiterMinSize             = reverb.LimiterMinSize
	LimiterSampleToInsertRatio = reverb.LimiterSampleToInsertRatio
	LimiterQueue               = reverb.LimiterQueue
	LimiterStack               = reverb.LimiterStack
)

// Defaults that SetDefaults fills in.
const (
	DefaultGrace     = 10 * time.Second
	DefaultTableName = "replay"
)

// SetDefaults fills the fields left at their zero value with their defaults. It
// does not validate; call Validate after it. Load and Parse call both.
//
// It also writes empty lists and tables as nil, so that a spec reads back equal
// to itself after Marshal whether a document wrote `env = {}` or left it out.
func (s *Spec) SetDefaults() { s.setDefaults(func(string) bool { return false }) }

// setDefaults is SetDefaults that leaves alone the fields whose key given
// reports as written in the document ("launch.np"), so that an explicit zero
// reaches Validate instead of turning into the default.
func (s *Spec) setDefaults(given func(key string) bool) {
	s.normalize()
	unset := func(key string, zero bool) bool { return zero && !given(key) }
	if len(s.Groups) == 0 && unset("launch.np", s.Launch.NP == 0) {
		s.Launch.NP = 1
	}
	if unset("launch.grace", s.Launch.Grace == 0) {
		s.Launch.Grace = Duration(DefaultGrace)
	}
	if unset("gmi.per_gpu", s.GMI.PerGPU == 0) {
		s.GMI.PerGPU = 1
	}
	if s.GMI.Backend == "" {
		s.GMI.Backend = BackendNone
		if s.GMI.PerGPU > 1 {
			s.GMI.Backend = BackendAuto
		}
	}
	if unset("slurm.nodes", s.Slurm.Nodes == 0) {
		s.Slurm.Nodes = 1
	}
	if unset("slurm.cpus_per_task", s.Slurm.CPUsPerTask == 0) {
		s.Slurm.CPUsPerTask = 1
	}
	if t := s.Table; t != nil {
		if t.Name == "" {
			t.Name = DefaultTableName
		}
		rl := &t.RateLimiter
		if rl.Kind == "" {
			rl.Kind = LimiterMinSize
		}
		if unset("table.rate_limiter.min_size_to_sample", rl.MinSizeToSample == 0) {
			rl.MinSizeToSample = 1
		}
		switch rl.Kind {
		case LimiterQueue, LimiterStack:
			want := presetSelector(rl.Kind)
			defaultString(&t.Sampler, want)
			defaultString(&t.Remover, want)
			if unset("table.max_times_sampled", t.MaxTimesSampled == 0) {
				t.MaxTimesSampled = 1
			}
		default:
			defaultString(&t.Sampler, reverb.Uniform)
			defaultString(&t.Remover, reverb.FIFO)
		}
		if t.prioritized() && unset("table.priority_exponent", t.PriorityExponent == 0) {
			t.PriorityExponent = 1
		}
	}
}

func (s *Spec) normalize() {
	nilIfEmpty(&s.Launch.Command)
	nilIfEmptyMap(&s.Launch.Env)
	nilIfEmpty(&s.Groups)
	for i := range s.Groups {
		nilIfEmpty(&s.Groups[i].Command)
		nilIfEmptyMap(&s.Groups[i].Env)
	}
	nilIfEmpty(&s.Slurm.Extra)
	if s.Table != nil {
		nilIfEmpty(&s.Table.Columns)
		for i := range s.Table.Columns {
			nilIfEmpty(&s.Table.Columns[i].Shape)
		}
	}
}

func nilIfEmpty[T any](p *[]T) {
	if len(*p) == 0 {
		*p = nil
	}
}

func nilIfEmptyMap[V any](p *map[string]V) {
	if len(*p) == 0 {
		*p = nil
	}
}

func defaultString(p *string, v string) {
	if *p == "" {
		*p = v
	}
}

// Role is one role of a job resolved from the spec: an SPMD job has one role
// whose Name is "", an MPMD job one per [[group]], in the spec's order. Ranks are
// numbered through the roles: role i holds world ranks FirstRank to
// FirstRank+NP-1.
type Role struct {
	Name      string
	NP        int
	FirstRank int
	Command   []string
	// Env is [launch].env overlaid with the group's env.
	Env         map[string]string
	GPUsPerRank int
}

// Roles resolves the spec's roles. The slices and maps it returns are copies.
func (s *Spec) Roles() []Role {
	if len(s.Groups) == 0 {
		return []Role{{
			NP:          s.Launch.NP,
			Command:     append([]string(nil), s.Launch.Command...),
			Env:         maps.Clone(s.Launch.Env),
			GPUsPerRank: s.Launch.GPUsPerRank,
		}}
	}
	roles := make([]Role, 0, len(s.Groups))
	first := 0
	for _, g := range s.Groups {
		env := maps.Clone(s.Launch.Env)
		if len(g.Env) > 0 {
			if env == nil {
				env = make(map[string]string, len(g.Env))
			}
			maps.Copy(env, g.Env)
		}
		roles = append(roles, Role{
			Name:        g.Role,
			NP:          g.NP,
			FirstRank:   first,
			Command:     append([]string(nil), g.Command...),
			Env:         env,
			GPUsPerRank: g.GPUsPerRank,
		})
		first += max(g.NP, 0)
	}
	return roles
}

// WorldSize is the number of ranks of the job: [launch].np for an SPMD job, the
// sum of the groups' np for an MPMD one.
func (s *Spec) WorldSize() int {
	if len(s.Groups) == 0 {
		return s.Launch.NP
	}
	n := 0
	for _, g := range s.Groups {
		if g.NP > 0 {
			if g.NP > math.MaxInt-n {
				return math.MaxInt // no int holds the sum; Validate refuses it
			}
			n += g.NP
		}
	}
	return n
}

// RoleOf returns the role of world rank r and r's index within it; ok is false
// when r is outside the world.
func (s *Spec) RoleOf(r int) (role Role, roleRank int, ok bool) {
	for _, ro := range s.Roles() {
		if r >= ro.FirstRank && r < ro.FirstRank+ro.NP {
			return ro, r - ro.FirstRank, true
		}
	}
	return Role{}, 0, false
}
