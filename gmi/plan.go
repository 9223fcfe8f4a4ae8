package gmi

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Backend is how the ranks on one GPU share it.
type Backend string

const (
	// BackendAuto lets NewPlan choose by GMI-DRL's rules.
	BackendAuto Backend = "auto"
	// BackendNone: one rank owns a whole GPU (--bind gpu).
	BackendNone Backend = "none"
	// BackendMPS: ranks are MPS clients, each limited to 100/K percent of the
	// GPU's SMs. MPS clients can communicate through the GPU.
	BackendMPS Backend = "mps"
	// BackendMIG: each rank binds to one MIG instance, isolated in hardware.
	BackendMIG Backend = "mig"
)

// ParseBackend reads "auto", "none", "mps" or "mig".
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(s); b {
	case BackendAuto, BackendNone, BackendMPS, BackendMIG:
		return b, nil
	}
	return "", fmt.Errorf("gmi: backend %q: want auto, mps, mig or none", s)
}

// Workload is what the GMIs do, which decides the backend under auto.
type Workload string

const (
	// Training: GMIs reduce gradients with each other, so they must
	// communicate, and MPS is chosen.
	Training Workload = "training"
	// Serving: GMIs run independently and isolation pays, so MIG is chosen
	// where MIG mode is already on.
	Serving Workload = "serving"
)

// ParseWorkload reads "training" or "serving".
func ParseWorkload(s string) (Workload, error) {
	switch w := Workload(s); w {
	case Training, Serving:
		return w, nil
	}
	return "", fmt.Errorf("gmi: workload %q: want training or serving", s)
}

// PlanRequest is what a job asks for.
type PlanRequest struct {
	// Ranks is the number of ranks (-np N), at least 1.
	Ranks int `json:"ranks"`
	// FirstRank is the first rank's ID: the plan places ranks FirstRank to
	// FirstRank+Ranks-1, and its mapping lists these IDs. An MPMD group is
	// planned at its world ranks this way; 0 for a job of one group.
	FirstRank int `json:"first_rank,omitempty"`
	// GPUsPerRank G > 1 gives each rank G whole GPUs (CUDA_VISIBLE_DEVICES
	// lists them); it needs one GMI per GPU and backend none or auto. 0 or 1:
	// each rank gets one GPU or a GMI of one.
	GPUsPerRank int `json:"gpus_per_rank,omitempty"`
	// GMIPerGPU is K, the ranks per GPU; 0 means 1 (one rank per GPU).
	GMIPerGPU int `json:"gmi_per_gpu"`
	// Backend is auto (the zero value means auto), mps, mig or none.
	Backend Backend `json:"backend"`
	// Workload is training (the zero value means training) or serving.
	Workload Workload `json:"workload"`
	// GPUs restricts the plan to these GPU indices, used in this order. Nil
	// means every GPU of the topology in index order.
	GPUs []int `json:"gpus,omitempty"`
	// MPSMemLimitMiB caps each MPS rank's pinned device memory
	// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); 0 sets no limit.
	MPSMemLimitMiB uint64 `json:"mps_mem_limit_mib,omitempty"`
	// MPSMemLimitEven caps each MPS rank at 1/K of its GPU's memory; it
	// overrides MPSMemLimitMiB.
	MPSMemLimitEven bool `json:"mps_mem_limit_even,omitempty"`
}

// GPUsNeeded is the number of GPUs the request occupies: Ranks x GPUsPerRank
// with several GPUs per rank, else Ranks / GMIPerGPU rounded up.
func (r PlanRequest) GPUsNeeded() int {
	if r.GPUsPerRank > 1 {
		return r.Ranks * r.GPUsPerRank
	}
	k := max(r.GMIPerGPU, 1)
	return (r.Ranks + k - 1) / k
}

// MaxGMIPerGPU bounds K: an MPS share is 100/K percent of the SMs, at least 1.
const MaxGMIPerGPU = 100

