package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

const gmiTopologies = "../../examples/topologies/"

// gmiRun runs gearrun with args and returns its exit code and output.
func gmiRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, stdio{strings.NewReader(""), &out, &errOut})
	return code, out.String(), errOut.String()
}

func TestGPUsCommand(t *testing.T) {
	code, out, errOut := gmiRun(t, "gpus", "--topology", gmiTopologies+"a100-mig-mixed.toml")
	if code != 0 || !strings.Contains(out, "NVIDIA A100-SXM4-40GB") || !strings.Contains(out, "3g.20gb") || errOut != "" {
		t.Errorf("gpus: %d\n%s\n%s", code, out, errOut)
	}
	t.Setenv("GEAR_TOPOLOGY", gmiTopologies+"v100-4x.toml")
	code, out, _ = gmiRun(t, "gpus", "--json")
	var topo struct {
		Source string
		GPUs   []struct {
			Index             int    `json:"index"`
			ComputeCapability string `json:"compute_capability"`
		} `json:"gpus"`
		MPS struct{ Running bool } `json:"mps"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &topo) != nil || len(topo.GPUs) != 4 || topo.GPUs[3].ComputeCapability != "7.0" || !topo.MPS.Running {
		t.Errorf("gpus --json from GEAR_TOPOLOGY: %d %+v\n%s", code, topo, out)
	}
	if code, _, errOut := gmiRun(t, "gpus", "--topology", gmiTopologies+"missing.toml"); code != 1 || !strings.Contains(errOut, "gearrun: gmi: topology file") {
		t.Errorf("missing file: %d %s", code, errOut)
	}
	if code, _, _ := gmiRun(t, "gpus", "extra"); code != 2 {
		t.Errorf("extra argument: %d", code)
	}
}

func TestGMIPlanCommand(t *testing.T) {
	topo := gmiTopologies + "a100-2x.toml"
	code, out, errOut := gmiRun(t, "gmi", "plan", "--topology", topo, "-np", "6", "--gmi-per-gpu", "3")
	if code != 0 || errOut != "" {
		t.Fatalf("plan: %d %s", code, errOut)
	}
	for _, want := range []string{"backend: mps", "mapping: [[0,1,2],[3,4,5]]", "strategy: hierarchical", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=33"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = gmiRun(t, "gmi", "plan", "--topology", topo, "-np", "4", "--gmi-per-gpu", "2", "--json", "--mps-mem-limit", "4G", "--devices", "1,0")
	var p struct {
		Mapping  [][]int `json:"mapping"`
		Strategy string  `json:"strategy"`
		GPUs     []int   `json:"gpus"`
		Bindings []struct {
			Env map[string]string `json:"env"`
		} `json:"bindings"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &p) != nil || p.Strategy != "multi-ring" || len(p.Bindings) != 4 ||
		p.Bindings[0].Env["CUDA_VISIBLE_DEVICES"] != "1" || p.Bindings[1].Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=4096M" {
		t.Errorf("plan --json: %d %+v\n%s", code, p, out)
	}
	fails := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-np", "8", "--gmi-per-gpu", "4", "--topology", gmiTopologies + "a100-mig-mixed.toml"}, 1, "gearrun: gmi: plan: GPU 1 (NVIDIA A100-SXM4-40GB, sm_80) has 3 MIG instances"},
		{[]string{"-np", "4", "--gmi-per-gpu", "2", "--gmi-backend", "mig", "--topology", topo}, 1, "MIG mode is off"},
		{[]string{"-np", "4", "--gmi-per-gpu", "2", "--topology", gmiTopologies + "p100-2x.toml"}, 1, "below sm_70"},
		{[]string{"--gmi-per-gpu", "2", "--topology", topo}, 2, "-np N is required"},
		{[]string{"-np", "2", "--gmi-backend", "vgpu", "--topology", topo}, 2, `backend "vgpu"`},
		{[]string{"-np", "2", "--workload", "x", "--topology", topo}, 2, `workload "x"`},
		{[]string{"-np", "2", "--devices", "a", "--topology", topo}, 2, "--devices"},
		{[]string{"-np", "2", "--mps-mem-limit", "lots", "--topology", topo}, 2, "memory limit"},
	}
	for _, f := range fails {
		code, _, errOut := gmiRun(t, append([]string{"gmi", "plan"}, f.args...)...)
		if code != f.code || !strings.Contains(errOut, f.want) {
			t.Errorf("gmi plan %v: %d %q, want %d and %q", f.args, code, errOut, f.code, f.want)
		}
	}
	if code, _, _ := gmiRun(t, "gmi", "plan", "-h"); code != 0 {
		t.Errorf("plan -h: %d", code)
	}
}

