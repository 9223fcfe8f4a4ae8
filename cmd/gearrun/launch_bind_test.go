package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/rank"
)

// bindingVars are the variables a rank's GPU binding consists of
// (rank.DeviceEnv); the "env" helper writes the ones it has (with its role)
// to env.<rank> in its directory.
var bindingVars = append(rank.DeviceEnv(), rank.EnvRole)

func writeBindingEnv(dir string, r int) int {
	got := map[string]string{}
	for _, k := range bindingVars {
		if v, ok := os.LookupEnv(k); ok {
			got[k] = v
		}
	}
	b, _ := json.Marshal(got)
	tmp := filepath.Join(dir, fmt.Sprintf("env.%d.tmp", r))
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("env.%d", r))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func topologyFile(name string) string {
	return filepath.Join("..", "..", "examples", "topologies", name)
}

// bindRun runs this test binary as gearrun with args, in which "PROG" stands
// for the rank program (this binary in "env" helper mode), and returns each
// rank's binding variables, gearrun's exit code and its stderr. The
// launcher's own environment has no binding variables unless extra sets them.
func bindRun(t *testing.T, extra []string, args ...string) (envs []map[string]string, code int, stderr string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	full := []string{"-x", envHelper + "=env", "-x", envDir + "=" + dir}
	for _, a := range args {
		if a == "PROG" {
			a = self
		}
		full = append(full, a)
	}
	cmd := exec.Command(self, full...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !contains(bindingVars, name) && name != rank.EnvTopology {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envAsGearrun+"=1", rank.EnvRuntimeDir+"="+t.TempDir())
	cmd.Env = append(cmd.Env, extra...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err = cmd.Run()
	code = exitCode(err)
	for r := 0; ; r++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("env.%d", r)))
		if err != nil {
			break
		}
		m := map[string]string{}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		envs = append(envs, m)
	}
	return envs, code, errb.String()
}

// wantEnv checks one rank's binding variables exactly (GEAR_ROLE aside unless
// want names it); "" in want means unset.
func wantEnv(t *testing.T, r int, got, want map[string]string) {
	t.Helper()
	for _, k := range bindingVars {
		w, named := want[k]
		if k == rank.EnvRole && !named {
			continue
		}
		g, set := got[k]
		if g != w || (w == "" && set) {
			t.Errorf("rank %d: %s=%q (set %v), want %q", r, k, g, set, w)
		}
	}
}

func TestBindLaunchMPS2x3(t *testing.T) {
	envs, code, stderr := bindRun(t, nil, "--topology", topologyFile("a100-2x.toml"), "--gmi-per-gpu", "3", "-np", "6", "PROG")
	if code != 0 || len(envs) != 6 {
		t.Fatalf("exit %d, %d ranks reported; stderr:\n%s", code, len(envs), stderr)
	}
	for r, env := range envs {
		wantEnv(t, r, env, map[string]string{
			rank.EnvCUDAVisibleDevices: strconv.Itoa(r / 3),
			rank.EnvCUDADeviceOrder:    "PCI_BUS_ID",
			rank.EnvMPSThreadPercent:   "33",
			rank.EnvGMILayout:          "[[0,1,2],[3,4,5]]",
		})
	}
}

// MIG mode on: each rank gets one MIG instance by UUID, whatever profile it
// is, and a warning says the profiles differ.
func TestBindLaunchMixedMIG(t *testing.T) {
	envs, code, stderr := bindRun(t, nil, "--topology", topologyFile("a100-mig-mixed.toml"),
		"--gmi-per-gpu", "4", "--gmi-workload", "serving", "-np", "7", "PROG")
	if code != 0 || len(envs) != 7 {
		t.Fatalf("exit %d, %d ranks reported; stderr:\n%s", code, len(envs), stderr)
	}
	migs := []string{
		"MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f01", "MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f02",
		"MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f03", "MIG-1f6d2a40-8b3c-5e7f-a1d2-3c4b5a6e7f04",
		"MIG-2a7e3b51-9c4d-5f80-b2e3-4d5c6b7f8a01", "MIG-2a7e3b51-9c4d-5f80-b2e3-4d5c6b7f8a02",
		"MIG-2a7e3b51-9c4d-5f80-b2e3-4d5c6b7f8a03",
	}
	for r, env := range envs {
		wantEnv(t, r, env, map[string]string{rank.EnvCUDAVisibleDevices: migs[r], rank.EnvGMILayout: "[[0,1,2,3],[4,5,6]]"})
	}
	if !strings.Contains(stderr, "gearrun: warning: group 0: GPU 0: ranks get unequal MIG instances (3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb)") {
		t.Errorf("no warning about unequal MIG instances; stderr:\n%s", stderr)
	}
}