// Validate checks the request on its own, without a topology.
func (r PlanRequest) Validate() error {
	if r.Ranks < 1 {
		return fmt.Errorf("gmi: plan: ranks %d: want at least 1", r.Ranks)
	}
	if r.FirstRank < 0 {
		return fmt.Errorf("gmi: plan: first rank %d: want at least 0", r.FirstRank)
	}
	if r.GMIPerGPU < 0 || r.GMIPerGPU > MaxGMIPerGPU {
		return fmt.Errorf("gmi: plan: gmi-per-gpu %d: want 1 to %d", r.GMIPerGPU, MaxGMIPerGPU)
	}
	if r.GPUsPerRank < 0 {
		return fmt.Errorf("gmi: plan: gpus-per-rank %d: want at least 1", r.GPUsPerRank)
	}
	if r.GPUsPerRank > 1 {
		if r.GMIPerGPU > 1 {
			return fmt.Errorf("gmi: plan: gpus-per-rank %d with gmi-per-gpu %d: a rank that shares a GPU cannot span several", r.GPUsPerRank, r.GMIPerGPU)
		}
		if r.Backend == BackendMPS || r.Backend == BackendMIG {
			return fmt.Errorf("gmi: plan: gpus-per-rank %d: a rank with several GPUs owns them whole; backend %s needs one GPU per rank", r.GPUsPerRank, r.Backend)
		}
	}
	if r.Backend != "" {
		if _, err := ParseBackend(string(r.Backend)); err != nil {
			return err
		}
	}
	if r.Workload != "" {
		if _, err := ParseWorkload(string(r.Workload)); err != nil {
			return err
		}
	}
	if r.Backend == BackendNone && r.GMIPerGPU > 1 {
		return fmt.Errorf("gmi: plan: backend none gives each rank a whole GPU: gmi-per-gpu %d needs mps, mig or auto", r.GMIPerGPU)
	}
	seen := map[int]bool{}
	for _, g := range r.GPUs {
		if seen[g] {
			return fmt.Errorf("gmi: plan: GPU %d listed twice", g)
		}
		seen[g] = true
	}
	return nil
}

// Plan places a job's ranks on GPUs and GMIs. It is data: the launcher sets
// each rank's Binding.Env, and the collective reads the mapping (from
// GEAR_GMI_LAYOUT) and runs Schedule.
type Plan struct {
	Ranks     int      `json:"ranks"`
	GMIPerGPU int      `json:"gmi_per_gpu"`
	Backend   Backend  `json:"backend"`
	Workload  Workload `json:"workload"`
	// Why says why the backend was chosen.
	Why string `json:"why"`
	// GPUs gives the GPU index of each mapping row. With GPUsPerRank G > 1 a
	// row is one rank on G GPUs, and GPUs holds G entries per row.
	GPUs []int `json:"gpus"`
	// GPUsPerRank is the request's GPUsPerRank when above 1.
	GPUsPerRank int `json:"gpus_per_rank,omitempty"`
	// Mapping is the GMI-to-GPU mapping list; GMI IDs are ranks.
	Mapping Mapping `json:"mapping"`
	// Strategy is Algorithm 1's choice for Mapping; StrategyWhy says which
	// of its rules decided.
	Strategy    Strategy `json:"strategy"`
	StrategyWhy string   `json:"strategy_why"`
	// Schedule is Strategy's reduction schedule on Mapping.
	Schedule Schedule `json:"schedule"`
	// Bindings has one entry per rank, in rank order.
	Bindings []Binding `json:"bindings"`
	// Warnings are things that work but may not be what was meant.
	Warnings []string `json:"warnings,omitempty"`
}

// Binding is one rank's device binding.
type Binding struct {
	Rank int `json:"rank"`
	// GPU is the GPU index; Slot is the rank's GMI index on that GPU.
	GPU  int `json:"gpu"`
	Slot int `json:"slot"`
	// GPUs lists the rank's GPUs when it has several (GPUsPerRank > 1); GPU
	// is the first of them.
	GPUs []int `json:"gpus,omitempty"`
	// MIG is the MIG instance the rank binds to (backend mig).
	MIG *MIGInstance `json:"mig,omitempty"`
	// ThreadPercent is the MPS share, 100/K (backend mps).
	ThreadPercent int `json:"thread_percent,omitempty"`
	// Env is what the launcher adds to the rank's environment:
	// CUDA_VISIBLE_DEVICES (GPU index or MIG UUID), CUDA_DEVICE_ORDER with a
	// GPU index, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
	// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for MPS, and GEAR_GMI_LAYOUT.
	Env map[string]string `json:"env"`
}

