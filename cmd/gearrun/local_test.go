package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/rank"
)

// gearrunIn runs gearrun in this process and returns its exit code, stdout and
// stderr.
func gearrunIn(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, stdio{strings.NewReader(""), &out, &errb})
	return code, out.String(), errb.String()
}

// privateState gives the test its own state and runtime directories.
func privateState(t *testing.T) (state string) {
	state = t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	t.Setenv(rank.EnvStateDir, "")
	t.Setenv(rank.EnvRuntimeDir, t.TempDir())
	return state
}

// statusRow finds the row of job id in gearrun status's local table and
// returns its columns.
func statusRow(t *testing.T, out, id string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
		if f[0] == id {
			return f
		}
	}
	t.Fatalf("job %s not listed by gearrun status:\n%s", id, out)
	return nil
}

// gearrun status lists the jobs run on this machine, running and ended, with
// their ranks, state, exit code, start time and checkpoint directory; a job
// with restarts says once, at its start, its ID and checkpoint directory; and
// status ID takes a local job's ID or a prefix of it.
func TestStatusListsLocalJobs(t *testing.T) {
	state := privateState(t)
	if code, _, errs := gearrunIn("--job-id", "done-job", "-np", "2", "/bin/true"); code != 0 {
		t.Fatalf("gearrun -np 2 /bin/true: exit %d: %s", code, errs)
	}
	code, _, errs := gearrunIn("--job-id", "failed-job", "--max-restarts", "1", "-np", "1", "/bin/false")
	if code != 1 {
		t.Fatalf("gearrun --max-restarts 1 -np 1 /bin/false: exit %d, want 1: %s", code, errs)
	}
	ckpt := filepath.Join(state, "gear", "checkpoints", "failed-job")
	announce := "gearrun: job failed-job (--max-restarts 1): checkpoints in " + ckpt + ", kept after the job (gearrun clean --checkpoints failed-job removes them)\n"
	if n := strings.Count(errs, announce); n != 1 {
		t.Errorf("the job's ID and checkpoint directory said %d times, want once at the start; stderr:\n%s", n, errs)
	} else if !strings.HasPrefix(errs, announce) {
		t.Errorf("the job's ID and checkpoint directory not said first; stderr:\n%s", errs)
	}

	// A job that runs while status looks.
	dir := t.TempDir()
	cmd := gearrunCmd(t, "hold", []string{envDir + "=" + dir}, "--job-id", "running-job", "--grace", "1s", "-np", "2")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pids := waitForFiles(t, dir, 4, time.Minute)

	before := time.Now()
	code, out, errs := gearrunIn("status")
	if code != 0 {
		t.Fatalf("gearrun status: exit %d: %s", code, errs)
	}
	if !strings.HasPrefix(out, "LOCAL JOB ID") {
		t.Errorf("gearrun status does not start with the local jobs' header:\n%s", out)
	}
	today := before.Format("2006-01-02")
	for _, want := range [][]string{
		{"running-job", "hold", "2", "RUNNING", "-", "-"},
		{"failed-job", "false", "1", "FAILED", "1", ckpt},
		{"done-job", "true", "2", "COMPLETED", "0", "-"},
	} {
		row := statusRow(t, out, want[0])
		// ID, NAME, RANKS, STATE, EXIT, STARTED (date and time), CHECKPOINTS
		if len(row) != 7 {
			t.Errorf("row %q: want 7 columns", row)
			continue
		}
		// NAME is the program's base name; the helper runs as the test binary.
		if want[1] == "hold" {
			want[1] = filepath.Base(os.Args[0])
		}
		if row[1] != want[1] || row[2] != want[2] || row[3] != want[3] || row[4] != want[4] || row[6] != want[5] {
			t.Errorf("row %q, want %q", row, want)
		}
		if !strings.HasPrefix(row[5], today) && !strings.HasPrefix(row[5], time.Now().Format("2006-01-02")) {
			t.Errorf("row %q: started %q is not today", row, row[5])
		}
	}
	// Newest first.
	if strings.Index(out, "running-job") > strings.Index(out, "failed-job") || strings.Index(out, "failed-job") > strings.Index(out, "done-job") {
		t.Errorf("local jobs not listed newest first:\n%s", out)
	}

	// status ID takes a prefix of a local job's ID.
	code, out, errs = gearrunIn("status", "fail")
	if code != 0 || !strings.Contains(out, "local job ID: failed-job") || !strings.Contains(out, "FAILED (exit 1)") || !strings.Contains(out, ckpt) {
		t.Errorf("gearrun status fail: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := gearrunIn("status", "nosuch-job"); code != 1 || !strings.Contains(errs, "no such job") {
		t.Errorf("gearrun status nosuch-job: exit %d, %q; want 1 and no such job", code, errs)
	}

	// The running job is stopped; status says how it ended.
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	assertAllGone(t, pids, time.Now().Add(time.Minute))
	code, out, errs = gearrunIn("status", "--wait", "--timeout", "1m", "running-job")
	if code != 1 || !strings.Contains(out, "state:        FAILED (exit") {
		t.Errorf("gearrun status --wait running-job after SIGTERM: exit %d, want 1 and FAILED\n%s%s", code, out, errs)
	}
	if code, out, _ := gearrunIn("status", "--wait", "done-"); code != 0 || !strings.Contains(out, "COMPLETED (exit 0)") {
		t.Errorf("gearrun status --wait done-: exit %d, want 0 and COMPLETED\n%s", code, out)
	}
}

// gearrun clean lists the checkpoint directories it keeps, with their sizes,
// and --checkpoints takes a job ID or a unique prefix of one, with and without
// --dry-run.
func TestCleanCheckpointsPrefixesAndListing(t *testing.T) {
	state := privateState(t)
	root := filepath.Join(state, "gear", "checkpoints")
	a := "0a1b2c3d-1111-4aaa-8bbb-000000000001"
	b := "0a1bffff-2222-4aaa-8bbb-000000000002"
	for id, size := range map[string]int64{a: 4_500_000, b: 512} {
		d := filepath.Join(root, id, "step-1")
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(d, "ckpt.bin"))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size)
		f.Close()
	}
	shm, rt := t.TempDir(), t.TempDir()
	clean := func(args ...string) (int, string, string) {
		return gearrunIn(append([]string{"clean", "--shm-dir", shm, "--runtime-dir", rt}, args...)...)
	}

	code, out, errs := clean("--dry-run")
	if code != 0 {
		t.Fatalf("clean --dry-run: exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"kept checkpoints of 2 jobs in " + root + " (remove one with gearrun clean --checkpoints ID):\n",
		"  " + a + "  4.5 MB\n",
		"  " + b + "  512 B\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("clean --dry-run: no %q in\n%s", want, out)
		}
	}

	code, _, errs = clean("--checkpoints", "0a1b")
	if code != 1 || !strings.Contains(errs, "ambiguous") || !strings.Contains(errs, a) || !strings.Contains(errs, b) {
		t.Errorf("clean --checkpoints 0a1b: exit %d, %q; want 1 and an ambiguity naming both jobs", code, errs)
	}
	code, _, errs = clean("--checkpoints", "0a1")
	if code != 1 || !strings.Contains(errs, "has no checkpoint directory") {
		t.Errorf("clean --checkpoints 0a1 (shorter than 4): exit %d, %q; want 1", code, errs)
	}
	code, out, errs = clean("--dry-run", "--checkpoints", "0a1b2")
	if code != 0 || out != "would remove checkpoints "+filepath.Join(root, a)+" (4.5 MB)\n" || !exists(filepath.Join(root, a)) {
		t.Errorf("clean --dry-run --checkpoints 0a1b2: exit %d, %q %q", code, out, errs)
	}
	code, out, errs = clean("--checkpoints", "0A1B2C")
	if code != 0 || out != "removed checkpoints "+filepath.Join(root, a)+"\n" || exists(filepath.Join(root, a)) {
		t.Errorf("clean --checkpoints 0A1B2C: exit %d, %q %q", code, out, errs)
	}
	code, out, _ = clean("--dry-run")
	if code != 0 || !strings.Contains(out, "kept checkpoints of 1 job in") || strings.Contains(out, a) || !strings.Contains(out, b) {
		t.Errorf("clean --dry-run after removing %s: exit %d\n%s", a, code, out)
	}
	if code, out, _ = clean("--checkpoints", b); code != 0 || exists(filepath.Join(root, b)) {
		t.Errorf("clean --checkpoints %s: exit %d %q", b, code, out)
	}
	if code, out, _ = clean("--dry-run"); code != 0 || strings.Contains(out, "kept checkpoints") {
		t.Errorf("clean --dry-run with no checkpoints: exit %d\n%s", code, out)
	}
}

func TestByteSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.0 kB", 4_500_000: "4.5 MB", 12_300_000_000: "12.3 GB"} {
		if got := byteSize(n); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
	}
}
