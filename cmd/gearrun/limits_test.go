package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// TestBoundsRefused checks that every bound on the command line is refused
// before anything starts, with a message that names the value and the limit.
func TestBoundsRefused(t *testing.T) {
	t.Setenv(rank.EnvRuntimeDir, t.TempDir())
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-np", "99999999999", "true"}, "-np 99999999999: a job has at most 65536 ranks"},
		{[]string{"--dry-run", "-np", "5000000", "true"}, "-np 5000000: a job has at most 65536 ranks"},
		{[]string{"-np", "65536", "true", ":", "-np", "1", "true"}, "the groups' ranks (65536 + 1) add up to more than the 65536"},
		{[]string{"-np", "0", "true"}, "-np 0: -np N is required and must be at least 1"},
		{[]string{"--timeout", "-5s", "-np", "1", "true"}, "--timeout -5s: must not be negative"},
		{[]string{"--grace", "-1s", "-np", "1", "true"}, "--grace -1s: must not be negative"},
		{[]string{"--rdzv-timeout", "-1s", "-np", "1", "true"}, "--rdzv-timeout -1s: must not be negative"},
	} {
		var out, errb bytes.Buffer
		start := time.Now()
		code := run(tc.args, stdio{strings.NewReader(""), &out, &errb})
		if code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errb.String(), tc.want)
		}
		// Refused from the flags alone, before any plan of millions of
		// ranks is made: far less than this even on a busy machine.
		if d := time.Since(start); d > underLoad/2 {
			t.Errorf("%v: took %v to refuse", tc.args, d)
		}
	}
}

// TestShmBudgetRefused plans more ranks than /dev/shm has room for: the launch
// is refused before any rank starts, naming the sizes and the ways around.
func TestShmBudgetRefused(t *testing.T) {
	t.Setenv(rank.EnvRuntimeDir, t.TempDir())
	lim := launch.ReadHostLimits("/dev/shm")
	if lim.ShmFree < 0 {
		t.Skip("cannot read /dev/shm's free space")
	}
	n := 2
	for collective.ShmBytes(n, collective.DefaultTuning()) <= lim.ShmFree {
		n++
	}
	if n > rank.MaxWorldSize {
		t.Skipf("/dev/shm has %d bytes free: more than a job of %d ranks can use", lim.ShmFree, rank.MaxWorldSize)
	}
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := run([]string{"-np", strconv.Itoa(n), "sh", "-c", "touch " + dir + "/started.$GEAR_RANK"}, stdio{strings.NewReader(""), &out, &errb})
	if code != launch.ExitLaunchFailed {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, launch.ExitLaunchFailed, errb.String())
	}
	for _, want := range []string{fmt.Sprintf("%d ranks on this host plan", n), "of shared memory for their communicator", "free in /dev/shm", "GEAR_TRANSPORT=tcp"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	if started, _ := filepath.Glob(filepath.Join(dir, "started.*")); len(started) > 0 {
		t.Errorf("%d ranks started although the launch was refused", len(started))
	}
}