// Environ returns Env as sorted "KEY=value" strings, for exec.Cmd.Env.
func (b Binding) Environ() []string {
	out := make([]string, 0, len(b.Env))
	for _, k := range slices.Sorted(maps.Keys(b.Env)) {
		out = append(out, k+"="+b.Env[k])
	}
	return out
}

// NewPlan places req.Ranks ranks on the topology's GPUs, K = req.GMIPerGPU
// per GPU in blocks (ranks 0..K-1 on the first GPU, and so on; the last GPU
// may hold fewer), chooses the backend, and the reduction strategy by
// Algorithm 1. Rank IDs start at req.FirstRank. With req.GPUsPerRank G > 1
// each rank takes the next G GPUs whole instead, and the mapping has one row
// per rank.
//
// The backend follows GMI-DRL's rules. Below sm_70 there is no GMI backend,
// so K must be 1. On sm_70 to sm_79 only MPS exists. On sm_80 and later, auto
// picks MPS when MIG mode is off, and MIG when it is on (a GPU in MIG mode is
// usable only through its instances); gear never changes MIG mode, so a
// serving workload that would prefer MIG gets MPS and a warning when MIG mode
// is off. With K = 1 on a GPU without MIG mode, auto gives the rank the whole
// GPU (backend none). All GPUs of a plan share one backend.
//
// Errors say what does not fit: too few GPUs, more ranks on a GPU than it has
// MIG instances, MIG asked of a GPU without MIG mode or below sm_80, MPS asked
// of a GPU in MIG mode or below sm_70.
func NewPlan(t *Topology, req PlanRequest) (*Plan, error) {
	if t == nil {
		return nil, errors.New("gmi: plan: no topology")
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.GMIPerGPU == 0 {
		req.GMIPerGPU = 1
	}
	if req.Backend == "" {
		req.Backend = BackendAuto
	}
	if req.Workload == "" {
		req.Workload = Training
	}
	k := req.GMIPerGPU
	cands := t.GPUs
	if req.GPUs != nil {
		cands = nil
		for _, idx := range req.GPUs {
			g, ok := t.GPU(idx)
			if !ok {
				return nil, fmt.Errorf("gmi: plan: GPU %d: not in the topology (%s)", idx, t.DescribeGPUs())
			}
			cands = append(cands, g)
		}
	}
	multi := req.GPUsPerRank > 1
	if multi && req.Backend == BackendAuto {
		req.Backend = BackendNone // whole GPUs: no GMIs, and no MIG instance spans GPUs
	}
	need := req.GPUsNeeded()
	if need > len(cands) {
		have := t.DescribeGPUs()
		if req.GPUs != nil {
			have = fmt.Sprintf("%d selected (%v)", len(cands), req.GPUs)
		}
		if multi {
			return nil, fmt.Errorf("gmi: plan: %d ranks at %d GPUs per rank need %d GPUs; %s", req.Ranks, req.GPUsPerRank, need, have)
		}
		return nil, fmt.Errorf("gmi: plan: %d ranks at %d per GPU need %d GPUs; %s", req.Ranks, k, need, have)
	}
	used := cands[:need]
	p := &Plan{
		Ranks: req.Ranks, GMIPerGPU: k, Workload: req.Workload,
		Mapping: offsetMapping(BlockMapping(req.Ranks, k), req.FirstRank),
	}
	if multi {
		p.GPUsPerRank = req.GPUsPerRank
	}
	var why []string
	for gi, g := range used {
		b, reason, err := chooseBackend(t, g, k, req)
		if err != nil {
			return nil, err
		}
		if gi == 0 {
			p.Backend = b
		} else if b != p.Backend {
			return nil, fmt.Errorf("gmi: plan: %s needs backend %s but %s needs %s; pick GPUs of one kind with the GPU list",
				used[0].describe(), p.Backend, g.describe(), b)
		}
		if !slices.Contains(why, reason) {
			why = append(why, reason)
		}
		p.GPUs = append(p.GPUs, g.Index)
	}
	p.Why = strings.Join(why, "; ")
	p.Strategy, p.StrategyWhy = chooseStrategy(p.Mapping)
	sc, err := ReductionSchedule(p.Mapping, p.Strategy)
	if err != nil {
		return nil, err
	}
	p.Schedule = sc

	if p.Backend == BackendMIG {
		// MIG instances share no memory and have no peer-to-peer path, not
		// even across GPUs: every group goes through the host.
		for i := range p.Schedule.Steps {
			for j := range p.Schedule.Steps[i].Groups {
				p.Schedule.Steps[i].Groups[j].Link = LinkHost
			}
		}
		for gi, g := range used {
			if n := len(p.Mapping[gi]); n > len(g.MIG) {
				return nil, fmt.Errorf("gmi: plan: %s has %d MIG instances (%s) but the plan puts %d ranks on it",
					g.describe(), len(g.MIG), profileList(g.MIG), n)
			}
			if mine := g.MIG[:len(p.Mapping[gi])]; hasMixedProfiles(mine) {
				p.Warnings = append(p.Warnings, fmt.Sprintf("GPU %d: ranks get unequal MIG instances (%s)", g.Index, profileList(mine)))
			}
		}
		if req.Workload == Training {
			p.Warnings = append(p.Warnings, "MIG instances share no GPU memory and have no peer-to-peer path: every reduction step goes through the host (MPS lets GMIs communicate)")
		}
	}
	if p.Backend == BackendMPS && !t.MPS.Running {
		p.Warnings = append(p.Warnings, "no MPS control daemon is reachable: start one (nvidia-cuda-mps-control -d) or the ranks time-share each GPU and the thread percentage has no effect")
	}

	layout := p.Mapping.String()
	for i := 0; i < req.Ranks; i++ {
		r := req.FirstRank + i
		gi, slot, _ := p.Mapping.Locate(r)
		g := used[gi]
		b := Binding{Rank: r, GPU: g.Index, Slot: slot, Env: map[string]string{EnvGMILayout: layout}}
		if multi {
			mine := used[i*req.GPUsPerRank : (i+1)*req.GPUsPerRank]
			b.GPU = mine[0].Index
			ids := make([]string, len(mine))
			for j, m := range mine {
				b.GPUs = append(b.GPUs, m.Index)
				ids[j] = strconv.Itoa(m.Index)
			}
			b.Env[EnvCUDAVisibleDevices] = strings.Join(ids, ",")
			b.Env[EnvCUDADeviceOrder] = "PCI_BUS_ID"
			p.Bindings = append(p.Bindings, b)
			continue
		}
		switch p.Backend {
		case BackendMIG:
			m := g.MIG[slot]
			dev, err := g.visibleDevice(m)
			if err != nil {
				return nil, err
			}
			b.MIG = &m
			b.Env[EnvCUDAVisibleDevices] = dev
		case BackendMPS:
			b.ThreadPercent = 100 / k
			b.Env[EnvCUDAVisibleDevices] = strconv.Itoa(g.Index)
			b.Env[EnvCUDADeviceOrder] = "PCI_BUS_ID"
			b.Env[EnvMPSThreadPercent] = strconv.Itoa(b.ThreadPercent)
			limit := req.MPSMemLimitMiB
			if req.MPSMemLimitEven {
				limit = (g.MemoryBytes >> 20) / uint64(k)
			}
			if limit > 0 {
				// Device ordinal 0: the rank sees only its own GPU.
				b.Env[EnvMPSPinnedMemLimit] = fmt.Sprintf("0=%dM", limit)
			}
		default:
			b.Env[EnvCUDAVisibleDevices] = strconv.Itoa(g.Index)
			b.Env[EnvCUDADeviceOrder] = "PCI_BUS_ID"
		}
		p.Bindings = append(p.Bindings, b)
	}
	return p, nil
}

// offsetMapping adds first to every ID of m.
func offsetMapping(m Mapping, first int) Mapping {
	for _, row := range m {
		for s := range row {
			row[s] += first
		}
	}
	return m
}

// chooseBackend applies GMI-DRL's backend rules to one GPU.
func chooseBackend(t *Topology, g GPU, k int, req PlanRequest) (Backend, string, error) {
	sm := g.Compute.SM()
	migOn := "MIG mode is on, and gear never changes it: the GPU is usable only through its MIG instances"
	switch req.Backend {
	case BackendNone:
		if g.MIGMode {
			return "", "", fmt.Errorf("gmi: plan: %s has MIG mode on: a rank cannot own the whole GPU; use backend mig or auto", g.describe())
		}
		return BackendNone, "one rank per GPU", nil
	case BackendMPS:
		if sm < 70 {
			return "", "", fmt.Errorf("gmi: plan: %s: MPS GMIs need sm_70 or later", g.describe())
		}
		if g.MIGMode {
			return "", "", fmt.Errorf("gmi: plan: %s has MIG mode on: MPS over the whole GPU is not possible; use backend mig (gear never changes MIG mode)", g.describe())
		}
		return BackendMPS, "MPS asked", nil
	case BackendMIG:
		if sm < 80 {
			return "", "", fmt.Errorf("gmi: plan: %s: MIG needs sm_80 or later", g.describe())
		}
		if !g.MIGMode {
			return "", "", fmt.Errorf("gmi: plan: %s: MIG asked but MIG mode is off (gear never changes it; an administrator turns it on with nvidia-smi -i %d -mig 1)", g.describe(), g.Index)
		}
		return BackendMIG, "MIG asked", nil
	}
	// auto
	if g.MIGMode {
		return BackendMIG, migOn, nil
	}
	if k == 1 {
		return BackendNone, "one rank per GPU", nil
	}
	switch {
	case sm < 70:
		return "", "", fmt.Errorf("gmi: plan: %s: below sm_70 there is no GMI backend; use 1 GMI per GPU", g.describe())
	case sm < 80:
		return BackendMPS, "sm_70 to sm_79: MPS is the only GMI backend", nil
	case req.Workload == Serving:
		return BackendMPS, "serving prefers MIG for isolation, but MIG mode is off (gear never changes it)", nil
	default:
		return BackendMPS, "training: GMIs must communicate, which MPS allows and MIG does not", nil
	}
}

func profileList(ms []MIGInstance) string {
	if len(ms) == 0 {
		return "none"
	}
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Profile
	}
	return strings.Join(names, ", ")
}