// sm_70: MPS is the only backend, even for serving, and GEAR_TOPOLOGY works
// as --topology does.
func TestBindLaunchSm70(t *testing.T) {
	envs, code, stderr := bindRun(t, []string{rank.EnvTopology + "=" + topologyFile("v100-4x.toml")},
		"--gmi-per-gpu", "2", "--gmi-workload", "serving", "--mps-mem-limit", "4G", "-np", "3", "PROG")
	if code != 0 || len(envs) != 3 {
		t.Fatalf("exit %d, %d ranks reported; stderr:\n%s", code, len(envs), stderr)
	}
	for r, env := range envs {
		wantEnv(t, r, env, map[string]string{
			rank.EnvCUDAVisibleDevices: strconv.Itoa(r / 2),
			rank.EnvCUDADeviceOrder:    "PCI_BUS_ID",
			rank.EnvMPSThreadPercent:   "50",
			rank.EnvMPSPinnedMemLimit:  "0=4096M",
			rank.EnvGMILayout:          "[[0,1],[2]]",
		})
	}
}

// MPMD: each group binds as its flags say (the flags before the first
// program are every group's defaults); bound groups get distinct GPUs, and a
// whole-GPU rank keeps no MPS share from the launcher's environment while an
// unbound rank inherits the launcher's variables untouched.
func TestBindLaunchMPMD(t *testing.T) {
	envs, code, stderr := bindRun(t, []string{rank.EnvMPSThreadPercent + "=10", rank.EnvCUDAVisibleDevices + "=1,2,3,4"},
		"--topology", topologyFile("dgx-a100.toml"), "--gmi-per-gpu", "2",
		"-np", "2", "--role", "learner", "PROG", ":",
		"-np", "2", "--role", "actor", "--bind", "none", "PROG", ":",
		"-np", "1", "--role", "server", "--gmi-per-gpu", "1", "--gmi-backend", "none", "PROG")
	if code != 0 || len(envs) != 5 {
		t.Fatalf("exit %d, %d ranks reported; stderr:\n%s", code, len(envs), stderr)
	}
	learner := map[string]string{rank.EnvRole: "learner", rank.EnvCUDAVisibleDevices: "1", rank.EnvCUDADeviceOrder: "PCI_BUS_ID",
		rank.EnvMPSThreadPercent: "50", rank.EnvGMILayout: "[[0,1]]"}
	actor := map[string]string{rank.EnvRole: "actor", rank.EnvCUDAVisibleDevices: "1,2,3,4", rank.EnvMPSThreadPercent: "10"}
	server := map[string]string{rank.EnvRole: "server", rank.EnvCUDAVisibleDevices: "2", rank.EnvCUDADeviceOrder: "PCI_BUS_ID",
		rank.EnvGMILayout: "[[4]]"}
	for r, want := range []map[string]string{learner, learner, actor, actor, server} {
		wantEnv(t, r, envs[r], want)
	}
}

func TestBindLaunchErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"more ranks than GPUs x K", []string{"--topology", topologyFile("a100-2x.toml"), "--gmi-per-gpu", "3", "-np", "7", "PROG"}, 1,
			"gearrun: launch: group 0: GPU binding: 7 ranks at 3 GMIs per GPU need 3 GPUs; the topology file ../../examples/topologies/a100-2x.toml has 2\n"},
		{"more GMIs than MIG instances", []string{"--topology", topologyFile("a100-mig-mixed.toml"), "--gmi-per-gpu", "4", "-np", "8", "PROG"}, 1,
			"GPU 1 (NVIDIA A100-SXM4-40GB, sm_80) has 3 MIG instances (2g.10gb, 2g.10gb, 2g.10gb) but the plan puts 4 ranks on it"},
		{"MIG on a GPU without MIG mode", []string{"--topology", topologyFile("a100-2x.toml"), "--gmi-backend", "mig", "--gmi-per-gpu", "2", "-np", "2", "PROG"}, 1,
			"MIG asked but MIG mode is off (gear never changes it; an administrator turns it on with nvidia-smi -i 0 -mig 1)"},
		{"MIG below sm_80", []string{"--topology", topologyFile("v100-4x.toml"), "--gmi-backend", "mig", "-np", "1", "PROG"}, 1,
			"GPU 0 (Tesla V100-SXM2-32GB, sm_70): MIG needs sm_80 or later"},
		{"GMIs below sm_70", []string{"--topology", topologyFile("p100-2x.toml"), "--gmi-per-gpu", "2", "-np", "2", "PROG"}, 1,
			"below sm_70 there is no GMI backend"},
		{"bad topology file", []string{"--topology", "no-such.toml", "--bind", "gpu", "-np", "1", "PROG"}, 1, "no-such.toml"},
		{"bad --bind", []string{"--bind", "cpu", "-np", "1", "PROG"}, 2, `--bind "cpu": want gpu or none`},
		{"bad backend", []string{"--gmi-backend", "vgpu", "-np", "1", "PROG"}, 2, `--gmi-backend: gmi: backend "vgpu"`},
		{"bad workload", []string{"--gmi-workload", "inference", "-np", "1", "PROG"}, 2, `--gmi-workload: gmi: workload "inference"`},
		{"bad memory limit", []string{"--mps-mem-limit", "lots", "-np", "1", "PROG"}, 2, `--mps-mem-limit: gmi: memory limit "lots"`},
		{"K out of range", []string{"--gmi-per-gpu", "0", "-np", "1", "PROG"}, 2, "--gmi-per-gpu 0: want 1 to 100"},
		{"--bind none with GMIs", []string{"--bind", "none", "--gmi-per-gpu", "2", "-np", "1", "PROG"}, 2, "--bind none with --gmi-per-gpu"},
		{"--topology without binding", []string{"--topology", topologyFile("a100-2x.toml"), "-np", "1", "PROG"}, 2, "--topology needs GPU binding"},
		{"-x fights the binding", []string{"--topology", topologyFile("a100-2x.toml"), "--bind", "gpu", "-x", "CUDA_VISIBLE_DEVICES=1", "-np", "1", "PROG"}, 2,
			"-x CUDA_VISIBLE_DEVICES: set by the launcher for each rank"},
	} {
		t.Run(c.name, func(t *testing.T) {
			envs, code, stderr := bindRun(t, nil, c.args...)
			if code != c.code || !strings.Contains(stderr, c.want) || len(envs) != 0 {
				t.Errorf("exit %d (want %d), %d ranks ran; stderr:\n%s\nwant it to contain %q", code, c.code, len(envs), stderr, c.want)
			}
		})
	}
}

// No GPUs found: the error names the topology source, whichever it is.
func TestBindNoGPUs(t *testing.T) {
	defer func(d func(context.Context, string) (*gmi.Topology, error)) { launchDiscover = d }(launchDiscover)
	launchDiscover = func(context.Context, string) (*gmi.Topology, error) {
		return &gmi.Topology{Source: gmi.SourceNone, Reason: "NVML: ERROR_LIBRARY_NOT_FOUND"}, nil
	}
	var out, errb bytes.Buffer
	code := run([]string{"--dry-run", "--bind", "gpu", "-np", "1", "/bin/true"}, stdio{strings.NewReader(""), &out, &errb})
	want := "gearrun: launch: group 0: GPU binding: no GPUs found (NVML: ERROR_LIBRARY_NOT_FOUND); a topology file (GEAR_TOPOLOGY, or gearrun --topology) can describe the GPUs\n"
	if code != 1 || errb.String() != want {
		t.Errorf("exit %d, stderr %q; want 1, %q", code, errb.String(), want)
	}
	empty := filepath.Join(t.TempDir(), "empty.toml")
	if err := os.WriteFile(empty, []byte("[mps]\nrunning = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	launchDiscover = gmiDiscover
	errb.Reset()
	code = run([]string{"--dry-run", "--topology", empty, "--gmi-per-gpu", "2", "-np", "2", "/bin/true"}, stdio{strings.NewReader(""), &out, &errb})
	if want := "no GPUs found: the topology file " + empty + " lists none"; code != 1 || !strings.Contains(errb.String(), want) {
		t.Errorf("exit %d, stderr %q; want 1 and %q", code, errb.String(), want)
	}
}

// Without binding flags nothing looks for GPUs: no NVML, no topology file.
func TestNoBindingNoDiscovery(t *testing.T) {
	t.Setenv(rank.EnvRuntimeDir, t.TempDir())
	t.Setenv(rank.EnvTopology, "/no/such/topology.toml")
	defer func(d func(context.Context, string) (*gmi.Topology, error)) { launchDiscover = d }(launchDiscover)
	launchDiscover = func(context.Context, string) (*gmi.Topology, error) {
		t.Error("a launch without binding flags discovered GPUs")
		return nil, fmt.Errorf("no")
	}
	for _, args := range [][]string{
		{"--dry-run", "-np", "4", "/bin/true"},
		{"-np", "2", "/bin/true"},
		{"-np", "1", "/bin/true", ":", "-np", "1", "--bind", "none", "/bin/true"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, stdio{strings.NewReader(""), &out, &errb}); code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errb.String())
		}
		if strings.Contains(out.String(), "device") || strings.Contains(out.String(), "gpus") {
			t.Errorf("%v: a binding in the plan:\n%s", args, out.String())
		}
	}
}

