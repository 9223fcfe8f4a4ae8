package launch

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/rank"

	"github.com/google/uuid"
)

// Request is what a caller wants launched: one or more groups of ranks (MPMD:
// `gearrun -np 4 ./actor : -np 1 ./trainer` is two groups), with job-wide settings.
type Request struct {
	Groups []Group
	// JobID names the job; "" means a new UUID.
	JobID string
	// Token is the per-job secret; "" means a new random one.
	Token string
	// RdzvAddr is where the coordinator listens; "" means 127.0.0.1 on a free port.
	RdzvAddr string
	// RdzvTimeout bounds the world's assembly; 0 means rank.DefaultRdzvTimeout.
	RdzvTimeout time.Duration
	// HeartbeatInterval and HeartbeatTimeout are the job's heartbeat
	// (Plan.HeartbeatInterval, Plan.HeartbeatTimeout); 0 means the rank
	// package's defaults.
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// Env is passed to every rank, mpirun's -x convention: "NAME=VALUE", or
	// "NAME" to pass the launcher's own value of NAME (looked up with Lookup).
	Env []string
	// Dir is every rank's working directory; "" means the launcher's.
	Dir string
	// Binder, if set, chooses the device binding of each rank whose group has
	// no Bind request.
	Binder Binder
	// Topology is the machine that groups with a Bind request are placed on
	// (gmi.Discover: NVML or a topology file). Required when a group binds;
	// unused otherwise, so a launch without GPU binding never looks for GPUs.
	Topology *gmi.Topology
	// Lookup resolves "NAME" entries of Env, and the launcher's
	// CUDA_VISIBLE_DEVICES when a group binds GPUs; nil means os.LookupEnv.
	Lookup func(string) (string, bool)
	// IsGoPackage reports whether a program names a Go package directory that Run
	// must build first; nil means: a directory holding .go files.
	IsGoPackage func(program string) bool
	// MaxRestarts is Plan.MaxRestarts; negative is an error.
	MaxRestarts int
	// CheckpointDir is Plan.CheckpointDir.
	CheckpointDir string
	// NoTorchEnv leaves out torchrun's variables (RANK, WORLD_SIZE,
	// MASTER_ADDR, ...; see rank.TorchEnv), which every rank gets otherwise.
	NoTorchEnv bool
}

// Group is one MPMD group: NP ranks running Argv.
type Group struct {
	// Role names the group's ranks (GEAR_ROLE). Groups with the same role form
	// one role, numbered in order. "" means: "" for a job of one group; else the
	// program's base name without extension ("./bin/actor" -> "actor"), or
	// "group<i>" (i the group's index) when several unnamed groups would derive
	// the same name.
	Role string
	NP   int
	// MinNP, if set, makes the job's size elastic (`-np MIN:MAX`, torchrun's
	// --nnodes MIN:MAX): NP is MAX, MinNP is MIN. On this machine the job
	// runs NP ranks; on hosts it runs as many as their slots hold, up to NP,
	// and a generation after a host left runs on the hosts that remain if
	// they hold at least MinNP (see Plan.MinSize). Only for a job of one
	// group, without GPU binding. 0: the size is NP, fixed.
	MinNP int
	Argv  []string
	// Env is passed to this group's ranks only, after Request.Env.
	Env []string
	// Bind, if set, binds the group's ranks to GPUs as gmi.NewPlan places
	// them on Request.Topology: one rank per GPU, K MPS shares or MIG
	// instances per GPU (Bind.GMIPerGPU), or several whole GPUs per rank
	// (Bind.GPUsPerRank). Bind.Ranks and Bind.FirstRank are the group's;
	// Bind.GPUs nil takes the next GPUs no earlier group took. Groups that
	// bind occupy distinct GPUs, in group order. When the launcher's
	// CUDA_VISIBLE_DEVICES (looked up with Request.Lookup) is set, only the
	// GPUs it names are used. See BindGPUs.
	Bind *gmi.PlanRequest
}

