package jobs

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

func loadTopology(t *testing.T, name string) *gmi.Topology {
	t.Helper()
	topo, err := gmi.LoadTopology("../examples/topologies/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func parseSpec(t *testing.T, doc string) *Spec {
	t.Helper()
	s, err := Parse([]byte("name=\"b\"\n"+doc), "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bindingOf is rank r's CUDA_VISIBLE_DEVICES, MPS share and GMI layout in the plan.
func bindingOf(p *launch.Plan, r int) [3]string {
	env := map[string]string{}
	for _, kv := range p.Ranks[r].Device.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return [3]string{env[rank.EnvCUDAVisibleDevices], env[rank.EnvMPSThreadPercent], env[rank.EnvGMILayout]}
}

// gpus_per_rank and [gmi] go through gmi.NewPlan, as gearrun's --bind and
// --gmi-per-gpu do.
func TestPlanBindsGPUs(t *testing.T) {
	t.Setenv(rank.EnvCUDAVisibleDevices, "")
	dgx, a100, mig := loadTopology(t, "dgx-a100.toml"), loadTopology(t, "a100-2x.toml"), loadTopology(t, "a100-mig-mixed.toml")
	tests := []struct {
		name    string
		spec    string
		topo    *gmi.Topology
		visible string
		want    [][3]string // by world rank
	}{
		{"two per rank", "[launch]\nnp = 2\ngpus_per_rank = 2\ncommand = [\"x\"]\n", dgx, "",
			[][3]string{{"0,1", "", "[[0],[1]]"}, {"2,3", "", "[[0],[1]]"}}},
		{"visible list", "[launch]\nnp = 2\ngpus_per_rank = 1\ncommand = [\"x\"]\n", dgx, "3,5",
			[][3]string{{"3", "", "[[0],[1]]"}, {"5", "", "[[0],[1]]"}}},
		{"mps shares", "[launch]\nnp = 4\ngpus_per_rank = 1\ncommand = [\"x\"]\n[gmi]\nper_gpu = 2\nbackend = \"mps\"\n", a100, "",
			[][3]string{{"0", "50", "[[0,1],[2,3]]"}, {"0", "50", "[[0,1],[2,3]]"}, {"1", "50", "[[0,1],[2,3]]"}, {"1", "50", "[[0,1],[2,3]]"}}},
		{"roles without GPUs", "[[group]]\nrole = \"a\"\nnp = 2\ncommand = [\"x\"]\n[[group]]\nrole = \"t\"\nnp = 1\ngpus_per_rank = 1\ncommand = [\"y\"]\n", a100, "",
			[][3]string{{}, {}, {"0", "", "[[2]]"}}},
		{"two bound roles on distinct GPUs", "[[group]]\nrole = \"a\"\nnp = 2\ngpus_per_rank = 1\ncommand = [\"x\"]\n[[group]]\nrole = \"t\"\nnp = 1\ngpus_per_rank = 2\ncommand = [\"y\"]\n", dgx, "",
			[][3]string{{"0", "", "[[0],[1]]"}, {"1", "", "[[0],[1]]"}, {"2,3", "", "[[2]]"}}},
		{"MIG instances under auto", "[launch]\nnp = 3\ngpus_per_rank = 1\ncommand = [\"x\"]\n[gmi]\nper_gpu = 2\n", mig, "",
			[][3]string{{"MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f01", "", "[[0,1],[2]]"}, {"MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f02", "", "[[0,1],[2]]"},
				{"MIG-2a7e3b51-9c4d-5f80-b2e3-4d5c6b7f8a01", "", "[[0,1],[2]]"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(rank.EnvCUDAVisibleDevices, tt.visible)
			p, err := parseSpec(t, tt.spec).Plan(t.Context(), "", WithTopology(tt.topo))
			if err != nil {
				t.Fatal(err)
			}
			for r, want := range tt.want {
				if got := bindingOf(p, r); got != want {
					t.Errorf("rank %d: binding %q, want %q", r, got, want)
				}
			}
		})
	}
}

// The example spec: eight trainers, two per GPU as MPS shares; the actors get
// no GPU.
func TestPlanReplayExample(t *testing.T) {
	t.Setenv(rank.EnvCUDAVisibleDevices, "")
	spec, err := Load("../examples/jobs/replay.toml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := spec.Plan(t.Context(), "../examples/jobs/replay.toml", WithTopology(loadTopology(t, "dgx-a100.toml")))
	if err != nil {
		t.Fatal(err)
	}
	if got := bindingOf(p, 7); got != ([3]string{}) {
		t.Errorf("actor 7 bound: %q", got)
	}
	layout := "[[8,9],[10,11],[12,13],[14,15]]"
	for r := 8; r < 16; r++ {
		if got, want := bindingOf(p, r), [3]string{strconv.Itoa((r - 8) / 2), "50", layout}; got != want {
			t.Errorf("trainer rank %d: %q, want %q", r, got, want)
		}
	}
	if len(p.GPUPlans) != 1 || p.GPUPlans[0].Role != "trainer" || p.GPUPlans[0].Backend != "mps" {
		t.Errorf("GPU plans %+v", p.GPUPlans)
	}
}

func TestPlanBindErrors(t *testing.T) {
	t.Setenv(rank.EnvCUDAVisibleDevices, "")
	for _, c := range []struct {
		name, spec string
		topo       *gmi.Topology
		want       string
	}{
		{"no GPUs", "[launch]\nnp = 1\ngpus_per_rank = 1\ncommand = [\"x\"]\n", &gmi.Topology{Source: gmi.SourceNone, Reason: "NVML: ERROR_LIBRARY_NOT_FOUND"},
			"jobs: launch: group 0: GPU binding: no GPUs found (NVML: ERROR_LIBRARY_NOT_FOUND)"},
		{"too few GPUs", "[launch]\nnp = 3\ngpus_per_rank = 1\ncommand = [\"x\"]\n", loadTopology(t, "a100-2x.toml"),
			"3 ranks at one per GPU need 3 GPUs; the topology file ../examples/topologies/a100-2x.toml has 2"},
		{"whole GPU in MIG mode", "[launch]\nnp = 1\ngpus_per_rank = 1\ncommand = [\"x\"]\n", loadTopology(t, "a100-mig-mixed.toml"),
			"has MIG mode on: a rank cannot own the whole GPU"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseSpec(t, c.spec).Plan(t.Context(), "", WithTopology(c.topo))
			var be *launch.BindError
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &be) {
				t.Errorf("error %v, want a BindError containing %q", err, c.want)
			}
		})
	}
}

// A spec without gpus_per_rank looks for no GPUs.
func TestPlanWithoutGPUsDiscoversNothing(t *testing.T) {
	t.Setenv(rank.EnvTopology, "/no/such/topology.toml")
	p, err := parseSpec(t, "[launch]\nnp = 2\ncommand = [\"x\"]\n[gmi]\nper_gpu = 2\n").Plan(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if p.Ranks[0].Device != (launch.Device{}) || p.GPUPlans != nil {
		t.Errorf("binding without gpus_per_rank: %+v %+v", p.Ranks[0].Device, p.GPUPlans)
	}
	// With gpus_per_rank, GEAR_TOPOLOGY is the machine.
	_, err = parseSpec(t, "[launch]\nnp = 2\ngpus_per_rank = 1\ncommand = [\"x\"]\n").Plan(t.Context(), "")
	if err == nil || !strings.Contains(err.Error(), "/no/such/topology.toml") {
		t.Errorf("GEAR_TOPOLOGY not read: %v", err)
	}
}

// Under SLURM each node plans its own ranks, role by role, with the same code.
func TestTaskBinding(t *testing.T) {
	spec := parseSpec(t, "[[group]]\nrole = \"actor\"\nnp = 2\ncommand = [\"x\"]\n"+
		"[[group]]\nrole = \"trainer\"\nnp = 4\ngpus_per_rank = 1\ncommand = [\"y\"]\n[gmi]\nper_gpu = 2\nbackend = \"mps\"\n")
	vars := map[string]string{rank.EnvTopology: "../examples/topologies/a100-2x.toml"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	// Two nodes of three ranks: node 0 holds the actors and trainer 0, node 1
	// trainers 1-3.
	for _, c := range []struct {
		rank, local int
		want        map[string]string
	}{
		{0, 0, nil},
		{2, 2, map[string]string{rank.EnvCUDAVisibleDevices: "0", rank.EnvCUDADeviceOrder: "PCI_BUS_ID", rank.EnvMPSThreadPercent: "50", rank.EnvGMILayout: "[[2]]"}},
		{3, 0, map[string]string{rank.EnvCUDAVisibleDevices: "0", rank.EnvCUDADeviceOrder: "PCI_BUS_ID", rank.EnvMPSThreadPercent: "50", rank.EnvGMILayout: "[[3,4],[5]]"}},
		{5, 2, map[string]string{rank.EnvCUDAVisibleDevices: "1", rank.EnvCUDADeviceOrder: "PCI_BUS_ID", rank.EnvMPSThreadPercent: "50", rank.EnvGMILayout: "[[3,4],[5]]"}},
	} {
		info := rank.Info{Rank: c.rank, Size: 6, LocalRank: c.local, LocalSize: 3}
		got, err := spec.taskBinding(context.Background(), info, lookup)
		if err != nil {
			t.Fatalf("rank %d: %v", c.rank, err)
		}
		if len(got) != len(c.want) {
			t.Errorf("rank %d: %v, want %v", c.rank, got, c.want)
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", c.rank, k, got[k], v)
			}
		}
	}
	// SLURM's CUDA_VISIBLE_DEVICES bounds the node's GPUs.
	vars[rank.EnvCUDAVisibleDevices] = "1"
	_, err := spec.taskBinding(context.Background(), rank.Info{Rank: 5, Size: 6, LocalRank: 2, LocalSize: 3}, lookup)
	if err == nil || !strings.Contains(err.Error(), "CUDA_VISIBLE_DEVICES=1 leaves 1") {
		t.Errorf("binding past the allocation: %v", err)
	}
}

// [launch].restarts and checkpoint_dir reach the plan; with restarts and no
// checkpoint_dir the job gets a directory of its own under the state dir.
func TestPlanRestartsAndCheckpoints(t *testing.T) {
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	p, err := parseSpec(t, "[launch]\nnp = 2\nrestarts = 2\ncommand = [\"x\"]\n").Plan(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if want := state + "/gear/checkpoints/" + p.JobID; p.MaxRestarts != 2 || p.CheckpointDir != want {
		t.Fatalf("plan: %d restarts, checkpoints %q; want 2 and %q", p.MaxRestarts, p.CheckpointDir, want)
	}
	p, err = parseSpec(t, "[launch]\nnp = 1\ncheckpoint_dir = \"ck\"\ncommand = [\"x\"]\n").Plan(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if p.MaxRestarts != 0 || p.CheckpointDir != "ck" {
		t.Fatalf("plan: %d restarts, checkpoints %q; want 0 and ck", p.MaxRestarts, p.CheckpointDir)
	}
	p, err = parseSpec(t, "[launch]\nnp = 1\ncommand = [\"x\"]\n").Plan(t.Context(), "")
	if err != nil || p.CheckpointDir != "" {
		t.Fatalf("plan without restarts: checkpoints %q, %v; want none", p.CheckpointDir, err)
	}
}
