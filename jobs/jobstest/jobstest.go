// Package jobstest holds the helpers of tests that submit real jobs with
// `gearrun submit` to the SLURM cluster that the environment points at
// (SLURM_CONF), such as the one of scripts/slurm-local.sh:
//
//	scripts/slurm-local.sh up && eval "$(scripts/slurm-local.sh env)"
//	GEAR_REQUIRE_SLURM=1 go test -run Slurm ./jobs ./examples/torch
//
// Without sbatch or a reachable cluster such tests skip (RequireSlurm), unless
// GEAR_REQUIRE_SLURM=1, which makes that a failure. The multi-node tests also
// need a cluster of several nodes (RequireNodes):
//
//	scripts/slurm-local.sh up --nodes 3 && eval "$(scripts/slurm-local.sh env)"
//	GEAR_REQUIRE_SLURM=1 GEAR_REQUIRE_MULTINODE=1 go test -run 'Slurm|MultiNode' ./jobs
//
// Nothing outside tests imports this package. The rank program of the
// multi-node tests is cmd/internal/multinode.
package jobstest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// WaitLimit bounds how long a test waits for a job; it guards against hangs
// and says nothing about speed.
const WaitLimit = 5 * time.Minute

// EnvRequireSlurm, set to 1, turns RequireSlurm's skip into a failure
// (.ci/run sets it).
const EnvRequireSlurm = "GEAR_REQUIRE_SLURM"

// RequireSlurm skips the test unless sbatch is installed and a cluster
// answers sinfo; with GEAR_REQUIRE_SLURM=1 it fails instead.
func RequireSlurm(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("SLURM end-to-end test skipped in -short mode")
	}
	why := slurmMissing()
	if why == "" {
		return
	}
	if os.Getenv(EnvRequireSlurm) == "1" {
		t.Fatalf("%s=1 but %s", EnvRequireSlurm, why)
	}
	t.Skipf("skipping SLURM test: %s (set %s=1 to make this a failure)", why, EnvRequireSlurm)
}

// slurmMissing says why no SLURM cluster can run jobs; "" when one can.
func slurmMissing() string {
	if _, err := exec.LookPath("sbatch"); err != nil {
		return "sbatch is not installed"
	}
	if out, err := exec.Command("sinfo", "--noheader", "--format=%t").CombinedOutput(); err != nil {
		return fmt.Sprintf("no SLURM cluster answers (sinfo: %v: %s); start one with scripts/slurm-local.sh up and eval \"$(scripts/slurm-local.sh env)\"", err, bytes.TrimSpace(out))
	}
	return ""
}

// EnvRequireMultinode, set to 1, turns RequireNodes's skip into a failure
// (.ci/run sets it).
const EnvRequireMultinode = "GEAR_REQUIRE_MULTINODE"

// RequireNodes skips the test unless it runs as root with ip netns (what
// scripts/slurm-local.sh up --nodes n needs to make a node per network
// namespace, and the tests to reach the nodes' processes), a SLURM cluster
// answers, and it has at least n nodes up; with GEAR_REQUIRE_MULTINODE=1
// (or, for a missing cluster, GEAR_REQUIRE_SLURM=1) it fails instead. It
// returns the nodes' names.
func RequireNodes(t testing.TB, n int) []string {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-node SLURM test skipped in -short mode")
	}
	why := ""
	var nodes []string
	if os.Geteuid() != 0 {
		why = "not root, so scripts/slurm-local.sh cannot make a node per network namespace"
	} else if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		why = fmt.Sprintf("no ip netns here (%v: %s), so scripts/slurm-local.sh cannot make a node per network namespace", err, bytes.TrimSpace(out))
	} else if why = slurmMissing(); why != "" {
		if os.Getenv(EnvRequireSlurm) == "1" {
			t.Fatalf("%s=1 but %s", EnvRequireSlurm, why)
		}
	} else {
		out, err := exec.Command("sinfo", "--noheader", "--Node", "--format=%N %t").Output()
		if err != nil {
			why = fmt.Sprintf("sinfo: %v", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			up := false
			for _, s := range []string{"idle", "mix", "alloc", "comp"} {
				up = up || strings.HasPrefix(f[1], s)
			}
			if len(f) == 2 && up && !slices.Contains(nodes, f[0]) {
				nodes = append(nodes, f[0])
			}
		}
		if why == "" && len(nodes) < n {
			why = fmt.Sprintf("the cluster has %d node(s) up, not %d; start one with scripts/slurm-local.sh down && scripts/slurm-local.sh up --nodes %d", len(nodes), n, n)
		}
	}
	if why == "" {
		return nodes
	}
	SkipMultinode(t, why)
	return nil
}