// Device is a rank's device binding, exported as CUDA_VISIBLE_DEVICES,
// CUDA_DEVICE_ORDER, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and GEAR_GMI_LAYOUT. Empty fields are not
// set; a rank bound through its group's Bind request (Backend set) inherits
// none of these from the launcher, other ranks inherit the launcher's values.
type Device struct {
	// VisibleDevices is a GPU index ("0"), GPU indices ("0,1") or a MIG UUID
	// ("MIG-...").
	VisibleDevices string `json:"cuda_visible_devices,omitempty"`
	// DeviceOrder is "PCI_BUS_ID" when GPUs are bound by index, so that CUDA
	// numbers them as NVML does.
	DeviceOrder string `json:"cuda_device_order,omitempty"`
	// MPSThreadPercent is the rank's share of the GPU's SMs under MPS (1-100).
	MPSThreadPercent int `json:"mps_active_thread_percentage,omitempty"`
	// MPSPinnedMemLimit is the MPS pinned device memory limit ("0=4G").
	MPSPinnedMemLimit string `json:"mps_pinned_device_mem_limit,omitempty"`
	// GMILayout is the group's mapping list in world ranks ("[[0,1],[2,3]]"),
	// for the collective's choice of reduction strategy.
	GMILayout string `json:"gmi_layout,omitempty"`

	// Backend is how the rank holds its GPU: "none" (whole GPUs), "mps" or
	// "mig"; "" when the binding came from a Binder. GPU (the first GPU's
	// index), GMI (the rank's slot on it) and MIGProfile describe the
	// binding when Backend is set.
	Backend    string `json:"backend,omitempty"`
	GPU        int    `json:"gpu,omitempty"`
	GMI        int    `json:"gmi,omitempty"`
	MIGProfile string `json:"mig_profile,omitempty"`
}

// Binder chooses a rank's device binding. Package gmi provides one; tests and job
// specs may use BinderFunc.
type Binder interface {
	Bind(r RankSpec) (Device, error)
}

// BinderFunc adapts a function to Binder.
type BinderFunc func(r RankSpec) (Device, error)

// Bind calls f.
func (f BinderFunc) Bind(r RankSpec) (Device, error) { return f(r) }

// Plan is a launch plan: plain data, printed by --dry-run, run by Run.
type Plan struct {
	JobID       string   `json:"job_id"`
	Token       string   `json:"token"`
	RdzvAddr    string   `json:"rdzv_addr"`
	RdzvTimeout Duration `json:"rdzv_timeout"`
	// HeartbeatInterval is how often the coordinator pings each rank, and
	// HeartbeatTimeout how long either side waits for a word from the other
	// before it takes it for gone (GEAR_HEARTBEAT_INTERVAL,
	// GEAR_HEARTBEAT_TIMEOUT); a silent rank is lost within
	// rank.DetectionTime of the two. 0: rank.DefaultHeartbeat and
	// rank.DefaultHeartbeatTimeout.
	HeartbeatInterval Duration `json:"heartbeat_interval,omitempty"`
	HeartbeatTimeout  Duration `json:"heartbeat_timeout,omitempty"`
	NumNodes          int      `json:"num_nodes"`
	// Hosts names the job's hosts in node order when its ranks run on other
	// hosts (PlaceOnHosts); empty for a job on this machine.
	Hosts []string `json:"hosts,omitempty"`
	// HostSlots are every host the job was given and its slots, those
	// without a rank included: where a later generation may run
	// (Survivors).
	HostSlots []Host `json:"host_slots,omitempty"`
	// MinSize and MaxSize bound the size of an elastic job (Group.MinNP):
	// every generation runs between MinSize and MaxSize ranks. 0: the size
	// is fixed, len(Ranks).
	MinSize int `json:"min_size,omitempty"`
	MaxSize int `json:"max_size,omitempty"`
	// TorchEnv gives every rank torchrun's variables (rank.TorchEnv), with
	// MASTER_ADDR and MASTER_PORT naming where rank 0 serves torch's TCPStore.
	// MasterPort 0 means: a free port that Run reserves on MasterAddr.
	TorchEnv   bool   `json:"torch_env"`
	MasterAddr string `json:"master_addr,omitempty"`
	MasterPort int    `json:"master_port,omitempty"`
	Dir        string `json:"dir,omitempty"`
	// Env holds the additions every rank gets (after the contract variables).
	Env []string `json:"env,omitempty"`
	// MaxRestarts is how many times Run starts the world again after a rank
	// failed (torchrun's --max-restarts): each new world is a new generation
	// of the same job, told to its ranks as GEAR_RESTART_COUNT. 0: none.
	MaxRestarts int `json:"max_restarts,omitempty"`
	// CheckpointDir is the job's checkpoint directory (GEAR_CHECKPOINT_DIR),
	// the same for every generation; Run creates it and never removes it.
	// "": the ranks get none.
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
	// Restart is the generation the plan describes: 0 for the job's first
	// world, n after n restarts. Run sets it as it starts each world.
	Restart int        `json:"restart,omitempty"`
	Roles   []RoleSpec `json:"roles"`
	// GPUPlans has one entry per group with a Bind request.
	GPUPlans []GPUPlan  `json:"gpu_plans,omitempty"`
	Ranks    []RankSpec `json:"ranks"`
}

