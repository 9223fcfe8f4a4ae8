package gmi

import (
	"slices"
	"strings"
	"testing"
)

// An MPMD group is planned at its world ranks: the mapping, the bindings and
// the schedule name ranks FirstRank and up.
func TestPlanFirstRank(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 6, GMIPerGPU: 3, FirstRank: 4})
	if p.Mapping.String() != "[[4,5,6],[7,8,9]]" || p.Ranks != 6 {
		t.Fatalf("mapping %s, ranks %d", p.Mapping, p.Ranks)
	}
	for i, b := range p.Bindings {
		if b.Rank != 4+i || b.GPU != i/3 || b.Slot != i%3 || b.Env[EnvGMILayout] != "[[4,5,6],[7,8,9]]" {
			t.Errorf("binding %d: %+v", i, b)
		}
	}
	var ids []int
	for _, st := range p.Schedule.Steps {
		for _, g := range st.Groups {
			ids = append(ids, g.Ranks...)
		}
	}
	if slices.Min(ids) != 4 || slices.Max(ids) != 9 {
		t.Errorf("schedule names ranks %v, want 4 to 9", ids)
	}
	planErr(t, topo, PlanRequest{Ranks: 1, FirstRank: -1}, "first rank -1")
}

func TestPlanSeveralGPUsPerRank(t *testing.T) {
	topo := loadExample(t, "dgx-a100.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 3, GPUsPerRank: 2, FirstRank: 1})
	if p.Backend != BackendNone || p.GPUsPerRank != 2 || p.Mapping.String() != "[[1],[2],[3]]" ||
		!slices.Equal(p.GPUs, []int{0, 1, 2, 3, 4, 5}) || p.Strategy != MultiRing {
		t.Fatalf("plan %+v", p)
	}
	for i, want := range []string{"0,1", "2,3", "4,5"} {
		b := p.Bindings[i]
		if b.Env[EnvCUDAVisibleDevices] != want || b.Env[EnvCUDADeviceOrder] != "PCI_BUS_ID" ||
			b.Env[EnvMPSThreadPercent] != "" || b.GPU != 2*i || !slices.Equal(b.GPUs, []int{2 * i, 2*i + 1}) {
			t.Errorf("rank %d: %+v", b.Rank, b)
		}
	}
	var text strings.Builder
	if err := p.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "ranks: 3 on 6 GPU(s) [0 1 2 3 4 5], 2 GPUs per rank\n") ||
		!strings.Contains(text.String(), "  3     4    0    4,5") {
		t.Errorf("plan text:\n%s", text.String())
	}
	if n := (PlanRequest{Ranks: 3, GPUsPerRank: 2}).GPUsNeeded(); n != 6 {
		t.Errorf("GPUsNeeded = %d, want 6", n)
	}
	if n := (PlanRequest{Ranks: 7, GMIPerGPU: 3}).GPUsNeeded(); n != 3 {
		t.Errorf("GPUsNeeded = %d, want 3", n)
	}
	a100 := loadExample(t, "a100-2x.toml")
	planErr(t, a100, PlanRequest{Ranks: 2, GPUsPerRank: 2}, "2 ranks at 2 GPUs per rank need 4 GPUs; the topology file ../examples/topologies/a100-2x.toml has 2")
	planErr(t, a100, PlanRequest{Ranks: 1, GPUsPerRank: 2, GMIPerGPU: 2}, "cannot span several")
	planErr(t, a100, PlanRequest{Ranks: 1, GPUsPerRank: 2, Backend: BackendMPS}, "owns them whole")
	planErr(t, a100, PlanRequest{Ranks: 1, GPUsPerRank: -1}, "gpus-per-rank -1")
	planErr(t, loadExample(t, "a100-mig-mixed.toml"), PlanRequest{Ranks: 1, GPUsPerRank: 2}, "MIG mode on: a rank cannot own the whole GPU")
}

func TestVisibleGPUs(t *testing.T) {
	topo := loadExample(t, "dgx-a100.toml")
	for _, c := range []struct {
		value string
		want  []int
	}{
		{"", nil},
		{"NoDevFiles", []int{}},
		{"4,5,6,7", []int{4, 5, 6, 7}},
		{" 3, 1 ", []int{3, 1}},
		{"GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c02,0", []int{2, 0}},
		{"GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c07", []int{7}},
	} {
		got, err := topo.VisibleGPUs(c.value)
		if err != nil || !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("VisibleGPUs(%q) = %v, %v; want %v", c.value, got, err, c.want)
		}
	}
	for _, c := range []struct{ value, want string }{
		{"8", `"8" names no GPU (the topology file ../examples/topologies/dgx-a100.toml has 8)`},
		{"0,x", `"x" is neither a GPU index nor a GPU UUID`},
		{"-1", `"-1" is neither`},
		{"1,1", `"1" names a GPU listed before`},
		{"GPU-9e8d", `"GPU-9e8d" names more than one GPU`},
		{"GPU-ffff", `"GPU-ffff" names no GPU`},
		{"MIG-1f6d2a40", "is a MIG instance"},
	} {
		_, err := topo.VisibleGPUs(c.value)
		if err == nil || !strings.HasPrefix(err.Error(), "gmi: CUDA_VISIBLE_DEVICES=") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("VisibleGPUs(%q): error %v, want one containing %q", c.value, err, c.want)
		}
	}
}
