package jobs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/jobs/jobstest"
)

// The tests in this file submit real jobs with `gearrun submit` to the SLURM
// cluster that the environment points at; see package jobstest.

// gearrunCmds is cmd/gearrun, built once for the package's tests.
var gearrunCmds = geartest.NewCommands("github.com/gear-rl/gear/cmd/gearrun")

var requireSlurm = jobstest.RequireSlurm

func gearrunBinary(t *testing.T) string { return gearrunCmds.Path(t, "gearrun") }

// gearrunCmd runs gearrun with args from the module root.
func gearrunCmd(t *testing.T, gearrun string, args ...string) (string, int) {
	t.Helper()
	return jobstest.Gearrun(t, "..", gearrun, args...)
}

// submit submits spec (relative to the module root, or absolute) from the
// module root.
func submit(t *testing.T, spec string) *jobstest.Job {
	t.Helper()
	return jobstest.Submit(t, "..", gearrunBinary(t), spec)
}

func TestSlurmHelloAllReduce(t *testing.T) {
	requireSlurm(t)
	j := submit(t, "examples/jobs/hello.toml")
	state, log := j.Wait()
	if state != "COMPLETED" {
		t.Fatalf("state %s, want COMPLETED; log:\n%s", state, log)
	}
	for r := range 4 {
		if want := fmt.Sprintf("hello from rank %d of 4", r); !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	// examples/hello prints the allreduce (sum) of the ranks: 0+1+2+3.
	m := regexp.MustCompile(`(?im)allreduce[^=\n]*=\s*(-?\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Errorf("log lacks the allreduce line:\n%s", log)
	} else if got, _ := strconv.Atoi(m[1]); got != 6 {
		t.Errorf("allreduce line %q, want the sum 6 of ranks 0..3", m[0])
	}
	if !strings.Contains(log, "gearrun: job hello completed: 4 ranks exited with status 0") {
		t.Errorf("log lacks gearrun's summary:\n%s", log)
	}
}

func TestSlurmFailingRank(t *testing.T) {
	requireSlurm(t)
	spec := jobstest.WriteSpec(t, `
name = "fail-rank"
[launch]
np = 4
grace = "2s"
command = ["sh", "-c", "if [ \"$GEAR_RANK\" = 2 ]; then echo 'rank two gives up' >&2; exit 3; fi; sleep 120"]
[slurm]
extra = ["--overcommit"]
`)
	j := submit(t, spec)
	state, log := j.Wait()
	if state != "FAILED" {
		t.Fatalf("state %s, want FAILED; log:\n%s", state, log)
	}
	for _, want := range []string{
		"rank two gives up",
		"gearrun: rank 2 on ",
		"gearrun: job fail-rank failed: rank 2 on ",
		"exited with status 3",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	out, _ := j.Run("status", j.GearID)
	if !strings.Contains(out, "FAILED (exit 3)") {
		t.Errorf("status does not report exit 3:\n%s", out)
	}
}

func TestSlurmCancel(t *testing.T) {
	requireSlurm(t)
	pids := t.TempDir()
	spec := jobstest.WriteSpec(t, fmt.Sprintf(`
name = "to-cancel"
[launch]
np = 2
grace = "2s"
command = ["sh", "-c", "sleep 600 & echo $! > %[1]s/$GEAR_RANK.child; echo $$ > %[1]s/$GEAR_RANK; wait"]
[slurm]
extra = ["--overcommit"]
`, pids))
	j := submit(t, spec)

	// Wait for both ranks and their children to run.
	var procs []int
	deadline := time.Now().Add(jobstest.WaitLimit)
	for len(procs) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the ranks never started; log:\n%s", j.Logs())
		}
		time.Sleep(200 * time.Millisecond)
		procs = procs[:0]
		for _, name := range []string{"0", "0.child", "1", "1.child"} {
			b, err := os.ReadFile(filepath.Join(pids, name))
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
				procs = append(procs, pid)
			}
		}
	}
	out, code := j.Run("cancel", j.GearID)
	if code != 0 {
		t.Fatalf("gearrun cancel: exit %d\n%s", code, out)
	}
	state, log := j.Wait()
	if state != "CANCELLED" {
		t.Fatalf("state %s, want CANCELLED; log:\n%s", state, log)
	}
	// SLURM kills what is left of the job's processes after KillWait.
	for _, pid := range procs {
		for processAlive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d of the cancelled job is still running", pid)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// processAlive reports whether pid runs and is not a zombie.
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestSlurmMPMD(t *testing.T) {
	requireSlurm(t)
	j := submit(t, "examples/jobs/mpmd.toml")
	state, log := j.Wait()
	if state != "COMPLETED" {
		t.Fatalf("state %s, want COMPLETED; log:\n%s", state, log)
	}
	for _, want := range []string{
		"hello from rank 0 of 4", "role actor 0/3)", "role actor 1/3)", "role actor 2/3)", "role trainer 0/1)",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}
