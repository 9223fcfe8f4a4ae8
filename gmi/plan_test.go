package gmi

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func mustPlan(t *testing.T, topo *Topology, req PlanRequest) *Plan {
	t.Helper()
	p, err := NewPlan(topo, req)
	if err != nil {
		t.Fatalf("NewPlan(%+v): %v", req, err)
	}
	return p
}

func planErr(t *testing.T, topo *Topology, req PlanRequest, want string) {
	t.Helper()
	_, err := NewPlan(topo, req)
	if err == nil || !strings.HasPrefix(err.Error(), "gmi: ") || !strings.Contains(err.Error(), want) {
		t.Errorf("NewPlan(%+v): error %v, want one containing %q", req, err, want)
	}
}

// envOf is what rank r's process gets from the plan.
func envOf(p *Plan, r int) map[string]string {
	env := map[string]string{}
	for _, kv := range p.Bindings[r].Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

func TestPlan2GPUsx3GMIsMPS(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 6, GMIPerGPU: 3})
	if p.Backend != BackendMPS || !strings.Contains(p.Why, "training") {
		t.Errorf("backend %s (%s), want mps for training", p.Backend, p.Why)
	}
	if p.Mapping.String() != "[[0,1,2],[3,4,5]]" || !slices.Equal(p.GPUs, []int{0, 1}) {
		t.Errorf("mapping %s on GPUs %v", p.Mapping, p.GPUs)
	}
	if p.Strategy != Hierarchical || p.Schedule.Strategy != Hierarchical || len(p.Schedule.Steps) != 3 {
		t.Errorf("strategy %s, schedule %+v", p.Strategy, p.Schedule)
	}
	if len(p.Warnings) != 0 {
		t.Errorf("warnings %v", p.Warnings)
	}
	for r := 0; r < 6; r++ {
		env := envOf(p, r)
		want := map[string]string{
			EnvCUDAVisibleDevices: fmt.Sprint(r / 3),
			EnvCUDADeviceOrder:    "PCI_BUS_ID",
			EnvMPSThreadPercent:   "33",
			EnvGMILayout:          "[[0,1,2],[3,4,5]]",
		}
		if fmt.Sprint(env) != fmt.Sprint(want) {
			t.Errorf("rank %d env %v, want %v", r, env, want)
		}
		b := p.Bindings[r]
		if b.Rank != r || b.GPU != r/3 || b.Slot != r%3 || b.ThreadPercent != 33 || b.MIG != nil {
			t.Errorf("rank %d binding %+v", r, b)
		}
	}
}

func TestPlanOneRankPerGPU(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 2})
	if p.Backend != BackendNone || p.GMIPerGPU != 1 || p.Strategy != MultiRing {
		t.Errorf("plan %+v", p)
	}
	for r := 0; r < 2; r++ {
		env := envOf(p, r)
		if env[EnvCUDAVisibleDevices] != fmt.Sprint(r) || env[EnvMPSThreadPercent] != "" || env[EnvGMILayout] != "[[0],[1]]" {
			t.Errorf("rank %d env %v", r, env)
		}
	}
	one := mustPlan(t, topo, PlanRequest{Ranks: 1, Backend: BackendNone})
	if one.Strategy != MultiProcess || len(one.Schedule.Steps) != 0 {
		t.Errorf("one rank: %+v", one)
	}
}