func TestBindDryRun(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"--dry-run", "--job-id", "job-8", "--topology", topologyFile("a100-2x.toml"),
		"-np", "1", "--role", "actor", "./actor", ":", "-np", "3", "--role", "learner", "--gmi-per-gpu", "2", "./learner"},
		stdio{strings.NewReader(""), &out, &errb})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := `job job-8: 4 ranks on 1 node(s)
rendezvous 127.0.0.1:0 (port chosen at launch), timeout 1m0s, token ****
torch env: MASTER_ADDR=127.0.0.1 MASTER_PORT=(a free port reserved at launch)
role actor: ranks 0
role learner: ranks 1-3
gpus group 1 (role learner, ranks 1-3): topology file ../../examples/topologies/a100-2x.toml
  GPUs 0,1, 2 per GPU, backend mps (training: GMIs must communicate, which MPS allows and MIG does not)
  GEAR_GMI_LAYOUT=[[1,2],[3]], strategy hierarchical (Algorithm 1: GPUs hold different numbers of GMIs)
shared memory node 0: 4 ranks, at most 32.4 MiB (4 inboxes of 4 rings of 2.0 MiB, a board of 388.0 KiB), 32.0 KiB at setup
rank 0: local 0/4 node 0 role "actor"/0: ./actor
rank 1: local 1/4 node 0 role "learner"/0: ./learner
  device GPU 0 GMI 0 mps 50%: CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
rank 2: local 2/4 node 0 role "learner"/1: ./learner
  device GPU 0 GMI 1 mps 50%: CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
rank 3: local 3/4 node 0 role "learner"/2: ./learner
  device GPU 1 GMI 0 mps 50%: CUDA_VISIBLE_DEVICES=1 CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
`
	if out.String() != want {
		t.Fatalf("dry run:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	code = run([]string{"--dry-run", "--json", "--topology", topologyFile("h100-mig-7x1g.toml"), "--gmi-per-gpu", "2", "-np", "2", "/bin/true"},
		stdio{strings.NewReader(""), &out, &errb})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var plan struct {
		GPUPlans []struct {
			Backend string `json:"backend"`
			Layout  string `json:"layout"`
		} `json:"gpu_plans"`
		Ranks []struct {
			Device struct {
				Backend    string `json:"backend"`
				MIGProfile string `json:"mig_profile"`
			} `json:"device"`
			Environ []string `json:"environ"`
		} `json:"ranks"`
	}
	if err := json.Unmarshal(out.Bytes(), &plan); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	// One H100 in MIG mode: each rank gets one of its instances (auto picks MIG).
	if len(plan.GPUPlans) != 1 || plan.GPUPlans[0].Backend != "mig" || plan.GPUPlans[0].Layout != "[[0,1]]" ||
		plan.Ranks[1].Device.MIGProfile != "1g.10gb" || !contains(plan.Ranks[1].Environ, "GEAR_GMI_LAYOUT=[[0,1]]") {
		t.Fatalf("plan:\n%s", out.String())
	}
}
