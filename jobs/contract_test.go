package jobs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/rank"
)

// A SLURM task's rank reads (rank.FromLookup) the place srun gave the task,
// with the role the spec gives it: a later generation's restart count and
// checkpoint directory as srun passes them, the spec's rendezvous timeout,
// nothing of a place the task's own environment had, and no GEAR_* or
// device variable that rank.LauncherEnv does not list.
func TestSlurmTaskEnvironDecodes(t *testing.T) {
	spec, err := Parse([]byte(`
name = "env"
[launch]
rdzv_timeout = "17s"
restarts = 3
[[group]]
role = "actor"
np = 2
command = ["sh", "-c", "env"]
[[group]]
role = "trainer"
np = 2
gpus_per_rank = 1
command = ["sh", "-c", "env"]
`), "env.toml")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{
		rank.EnvSlurmProcID: "3", rank.EnvSlurmNTasks: "4", rank.EnvSlurmLocalID: "1",
		rank.EnvSlurmNodeID: "1", rank.EnvSlurmNodeList: "n[1-2]", rank.EnvSlurmJobID: "77",
		rank.EnvSlurmTasksPerNode: "2(x2)", rank.EnvCUDAVisibleDevices: "0,1",
		rank.EnvTopology: "../examples/topologies/dgx-a100.toml",
		// What gearrun run --slurm puts in srun's environment.
		rank.EnvRdzvAddr: "n1:29577", rank.EnvJobID: "11111111-2222-3333-4444-555555555555",
		rank.EnvJobToken: "secret", rank.EnvRestartCount: "2", rank.EnvCheckpointDir: "/ckpt/j",
		rank.EnvTorchMasterAddr: "n1", rank.EnvTorchMasterPort: "29601",
		rank.EnvRank: "99", // leaked from an outer launch: must be ignored
	}
	// The task's own environment: a place of another job's, every name of it.
	base := []string{"PATH=" + os.Getenv("PATH"), rank.EnvOMPNumThreads + "=4"}
	for _, name := range rank.LauncherEnv() {
		base = append(base, name+"=9")
	}
	var stdout, stderr bytes.Buffer
	task := &SlurmTask{
		Spec: spec, SpecPath: "env.toml",
		Lookup:  func(k string) (string, bool) { v, ok := vars[k]; return v, ok },
		Environ: base,
		Stdout:  &stdout, Stderr: &stderr,
	}
	if code, err := task.Run(context.Background()); err != nil || code != 0 {
		t.Fatalf("Run: %d %v\n%s", code, err, stderr.String())
	}
	got := map[string]string{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	info, err := rank.FromLookup(func(k string) (string, bool) { v, ok := got[k]; return v, ok })
	if err != nil {
		t.Fatalf("the rank's environment: %v", err)
	}
	want := rank.Info{
		Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, NodeRank: 1, NumNodes: 2,
		Role: "trainer", RoleRank: 1, RdzvAddr: "n1:29577", RdzvTimeout: 17 * time.Second,
		JobID: "11111111-2222-3333-4444-555555555555", Token: "secret",
		Restart: 2, CheckpointDir: "/ckpt/j", Source: rank.SourceGear,
	}
	if info != want {
		t.Errorf("the rank reads\n %#v\nwant %#v", info, want)
	}
	listed := rank.LauncherEnv()
	for k := range got {
		if (strings.HasPrefix(k, "GEAR_") || strings.HasPrefix(k, "CUDA_")) && !slices.Contains(listed, k) {
			t.Errorf("the task sets %s, which rank.LauncherEnv does not list", k)
		}
	}
	// The binding and the spec's path are the task's, not the inherited ones;
	// torchrun's default gives way to the task's own value.
	for k, v := range map[string]string{
		rank.EnvCUDAVisibleDevices: "1", rank.EnvGMILayout: "[[2],[3]]",
		rank.EnvOMPNumThreads: "4", rank.EnvTorchRestartCount: "2", rank.EnvTorchMaxRestarts: "3",
	} {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if !strings.HasSuffix(got[rank.EnvJobSpec], "/env.toml") {
		t.Errorf("%s=%q, want the spec's absolute path", rank.EnvJobSpec, got[rank.EnvJobSpec])
	}
}

// A job spec's env may set no variable that the launcher sets for a rank
// (rank.LauncherEnv), in [launch.env] or a group's env, and may set others.
func TestValidateRefusesLauncherEnv(t *testing.T) {
	for _, name := range rank.LauncherEnv() {
		for _, tc := range []struct{ spec, field string }{
			{validBase + "[launch.env]\n" + name + " = \"x\"\n", "launch.env." + name},
			{validMPMD + "[group.env]\n" + name + " = \"x\"\n", "group[1].env." + name},
		} {
			s, err := Parse([]byte(tc.spec), "")
			if err == nil {
				err = s.Validate()
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Problem, "set by the launcher") {
				t.Errorf("%s: got %v, want %s refused as set by the launcher", name, err, tc.field)
			}
		}
	}
	for _, name := range []string{"MY_VAR", rank.EnvTorchRank, rank.EnvOMPNumThreads, rank.EnvTransport} {
		s, err := Parse([]byte(validBase+"[launch.env]\n"+name+" = \"x\"\n"), "")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v, want it accepted", name, err)
		}
	}
}