func TestPlanMPSOptions(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 3, MPSMemLimitEven: true})
	if got := envOf(p, 0)[EnvMPSPinnedMemLimit]; got != "0=13653M" {
		t.Errorf("even limit %q, want 0=13653M (40960 MiB / 3)", got)
	}
	// The last GPU holds one rank but keeps a 1/K share.
	if p.Mapping.String() != "[[0,1,2],[3]]" || envOf(p, 3)[EnvMPSThreadPercent] != "33" || p.Strategy != Hierarchical {
		t.Errorf("uneven: %s %v %s", p.Mapping, envOf(p, 3), p.Strategy)
	}
	p = mustPlan(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 2, MPSMemLimitMiB: 8192, Backend: BackendMPS})
	if got := envOf(p, 3)[EnvMPSPinnedMemLimit]; got != "0=8192M" || envOf(p, 3)[EnvMPSThreadPercent] != "50" {
		t.Errorf("explicit limit: %v", envOf(p, 3))
	}
	if p.Strategy != MultiRing {
		t.Errorf("2 GPUs x 2 GMIs: %s", p.Strategy)
	}
	// Serving would prefer MIG, but MIG mode is off and gear leaves it off.
	s := mustPlan(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 2, Workload: Serving})
	if s.Backend != BackendMPS || !strings.Contains(s.Why, "MIG mode is off") {
		t.Errorf("serving: %s (%s)", s.Backend, s.Why)
	}
	// K = 1 with MPS asked: a full share.
	full := mustPlan(t, topo, PlanRequest{Ranks: 2, Backend: BackendMPS})
	if envOf(full, 1)[EnvMPSThreadPercent] != "100" {
		t.Errorf("K=1 MPS: %v", envOf(full, 1))
	}
}

func TestPlanMPSDaemonMissingWarns(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	topo.MPS.Running = false
	p := mustPlan(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 2})
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "MPS control daemon") {
		t.Errorf("warnings %v", p.Warnings)
	}
}

func TestPlanDoesNotFit(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	planErr(t, topo, PlanRequest{Ranks: 7, GMIPerGPU: 3}, "7 ranks at 3 per GPU need 3 GPUs; the topology file ../examples/topologies/a100-2x.toml has 2")
	planErr(t, topo, PlanRequest{Ranks: 3}, "need 3 GPUs")
	planErr(t, topo, PlanRequest{Ranks: 6, GMIPerGPU: 3, Backend: BackendMIG}, "GPU 0 (NVIDIA A100-SXM4-40GB, sm_80): MIG asked but MIG mode is off")
	planErr(t, topo, PlanRequest{Ranks: 2, GPUs: []int{5}}, "GPU 5: not in the topology")
	planErr(t, topo, PlanRequest{Ranks: 2, GPUs: []int{1}}, "2 ranks at 1 per GPU need 2 GPUs; 1 selected ([1])")
	planErr(t, &Topology{Source: SourceNone, Reason: "NVML: ERROR_LIBRARY_NOT_FOUND"}, PlanRequest{Ranks: 1},
		"no GPUs (NVML: ERROR_LIBRARY_NOT_FOUND); a topology file (GEAR_TOPOLOGY) can describe them")
}