// SkipMultinode skips a multi-node test for the reason why, or fails it with
// GEAR_REQUIRE_MULTINODE=1.
func SkipMultinode(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(EnvRequireMultinode) == "1" {
		t.Fatalf("%s=1 but %s", EnvRequireMultinode, why)
	}
	t.Skipf("skipping multi-node SLURM test: %s (set %s=1 to make this a failure)", why, EnvRequireMultinode)
}

// Gearrun runs the gearrun binary with args in dir and returns its combined
// output and exit code.
func Gearrun(t testing.TB, dir, gearrun string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), WaitLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, gearrun, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("gearrun %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}

// Job is one submitted job and the state directory it is recorded in.
type Job struct {
	T        testing.TB
	Gearrun  string // the gearrun binary
	Dir      string // where gearrun runs
	StateDir string
	GearID   string
	SlurmID  string
}

// Submit runs `gearrun submit --parsable` on spec (relative to dir, or
// absolute) in dir, with a state directory of the test's own. The job is
// cancelled when the test ends, whatever it did.
func Submit(t testing.TB, dir, gearrun, spec string) *Job {
	t.Helper()
	j := &Job{T: t, Gearrun: gearrun, Dir: dir, StateDir: t.TempDir()}
	out, code := Gearrun(t, dir, gearrun, "submit", "--parsable", "--state-dir", j.StateDir, spec)
	if code != 0 {
		t.Fatalf("gearrun submit %s: exit %d\n%s", spec, code, out)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("gearrun submit --parsable printed %q, want \"GEAR_ID SLURM_ID\"", out)
	}
	j.GearID, j.SlurmID = f[0], f[1]
	t.Logf("submitted %s: gear job %s, SLURM job %s", spec, j.GearID, j.SlurmID)
	t.Cleanup(func() { exec.Command("scancel", j.SlurmID).Run() })
	return j
}

// Run runs `gearrun SUBCOMMAND --state-dir DIR ARGS...` against the job's
// state directory (status, logs, cancel).
func (j *Job) Run(subcommand string, args ...string) (string, int) {
	j.T.Helper()
	return Gearrun(j.T, j.Dir, j.Gearrun, append([]string{subcommand, "--state-dir", j.StateDir}, args...)...)
}

// Wait runs `gearrun status --wait` and returns the final state and the job's
// log.
func (j *Job) Wait() (state, log string) {
	j.T.Helper()
	out, _ := j.Run("status", "--wait", "--timeout", WaitLimit.String(), j.SlurmID)
	m := regexp.MustCompile(`(?m)^state:\s+(\S+)`).FindStringSubmatch(out)
	if m == nil {
		j.T.Fatalf("gearrun status printed no state:\n%s", out)
	}
	return m[1], j.Logs()
}

// SlurmState returns the job's state as slurmctld has it now (scontrol show
// job), such as RUNNING or FAILED; "" when scontrol does not answer.
func (j *Job) SlurmState() string {
	out, err := exec.Command("scontrol", "show", "job", "--oneliner", j.SlurmID).Output()
	if err != nil {
		return ""
	}
	m := regexp.MustCompile(`\bJobState=(\S+)`).FindSubmatch(out)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// Logs returns the job's output so far (gearrun logs).
func (j *Job) Logs() string {
	j.T.Helper()
	out, code := j.Run("logs", j.GearID)
	if code != 0 {
		j.T.Fatalf("gearrun logs: exit %d\n%s", code, out)
	}
	return out
}

// WriteSpec writes a job spec into a temporary directory of the test and
// returns its path.
func WriteSpec(t testing.TB, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.toml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
