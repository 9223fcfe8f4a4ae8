package launch

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/rank"
)

// GPUPlan is how one group's ranks were placed on GPUs: a summary of the
// group's gmi.Plan, kept in the launch plan for --dry-run and for warnings.
type GPUPlan struct {
	// Group is the MPMD group's index; Role its role.
	Group int    `json:"group"`
	Role  string `json:"role"`
	// FirstRank and NP are the group's world ranks.
	FirstRank int `json:"first_rank"`
	NP        int `json:"np"`
	// Source says where the GPUs came from: "NVML (driver 550.54.15)",
	// "topology file t.toml".
	Source string `json:"source"`
	// Backend is none, mps or mig; Why says why it was chosen.
	Backend string `json:"backend"`
	Why     string `json:"why"`
	// GPUs are the GPU indices the group occupies, in mapping order.
	GPUs        []int `json:"gpus"`
	GMIPerGPU   int   `json:"gmi_per_gpu"`
	GPUsPerRank int   `json:"gpus_per_rank,omitempty"`
	// Layout is the mapping list (GEAR_GMI_LAYOUT) in world ranks.
	Layout string `json:"layout"`
	// Strategy is GMI-DRL Algorithm 1's reduction strategy for Layout.
	Strategy    string `json:"strategy"`
	StrategyWhy string `json:"strategy_why"`
	// Warnings are things that work but may not be what was meant (no MPS
	// daemon, unequal MIG instances, MIG for training).
	Warnings []string `json:"warnings,omitempty"`
}

// BindError is NewPlan's (and BindGPUs's) error when a group's GPU binding
// does not fit the machine: no GPUs found, fewer GPUs than the ranks need,
// more GMIs on a GPU than it has MIG instances, a backend the GPUs do not
// offer. A launcher reports it as a failed launch, not as a usage error.
type BindError struct {
	Group int
	Role  string
	Err   error
}

func (e *BindError) Error() string {
	role := ""
	if e.Role != "" {
		role = fmt.Sprintf(" (%s)", e.Role)
	}
	return fmt.Sprintf("launch: group %d%s: GPU binding: %s", e.Group, role, strings.TrimPrefix(e.Err.Error(), "launch: "))
}

func (e *BindError) Unwrap() error { return e.Err }

// GPUGroup is one group's GPU request at its world ranks, the input of
// BindGPUs.
type GPUGroup struct {
	// Group and Role name the group in errors and in its GPUPlan.
	Group int
	Role  string
	// FirstRank and NP are the group's world ranks.
	FirstRank, NP int
	// Req is the gmi request; its Ranks and FirstRank are replaced by NP and
	// FirstRank. Req.GPUs nil means the next free GPUs.
	Req gmi.PlanRequest
}

// BindGPUs places groups on the GPUs of topo with gmi.NewPlan, one plan per
// group, in order. visible is the launcher's CUDA_VISIBLE_DEVICES (""
// for none): when set, only the GPUs it names are used (Topology.VisibleGPUs).
// A group without Req.GPUs takes the next GPUs that no earlier group took,
// as many as its request needs (Req.GPUsNeeded); a group with Req.GPUs gets
// those. It returns the groups' plans and each rank's Device, by world rank.
// Its errors are *BindError.
func BindGPUs(topo *gmi.Topology, visible string, groups []GPUGroup) ([]GPUPlan, map[int]Device, error) {
	if len(groups) == 0 {
		return nil, nil, nil
	}
	fail := func(g GPUGroup, err error) ([]GPUPlan, map[int]Device, error) {
		return nil, nil, &BindError{Group: g.Group, Role: g.Role, Err: err}
	}
	if topo == nil {
		return fail(groups[0], errors.New("no topology: discover the machine (gmi.Discover) first"))
	}
	if len(topo.GPUs) == 0 {
		return fail(groups[0], fmt.Errorf("no GPUs found%s", noGPUs(topo)))
	}
	pool, err := topo.VisibleGPUs(visible)
	if err != nil {
		return fail(groups[0], err)
	}
	restricted := pool != nil
	if !restricted {
		for _, g := range topo.GPUs {
			pool = append(pool, g.Index)
		}
	}
	free := slices.Clone(pool)
	var taken []int
	var plans []GPUPlan
	devs := map[int]Device{}
	for _, g := range groups {
		req := g.Req
		req.Ranks, req.FirstRank = g.NP, g.FirstRank
		if err := req.Validate(); err != nil {
			return fail(g, err)
		}
		if req.GPUs == nil {
			need := req.GPUsNeeded()
			if need > len(free) {
				return fail(g, fmt.Errorf("%s need %d GPUs; %s", asked(req), need, available(topo, visible, restricted, pool, free, taken)))
			}
			req.GPUs = free[:need:need]
		} else if restricted {
			for _, i := range req.GPUs {
				if !slices.Contains(pool, i) {
					return fail(g, fmt.Errorf("GPU %d: not among %s=%s", i, rank.EnvCUDAVisibleDevices, visible))
				}
			}
		}
		p, err := gmi.NewPlan(topo, req)
		if err != nil {
			return fail(g, err)
		}
		if (req.MPSMemLimitMiB > 0 || req.MPSMemLimitEven) && p.Backend != gmi.BackendMPS {
			return fail(g, fmt.Errorf("an MPS memory limit needs MPS shares, but the ranks' backend is %s (%s)", p.Backend, p.Why))
		}
		free = slices.DeleteFunc(free, func(i int) bool { return slices.Contains(p.GPUs, i) })
		taken = append(taken, p.GPUs...)
		plans = append(plans, GPUPlan{
			Group: g.Group, Role: g.Role, FirstRank: g.FirstRank, NP: g.NP,
			Source: topoSource(topo), Backend: string(p.Backend), Why: p.Why,
			GPUs: p.GPUs, GMIPerGPU: p.GMIPerGPU, GPUsPerRank: p.GPUsPerRank,
			Layout: p.Mapping.String(), Strategy: string(p.Strategy), StrategyWhy: p.StrategyWhy,
			Warnings: p.Warnings,
		})
		for _, b := range p.Bindings {
			d, err := deviceOf(p, b)
			if err != nil {
				return fail(g, err)
			}
			devs[b.Rank] = d
		}
	}
	return plans, devs, nil
}