// RoleSpec is one role of the plan and its ranks.
type RoleSpec struct {
	Name  string `json:"name"`
	Ranks []int  `json:"ranks"`
}

// RankSpec is one rank of the plan.
type RankSpec struct {
	Rank      int    `json:"rank"`
	LocalRank int    `json:"local_rank"`
	LocalSize int    `json:"local_size"`
	Node      int    `json:"node"`
	Role      string `json:"role"`
	RoleRank  int    `json:"role_rank"`
	// Group is the index of the MPMD group the rank comes from.
	Group int      `json:"group"`
	Argv  []string `json:"argv"`
	// GoPackage: Argv[0] is a Go package directory; Run builds it once and runs
	// the binary.
	GoPackage bool `json:"go_package,omitempty"`
	// Env holds the group's additions (after the plan's).
	Env    []string `json:"env,omitempty"`
	Device Device   `json:"device"`
	// Host is the rank's host as -H or a hostfile names it ("" on this
	// machine); the rank gets it as GEAR_NODE_NAME.
	Host string `json:"host,omitempty"`
}

// Duration is a time.Duration that reads and writes as text ("60s") in JSON.
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("launch: duration %s: %w", b, err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("launch: duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// Size is the number of ranks.
func (p *Plan) Size() int { return len(p.Ranks) }

// NewPlan builds the plan for req. It is a pure function of req (JobID and Token
// aside, which it generates when req leaves them empty, the file-system check
// that tells a Go package from a program, and the launcher's
// CUDA_VISIBLE_DEVICES when a group binds GPUs). The error names the group and
// field; a GPU binding that does not fit the machine is a *BindError.
func NewPlan(req Request) (*Plan, error) {
	if len(req.Groups) == 0 {
		return nil, fmt.Errorf("launch: no program to launch")
	}
	p := &Plan{
		JobID:       req.JobID,
		Token:       req.Token,
		RdzvAddr:    req.RdzvAddr,
		RdzvTimeout: Duration(req.RdzvTimeout),
		NumNodes:    1,
		Dir:         req.Dir,
	}
	if p.JobID == "" {
		p.JobID = uuid.NewString()
	}
	if err := rank.CheckJobID(p.JobID); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	if p.Token == "" {
		p.Token = rank.NewToken()
	}
	if p.RdzvAddr == "" {
		p.RdzvAddr = "127.0.0.1:0"
	}
	if req.MaxRestarts < 0 {
		return nil, fmt.Errorf("launch: max restarts %d: must not be negative (0 means none)", req.MaxRestarts)
	}
	p.MaxRestarts = req.MaxRestarts
	p.CheckpointDir = req.CheckpointDir
	if req.RdzvTimeout < 0 {
		return nil, fmt.Errorf("launch: rendezvous timeout %v: must not be negative (0 means the default, %v)", req.RdzvTimeout, rank.DefaultRdzvTimeout)
	}
	if p.RdzvTimeout == 0 {
		p.RdzvTimeout = Duration(rank.DefaultRdzvTimeout)
	}
	if err := rank.CheckHeartbeat(req.HeartbeatInterval, req.HeartbeatTimeout); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	p.HeartbeatInterval, p.HeartbeatTimeout = Duration(req.HeartbeatInterval), Duration(req.HeartbeatTimeout)
	if !req.NoTorchEnv {
		p.TorchEnv = true
		p.MasterAddr = masterHost(p.RdzvAddr)
	}
	lookup := req.Lookup
	if lookup == nil {
		lookup = os.LookupEnv
	}
	isGo := req.IsGoPackage
	if isGo == nil {
		isGo = IsGoPackageDir
	}
	var err error
	if p.Env, err = resolveEnv("launch: env", req.Env, lookup); err != nil {
		return nil, err
	}
	roles := groupRoles(req.Groups)
	size := 0
	for i, g := range req.Groups {
		if g.NP < 1 {
			return nil, fmt.Errorf("launch: group %d: -np %d: want at least 1", i, g.NP)
		}
		if len(g.Argv) == 0 || g.Argv[0] == "" {
			return nil, fmt.Errorf("launch: group %d: no program", i)
		}
		if strings.ContainsAny(roles[i], "=\n\x00") {
			return nil, fmt.Errorf("launch: group %d: role %q: must not contain '=', newline or NUL", i, roles[i])
		}
		if g.NP > rank.MaxWorldSize-size {
			return nil, tooManyRanks(req.Groups, i)
		}
		size += g.NP
		if g.MinNP != 0 {
			if g.MinNP < 1 || g.MinNP > g.NP {
				return nil, fmt.Errorf("launch: group %d: -np %d:%d: want 1 <= MIN <= MAX", i, g.MinNP, g.NP)
			}
			if len(req.Groups) > 1 {
				return nil, fmt.Errorf("launch: group %d: -np %d:%d: an elastic size is for a job of one group", i, g.MinNP, g.NP)
			}
			if g.Bind != nil {
				return nil, fmt.Errorf("launch: group %d: -np %d:%d: an elastic size cannot be combined with GPU binding", i, g.MinNP, g.NP)
			}
			p.MinSize, p.MaxSize = g.MinNP, g.NP
		}
	}
	roleIndex := map[string]int{}
	for i, g := range req.Groups {
		env, err := resolveEnv(fmt.Sprintf("launch: group %d: env", i), g.Env, lookup)
		if err != nil {
			return nil, err
		}
		goPkg := isGo(g.Argv[0])
		ri, ok := roleIndex[roles[i]]
		if !ok {
			ri = len(p.Roles)
			roleIndex[roles[i]] = ri
			p.Roles = append(p.Roles, RoleSpec{Name: roles[i]})
		}
		for range g.NP {
			r := len(p.Ranks)
			spec := RankSpec{
				Rank:      r,
				LocalRank: r,
				LocalSize: size,
				Role:      roles[i],
				RoleRank:  len(p.Roles[ri].Ranks),
				Group:     i,
				Argv:      append([]string(nil), g.Argv...),
				GoPackage: goPkg,
				Env:       env,
			}
			p.Roles[ri].Ranks = append(p.Roles[ri].Ranks, r)
			p.Ranks = append(p.Ranks, spec)
		}
	}
	if err := bindGroups(req, p, lookup); err != nil {
		return nil, err
	}
	if req.Binder != nil {
		for i := range p.Ranks {
			if req.Groups[p.Ranks[i].Group].Bind != nil {
				continue
			}
			d, err := req.Binder.Bind(p.Ranks[i])
			if err != nil {
				return nil, fmt.Errorf("launch: rank %d: device binding: %w", i, err)
			}
			p.Ranks[i].Device = d
		}
	}
	return p, nil
}

// tooManyRanks is the error for a job whose groups 0 to last add up to more than
// rank.MaxWorldSize ranks.
func tooManyRanks(groups []Group, last int) error {
	if last == 0 {
		return fmt.Errorf("launch: -np %d: a job has at most %d ranks (rank.MaxWorldSize); split the work into several jobs", groups[0].NP, rank.MaxWorldSize)
	}
	nps := make([]string, last+1)
	for i := range nps {
		nps[i] = strconv.Itoa(groups[i].NP)
	}
	return fmt.Errorf("launch: group %d: -np %d: the groups' ranks (%s) add up to more than the %d a job may have (rank.MaxWorldSize); split the work into several jobs",
		last, groups[last].NP, strings.Join(nps, " + "), rank.MaxWorldSize)
}

// groupRoles names each group's role (see Group.Role).
func groupRoles(groups []Group) []string {
	names := make([]string, len(groups))
	if len(groups) == 1 {
		names[0] = groups[0].Role
		return names
	}
	derived := map[string]int{} // how many unnamed groups derive each name
	for i, g := range groups {
		names[i] = g.Role
		if names[i] == "" {
			base := filepath.Base(g.Argv0())
			names[i] = strings.TrimSuffix(base, filepath.Ext(base))
			derived[names[i]]++
		}
	}
	for i, g := range groups {
		if g.Role == "" && (derived[names[i]] > 1 || names[i] == "." || names[i] == "/" || names[i] == "") {
			names[i] = "group" + strconv.Itoa(i)
		}
	}
	return names
}

// Argv0 is the group's program, or "".
func (g Group) Argv0() string {
	if len(g.Argv) == 0 {
		return ""
	}
	return g.Argv[0]
}

func resolveEnv(what string, env []string, lookup func(string) (string, bool)) ([]string, error) {
	var out []string
	for _, kv := range env {
		name, _, hasValue := strings.Cut(kv, "=")
		if name == "" || strings.ContainsAny(name, " \t\n\x00") {
			return nil, fmt.Errorf("%s %q: want NAME=VALUE or NAME", what, kv)
		}
		if !hasValue {
			v, ok := lookup(name)
			if !ok {
				continue // like mpirun: -x of an unset variable passes nothing
			}
			kv = name + "=" + v
		}
		out = append(out, kv)
	}
	return out, nil
}

// masterHost is rank 0's host for torch's TCPStore: the coordinator's host
// when the coordinator listens on one address, else loopback, since every rank
// of a local launch runs on this host.
func masterHost(rdzvAddr string) string {
	host, _, err := net.SplitHostPort(rdzvAddr)
	if err != nil || host == "" {
		return "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return "127.0.0.1"
	}
	return host
}

// IsGoPackageDir reports whether path is a directory holding .go files.
func IsGoPackageDir(path string) bool {
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		return false
	}
	m, _ := filepath.Glob(filepath.Join(path, "*.go"))
	return len(m) > 0
}

// Environ returns the variables that rank r gets on top of the launcher's
// environment: the contract (rankInfo's rank.Info.Environ), GEAR_NODE_NAME on
// a host, torchrun's variables (when TorchEnv), the device binding, then the
// plan's and the group's additions, which win over torchrun's. rdzvAddr is
// the coordinator's actual address.
func (p *Plan) Environ(r int, rdzvAddr string) []string {
	s := &p.Ranks[r]
	env := make([]string, 0, 32+len(p.Env)+len(s.Env))
	env = append(env, p.rankInfo(r, rdzvAddr).Environ()...)
	if s.Host != "" {
		env = append(env, rank.EnvNodeName+"="+s.Host)
	}
	if p.TorchEnv {
		env = append(env, p.torchEnv(r).Environ()...)
	}
	env = append(env, s.Device.Environ()...)
	env = append(env, p.Env...)
	return append(env, s.Env...)
}

// rankInfo is rank r's place in the world, as Environ tells it to the rank
// (rank.FromEnv reads it back). rdzvAddr is the coordinator's actual address.
func (p *Plan) rankInfo(r int, rdzvAddr string) rank.Info {
	s := &p.Ranks[r]
	return rank.Info{
		Rank: s.Rank, Size: len(p.Ranks),
		LocalRank: s.LocalRank, LocalSize: s.LocalSize,
		NodeRank: s.Node, NumNodes: p.NumNodes,
		Role: s.Role, RoleRank: s.RoleRank,
		RdzvAddr: rdzvAddr, RdzvTimeout: time.Duration(p.RdzvTimeout),
		JobID: p.JobID, Token: p.Token,
		Restart: p.Restart, CheckpointDir: p.CheckpointDir,
		HeartbeatInterval: time.Duration(p.HeartbeatInterval), HeartbeatTimeout: time.Duration(p.HeartbeatTimeout),
		Source: rank.SourceGear,
	}
}

// torchEnv is rank r's place in torchrun's terms.
func (p *Plan) torchEnv(r int) rank.TorchEnv {
	s := &p.Ranks[r]
	roleSize := 0
	for _, ro := range p.Roles {
		if ro.Name == s.Role {
			roleSize = len(ro.Ranks)
		}
	}
	return rank.TorchEnv{
		Rank: s.Rank, WorldSize: len(p.Ranks),
		LocalRank: s.LocalRank, LocalWorldSize: s.LocalSize,
		GroupRank: s.Node, GroupWorldSize: p.NumNodes,
		RoleName: s.Role, RoleRank: s.RoleRank, RoleWorldSize: roleSize,
		MasterAddr: p.MasterAddr, MasterPort: p.MasterPort,
		RestartCount: p.Restart, MaxRestarts: p.MaxRestarts,
		RunID: p.JobID,
	}
}

// inheritDefaults lists what rank r gets only where the launcher's
// environment and the plan give no value (OMP_NUM_THREADS under the torch
// contract).
func (p *Plan) inheritDefaults(r int) []string {
	if !p.TorchEnv {
		return nil
	}
	return rank.TorchEnv{LocalWorldSize: p.Ranks[r].LocalSize}.Defaults()
}

// Environ returns the binding's variables as "NAME=value" entries, only
// those with a value.
func (d Device) Environ() []string {
	var env []string
	add := func(k, v string) {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	add(rank.EnvCUDAVisibleDevices, d.VisibleDevices)
	add(rank.EnvCUDADeviceOrder, d.DeviceOrder)
	if d.MPSThreadPercent > 0 {
		add(rank.EnvMPSThreadPercent, strconv.Itoa(d.MPSThreadPercent))
	}
	add(rank.EnvMPSPinnedMemLimit, d.MPSPinnedMemLimit)
	add(rank.EnvGMILayout, d.GMILayout)
	return env
}

// Masked returns a copy of p whose token reads "****", for printing.
func (p *Plan) Masked() *Plan {
	q := *p
	if q.Token != "" {
		q.Token = maskedToken
	}
	return &q
}

const maskedToken = "****"

// copy returns a copy of p that Run may fill in without touching the caller's.
func (p *Plan) copy() *Plan {
	q := *p
	return &q
}