func TestGMIScheduleCommand(t *testing.T) {
	code, out, _ := gmiRun(t, "gmi", "schedule", "--layout", "[[0,1,2],[3,4,5]]")
	if code != 0 || !strings.HasPrefix(out, "hierarchical on [[0,1,2],[3,4,5]]") || !strings.Contains(out, "{0,3}") {
		t.Errorf("schedule: %d\n%s", code, out)
	}
	t.Setenv("GEAR_GMI_LAYOUT", "[[0,1],[2,3]]")
	code, out, _ = gmiRun(t, "gmi", "schedule", "--strategy", "multi-ring", "--json")
	if code != 0 || !strings.Contains(out, `"phase": "ring-ends"`) {
		t.Errorf("schedule from GEAR_GMI_LAYOUT: %d\n%s", code, out)
	}
	if code, _, errOut := gmiRun(t, "gmi", "schedule", "--layout", "[[0,1],[2]]", "--strategy", "multi-ring"); code != 1 || !strings.Contains(errOut, "same number") {
		t.Errorf("uneven multi-ring: %d %s", code, errOut)
	}
	if code, _, _ := gmiRun(t, "gmi", "schedule", "--layout", "[[0],[0]]"); code != 2 {
		t.Errorf("bad layout: %d", code)
	}
}

// The search over a shell benchmark whose one-GMI throughput stops growing at
// 1024 environments and is the same for every K: the estimate grows with K,
// so the best is the most GMIs tried at the saturation point.
func TestGMISearchCommand(t *testing.T) {
	bench := `e=$GEAR_NUM_ENV; [ "$e" -gt 1024 ] && e=1024; echo "throughput=$e memory=$((GEAR_NUM_ENV * 1000000 + 100000000))"`
	code, out, errOut := gmiRun(t, "gmi", "search", "--topology", gmiTopologies+"a100-2x.toml", "--max-gmi", "3", "--max-env", "8192", "--", "sh", "-c", bench)
	if code != 0 {
		t.Fatalf("search: %d %s\n%s", code, errOut, out)
	}
	for _, want := range []string{"GMI/GPU", "saturated", "best: 3 GMIs per GPU, num_env 1024", "on 2 GPU(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("search output lacks %q:\n%s", want, out)
		}
	}
	if regexp.MustCompile(`(?m)^\d+ +4096 `).MatchString(out) {
		t.Errorf("search ran past the saturation point:\n%s", out)
	}
	code, out, _ = gmiRun(t, "gmi", "search", "--topology", gmiTopologies+"a100-2x.toml", "--max-gmi", "1", "--max-env", "256", "--json", "--", "sh", "-c", "exit 3")
	var res struct {
		Found bool `json:"found"`
		Rows  []struct {
			Verdict string `json:"verdict"`
			Why     string `json:"why"`
		} `json:"rows"`
	}
	if code != 1 || json.Unmarshal([]byte(out), &res) != nil || res.Found || len(res.Rows) != 2 || res.Rows[0].Verdict != "not runnable" || !strings.Contains(res.Rows[0].Why, "exit status 3") {
		t.Errorf("failing benchmark: %d %+v\n%s", code, res, out)
	}
	for _, args := range [][]string{
		{"gmi", "search"},
		{"gmi", "search", "--alpha", "0", "--", "true"},
		{"gmi", "search", "--min-env", "0", "--", "true"},
		{"gmi", "search", "--topology", gmiTopologies + "a100-2x.toml", "--gpu", "7", "--", "true"},
		{"gmi", "search", "--max-gmi", "200", "--", "true"},
	} {
		if code, _, _ := gmiRun(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func TestGMICommandUsage(t *testing.T) {
	if code, _, errOut := gmiRun(t, "gmi"); code != 2 || !strings.Contains(errOut, "gearrun gmi plan") {
		t.Errorf("gmi: %d %s", code, errOut)
	}
	if code, out, _ := gmiRun(t, "gmi", "help"); code != 0 || !strings.Contains(out, "search") {
		t.Errorf("gmi help: %d %s", code, out)
	}
	if code, _, errOut := gmiRun(t, "gmi", "frobnicate"); code != 2 || !strings.Contains(errOut, `unknown subcommand "frobnicate"`) {
		t.Errorf("gmi frobnicate: %d %s", code, errOut)
	}
}