// deviceOf turns a gmi binding into a Device.
func deviceOf(p *gmi.Plan, b gmi.Binding) (Device, error) {
	d := Device{Backend: string(p.Backend), GPU: b.GPU, GMI: b.Slot}
	if b.MIG != nil {
		d.MIGProfile = b.MIG.Profile
	}
	for k, v := range b.Env {
		switch k {
		case rank.EnvCUDAVisibleDevices:
			d.VisibleDevices = v
		case rank.EnvCUDADeviceOrder:
			d.DeviceOrder = v
		case rank.EnvMPSThreadPercent:
			d.MPSThreadPercent = b.ThreadPercent
		case rank.EnvMPSPinnedMemLimit:
			d.MPSPinnedMemLimit = v
		case rank.EnvGMILayout:
			d.GMILayout = v
		default:
			return Device{}, fmt.Errorf("rank %d: the GMI plan sets %s, which the launch plan cannot carry", b.Rank, k)
		}
	}
	return d, nil
}

// asked says what a request asks for: "7 ranks at 3 GMIs per GPU".
func asked(req gmi.PlanRequest) string {
	switch {
	case req.GPUsPerRank > 1:
		return fmt.Sprintf("%d ranks at %d GPUs per rank", req.Ranks, req.GPUsPerRank)
	case req.GMIPerGPU > 1:
		return fmt.Sprintf("%d ranks at %d GMIs per GPU", req.Ranks, req.GMIPerGPU)
	}
	return fmt.Sprintf("%d ranks at one per GPU", req.Ranks)
}

// available says which GPUs were left for a group: the machine's (naming
// the topology source), less what CUDA_VISIBLE_DEVICES hides and what
// earlier groups took.
func available(topo *gmi.Topology, visible string, restricted bool, pool, free, taken []int) string {
	s := topo.DescribeGPUs()
	if restricted {
		s += fmt.Sprintf(", of which %s=%s leaves %d", rank.EnvCUDAVisibleDevices, visible, len(pool))
	}
	if len(taken) > 0 {
		s += fmt.Sprintf(", and earlier groups took %s, leaving %d", formatInts(taken), len(free))
	}
	return s
}

// noGPUs explains a topology without GPUs, naming its source.
func noGPUs(topo *gmi.Topology) string {
	switch topo.Source {
	case gmi.SourceFile:
		return ": the topology file " + topo.Path + " lists none"
	case gmi.SourceNVML:
		return ": NVML lists none on this machine"
	}
	why := ""
	if topo.Reason != "" {
		why = " (" + topo.Reason + ")"
	}
	return why + "; a topology file (" + rank.EnvTopology + ", or gearrun --topology) can describe the GPUs"
}

// topoSource names where a topology came from.
func topoSource(topo *gmi.Topology) string {
	switch topo.Source {
	case gmi.SourceFile:
		return "topology file " + topo.Path
	case gmi.SourceNVML:
		if topo.Driver != "" {
			return "NVML (driver " + topo.Driver + ")"
		}
		return "NVML"
	}
	return "none"
}

func formatInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return "GPUs " + strings.Join(s, ",")
}

// bindGroups fills p's GPU plans and devices from the groups' Bind requests,
// and checks that no group that binds sets a binding variable itself.
func bindGroups(req Request, p *Plan, lookup func(string) (string, bool)) error {
	var groups []GPUGroup
	first := 0
	for i, g := range req.Groups {
		if g.Bind != nil {
			groups = append(groups, GPUGroup{Group: i, Role: p.Ranks[first].Role, FirstRank: first, NP: g.NP, Req: *g.Bind})
			for _, kv := range append(slices.Clone(p.Env), p.Ranks[first].Env...) {
				if name, _, _ := strings.Cut(kv, "="); slices.Contains(rank.DeviceEnv(), name) {
					return fmt.Errorf("launch: group %d: env %s: the group's GPU binding sets it", i, name)
				}
			}
		}
		first += g.NP
	}
	if len(groups) == 0 {
		return nil
	}
	visible, _ := lookup(rank.EnvCUDAVisibleDevices)
	plans, devs, err := BindGPUs(req.Topology, visible, groups)
	if err != nil {
		return err
	}
	p.GPUPlans = plans
	for r, d := range devs {
		p.Ranks[r].Device = d
	}
	return nil
}

// inheritDrop lists the variables rank r must not inherit from the
// launcher's environment: the binding variables when the rank is bound to a
// GPU (a whole-GPU rank must not keep an MPS share from outside), which
// rank.DeviceEnv lists; a group that binds may not set them with -x either.
func (p *Plan) inheritDrop(r int) []string {
	if p.Ranks[r].Device.Backend == "" {
		return nil
	}
	return rank.DeviceEnv()
}