func TestPlanGPUSubset(t *testing.T) {
	topo := loadExample(t, "dgx-a100.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 2, GPUs: []int{6, 3}})
	if !slices.Equal(p.GPUs, []int{6, 3}) || envOf(p, 0)[EnvCUDAVisibleDevices] != "6" || envOf(p, 3)[EnvCUDAVisibleDevices] != "3" {
		t.Errorf("GPUs %v, envs %v %v", p.GPUs, envOf(p, 0), envOf(p, 3))
	}
	big := mustPlan(t, topo, PlanRequest{Ranks: 32, GMIPerGPU: 4})
	if big.Strategy != MultiRing || len(big.GPUs) != 8 || envOf(big, 31)[EnvMPSThreadPercent] != "25" {
		t.Errorf("DGX 8 x 4: %s %v", big.Strategy, big.GPUs)
	}
}

func TestPlanMixedMIGProfiles(t *testing.T) {
	topo := loadExample(t, "a100-mig-mixed.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 6, GMIPerGPU: 3})
	if p.Backend != BackendMIG || !strings.Contains(p.Why, "MIG mode is on") {
		t.Errorf("backend %s (%s)", p.Backend, p.Why)
	}
	if p.Strategy != Hierarchical {
		t.Errorf("strategy %s", p.Strategy)
	}
	wantProfiles := []string{"3g.20gb", "2g.10gb", "1g.5gb", "2g.10gb", "2g.10gb", "2g.10gb"}
	for r, b := range p.Bindings {
		env := envOf(p, r)
		g, _ := topo.GPU(b.GPU)
		want := g.MIG[b.Slot]
		if b.MIG == nil || b.MIG.Profile != wantProfiles[r] || env[EnvCUDAVisibleDevices] != want.UUID || !strings.HasPrefix(want.UUID, "MIG-") {
			t.Errorf("rank %d: binding %+v env %v", r, b, env)
		}
		if _, ok := env[EnvMPSThreadPercent]; ok {
			t.Errorf("rank %d: MPS share on a MIG binding: %v", r, env)
		}
		if _, ok := env[EnvCUDADeviceOrder]; ok {
			t.Errorf("rank %d: device order with a MIG UUID: %v", r, env)
		}
	}
	// MIG UUIDs are all different.
	seen := map[string]bool{}
	for r := range p.Bindings {
		seen[envOf(p, r)[EnvCUDAVisibleDevices]] = true
	}
	if len(seen) != 6 {
		t.Errorf("%d distinct devices for 6 ranks", len(seen))
	}
	for _, st := range p.Schedule.Steps {
		for _, g := range st.Groups {
			if g.Link != LinkHost {
				t.Errorf("MIG plan: step %s group %v on %s, want host", st.Phase, g.Ranks, g.Link)
			}
		}
	}
	joined := strings.Join(p.Warnings, "\n")
	if !strings.Contains(joined, "GPU 0: ranks get unequal MIG instances (3g.20gb, 2g.10gb, 1g.5gb)") || strings.Contains(joined, "GPU 1:") ||
		!strings.Contains(joined, "through the host") {
		t.Errorf("warnings:\n%s", joined)
	}
	// Serving on MIG: no training warning.
	s := mustPlan(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 2, Workload: Serving, Backend: BackendMIG})
	if strings.Contains(strings.Join(s.Warnings, "\n"), "through the host") || s.Strategy != MultiRing {
		t.Errorf("serving: %v %s", s.Warnings, s.Strategy)
	}
	// GPU 1 has only three instances.
	planErr(t, topo, PlanRequest{Ranks: 8, GMIPerGPU: 4}, "GPU 1 (NVIDIA A100-SXM4-40GB, sm_80) has 3 MIG instances (2g.10gb, 2g.10gb, 2g.10gb) but the plan puts 4 ranks on it")
	planErr(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 2, Backend: BackendMPS}, "has MIG mode on: MPS over the whole GPU is not possible")
	planErr(t, topo, PlanRequest{Ranks: 2, Backend: BackendNone}, "has MIG mode on: a rank cannot own the whole GPU")
	// One rank per GPU in MIG mode takes the first instance.
	one := mustPlan(t, topo, PlanRequest{Ranks: 2})
	if one.Backend != BackendMIG || envOf(one, 1)[EnvCUDAVisibleDevices] != topo.GPUs[1].MIG[0].UUID {
		t.Errorf("one per GPU: %s %v", one.Backend, envOf(one, 1))
	}
}

