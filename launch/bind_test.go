package launch

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/rank"
)

func topology(t *testing.T, name string) *gmi.Topology {
	t.Helper()
	topo, err := gmi.LoadTopology(filepath.Join("..", "examples", "topologies", name))
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

// noVisible is a Lookup under which the launcher has no CUDA_VISIBLE_DEVICES.
func noVisible(string) (string, bool) { return "", false }

// envMap is rank r's whole addition to its environment.
func envMap(p *Plan, r int) map[string]string {
	m := map[string]string{}
	for _, kv := range p.Environ(r, "127.0.0.1:1") {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func bindPlan(t *testing.T, req Request) *Plan {
	t.Helper()
	req.IsGoPackage = noGo
	if req.Lookup == nil {
		req.Lookup = noVisible
	}
	p, err := NewPlan(req)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBindMPSShares(t *testing.T) {
	p := bindPlan(t, Request{
		Topology: topology(t, "a100-2x.toml"),
		Groups:   []Group{{NP: 6, Argv: []string{"prog"}, Bind: &gmi.PlanRequest{GMIPerGPU: 3, MPSMemLimitEven: true}}},
	})
	for r := range 6 {
		env := envMap(p, r)
		want := map[string]string{
			rank.EnvCUDAVisibleDevices: []string{"0", "1"}[r/3],
			rank.EnvCUDADeviceOrder:    "PCI_BUS_ID",
			rank.EnvMPSThreadPercent:   "33",
			rank.EnvMPSPinnedMemLimit:  "0=13653M",
			rank.EnvGMILayout:          "[[0,1,2],[3,4,5]]",
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
			}
		}
		if d := p.Ranks[r].Device; d.Backend != "mps" || d.GPU != r/3 || d.GMI != r%3 {
			t.Errorf("rank %d device %+v", r, d)
		}
	}
	if len(p.GPUPlans) != 1 {
		t.Fatalf("GPU plans %+v", p.GPUPlans)
	}
	gp := p.GPUPlans[0]
	if gp.Backend != "mps" || gp.Strategy != "hierarchical" || !slices.Equal(gp.GPUs, []int{0, 1}) ||
		gp.Source != "topology file ../examples/topologies/a100-2x.toml" || len(gp.Warnings) != 0 {
		t.Errorf("GPU plan %+v", gp)
	}
}

// MPMD: only the groups that ask are bound; each bound group is its own plan
// at its world ranks, on GPUs no earlier group took.
func TestBindPerGroup(t *testing.T) {
	p := bindPlan(t, Request{
		Topology: topology(t, "dgx-a100.toml"),
		Groups: []Group{
			{NP: 2, Role: "actor", Argv: []string{"actor"}},
			{NP: 3, Role: "learner", Argv: []string{"learner"}, Bind: &gmi.PlanRequest{GMIPerGPU: 2}},
			{NP: 2, Role: "server", Argv: []string{"server"}, Bind: &gmi.PlanRequest{GPUsPerRank: 2}},
			{NP: 1, Role: "eval", Argv: []string{"eval"}, Bind: &gmi.PlanRequest{}},
		},
	})
	want := []struct{ visible, percent, layout string }{
		{"", "", ""}, {"", "", ""},
		{"0", "50", "[[2,3],[4]]"}, {"0", "50", "[[2,3],[4]]"}, {"1", "50", "[[2,3],[4]]"},
		{"2,3", "", "[[5],[6]]"}, {"4,5", "", "[[5],[6]]"},
		{"6", "", "[[7]]"},
	}
	for r, w := range want {
		env := envMap(p, r)
		if env[rank.EnvCUDAVisibleDevices] != w.visible || env[rank.EnvMPSThreadPercent] != w.percent || env[rank.EnvGMILayout] != w.layout {
			t.Errorf("rank %d: %s=%q %s=%q %s=%q, want %+v", r, rank.EnvCUDAVisibleDevices, env[rank.EnvCUDAVisibleDevices],
				rank.EnvMPSThreadPercent, env[rank.EnvMPSThreadPercent], rank.EnvGMILayout, env[rank.EnvGMILayout], w)
		}
		if _, ok := env[rank.EnvCUDADeviceOrder]; ok != (w.visible != "") {
			t.Errorf("rank %d: %s set: %v", r, rank.EnvCUDADeviceOrder, ok)
		}
	}
	if len(p.GPUPlans) != 3 || p.GPUPlans[0].Group != 1 || p.GPUPlans[1].Role != "server" || p.GPUPlans[2].FirstRank != 7 {
		t.Errorf("GPU plans %+v", p.GPUPlans)
	}
}

// The launcher's CUDA_VISIBLE_DEVICES restricts the GPUs (a SLURM allocation,
// a container); -x may not fight the binding.
func TestBindVisibleDevices(t *testing.T) {
	topo := topology(t, "dgx-a100.toml")
	p := bindPlan(t, Request{
		Topology: topo,
		Lookup: func(k string) (string, bool) {
			return "6,GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c03", k == rank.EnvCUDAVisibleDevices
		},
		Groups: []Group{{NP: 2, Argv: []string{"prog"}, Bind: &gmi.PlanRequest{}}},
	})
	if envMap(p, 0)[rank.EnvCUDAVisibleDevices] != "6" || envMap(p, 1)[rank.EnvCUDAVisibleDevices] != "3" {
		t.Errorf("envs %v %v", envMap(p, 0), envMap(p, 1))
	}
	_, err := NewPlan(Request{
		Topology: topo, Lookup: func(k string) (string, bool) { return "4,5", k == rank.EnvCUDAVisibleDevices }, IsGoPackage: noGo,
		Groups: []Group{{NP: 3, Argv: []string{"prog"}, Bind: &gmi.PlanRequest{}}},
	})
	want := "launch: group 0: GPU binding: 3 ranks at one per GPU need 3 GPUs; the topology file ../examples/topologies/dgx-a100.toml has 8, of which CUDA_VISIBLE_DEVICES=4,5 leaves 2"
	if err == nil || err.Error() != want {
		t.Errorf("error %v\nwant %s", err, want)
	}
	_, err = NewPlan(Request{
		Topology: topo, Lookup: func(k string) (string, bool) { return "4,5", k == rank.EnvCUDAVisibleDevices }, IsGoPackage: noGo,
		Groups: []Group{{NP: 1, Argv: []string{"prog"}, Bind: &gmi.PlanRequest{GPUs: []int{3}}}},
	})
	if err == nil || !strings.Contains(err.Error(), "GPU 3: not among CUDA_VISIBLE_DEVICES=4,5") {
		t.Errorf("explicit GPU outside CUDA_VISIBLE_DEVICES: %v", err)
	}
}

func TestBindErrors(t *testing.T) {
	a100 := topology(t, "a100-2x.toml")
	mig := topology(t, "a100-mig-mixed.toml")
	one := func(topo *gmi.Topology, np int, b gmi.PlanRequest) Request {
		return Request{Topology: topo, Groups: []Group{{NP: np, Role: "trainer", Argv: []string{"prog"}, Bind: &b}}}
	}
	for _, c := range []struct {
		name string
		req  Request
		want string
		bind bool // a *BindError, not a usage error
	}{
		{"no topology", one(nil, 1, gmi.PlanRequest{}), "no topology", true},
		{"no GPUs", one(&gmi.Topology{Source: gmi.SourceNone, Reason: "NVML: ERROR_LIBRARY_NOT_FOUND"}, 1, gmi.PlanRequest{}),
			"launch: group 0 (trainer): GPU binding: no GPUs found (NVML: ERROR_LIBRARY_NOT_FOUND); a topology file (GEAR_TOPOLOGY, or gearrun --topology) can describe the GPUs", true},
		{"empty topology file", one(&gmi.Topology{Source: gmi.SourceFile, Path: "t.toml"}, 1, gmi.PlanRequest{}),
			"no GPUs found: the topology file t.toml lists none", true},
		{"more ranks than GPUs x K", one(a100, 7, gmi.PlanRequest{GMIPerGPU: 3}),
			"7 ranks at 3 GMIs per GPU need 3 GPUs; the topology file ../examples/topologies/a100-2x.toml has 2", true},
		{"MIG mode off", one(a100, 4, gmi.PlanRequest{GMIPerGPU: 2, Backend: gmi.BackendMIG}),
			"GPU 0 (NVIDIA A100-SXM4-40GB, sm_80): MIG asked but MIG mode is off", true},
		{"more GMIs than MIG instances", one(mig, 5, gmi.PlanRequest{GMIPerGPU: 5}),
			"GPU 0 (NVIDIA A100-SXM4-40GB, sm_80) has 4 MIG instances (3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb) but the plan puts 5 ranks on it", true},
		{"MPS on MIG", one(mig, 2, gmi.PlanRequest{GMIPerGPU: 2, Backend: gmi.BackendMPS}), "has MIG mode on: MPS over the whole GPU is not possible", true},
		{"below sm_70", one(topology(t, "p100-2x.toml"), 4, gmi.PlanRequest{GMIPerGPU: 2}), "below sm_70 there is no GMI backend", true},
		{"memory limit without MPS", one(a100, 2, gmi.PlanRequest{MPSMemLimitMiB: 4096}),
			"an MPS memory limit needs MPS shares, but the ranks' backend is none (one rank per GPU)", true},
		{"bad request", one(a100, 2, gmi.PlanRequest{GMIPerGPU: 2, Backend: gmi.BackendNone}), "backend none gives each rank a whole GPU", true},
		{"later group finds no GPU left", Request{Topology: a100, Groups: []Group{
			{NP: 3, Argv: []string{"a"}, Bind: &gmi.PlanRequest{GMIPerGPU: 2}},
			{NP: 1, Argv: []string{"b"}, Bind: &gmi.PlanRequest{}},
		}}, "launch: group 1 (b): GPU binding: 1 ranks at one per GPU need 1 GPUs; the topology file ../examples/topologies/a100-2x.toml has 2, and earlier groups took GPUs 0,1, leaving 0", true},
		{"-x fights the binding", Request{Topology: a100, Env: []string{"CUDA_VISIBLE_DEVICES=1"},
			Groups: []Group{{NP: 1, Argv: []string{"a"}, Bind: &gmi.PlanRequest{}}}},
			"launch: group 0: env CUDA_VISIBLE_DEVICES: the group's GPU binding sets it", false},
		{"group env fights the binding", Request{Topology: a100,
			Groups: []Group{{NP: 1, Argv: []string{"a"}}, {NP: 1, Argv: []string{"b"}, Env: []string{"GEAR_GMI_LAYOUT=[[0]]"}, Bind: &gmi.PlanRequest{}}}},
			"launch: group 1: env GEAR_GMI_LAYOUT", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.req.IsGoPackage, c.req.Lookup = noGo, noVisible
			_, err := NewPlan(c.req)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			var be *BindError
			if errors.As(err, &be) != c.bind {
				t.Errorf("error %T: BindError %v, want %v", err, !c.bind, c.bind)
			}
		})
	}
}

// The sm_70 rule: MPS only, whatever the workload; MIG is refused.
func TestBindSm70(t *testing.T) {
	v100 := topology(t, "v100-4x.toml")
	p := bindPlan(t, Request{Topology: v100, Groups: []Group{{NP: 4, Argv: []string{"a"},
		Bind: &gmi.PlanRequest{GMIPerGPU: 2, Workload: gmi.Serving}}}})
	if gp := p.GPUPlans[0]; gp.Backend != "mps" || !strings.Contains(gp.Why, "sm_70 to sm_79") {
		t.Errorf("plan %+v", gp)
	}
	_, err := NewPlan(Request{Topology: v100, IsGoPackage: noGo, Lookup: noVisible,
		Groups: []Group{{NP: 2, Argv: []string{"a"}, Bind: &gmi.PlanRequest{GMIPerGPU: 2, Backend: gmi.BackendMIG}}}})
	if err == nil || !strings.Contains(err.Error(), "MIG needs sm_80 or later") {
		t.Errorf("MIG on sm_70: %v", err)
	}
}

// A bound rank inherits no binding variable from the launcher; an unbound
// rank keeps the launcher's; nobody inherits a GMI layout.
func TestBindInheritance(t *testing.T) {
	p := bindPlan(t, Request{Topology: topology(t, "a100-2x.toml"), Groups: []Group{
		{NP: 1, Argv: []string{"a"}},
		{NP: 1, Argv: []string{"b"}, Bind: &gmi.PlanRequest{}},
	}})
	base := []string{"CUDA_VISIBLE_DEVICES=7", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10", "GEAR_GMI_LAYOUT=[[9]]", "PATH=/bin"}
	unbound := rank.MergeEnv(base, p.Environ(0, "x"), p.inheritDrop(0)...)
	bound := rank.MergeEnv(base, p.Environ(1, "x"), p.inheritDrop(1)...)
	for _, kv := range []string{"CUDA_VISIBLE_DEVICES=7", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10", "PATH=/bin"} {
		if !slices.Contains(unbound, kv) {
			t.Errorf("unbound rank lacks %s: %v", kv, unbound)
		}
	}
	for _, kv := range []string{"CUDA_VISIBLE_DEVICES=0", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "GEAR_GMI_LAYOUT=[[1]]", "PATH=/bin"} {
		if !slices.Contains(bound, kv) {
			t.Errorf("bound rank lacks %s: %v", kv, bound)
		}
	}
	for _, kv := range bound {
		if strings.HasPrefix(kv, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=") || kv == "CUDA_VISIBLE_DEVICES=7" {
			t.Errorf("bound rank inherited %s: %v", kv, bound)
		}
	}
	if slices.Contains(unbound, "GEAR_GMI_LAYOUT=[[9]]") || slices.Contains(bound, "GEAR_GMI_LAYOUT=[[9]]") {
		t.Errorf("a rank inherited the launcher's GMI layout: %v / %v", unbound, bound)
	}
}

// Groups with a Bind request are not handed to the Binder.
func TestBindAndBinder(t *testing.T) {
	var asked []int
	p := bindPlan(t, Request{Topology: topology(t, "a100-2x.toml"),
		Groups: []Group{{NP: 1, Argv: []string{"a"}}, {NP: 1, Argv: []string{"b"}, Bind: &gmi.PlanRequest{}}},
		Binder: BinderFunc(func(r RankSpec) (Device, error) {
			asked = append(asked, r.Rank)
			return Device{VisibleDevices: "5"}, nil
		}),
	})
	if !slices.Equal(asked, []int{0}) || p.Ranks[0].Device.VisibleDevices != "5" || p.Ranks[1].Device.VisibleDevices != "0" {
		t.Errorf("binder asked for %v; devices %+v %+v", asked, p.Ranks[0].Device, p.Ranks[1].Device)
	}
}

func TestBindDryRunGolden(t *testing.T) {
	p := bindPlan(t, Request{
		JobID: "job-2", Token: "secret", Topology: topology(t, "a100-mig-mixed.toml"),
		Groups: []Group{
			{NP: 2, Role: "actor", Argv: []string{"./actor"}},
			{NP: 7, Role: "server", Argv: []string{"./server"}, Bind: &gmi.PlanRequest{GMIPerGPU: 4, Workload: gmi.Serving}},
		},
	})
	var text, js bytes.Buffer
	if err := p.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "plan_gpus.txt")
	if *update {
		os.WriteFile(path, text.Bytes(), 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if text.String() != string(want) {
		t.Errorf("dry-run text differs from %s (run with -update to accept):\n%s", path, text.String())
	}
	var out struct {
		GPUPlans []GPUPlan `json:"gpu_plans"`
		Ranks    []struct {
			Device  Device   `json:"device"`
			Environ []string `json:"environ"`
		} `json:"ranks"`
	}
	if err := json.Unmarshal(js.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.GPUPlans) != 1 || out.GPUPlans[0].Layout != "[[2,3,4,5],[6,7,8]]" || out.Ranks[8].Device.MIGProfile != "2g.10gb" ||
		!slices.Contains(out.Ranks[3].Environ, "CUDA_VISIBLE_DEVICES=MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f02") {
		t.Errorf("JSON plan: %s", js.String())
	}
}
