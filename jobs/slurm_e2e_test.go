package jobs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
)

// The tests in this file submit real jobs with `gearrun submit` to the SLURM
// cluster that the environment points at (SLURM_CONF), such as the one-node
// cluster of scripts/slurm-local.sh:
//
//	scripts/slurm-local.sh up && eval "$(scripts/slurm-local.sh env)"
//	GEAR_REQUIRE_SLURM=1 go test -run Slurm ./jobs
//
// Without sbatch or a reachable cluster they skip, unless GEAR_REQUIRE_SLURM=1,
// which makes that a failure.

// e2eWait bounds how long a test waits for a job; it guards against hangs and
// says nothing about speed.
const e2eWait = 5 * time.Minute

func requireSlurm(t *testing.T) {
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
	if os.Getenv("GEAR_REQUIRE_SLURM") == "1" {
		t.Fatalf("GEAR_REQUIRE_SLURM=1 but %s", why)
	}
	t.Skipf("skipping SLURM test: %s (set GEAR_REQUIRE_SLURM=1 to make this a failure)", why)
}

// gearrunCmds is cmd/gearrun, built once for the package's tests.
var gearrunCmds = geartest.NewCommands("github.com/gear-rl/gear/cmd/gearrun")

// gearrunBinary builds cmd/gearrun once for the package's tests.
func gearrunBinary(t *testing.T) string {
	t.Helper()
	return gearrunCmds.Path(t, "gearrun")
}

// e2eJob is one submitted job and the state directory it is recorded in.
type e2eJob struct {
	t        *testing.T
	gearrun  string
	stateDir string
	gearID   string
	slurmID  string
}

// gearrunCmd runs gearrun with args from the module root and returns its
// combined output and exit code.
func gearrunCmd(t *testing.T, gearrun string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, gearrun, args...)
	cmd.Dir = ".."
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

// submit runs `gearrun submit --parsable` on spec (relative to the module root
// or absolute).
func submit(t *testing.T, spec string) *e2eJob {
	t.Helper()
	j := &e2eJob{t: t, gearrun: gearrunBinary(t), stateDir: t.TempDir()}
	out, code := gearrunCmd(t, j.gearrun, "submit", "--parsable", "--state-dir", j.stateDir, spec)
	if code != 0 {
		t.Fatalf("gearrun submit %s: exit %d\n%s", spec, code, out)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("gearrun submit --parsable printed %q, want \"GEAR_ID SLURM_ID\"", out)
	}
	j.gearID, j.slurmID = f[0], f[1]
	t.Logf("submitted %s: gear job %s, SLURM job %s", spec, j.gearID, j.slurmID)
	t.Cleanup(func() {
		// Leave no job behind, whatever the test did.
		exec.Command("scancel", j.slurmID).Run()
	})
	return j
}

// wait runs `gearrun status --wait` and returns the final state and the job's
// log.
func (j *e2eJob) wait() (state, log string) {
	j.t.Helper()
	out, _ := gearrunCmd(j.t, j.gearrun, "status", "--wait", "--timeout", e2eWait.String(), "--state-dir", j.stateDir, j.slurmID)
	m := regexp.MustCompile(`(?m)^state:\s+(\S+)`).FindStringSubmatch(out)
	if m == nil {
		j.t.Fatalf("gearrun status printed no state:\n%s", out)
	}
	return m[1], j.logs()
}

func (j *e2eJob) logs() string {
	j.t.Helper()
	out, code := gearrunCmd(j.t, j.gearrun, "logs", "--state-dir", j.stateDir, j.gearID)
	if code != 0 {
		j.t.Fatalf("gearrun logs: exit %d\n%s", code, out)
	}
	return out
}

func writeSpec(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.toml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSlurmHelloAllReduce(t *testing.T) {
	requireSlurm(t)
	j := submit(t, "examples/jobs/hello.toml")
	state, log := j.wait()
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
	spec := writeSpec(t, `
name = "fail-rank"
[launch]
np = 4
grace = "2s"
command = ["sh", "-c", "if [ \"$GEAR_RANK\" = 2 ]; then echo 'rank two gives up' >&2; exit 3; fi; sleep 120"]
[slurm]
extra = ["--overcommit"]
`)
	j := submit(t, spec)
	state, log := j.wait()
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
	out, _ := gearrunCmd(t, j.gearrun, "status", "--state-dir", j.stateDir, j.gearID)
	if !strings.Contains(out, "FAILED (exit 3)") {
		t.Errorf("status does not report exit 3:\n%s", out)
	}
}

func TestSlurmCancel(t *testing.T) {
	requireSlurm(t)
	pids := t.TempDir()
	spec := writeSpec(t, fmt.Sprintf(`
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
	deadline := time.Now().Add(e2eWait)
	for len(procs) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the ranks never started; log:\n%s", j.logs())
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
	out, code := gearrunCmd(t, j.gearrun, "cancel", "--state-dir", j.stateDir, j.gearID)
	if code != 0 {
		t.Fatalf("gearrun cancel: exit %d\n%s", code, out)
	}
	state, log := j.wait()
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
	state, log := j.wait()
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
