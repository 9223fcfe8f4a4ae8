package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/examples/dqn/cartpole"
	"github.com/gear-rl/gear/examples/dqn/dist"
	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/rank"
)

// bins are gearrun and dqn, built once for the tests that launch them.
var bins = geartest.NewCommands("github.com/gear-rl/gear/cmd/gearrun", "github.com/gear-rl/gear/examples/dqn")

// binaries builds gearrun and dqn (once) and returns their paths.
func binaries(t *testing.T) (gearrun, dqn string) {
	t.Helper()
	return bins.Path(t, "gearrun"), bins.Path(t, "dqn")
}

// withoutRankEnv keeps a test run under gearrun from passing its own rank
// contract to the gearrun it starts.
func withoutRankEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GEAR_") && !strings.HasPrefix(kv, "SLURM_") {
			env = append(env, kv)
		}
	}
	return env
}

// segmentsLeft lists the shared-memory segments of job id.
func segmentsLeft(id string) []string {
	m, _ := filepath.Glob("/dev/shm/" + rank.SegmentName(id, "*"))
	return m
}

// The CI run, distributed: one trainer and one inline actor as two processes
// of a gearrun job spec (with its [table]), the quick recipe. It must lift
// the mean return over 20 episodes from a random policy's (about 20) to 150,
// well within three minutes.
func TestDistributedQuickRun(t *testing.T) {
	gearrun, dqn := binaries(t)
	dir := t.TempDir()
	curve := filepath.Join(dir, "curve.csv")
	spec := filepath.Join(dir, "dqn-quick.toml")
	q := func(s string) string { return strconv.Quote(s) }
	os.WriteFile(spec, []byte(`name = "dqn-quick"

[launch]
timeout = "3m"

[[group]]
role = "trainer"
np = 1
command = [`+q(dqn)+`, "--quick", "--seed", "1", "--report-every", "500ms", "--curve", `+q(curve)+`]

[[group]]
role = "actor"
np = 1
command = [`+q(dqn)+`]

[table]
capacity = 50000
trajectory_length = 1
sampler = "prioritized"
priority_exponent = 0.6
remover = "fifo"

[[table.columns]]
name = "obs"
dtype = "float32"
shape = [4]

[[table.columns]]
name = "action"
dtype = "int32"

[[table.columns]]
name = "reward"
dtype = "float32"

[[table.columns]]
name = "discount"
dtype = "float32"

[[table.columns]]
name = "next_obs"
dtype = "float32"
shape = [4]

[[table.columns]]
name = "version"
dtype = "int64"

[table.rate_limiter]
kind = "sample_to_insert_ratio"
min_size_to_sample = 500
samples_per_insert = 64.0
error_buffer = 6400.0
`), 0o644)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gearrun, "run", spec)
	cmd.Env = withoutRankEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	t.Logf("wall %.1fs\n%s", wall.Seconds(), out.String())
	if err != nil {
		t.Fatalf("gearrun run: %v\nstderr:\n%s", err, errb.String())
	}
	if wall > 3*time.Minute {
		t.Fatalf("wall %v, want under 3 minutes", wall)
	}
	m := regexp.MustCompile(`\[0\] dqn: solved: (\d+) episodes, (\d+) frames.*mean20 ([0-9.]+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no solved line from the trainer")
	}
	if mean, _ := strconv.ParseFloat(m[3], 64); mean < 150 {
		t.Fatalf("mean return %v, want >= 150", mean)
	}
	for _, want := range []string{
		"1 trainer, 1 actor, inline inference; transitions straight into the trainer's shard",
		"replay 50000 per trainer, 64 samples per insert ± 6400",
		"[1] dqn: actor 0: rank 1",
		"samples/insert",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	f, err := os.Open(curve)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) < 21 || rows[len(rows)-1][0] != m[1] {
		t.Fatalf("curve: %d rows, %v; the trainer counted %s episodes", len(rows), err, m[1])
	}
	if seg := regexp.MustCompile(`shard gear\.([^.]+)\.dqn`).FindStringSubmatch(out.String()); seg == nil {
		t.Error("the trainer did not name its shard")
	} else if left := segmentsLeft(seg[1]); len(left) > 0 {
		t.Errorf("segments left: %v", left)
	}
}

// The committed job spec is valid and describes this program's table.
func TestJobSpec(t *testing.T) {
	spec, err := jobs.Load("../jobs/dqn.toml")
	if err != nil {
		t.Fatal(err)
	}
	if spec.Table == nil {
		t.Fatal("no [table]")
	}
	cfg := dist.DefaultConfig()
	if err := dist.ApplyTable(&cfg, spec.Table, spec.WorldSize(), cartpole.ObsSize); err != nil {
		t.Fatal(err)
	}
	def := dist.DefaultConfig()
	spi, eb := cfg.RateLimit()
	dspi, deb := def.RateLimit()
	if cfg.Agent.ReplayCapacity != def.Agent.ReplayCapacity || cfg.Agent.LearningStarts != def.Agent.LearningStarts ||
		cfg.Agent.PriorityExponent != def.Agent.PriorityExponent || spi != dspi || eb != deb {
		t.Errorf("the spec's table changes the recipe: %+v", spec.Table)
	}
	roles := map[string]int{}
	for _, g := range spec.Groups {
		roles[g.Role] += g.NP
	}
	if roles["trainer"] != 1 || roles["actor"] < 1 {
		t.Errorf("roles %v", roles)
	}
}

// A policy worker killed mid-run is an error for its actors, which name it,
// and gearrun exits non-zero.
func TestKilledPolicyWorkerFailsItsActors(t *testing.T) {
	gearrun, dqn := binaries(t)
	id := fmt.Sprintf("dqn-test-%d", os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Roles from gearrun's --role this time (GEAR_ROLE), not dqn's.
	cmd := exec.CommandContext(ctx, gearrun, "--job-id", id,
		"-np", "1", "--role", "trainer", dqn, "--quick", "--target-return", "1000", "--frames", "100000000", "--report-every", "100ms", ":",
		"-np", "1", "--role", "policy", dqn, ":",
		"-np", "2", "--role", "actor", dqn)
	cmd.Env = withoutRankEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read until the policy worker has said its pid and the trainer has
	// reported progress, then kill the policy worker.
	lines := bufio.NewScanner(stdout)
	var out strings.Builder
	policyPID := 0
	killed := false
	for lines.Scan() {
		line := lines.Text()
		out.WriteString(line + "\n")
		if m := regexp.MustCompile(`^\[1\] dqn: policy worker 0: rank 1, pid (\d+)`).FindStringSubmatch(line); m != nil {
			policyPID, _ = strconv.Atoi(m[1])
		}
		if !killed && policyPID > 0 && strings.HasPrefix(line, "[0]") && strings.Contains(line, "frames/s") {
			if err := syscall.Kill(policyPID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	if !killed {
		t.Fatalf("never killed the policy worker (pid %d)", policyPID)
	}
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() == 0 {
		t.Fatalf("gearrun: %v, want a non-zero exit", err)
	}
	if ee.ExitCode() != 128+int(syscall.SIGKILL) {
		t.Errorf("gearrun exit %d, want %d (the first failed rank died of SIGKILL)", ee.ExitCode(), 128+int(syscall.SIGKILL))
	}
	for _, actor := range []string{"[2]", "[3]"} {
		want := actor + " dqn: actor rank "
		found := false
		for _, line := range strings.Split(errb.String(), "\n") {
			if strings.HasPrefix(line, want) && strings.Contains(line, "policy worker rank 1 lost") {
				found = true
			}
		}
		if !found {
			t.Errorf("no error of actor %s naming policy worker rank 1", actor)
		}
	}
	if !strings.Contains(errb.String(), fmt.Sprintf("gearrun: rank 1 (pid %d, policy 0) killed by SIGKILL", policyPID)) {
		t.Errorf("gearrun did not report the killed rank")
	}
	if left := segmentsLeft(id); len(left) > 0 {
		t.Errorf("segments left: %v", left)
	}
}

// --bench measures frames per second under gearrun and says so.
func TestBenchUnderGearrun(t *testing.T) {
	gearrun, dqn := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gearrun,
		"-np", "1", dqn, "--role", "trainer", "--quick", "--bench", "1s", "--bench-warmup", "500ms", ":",
		"-np", "1", dqn, "--role", "policy", ":",
		"-np", "2", dqn, "--role", "actor")
	cmd.Env = withoutRankEnv()
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("gearrun: %v", err)
	}
	m := regexp.MustCompile(`\[0\] dqn: bench: 2 actors, 1 policy worker: (\d+) frames/s \((\d+) frames in ([0-9.]+)s\)`).FindSubmatch(out)
	if m == nil {
		t.Fatal("no bench line")
	}
	if fps, _ := strconv.Atoi(string(m[1])); fps <= 0 {
		t.Fatalf("%d frames/s", fps)
	}
}