func hasMixedProfiles(ms []MIGInstance) bool {
	for _, m := range ms {
		if m.Profile != ms[0].Profile {
			return true
		}
	}
	return false
}

// DescribeGPUs says how many GPUs the topology has and where it came from,
// for error messages: "the topology file t.toml has 2", "this machine has 8",
// "no GPUs (NVML: ...); a topology file (GEAR_TOPOLOGY) can describe them".
func (t *Topology) DescribeGPUs() string {
	switch t.Source {
	case SourceNone:
		if t.Reason != "" {
			return "no GPUs (" + t.Reason + "); a topology file (GEAR_TOPOLOGY) can describe them"
		}
		return "no GPUs"
	case SourceFile:
		return fmt.Sprintf("the topology file %s has %d", t.Path, len(t.GPUs))
	}
	return fmt.Sprintf("this machine has %d", len(t.GPUs))
}

// ParseMemLimit reads a per-rank MPS memory limit as the command line gives
// it: "even" (1/K of the GPU's memory), or a size in MiB with an optional
// unit: "8192", "512M", "512MiB", "8G", "8GiB", "1T". It returns the MiB or
// even = true.
func ParseMemLimit(s string) (mib uint64, even bool, err error) {
	if s == "even" {
		return 0, true, nil
	}
	num := strings.TrimRight(s, "BbGgMmTtIi")
	unit := strings.ToUpper(s[len(num):])
	if u, ok := strings.CutSuffix(unit, "IB"); ok {
		unit = u
		if u == "" {
			unit = "?" // "IB" alone names no unit
		}
	} else {
		unit = strings.TrimSuffix(unit, "B")
	}
	mult := map[string]uint64{"": 1, "M": 1, "G": 1 << 10, "T": 1 << 20}
	m, okUnit := mult[unit]
	n, perr := strconv.ParseUint(num, 10, 64)
	if perr != nil || !okUnit || n == 0 || n > (1<<40)/m {
		return 0, false, fmt.Errorf("gmi: memory limit %q: want \"even\" or a size such as 8G or 512M", s)
	}
	return n * m, false, nil
}
