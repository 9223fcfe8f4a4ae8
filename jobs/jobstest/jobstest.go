// Package jobstest holds the helpers of tests that submit real jobs with
// `gearrun submit` to the SLURM cluster that the environment points at
// (SLURM_CONF), such as the one of scripts/slurm-local.sh:
//
//	scripts/slurm-local.sh up && eval "$(scripts/slurm-local.sh env)"
//	GEAR_REQUIRE_SLURM=1 go test -run Slurm ./jobs ./examples/torch
//
// Without sbatch or a reachable cluster such tests skip (RequireSlurm), unless
// GEAR_REQUIRE_SLURM=1, which makes that a failure. Nothing outside tests
// imports this package.
package jobstest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	why := ""
	if _, err := exec.LookPath("sbatch"); err != nil {
		why = "sbatch is not installed"
	} else if out, err := exec.Command("sinfo", "--noheader", "--format=%t").CombinedOutput(); err != nil {
		why = fmt.Sprintf("no SLURM cluster answers (sinfo: %v: %s); start one with scripts/slurm-local.sh up and eval \"$(scripts/slurm-local.sh env)\"", err, bytes.TrimSpace(out))
	}
	if why == "" {
		return
	}
	if os.Getenv(EnvRequireSlurm) == "1" {
		t.Fatalf("%s=1 but %s", EnvRequireSlurm, why)
	}
	t.Skipf("skipping SLURM test: %s (set %s=1 to make this a failure)", why, EnvRequireSlurm)
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
