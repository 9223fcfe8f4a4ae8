package jobs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// fakeSrun is a stand-in for srun on one node: it starts --ntasks copies of the
// command with SLURM's per-task variables, waits for all, and exits with the
// highest status. With --kill-on-bad-exit it does not kill the others; the tests
// do not depend on it.
const fakeSrun = `#!/bin/sh
n=1
while [ $# -gt 0 ]; do
	case "$1" in
	--ntasks=*) n=${1#--ntasks=} ;;
	--*) ;;
	*) break ;;
	esac
	shift
done
i=0
pids=""
# As srun does, pass SIGTERM and SIGINT on to the tasks: a stopped step leaves
# no task behind.
trap 'kill -TERM $pids 2>/dev/null' TERM INT
while [ $i -lt $n ]; do
	SLURM_PROCID=$i SLURM_NTASKS=$n SLURM_LOCALID=$i SLURM_NODEID=0 \
	SLURM_JOB_NUM_NODES=1 SLURM_TASKS_PER_NODE=$n SLURMD_NODENAME=fakenode "$@" &
	pids="$pids $!"
	i=$((i + 1))
done
rc=0
for p in $pids; do
	wait $p
	s=$?
	if [ $s -gt $rc ]; then rc=$s; fi
done
exit $rc
`

// runFakeSlurm runs spec through SlurmRun with the fake srun, whose tasks are
// this test binary acting as `gearrun run --slurm-task`.
func runFakeSlurm(t *testing.T, doc string) (*Result, string, string) {
	t.Helper()
	dir := t.TempDir()
	srun := filepath.Join(dir, "srun")
	if err := os.WriteFile(srun, []byte(fakeSrun), 0o755); err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(dir, "job.toml")
	if err := os.WriteFile(specPath, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	spec, err := Load(specPath)
	if err != nil {
		t.Fatal(err)
	}
	jobDir := filepath.Join(dir, "state")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(envTestTask, "1")
	t.Setenv(rank.EnvSlurmJobID, "4242")
	t.Setenv(rank.EnvSlurmNodeList, "127.0.0.1")
	t.Setenv(rank.EnvJobID, "")
	t.Setenv(rank.EnvJobToken, "")
	var stdout, stderr geartest.Buffer
	sr := &SlurmRun{
		Spec: spec, SpecPath: specPath, JobDir: jobDir,
		Gearrun: self, TaskArgs: []string{}, Srun: srun, ListenAddr: "127.0.0.1:0",
		Stdout: &stdout, Stderr: &stderr, NoSweep: true,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// When the test is done (a test that plays a stuck node ends its task
	// itself), no process of the step may be left.
	t.Cleanup(func() {
		if left := tasksLeft(dir, 30*time.Second); len(left) > 0 {
			t.Errorf("processes of the step left after the job ended: %v", left)
			for _, pid := range left {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	res, err := sr.Run(ctx)
	if err != nil {
		t.Fatalf("SlurmRun: %v\nstderr:\n%s", err, stderr.String())
	}
	return res, stdout.String(), stderr.String()
}

// tasksLeft returns the processes whose command line names dir (the step's
// tasks and their ranks), waiting up to patience for them to end.
func tasksLeft(dir string, patience time.Duration) []int {
	deadline := time.Now().Add(patience)
	for {
		var left []int
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err != nil || !bytes.Contains(b, []byte(dir)) {
				continue
			}
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
				left = append(left, pid)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSlurmRunMPMDRendezvous(t *testing.T) {
	res, out, errOut := runFakeSlurm(t, `
name = "mpmd-test"
[launch]
rdzv_timeout = "90s"
[launch.env]
`+envTestRank+` = "1"
`+envTestTask+` = "0"
[[group]]
role = "actor"
np = 2
command = ["`+os.Args[0]+`"]
[[group]]
role = "trainer"
np = 1
command = ["`+os.Args[0]+`"]
`)
	if res.ExitCode != 0 {
		t.Fatalf("exit code %d, message %q\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Message, out, errOut)
	}
	for _, want := range []string{
		`rank 0/3 role "actor" 0/2 spec mpmd-test`,
		`rank 1/3 role "actor" 1/2 spec mpmd-test`,
		`rank 2/3 role "trainer" 0/1 spec mpmd-test`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\nstderr:\n%s", want, out, errOut)
		}
	}
	if !strings.Contains(res.Message, "completed") {
		t.Errorf("message %q", res.Message)
	}
	// The ranks made metrics segments (rank.Init); no launcher lives on a
	// SLURM node to remove them, so their tasks do.
	m := regexp.MustCompile(`spec mpmd-test job (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no job ID in the output:\n%s", out)
	}
	if left, _ := filepath.Glob(filepath.Join("/dev/shm", rank.SegmentName(m[1], "*"))); len(left) != 0 {
		for _, p := range left {
			os.Remove(p) // no litter from this test's failure
		}
		t.Errorf("segments of the job left in /dev/shm: %v", left)
	}
}

func TestSlurmRunFailingRank(t *testing.T) {
	res, out, errOut := runFakeSlurm(t, `
name = "fails"
[launch]
np = 3
grace = "1s"
command = ["sh", "-c", "if [ \"$GEAR_RANK\" = 1 ]; then echo \"$GEAR_ROLE_RANK $GEAR_WORLD_SIZE\"; exit 7; fi"]
`)
	if res.ExitCode != 7 {
		t.Errorf("exit code %d, want the failed rank's 7", res.ExitCode)
	}
	want := "job fails failed: rank 1 on fakenode exited with status 7"
	if res.Message != want {
		t.Errorf("message %q, want %q", res.Message, want)
	}
	if !strings.Contains(errOut, "gearrun: rank 1 on fakenode exited with status 7") {
		t.Errorf("stderr lacks the rank's message:\n%s", errOut)
	}
	if !strings.Contains(out, "1 3") {
		t.Errorf("rank 1 did not see GEAR_ROLE_RANK and GEAR_WORLD_SIZE: %q", out)
	}
	if len(res.FailedRanks) != 1 || res.FailedRanks[0].Rank != 1 || res.FailedRanks[0].Status != 7 {
		t.Errorf("failed ranks %+v", res.FailedRanks)
	}
}

// TestSlurmRunNamesKilledRank: a rank killed by SIGKILL is the failure that
// gearrun names, even when a peer exited with an error a moment earlier (as
// the peers of a lost node do).
func TestSlurmRunNamesKilledRank(t *testing.T) {
	res, _, errOut := runFakeSlurm(t, `
name = "killed"
[launch]
np = 3
grace = "1s"
command = ["sh", "-c", "case $GEAR_RANK in 0) exit 1 ;; 1) sleep 0.2; kill -9 $$ ;; esac"]
`)
	want := "job killed failed: rank 1 on fakenode was killed by signal killed"
	if res.Message != want || res.ExitCode != 137 {
		t.Errorf("exit %d message %q, want 137 and %q\nstderr:\n%s", res.ExitCode, res.Message, want, errOut)
	}
	if len(res.FailedRanks) != 2 || res.FailedRanks[0].Rank != 0 || res.FailedRanks[1].Signal != "killed" {
		t.Errorf("failed ranks %+v, want rank 0's exit, then rank 1's kill", res.FailedRanks)
	}
}

// TestSlurmRunStopsStuckStep: the world fails (here a rank never joins) but
// srun does not end (one of its tasks hangs, as the tasks of a dead node do
// for srun): gearrun stops srun [launch].grace later and names the failure.
func TestSlurmRunStopsStuckStep(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	res, _, errOut := runFakeSlurm(t, `
name = "stuck"
[launch]
np = 2
grace = "1s"
rdzv_timeout = "1s"
[launch.env]
`+envTestRank+` = "1"
`+envTestTask+` = "0"
[[group]]
role = "joins"
np = 1
command = ["`+os.Args[0]+`"]
[[group]]
role = "hangs"
np = 1
command = ["sh", "-c", "echo $$ > `+pidFile+`; exec sleep 60"]
`)
	if b, err := os.ReadFile(pidFile); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if res.ExitCode == 0 || !strings.HasPrefix(res.Message, "job stuck failed: rendezvous failed: ") {
		t.Errorf("exit %d message %q, want a failure naming the rendezvous\nstderr:\n%s", res.ExitCode, res.Message, errOut)
	}
	if !strings.Contains(errOut, "gearrun: srun has not ended 1s after the rendezvous failed") {
		t.Errorf("stderr lacks the news of srun's stop:\n%s", errOut)
	}
	// Well before the context's 2 minutes: the stuck step was stopped, not
	// waited out (a busy machine takes longer than an idle one's few seconds).
	if d := time.Since(start); d > 90*time.Second {
		t.Errorf("the job took %v", d)
	}
}

func TestFirstFailure(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	exit := func(r int, at time.Duration, signal string) RankExit {
		return RankExit{Rank: r, Status: 1, Signal: signal, At: t0.Add(at)}
	}
	for _, tc := range []struct {
		name  string
		exits []RankExit
		want  int
	}{
		{"one", []RankExit{exit(3, 0, "")}, 3},
		{"earliest exit", []RankExit{exit(2, 0, ""), exit(0, 10*time.Millisecond, "")}, 2},
		{"killed just after", []RankExit{exit(2, 0, ""), exit(0, 5*time.Millisecond, ""), exit(4, 20*time.Millisecond, "killed")}, 4},
		{"killed long after", []RankExit{exit(2, 0, ""), exit(4, 2*time.Second, "killed")}, 2},
		{"earliest killed", []RankExit{exit(5, 0, "killed"), exit(4, time.Millisecond, "segmentation fault")}, 5},
	} {
		if got := firstFailure(tc.exits); got.Rank != tc.want {
			t.Errorf("%s: rank %d, want %d", tc.name, got.Rank, tc.want)
		}
	}
}

func TestNodeAddrField(t *testing.T) {
	for out, want := range map[string]string{
		"NodeName=n2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.251.0.3 NodeHostName=vm Version=22.05.8\n": "10.251.0.3",
		"NodeName=gpu01 NodeAddr=gpu01 NodeHostName=gpu01":                                               "gpu01",
		"NodeName=gpu01 NodeAddr=(null)":                                                                 "",
		"Node n9 not found":                                                                              "",
	} {
		if got := nodeAddrField(out); got != want {
			t.Errorf("nodeAddrField(%q) = %q, want %q", out, got, want)
		}
	}
	if got := SlurmNodeAddr(context.Background(), "127.0.0.1"); got != "127.0.0.1" {
		t.Errorf("SlurmNodeAddr of an address: %q", got)
	}
}

func TestSlurmRunTimeout(t *testing.T) {
	res, _, errOut := runFakeSlurm(t, `
name = "slow"
[launch]
np = 2
timeout = "500ms"
grace = "1s"
command = ["sleep", "60"]
`)
	if res.ExitCode != 124 || !strings.Contains(res.Message, "timed out") {
		t.Errorf("exit %d message %q, want 124 and a timeout\nstderr:\n%s", res.ExitCode, res.Message, errOut)
	}
}

func TestSlurmRunBuildsGoPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go program")
	}
	pkg := filepath.Join(t.TempDir(), "prog")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	src := "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() { fmt.Println(\"built rank\", os.Getenv(\"GEAR_RANK\")) }\n"
	if err := os.WriteFile(filepath.Join(pkg, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// A Go package outside any module builds as a lone file set in GOPATH mode
	// only when GO111MODULE allows it; give it a module of its own instead.
	if err := os.WriteFile(filepath.Join(pkg, "go.mod"), []byte("module prog\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(pkg)
	res, out, errOut := runFakeSlurm(t, `
name = "built"
[launch]
np = 2
command = ["`+pkg+`"]
`)
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s\nstderr:\n%s", res.ExitCode, res.Message, errOut)
	}
	for _, want := range []string{"built rank 0", "built rank 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestSlurmTaskEnvironment(t *testing.T) {
	spec, err := Parse([]byte(`
name = "env"
[launch]
[launch.env]
SHARED = "all"
[[group]]
role = "actor"
np = 2
command = ["sh", "-c", "env"]
[[group]]
role = "trainer"
np = 2
gpus_per_rank = 2
command = ["sh", "-c", "env"]
[group.env]
SHARED = "trainer"
[slurm]
gpus_per_node = 4
`), "env.toml")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{
		rank.EnvSlurmProcID: "3", rank.EnvSlurmNTasks: "4", rank.EnvSlurmLocalID: "3",
		rank.EnvSlurmNodeID: "0", rank.EnvSlurmNodeList: "n[1-2]", rank.EnvSlurmJobID: "77",
		rank.EnvSlurmTasksPerNode: "4", rank.EnvRdzvAddr: "n1:29577", rank.EnvJobID: "11111111-2222-3333-4444-555555555555",
		rank.EnvJobToken: "secret", rank.EnvCUDAVisibleDevices: "4,5,6,7",
		rank.EnvTopology: "../examples/topologies/dgx-a100.toml", // the node: 8 GPUs
		rank.EnvRank:     "99",                                   // leaked from an outer launch: must be ignored
		// What gearrun run --slurm puts in srun's environment.
		rank.EnvTorchMasterAddr: "n1", rank.EnvTorchMasterPort: "29601",
	}
	var stdout, stderr bytes.Buffer
	task := &SlurmTask{
		Spec: spec, SpecPath: "env.toml",
		Lookup:  func(k string) (string, bool) { v, ok := vars[k]; return v, ok },
		Environ: []string{"PATH=" + os.Getenv("PATH"), "SHARED=outer", "KEEP=1"},
		Stdout:  &stdout, Stderr: &stderr,
	}
	code, err := task.Run(context.Background())
	if err != nil || code != 0 {
		t.Fatalf("Run: %d %v\n%s", code, err, stderr.String())
	}
	got := map[string]string{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	abs, _ := filepath.Abs("env.toml")
	want := map[string]string{
		rank.EnvRank: "3", rank.EnvWorldSize: "4", rank.EnvLocalRank: "3", rank.EnvLocalSize: "4",
		rank.EnvNodeRank: "0", rank.EnvNumNodes: "2", rank.EnvRole: "trainer", rank.EnvRoleRank: "1",
		rank.EnvRdzvAddr: "n1:29577", rank.EnvJobID: "11111111-2222-3333-4444-555555555555",
		rank.EnvJobToken: "secret", rank.EnvJobSpec: abs,
		// rank 2 (trainer 0) holds the node's GPUs 0-1 of 4,5,6,7; rank 3 the next two.
		rank.EnvCUDAVisibleDevices: "6,7",
		rank.EnvCUDADeviceOrder:    "PCI_BUS_ID",
		rank.EnvGMILayout:          "[[2],[3]]",
		"SHARED":                   "trainer",
		"KEEP":                     "1",
		// torchrun's contract: the node is torchrun's group, the role its role.
		"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
		"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "trainer", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2",
		"MASTER_ADDR": "n1", "MASTER_PORT": "29601", "TORCHELASTIC_RESTART_COUNT": "0",
		"TORCHELASTIC_RUN_ID": "11111111-2222-3333-4444-555555555555", "OMP_NUM_THREADS": "1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
}

// With [launch] torch_env = false a task sets none of torchrun's variables
// and needs no MASTER_ADDR; with it on, a task without them says which.
func TestSlurmTaskTorchEnvSwitch(t *testing.T) {
	vars := map[string]string{rank.EnvSlurmProcID: "0", rank.EnvSlurmNTasks: "1", rank.EnvSlurmNodeList: "n1",
		rank.EnvRdzvAddr: "n1:1", rank.EnvJobID: "11111111-2222-3333-4444-555555555555"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	spec, err := Parse([]byte("name=\"t\"\n[launch]\ntorch_env = false\ncommand = [\"sh\", \"-c\", \"env\"]\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	task := &SlurmTask{Spec: spec, Lookup: lookup, Environ: []string{"PATH=" + os.Getenv("PATH")}, Stdout: &stdout, Stderr: &bytes.Buffer{}}
	if code, err := task.Run(context.Background()); code != 0 || err != nil {
		t.Fatalf("Run: %d %v", code, err)
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		for _, name := range []string{"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"} {
			if strings.HasPrefix(line, name+"=") {
				t.Errorf("torch_env = false, yet the rank got %s", line)
			}
		}
	}
	on, err := Parse([]byte("name=\"t\"\n[launch]\ncommand = [\"true\"]\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	task = &SlurmTask{Spec: on, Lookup: lookup, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}
	if _, err := task.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "MASTER_ADDR and MASTER_PORT are not set") {
		t.Fatalf("Run without MASTER_ADDR: %v", err)
	}
}

func TestSlurmTaskRefusesMismatchedWorld(t *testing.T) {
	spec, err := Parse([]byte("name=\"w\"\n[launch]\nnp = 4\ncommand = [\"true\"]\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{rank.EnvSlurmProcID: "0", rank.EnvSlurmNTasks: "2", rank.EnvSlurmNodeList: "n1", rank.EnvRdzvAddr: "n1:1"}
	task := &SlurmTask{Spec: spec, Lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}
	_, err = task.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "srun started 2 tasks but the spec has 4 ranks") {
		t.Fatalf("Run: %v", err)
	}
}

func TestPlanFromSpec(t *testing.T) {
	spec, err := Load("../examples/jobs/mpmd.toml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := spec.Plan(t.Context(), "../examples/jobs/mpmd.toml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Size() != 4 || len(p.Roles) != 2 || p.Roles[0].Name != "actor" || p.Roles[1].Name != "trainer" {
		t.Fatalf("plan roles %+v", p.Roles)
	}
	if got := time.Duration(p.RdzvTimeout); got != 2*time.Minute {
		t.Errorf("rdzv timeout %v, want 2m", got)
	}
	abs, _ := filepath.Abs("../examples/jobs/mpmd.toml")
	env := p.Environ(1, p.RdzvAddr)
	for _, want := range []string{rank.EnvJobSpec + "=" + abs, "GEAR_TRANSPORT=tcp", "ACTOR_ENVS=16", rank.EnvRole + "=actor", rank.EnvRoleRank + "=1"} {
		if !slices.Contains(env, want) {
			t.Errorf("rank 1's environment lacks %s: %q", want, env)
		}
	}
	if slices.Contains(p.Environ(3, p.RdzvAddr), "ACTOR_ENVS=16") {
		t.Error("the trainer got the actor group's env")
	}
	var text bytes.Buffer
	if err := p.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`role trainer: ranks 3`).MatchString(text.String()) {
		t.Errorf("dry-run text:\n%s", text.String())
	}
	opts := spec.Options()
	if opts.Timeout != 10*time.Minute || opts.Grace != DefaultGrace || !opts.TagOutput {
		t.Errorf("options %+v", opts)
	}
}

func TestRendezvousPortMatchesRank(t *testing.T) {
	// rank.FromEnv derives the same port for ranks started by srun alone.
	info, err := rank.FromLookup(func(k string) (string, bool) {
		v, ok := map[string]string{
			rank.EnvSlurmProcID: "1", rank.EnvSlurmNTasks: "2", rank.EnvSlurmJobID: "123456",
			rank.EnvSlurmNodeList: "gpu[07-08]",
		}[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("gpu07:%d", RendezvousPort("123456")); info.RdzvAddr != want {
		t.Fatalf("rank derives %s, jobs %s", info.RdzvAddr, want)
	}
}

func TestSlurmTaskOutputDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	spec, err := Parse([]byte(`name = "o"
[launch]
np = 2
output_dir = "`+dir+`"
command = ["sh", "-c", "echo out $GEAR_RANK; echo err $GEAR_RANK >&2"]
`), "")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{rank.EnvSlurmProcID: "1", rank.EnvSlurmNTasks: "2", rank.EnvSlurmLocalID: "1",
		rank.EnvSlurmNodeList: "n1", rank.EnvRdzvAddr: "n1:1", rank.EnvJobID: "11111111-2222-3333-4444-555555555555",
		rank.EnvTorchMasterAddr: "n1", rank.EnvTorchMasterPort: "29500"}
	var stdout, stderr bytes.Buffer
	task := &SlurmTask{Spec: spec, Lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok },
		Stdout: &stdout, Stderr: &stderr}
	if code, err := task.Run(context.Background()); code != 0 || err != nil {
		t.Fatalf("Run: %d %v", code, err)
	}
	for file, want := range map[string]string{"rank.1.stdout": "out 1\n", "rank.1.stderr": "err 1\n"} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", file, b, err, want)
		}
	}
	if stdout.Len()+stderr.Len() != 0 {
		t.Errorf("output went to the task's streams too: %q %q", stdout.String(), stderr.String())
	}
}

// [launch].restarts under SLURM: rank 1 killed with SIGKILL in generations 0
// and 1 makes two more srun steps, each a new generation of the job with the
// same checkpoint directory; the third finishes and the job completes. One
// more kill than restarts ends the job with the rank's 137.
func TestSlurmRunRestarts(t *testing.T) {
	for _, c := range []struct {
		kills, code int
	}{{2, 0}, {3, 137}} {
		ckpt := filepath.Join(t.TempDir(), "ckpt")
		res, out, errOut := runFakeSlurm(t, fmt.Sprintf(`
name = "restarts"
[launch]
np = 2
grace = "1s"
restarts = 2
checkpoint_dir = %q
command = ["sh", "-c", "echo \"gen $GEAR_RESTART_COUNT torch $TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS ckpt $GEAR_CHECKPOINT_DIR\"; [ $GEAR_RANK = 1 ] && [ $GEAR_RESTART_COUNT -lt %d ] && kill -9 $$; exit 0"]
`, ckpt, c.kills))
		if res.ExitCode != c.code {
			t.Fatalf("%d kills: exit %d (%s), want %d\nstdout:\n%s\nstderr:\n%s", c.kills, res.ExitCode, res.Message, c.code, out, errOut)
		}
		for g := range 3 {
			if want := fmt.Sprintf("gen %d torch %d/2 ckpt %s", g, g, ckpt); strings.Count(out, want) != 2 {
				t.Errorf("%d kills: %q not printed by both ranks:\n%s", c.kills, want, out)
			}
		}
		lines := regexp.MustCompile(`(?m)^gearrun: restart (\d) of 2: rank 1 on fakenode was killed by signal killed$`).FindAllString(errOut, -1)
		if len(lines) != 2 {
			t.Errorf("%d kills: want 2 restart lines; stderr:\n%s", c.kills, errOut)
		}
		// The lines are the ones every launch path prints.
		for n := 1; n <= 2; n++ {
			if want := launch.RestartLine("gearrun", n, 2, "rank 1 on fakenode was killed by signal killed", ""); !strings.Contains(errOut, want+"\n") {
				t.Errorf("%d kills: stderr lacks RestartLine's %q:\n%s", c.kills, want, errOut)
			}
		}
		if strings.Contains(out, "gen 3") {
			t.Errorf("%d kills: a fourth generation ran:\n%s", c.kills, out)
		}
		// It says where the checkpoints go as it starts, as a local job does.
		said := regexp.MustCompile(`(?m)^gearrun: job (\S+) \(restarts = 2\): checkpoints in .*$`).FindAllStringSubmatch(errOut, -1)
		if len(said) != 1 || said[0][0] != launch.CheckpointLine(said[0][1], "restarts = 2", ckpt) {
			t.Errorf("%d kills: stderr lacks the checkpoint line, once:\n%s", c.kills, errOut)
		}
	}
}

func TestShrunkWorld(t *testing.T) {
	spec := func(np, minNP, perNode int) *Spec {
		return &Spec{Launch: Launch{NP: np, MinNP: minNP, Restarts: 1}, Slurm: Slurm{Nodes: 3, NTasksPerNode: perNode}}
	}
	for _, tc := range []struct {
		s           *Spec
		nodes, left int
		want        int
		err         string
	}{
		{spec(6, 4, 2), 3, 2, 4, ""},
		{spec(6, 4, 2), 3, 3, 6, ""},
		{spec(6, 5, 2), 3, 2, 0, "2 nodes left hold 4 ranks, fewer than the 5 the job needs at least (launch.min_np)"},
		{spec(6, 0, 2), 3, 2, 0, "2 nodes left hold 4 ranks, fewer than the job's 6 (launch.min_np makes its size elastic)"},
		{spec(5, 2, 0), 3, 2, 4, ""}, // 2 a node, as the first world's share
		{spec(6, 4, 2), 3, 0, 0, "no node is left"},
	} {
		got, err := shrunkWorld(tc.s, tc.nodes, tc.left)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && err.Error() != tc.err {
			t.Errorf("shrunkWorld(np %d min %d, %d of %d nodes) = %d, %v; want %d, %q", tc.s.Launch.NP, tc.s.Launch.MinNP, tc.left, tc.nodes, got, err, tc.want, tc.err)
		}
	}
}

func TestKilledNodes(t *testing.T) {
	g := &slurmGeneration{
		slurmJob: &slurmJob{
			s:          &Spec{Launch: Launch{NP: 6, MinNP: 4, Restarts: 1}, Slurm: Slurm{Nodes: 3, NTasksPerNode: 2}},
			allocation: []string{"n1", "n2", "n3"},
			getenv: func(k string) string {
				if k == "SLURM_TASKS_PER_NODE" {
					return "2(x3)"
				}
				return ""
			},
		},
		hosts: []string{"n1", "n2", "n3"}, world: 6,
	}
	kill := func(r int, host string) RankExit { return RankExit{Rank: r, Host: host, Status: 137, Signal: "killed"} }
	fail := func(r int, host string) RankExit { return RankExit{Rank: r, Host: host, Status: 1} }
	for _, tc := range []struct {
		name  string
		exits []RankExit
		want  []string
	}{
		{"both ranks of n2 killed", []RankExit{kill(2, "n2"), fail(0, "n1"), kill(3, "n2"), fail(5, "n3")}, []string{"n2"}},
		{"one rank of n2 killed", []RankExit{kill(2, "n2"), fail(0, "n1"), fail(3, "n2")}, nil},
		{"only one rank reported", []RankExit{kill(3, "n2"), fail(4, "n3")}, nil},
		{"terminated, not killed", []RankExit{{Rank: 2, Host: "n2", Status: 143, Signal: "terminated"}, {Rank: 3, Host: "n2", Status: 143, Signal: "terminated"}}, nil},
		{"every node killed", []RankExit{kill(0, "n1"), kill(1, "n1"), kill(2, "n2"), kill(3, "n2"), kill(4, "n3"), kill(5, "n3")}, nil},
		{"two nodes killed", []RankExit{kill(0, "n1"), kill(1, "n1"), kill(4, "n3"), kill(5, "n3")}, []string{"n1", "n3"}},
	} {
		if got := g.killedNodes(tc.exits); !slices.Equal(got, tc.want) {
			t.Errorf("%s: killedNodes = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestKilledOutside(t *testing.T) {
	at := time.Unix(100, 0)
	for _, tc := range []struct {
		stopped time.Duration // before the end; 0: never stopped
		want    bool
	}{
		{0, true},
		{-time.Millisecond, true}, // stopped after it died
		{50 * time.Millisecond, true},
		{2 * time.Second, false},         // the task's own SIGKILL, grace after its SIGTERM
		{1500 * time.Millisecond, false}, // past half the wait delay
	} {
		var stopped int64
		if tc.stopped != 0 {
			stopped = at.Add(-tc.stopped).UnixNano()
		}
		if got := killedOutside(stopped, at, 2*time.Second); got != tc.want {
			t.Errorf("killedOutside(stopped %v before the end, wait delay 2s) = %v, want %v", tc.stopped, got, tc.want)
		}
	}
}