func TestCheckHost(t *testing.T) {
	plan := func(n int, env ...string) *launch.Plan {
		p, err := launch.NewPlan(launch.Request{Groups: []launch.Group{{NP: n, Argv: []string{"true"}, Env: env}},
			IsGoPackage: func(string) bool { return false }})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	roomy := launch.HostLimits{Files: 1 << 20, FilesHard: 1 << 20, ShmDir: "/dev/shm", ShmFree: 1 << 50}
	for _, tc := range []struct {
		name string
		p    *launch.Plan
		lim  launch.HostLimits
		want string
	}{
		{"fits", plan(8), roomy, ""},
		{"processes", plan(100), launch.HostLimits{Procs: 120, ProcsHard: 4096, ProcsUsed: 30, Files: 1 << 20}, "100 ranks and the 30 tasks you run now exceed your process limit of 120 (RLIMIT_NPROC"},
		{"files", plan(1000), launch.HostLimits{Files: 1024, FilesHard: 1024, ShmFree: -1}, "1000 ranks need about 4064 open files in the launcher (4 per rank), over its hard limit of 1024 (RLIMIT_NOFILE"},
		{"shm", plan(4), launch.HostLimits{Files: 1 << 20, ShmDir: "/dev/shm", ShmFree: 16 << 20}, "4 ranks on this host plan 32.4 MiB of shared memory for their communicator (4 inboxes of 4 rings of 2.0 MiB, a board of 388.0 KiB), over the 16.0 MiB free in /dev/shm"},
		{"shm over tcp", plan(4, rank.EnvTransport+"=tcp"), launch.HostLimits{Files: 1 << 20, ShmDir: "/dev/shm", ShmFree: 16 << 20}, ""},
		{"one rank takes no shm", plan(1), launch.HostLimits{Files: 1 << 20, ShmDir: "/dev/shm", ShmFree: 0}, ""},
	} {
		err := launch.CheckHost(tc.p, tc.lim, nil)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// rss reads a process's resident and peak resident set sizes in bytes.
func rss(t *testing.T, pid int) (now, peak int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			now = v << 10
		case "VmHWM:":
			peak = v << 10
		}
	}
	return now, peak
}

// TestHostileConnectionsAgainstLiveJob opens 1,000 hostile connections to the
// coordinator of a running 2-rank job: garbage, oversized frame headers, wrong
// proofs and idle ones. The job stays healthy and finishes, the launcher's
// memory grows by less than 32 MiB, and the refusals reach its stderr at Warn.
func TestHostileConnectionsAgainstLiveJob(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr geartest.Buffer
	cmd := gearrunCmd(t, "rdzvwait", []string{envDir + "=" + dir}, "-v", "-np", "2")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitForFiles(t, dir, 2, underLoad)
	addr := regexp.MustCompile(`rdzv=(127\.0\.0\.1:\d+)`).FindStringSubmatch(stderr.String())
	if addr == nil {
		t.Fatalf("no rendezvous address in the launcher's log:\n%s", stderr.String())
	}
	before, _ := rss(t, cmd.Process.Pid)
	for _, err := range geartest.HostileFlood(addr[1], 1000, 100, 20*time.Second) {
		t.Errorf("%v (the launcher should have dropped it)", err)
	}
	now, peak := rss(t, cmd.Process.Pid)
	t.Logf("launcher RSS: %d MiB before, %d MiB after, peak %d MiB", before>>20, now>>20, peak>>20)
	if grew := peak - before; grew > 32<<20 {
		t.Errorf("the launcher's memory grew by %d MiB under 1,000 hostile connections", grew>>20)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("job after the flood: %v\n%s", err, stderr.String())
	}
	for r := range 2 {
		if !strings.Contains(stdout.String(), fmt.Sprintf("rank %d of 2 passed the barrier", r)) {
			t.Errorf("rank %d did not finish:\n%s", r, stdout.String())
		}
	}
	log := stderr.String()
	for _, want := range []string{"level=WARN", "refused connection", "remote=127.0.0.1:", "reason="} {
		if !strings.Contains(log, want) {
			t.Errorf("launcher's stderr lacks %q", want)
		}
	}
}

// childrenOf lists pid's child processes.
func childrenOf(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, path := range tasks {
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// TestStaleSegmentsRemovedAtStart kills a launcher and its guard together, as
// an OOM killer or a kill -9 of the process group would, while its ranks hold
// their replay shards in shared memory; the segments stay behind. The next
// gearrun removes them, says so, and runs its own job.
func TestStaleSegmentsRemovedAtStart(t *testing.T) {
	dir, rt := t.TempDir(), t.TempDir()
	job := fmt.Sprintf("stale-%d", os.Getpid())
	cmd := gearrunCmd(t, "shardhold", []string{envDir + "=" + dir}, "--job-id", job, "-np", "2")
	cmd.Env = append(cmd.Env, rank.EnvRuntimeDir+"="+rt)
	var firstErr geartest.Buffer
	cmd.Stderr = &firstErr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pids := waitForFiles(t, dir, 2, underLoad)
	pattern := filepath.Join("/dev/shm", rank.SegmentName(job, "*"))
	segs, _ := filepath.Glob(pattern)
	if len(segs) == 0 {
		t.Fatalf("the ranks made no segments (%s); stderr:\n%s", pattern, firstErr.String())
	}
	t.Cleanup(func() {
		left, _ := filepath.Glob(pattern)
		for _, s := range left {
			os.Remove(s)
		}
	})
	var size int64
	for _, s := range segs {
		if fi, err := os.Stat(s); err == nil {
			size += fi.Size()
		}
	}
	var guard int
	for _, c := range childrenOf(cmd.Process.Pid) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c)); strings.TrimSpace(string(comm)) == "sh" {
			guard = c
		}
	}
	if guard == 0 {
		t.Fatal("no guard process among the launcher's children")
	}
	syscall.Kill(guard, syscall.SIGKILL)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	// The ranks end by their parent-death signal.
	assertAllGone(t, pids, time.Now().Add(underLoad))
	time.Sleep(200 * time.Millisecond)
	if left, _ := filepath.Glob(pattern); len(left) != len(segs) {
		t.Fatalf("%d of %d segments left after the kill; want all (the guard was killed)", len(left), len(segs))
	}

	var stdout, stderr geartest.Buffer
	next := gearrunCmd(t, "rdzv", nil, "-np", "2")
	next.Env = append(next.Env, rank.EnvRuntimeDir+"="+rt)
	next.Stdout, next.Stderr = &stdout, &stderr
	if err := next.Run(); err != nil {
		t.Fatalf("the next job: %v\n%s", err, stderr.String())
	}
	if left, _ := filepath.Glob(pattern); len(left) > 0 {
		t.Errorf("%v survived the next launch", left)
	}
	want := fmt.Sprintf("gearrun: removed %d shared-memory segments (%s) left by ended jobs %s", len(segs), launch.FormatBytes(size), job)
	if !strings.Contains(stderr.String(), want) {
		t.Errorf("the next launch did not say %q:\n%s", want, stderr.String())
	}
	if exists(filepath.Join(rt, job+".lock")) {
		t.Error("the ended job's lock file is still there")
	}
	if !strings.Contains(stdout.String(), "rank 1 of 2 passed the barrier") {
		t.Errorf("the next job did not run:\n%s", stdout.String())
	}
}