func TestPlanMIGServingOnH100(t *testing.T) {
	topo := loadExample(t, "h100-mig-7x1g.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 7, GMIPerGPU: 7, Workload: Serving})
	if p.Backend != BackendMIG || p.Strategy != MultiProcess || len(p.Warnings) != 0 {
		t.Errorf("plan: %s %s %v", p.Backend, p.Strategy, p.Warnings)
	}
	if envOf(p, 6)[EnvCUDAVisibleDevices] != "MIG-6c5b4a39-2817-5f6e-9d4c-3b2a1f0e9d06" {
		t.Errorf("rank 6: %v", envOf(p, 6))
	}
}

func TestPlanSm70MPSOnly(t *testing.T) {
	topo := loadExample(t, "v100-4x.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 8, GMIPerGPU: 2})
	if p.Backend != BackendMPS || !strings.Contains(p.Why, "sm_70 to sm_79") || p.Strategy != MultiRing {
		t.Errorf("v100: %s (%s) %s", p.Backend, p.Why, p.Strategy)
	}
	if envOf(p, 7)[EnvCUDAVisibleDevices] != "3" || envOf(p, 7)[EnvMPSThreadPercent] != "50" {
		t.Errorf("rank 7: %v", envOf(p, 7))
	}
	planErr(t, topo, PlanRequest{Ranks: 8, GMIPerGPU: 2, Backend: BackendMIG}, "GPU 0 (Tesla V100-SXM2-32GB, sm_70): MIG needs sm_80 or later")
	s := mustPlan(t, topo, PlanRequest{Ranks: 8, GMIPerGPU: 2, Workload: Serving})
	if s.Backend != BackendMPS {
		t.Errorf("v100 serving: %s", s.Backend)
	}
}

func TestPlanBelowSm70(t *testing.T) {
	topo := loadExample(t, "p100-2x.toml")
	planErr(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 2}, "GPU 0 (Tesla P100-PCIE-16GB, sm_60): below sm_70 there is no GMI backend")
	planErr(t, topo, PlanRequest{Ranks: 2, Backend: BackendMPS}, "MPS GMIs need sm_70")
	p := mustPlan(t, topo, PlanRequest{Ranks: 2})
	if p.Backend != BackendNone || envOf(p, 1)[EnvCUDAVisibleDevices] != "1" {
		t.Errorf("p100 one per GPU: %s %v", p.Backend, envOf(p, 1))
	}
}

func TestPlanMixedBackendsRefused(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	topo.GPUs[1].MIGMode = true
	topo.GPUs[1].MIG = []MIGInstance{{UUID: "MIG-x", Profile: "7g.40gb"}}
	planErr(t, topo, PlanRequest{Ranks: 2}, "needs backend none but GPU 1 (NVIDIA A100-SXM4-40GB, sm_80) needs mig")
}

func TestPlanRequestValidate(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	planErr(t, topo, PlanRequest{Ranks: 0}, "ranks 0")
	planErr(t, nil, PlanRequest{Ranks: 1}, "no topology")
	planErr(t, topo, PlanRequest{Ranks: 2, GMIPerGPU: 101}, "gmi-per-gpu 101")
	planErr(t, topo, PlanRequest{Ranks: 2, Backend: "vgpu"}, `backend "vgpu"`)
	planErr(t, topo, PlanRequest{Ranks: 2, Workload: "inference"}, `workload "inference"`)
	planErr(t, topo, PlanRequest{Ranks: 2, GPUs: []int{1, 1}}, "GPU 1 listed twice")
	planErr(t, topo, PlanRequest{Ranks: 4, GMIPerGPU: 2, Backend: BackendNone}, "backend none gives each rank a whole GPU")
}

func TestPlanJSON(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 6, GMIPerGPU: 3})
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Mapping  [][]int `json:"mapping"`
		Strategy string  `json:"strategy"`
		Bindings []struct {
			Env map[string]string `json:"env"`
		} `json:"bindings"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(back.Mapping) != "[[0 1 2] [3 4 5]]" || back.Strategy != "hierarchical" || back.Bindings[4].Env[EnvCUDAVisibleDevices] != "1" {
		t.Errorf("JSON %s", b)
	}
}

func TestPlanText(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 6, GMIPerGPU: 3})
	var sb strings.Builder
	if err := p.WriteText(&sb); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	for _, want := range []string{
		"backend: mps",
		"mapping: [[0,1,2],[3,4,5]]",
		"strategy: hierarchical (Algorithm 1: 3 GMIs per GPU > 2 GPUs)",
		"{0,1,2}->0 {3,4,5}->3",
		"0->{0,1,2} 3->{3,4,5}",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=33",
		"every rank: GEAR_GMI_LAYOUT=[[0,1,2],[3,4,5]]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan text lacks %q:\n%s", want, out)
		}
	}
}

func TestParseMemLimit(t *testing.T) {
	good := map[string]uint64{"8192": 8192, "512M": 512, "512MiB": 512, "512MB": 512, "8G": 8192, "8GiB": 8192, "8g": 8192, "8gib": 8192, "1T": 1 << 20}
	for s, want := range good {
		mib, even, err := ParseMemLimit(s)
		if err != nil || even || mib != want {
			t.Errorf("ParseMemLimit(%q) = %d, %v, %v; want %d", s, mib, even, err, want)
		}
	}
	if _, even, err := ParseMemLimit("even"); !even || err != nil {
		t.Errorf("even: %v %v", even, err)
	}
	for _, s := range []string{"", "0", "-1G", "8X", "G", "1.5G", "8 G", "9999999999999T", "8GiBB", "8IB"} {
		if _, _, err := ParseMemLimit(s); err == nil {
			t.Errorf("ParseMemLimit(%q): no error", s)
		}
	}
}
