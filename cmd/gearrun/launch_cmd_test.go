package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/internal/statehome"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"

	"go.uber.org/goleak"
)

// The test binary plays three parts: the tests; gearrun itself (envAsGearrun),
// so that tests can signal and kill a real launcher process; and the rank
// programs (envHelper), which gearrun launches with -x.
const (
	envAsGearrun = "GEARRUN_TEST_AS_GEARRUN"
	envHelper    = "GEARRUN_TEST_HELPER"
	envDir       = "GEARRUN_TEST_DIR"
	envLines     = "GEARRUN_TEST_LINES"
	envFailRank  = "GEARRUN_TEST_FAIL_RANK"
	envSkipRank  = "GEARRUN_TEST_SKIP_RANK"
	envNoTerm    = "GEARRUN_TEST_IGNORE_TERM"
	envNoInt     = "GEARRUN_TEST_IGNORE_INT"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envHelper); mode != "" {
		os.Exit(helper(mode))
	}
	if os.Getenv(envAsGearrun) == "1" {
		os.Exit(run(os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr}))
	}
	removeState := func() {}
	if os.Getenv(envHostsRank) == "" { // a rank of TestHostsOverSSH ends in os.Exit
		removeState = statehome.Private()
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		removeState()
		os.Exit(code)
	}))
}

// helper is a rank program.
func helper(mode string) int {
	r, _ := strconv.Atoi(os.Getenv(rank.EnvRank))
	size, _ := strconv.Atoi(os.Getenv(rank.EnvWorldSize))
	dir := os.Getenv(envDir)
	if os.Getenv(envNoTerm) == strconv.Itoa(r) {
		signal.Ignore(syscall.SIGTERM)
	}
	if os.Getenv(envNoInt) != "" {
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	}
	switch mode {
	case "lines":
		n, _ := strconv.Atoi(os.Getenv(envLines))
		// Small buffers so that lines are split across writes.
		out := bufio.NewWriterSize(os.Stdout, 97)
		errw := bufio.NewWriterSize(os.Stderr, 89)
		for i := range n {
			fmt.Fprintf(out, "%d:%d:%s\n", r, i, payload(r, i))
			fmt.Fprintf(errw, "e%d:%d:%s\n", r, i, payload(r, i))
		}
		out.Flush()
		errw.Flush()
		return 0
	case "hold", "failfast", "sigint":
		var sigs chan os.Signal
		if mode == "sigint" {
			sigs = make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGINT)
		}
		fail, _ := strconv.Atoi(os.Getenv(envFailRank))
		if mode == "failfast" && r == fail {
			writeFile(dir, fmt.Sprintf("pid.%d", r), os.Getpid())
			// Wait for the test's go-ahead, then fail.
			for !exists(filepath.Join(dir, "go")) {
				time.Sleep(10 * time.Millisecond)
			}
			return 3
		}
		child := exec.Command("sleep", "300")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		writeFile(dir, fmt.Sprintf("child.%d", r), child.Process.Pid)
		writeFile(dir, fmt.Sprintf("pid.%d", r), os.Getpid())
		if sigs != nil {
			<-sigs
			fmt.Printf("rank %d got SIGINT\n", r)
			child.Process.Kill()
			child.Wait()
			return 0
		}
		select {}
	case "rdzv":
		skip, _ := strconv.Atoi(os.Getenv(envSkipRank))
		if os.Getenv(envSkipRank) != "" && r == skip {
			time.Sleep(time.Minute)
			return 0
		}
		w, err := rank.Init(context.Background())
		if err != nil {
			fmt.Fprintln(os.Stderr, "init:", err)
			return 1
		}
		defer w.Close()
		if err := w.Barrier(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "barrier:", err)
			return 1
		}
		fmt.Printf("rank %d of %d passed the barrier\n", r, size)
		return 0
	case "shardhold":
		// Create this rank's replay shard in shared memory, as a trainer does,
		// then hold.
		spec := store.Spec{Capacity: 64, Columns: []store.Column{{Name: "obs", DType: store.Float32, Shape: []int{1024}, Length: 1}}}
		name := rank.SegmentName(os.Getenv(rank.EnvJobID), fmt.Sprintf("store.%d", r))
		sh, err := store.Create(name, spec)
		if err != nil {
			fmt.Fprintln(os.Stderr, "shard:", err)
			return 1
		}
		_ = sh
		writeFile(dir, fmt.Sprintf("pid.%d", r), os.Getpid())
		select {}
	case "rdzvwait":
		// Join, say so, wait for the test's go-ahead, then pass a barrier.
		w, err := rank.Init(context.Background())
		if err != nil {
			fmt.Fprintln(os.Stderr, "init:", err)
			return 1
		}
		defer w.Close()
		writeFile(dir, fmt.Sprintf("pid.%d", r), os.Getpid())
		for !exists(filepath.Join(dir, "go")) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := w.Barrier(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "barrier:", err)
			return 1
		}
		fmt.Printf("rank %d of %d passed the barrier\n", r, size)
		return 0
	case "stdin":
		io.Copy(os.Stdout, os.Stdin)
		return 0
	case "env":
		return writeBindingEnv(dir, r)
	case "elastic":
		return elasticHelper(r, dir)
	case "shrink":
		return shrinkHelper(r, dir)
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 2
}

func payload(r, i int) string {
	return strings.Repeat(string(rune('a'+(r+i)%26)), 40+(i%50))
}

func writeFile(dir, name string, pid int) {
	tmp := filepath.Join(dir, name+".tmp")
	os.WriteFile(tmp, []byte(strconv.Itoa(pid)), 0o644)
	os.Rename(tmp, filepath.Join(dir, name))
}

// underLoad bounds the waits for what happens at once on an idle machine:
// rank processes that start, end or are reaped, a launcher that ends after a
// signal. On 2 cores shared with other busy processes, under -race, that can
// take seconds; every such wait polls or selects, so a long bound costs
// nothing when it is met sooner, and still catches what never happens (a
// launcher that waits for ranks that ignore SIGTERM, a rank that survives).
const underLoad = time.Minute

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// gearrunCmd returns a command that runs this test binary as gearrun, with rank
// programs played by the test binary in helper mode.
func gearrunCmd(t *testing.T, mode string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// args are gearrun's flags ending in "-np N"; the program is this binary, and
	// only the ranks (-x) get the helper mode.
	full := append([]string{"-x", envHelper + "=" + mode}, args...)
	full = append(full, self)
	cmd := exec.Command(self, full...)
	cmd.Env = append(os.Environ(), envAsGearrun+"=1")
	cmd.Env = append(cmd.Env, env...)
	cmd.Env = append(cmd.Env, rank.EnvRuntimeDir+"="+t.TempDir())
	// A test that fails early still ends its launcher (and so, through the
	// parent-death signal and the guard, every rank).
	t.Cleanup(func() {
		if cmd.Process != nil && cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// pidsIn reads the pid files the helpers wrote.
func pidsIn(t *testing.T, dir string) map[string]int {
	t.Helper()
	out := map[string]int{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") || e.Name() == "go" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(b))
		if err == nil {
			out[e.Name()] = pid
		}
	}
	return out
}

func waitForFiles(t *testing.T, dir string, n int, d time.Duration) map[string]int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		pids := pidsIn(t, dir)
		if len(pids) >= n {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d pid files after %v: %v", len(pids), n, d, pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// assertAllGone checks that every process in pids has ended by the deadline; it
// kills survivors (so the test leaks nothing) and reports them.
func assertAllGone(t *testing.T, pids map[string]int, deadline time.Time) {
	t.Helper()
	for {
		var alive []string
		for name, pid := range pids {
			if rank.ProcessAlive(pid) {
				alive = append(alive, fmt.Sprintf("%s=%d", name, pid))
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("processes still alive: %v", alive)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func TestTaggedOutputNeverTearsLines(t *testing.T) {
	const ranks, lines = 4, 10000
	var stdout, stderr bytes.Buffer
	cmd := gearrunCmd(t, "lines", []string{envLines + "=" + strconv.Itoa(lines)}, "-np", strconv.Itoa(ranks))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("gearrun: %v\n%s", err, stderr.String())
	}
	check := func(stream string, out *bytes.Buffer, tag string) {
		re := regexp.MustCompile(`^\[(\d+)\] ` + tag + `(\d+):(\d+):([a-z]+)$`)
		next := make([]int, ranks)
		sc := bufio.NewScanner(out)
		n := 0
		for sc.Scan() {
			n++
			m := re.FindStringSubmatch(sc.Text())
			if m == nil {
				t.Fatalf("%s line %d is torn or foreign: %q", stream, n, sc.Text())
			}
			tagRank, _ := strconv.Atoi(m[1])
			r, _ := strconv.Atoi(m[2])
			i, _ := strconv.Atoi(m[3])
			if tagRank != r || r >= ranks || i != next[r] || m[4] != payload(r, i) {
				t.Fatalf("%s line %d: %q (want rank %d's line %d)", stream, n, sc.Text(), r, next[r])
			}
			next[r]++
		}
		for r, k := range next {
			if k != lines {
				t.Fatalf("%s: rank %d wrote %d lines, want %d", stream, r, k, lines)
			}
		}
	}
	check("stdout", &stdout, "")
	check("stderr", &stderr, "e")
}

// With --tag-output=false a rank's bytes pass through unchanged: no newline
// is added at the end, and a line of 3 MB is not split.
func TestUntaggedOutputPassesThrough(t *testing.T) {
	t.Setenv(rank.EnvRuntimeDir, t.TempDir())
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tag-output=false", "-np", "1", "printf", "abc"}, "abc"},
		{[]string{"--tag-output=false", "-np", "1", "sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' y"}, strings.Repeat("y", 3000000)},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, stdio{strings.NewReader(""), &out, &errb})
		if code != 0 || out.String() != c.want {
			t.Errorf("%v: exit %d, %d bytes out (ending %q), want 0 and %d bytes; stderr %q", c.args, code, out.Len(), out.String()[max(out.Len()-8, 0):], len(c.want), errb.String())
		}
	}
}

func TestFailFast(t *testing.T) {
	dir := t.TempDir()
	const grace = time.Second
	var stderr bytes.Buffer
	cmd := gearrunCmd(t, "failfast", []string{envDir + "=" + dir, envFailRank + "=1", envNoTerm + "=2"},
		"--grace", grace.String(), "-np", "4")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// 4 ranks, 3 of them with a grandchild.
	pids := waitForFiles(t, dir, 7, underLoad)
	start := time.Now()
	writeFile(dir, "go", 0)
	var err error
	select {
	case err = <-done:
	case <-time.After(grace + underLoad):
		// The ranks ignore SIGTERM: only the SIGKILL after the grace ends them.
		cmd.Process.Kill()
		<-done
		t.Fatalf("gearrun did not end %v after rank 1 failed; stderr:\n%s", grace+underLoad, stderr.String())
	}
	t.Logf("gearrun ended %v after the failure (grace %v)", time.Since(start).Round(time.Millisecond), grace)
	if code := exitCode(err); code != 3 {
		t.Fatalf("gearrun exit code %d, want 3; stderr:\n%s", code, stderr.String())
	}
	assertAllGone(t, pids, start.Add(grace+underLoad))
	if !regexp.MustCompile(`(?m)^gearrun: rank 1 \(pid \d+\) exited with status 3$`).MatchString(stderr.String()) {
		t.Fatalf("no line naming rank 1 and its status; stderr:\n%s", stderr.String())
	}
	if strings.Count(stderr.String(), "gearrun:") != 1 {
		t.Fatalf("want exactly one gearrun line; stderr:\n%s", stderr.String())
	}
}

func TestSIGINTIsForwarded(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	cmd := gearrunCmd(t, "sigint", []string{envDir + "=" + dir}, "--grace", "5s", "-np", "3")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pids := waitForFiles(t, dir, 6, underLoad)
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	if code := exitCode(err); code != 130 {
		t.Fatalf("exit code %d, want 130; stderr:\n%s", code, stderr.String())
	}
	for r := range 3 {
		if !strings.Contains(stdout.String(), fmt.Sprintf("[%d] rank %d got SIGINT", r, r)) {
			t.Fatalf("rank %d did not get SIGINT; stdout:\n%s\nstderr:\n%s", r, stdout.String(), stderr.String())
		}
	}
	assertAllGone(t, pids, time.Now().Add(underLoad))
}

func TestSecondSIGINTKillsAtOnce(t *testing.T) {
	dir := t.TempDir()
	var stderr bytes.Buffer
	// The ranks (and their children) ignore SIGINT and SIGTERM: the first SIGINT
	// changes nothing, the second must kill them at once, long before the grace.
	cmd := gearrunCmd(t, "hold", []string{envDir + "=" + dir, envNoInt + "=1"}, "--grace", "10m", "-np", "2")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pids := waitForFiles(t, dir, 4, underLoad)
	cmd.Process.Signal(syscall.SIGINT)
	time.Sleep(50 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if code := exitCode(err); code != 130 {
			t.Fatalf("exit code %d, want 130; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(underLoad):
		cmd.Process.Kill()
		<-done
		t.Fatalf("gearrun still running %v after two SIGINTs (grace 10m)", underLoad)
	}
	assertAllGone(t, pids, time.Now().Add(underLoad))
}

func TestSIGKILLOfGearrunLeavesNoSurvivors(t *testing.T) {
	dir := t.TempDir()
	job := fmt.Sprintf("sigkill-%d", os.Getpid())
	cmd := gearrunCmd(t, "hold", []string{envDir + "=" + dir}, "--job-id", job, "-np", "3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pids := waitForFiles(t, dir, 6, underLoad)
	seg := filepath.Join("/dev/shm", rank.SegmentName(job, "x"))
	if err := os.WriteFile(seg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(seg)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	assertAllGone(t, pids, time.Now().Add(underLoad))
	deadline := time.Now().Add(underLoad)
	for exists(seg) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if exists(seg) {
		t.Fatal("the job's segment survived the launcher's SIGKILL")
	}
}

func TestMissingRankNamed(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := gearrunCmd(t, "rdzv", []string{envSkipRank + "=2"}, "--rdzv-timeout", "4s", "--grace", "1s", "-np", "4")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if code := exitCode(err); code != launch.ExitLaunchFailed {
		t.Fatalf("exit code %d, want %d; stderr:\n%s", code, launch.ExitLaunchFailed, stderr.String())
	}
	if !strings.Contains(stderr.String(), "gearrun: rendezvous failed: rank 2 never joined") {
		t.Fatalf("launcher did not name rank 2; stderr:\n%s", stderr.String())
	}
	// The waiting ranks got the same news.
	if strings.Count(stderr.String(), "init: rank: rendezvous failed: rank 2 never joined") != 3 {
		t.Fatalf("waiting ranks did not all name rank 2; stderr:\n%s", stderr.String())
	}
	// It gave up after --rdzv-timeout 4s, not after the default.
	if d := time.Since(start); d >= rank.DefaultRdzvTimeout {
		t.Fatalf("took %v, as long as the default rendezvous timeout (%v), not --rdzv-timeout 4s", d, rank.DefaultRdzvTimeout)
	}
}

func TestRendezvousAndBarrier(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := gearrunCmd(t, "rdzv", nil, "-np", "4")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for r := range 4 {
		if !strings.Contains(stdout.String(), fmt.Sprintf("[%d] rank %d of 4 passed the barrier", r, r)) {
			t.Fatalf("rank %d missing:\n%s", r, stdout.String())
		}
	}
}

func TestWrongTokenRefusedByLauncher(t *testing.T) {
	dir := t.TempDir()
	var stderr geartest.Buffer
	// A job whose ranks hold: its coordinator keeps listening.
	cmd := gearrunCmd(t, "hold", []string{envDir + "=" + dir}, "-v", "-np", "2")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	waitForFiles(t, dir, 4, underLoad)
	addr := regexp.MustCompile(`rdzv=(127\.0\.0\.1:\d+)`).FindStringSubmatch(stderr.String())
	if addr == nil {
		t.Fatalf("no rendezvous address in the launcher's log:\n%s", stderr.String())
	}
	info := rank.Info{Rank: 0, Size: 2, LocalSize: 2, NumNodes: 1, RdzvAddr: addr[1],
		RdzvTimeout: underLoad, JobID: "whatever", Token: "guessed", Source: rank.SourceGear}
	_, err := rank.Init(context.Background(), rank.WithInfo(info))
	if !errors.Is(err, rank.ErrTokenRefused) {
		t.Fatalf("Init with a guessed token: %v", err)
	}
	deadline := time.Now().Add(underLoad)
	for !strings.Contains(stderr.String(), "refused connection") {
		if time.Now().After(deadline) {
			t.Fatalf("the launcher did not log the refusal:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStdinGoesToRankZero(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := gearrunCmd(t, "stdin", nil, "-np", "2")
	cmd.Stdin = strings.NewReader("line one\nline two\n")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if stdout.String() != "[0] line one\n[0] line two\n" {
		t.Fatalf("stdout %q", stdout.String())
	}
}

func TestDryRun(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"--dry-run", "--job-id", "job-7", "-x", "A=1", "-np", "2", "./actor", "--fast", ":",
		"-np", "1", "--role", "learner", "-x", "B=2", "./trainer"}, stdio{strings.NewReader(""), &out, &errb})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := `job job-7: 3 ranks on 1 node(s)
rendezvous 127.0.0.1:0 (port chosen at launch), timeout 1m0s, token ****
torch env: MASTER_ADDR=127.0.0.1 MASTER_PORT=(a free port reserved at launch)
role actor: ranks 0-1
role learner: ranks 2
env A=1
shared memory node 0: 3 ranks, at most 18.4 MiB (3 inboxes of 3 rings of 2.0 MiB, a board of 324.0 KiB), 24.0 KiB at setup
rank 0: local 0/3 node 0 role "actor"/0: ./actor --fast
rank 1: local 1/3 node 0 role "actor"/1: ./actor --fast
rank 2: local 2/3 node 0 role "learner"/0: ./trainer
  env B=2
`
	if out.String() != want {
		t.Fatalf("dry run:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	code = run([]string{"--dry-run", "--json", "-np", "2", "/bin/true"}, stdio{strings.NewReader(""), &out, &errb})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var plan struct {
		Token string `json:"token"`
		Ranks []struct {
			Rank    int      `json:"rank"`
			Environ []string `json:"environ"`
		} `json:"ranks"`
	}
	if err := json.Unmarshal(out.Bytes(), &plan); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if plan.Token != "****" || len(plan.Ranks) != 2 {
		t.Fatalf("plan %+v", plan)
	}
	if !contains(plan.Ranks[1].Environ, "GEAR_RANK=1") || !contains(plan.Ranks[1].Environ, "GEAR_JOB_TOKEN=****") {
		t.Fatalf("rank 1 environ %v", plan.Ranks[1].Environ)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-np", "0", "/bin/true"},
		{"/bin/true"},
		{"-np", "2"},
		{"-np", "1", "/bin/true", ":", "-np", "1"},
		{"--json", "-np", "1", "/bin/true"},
		{"--bogus", "-np", "1", "/bin/true"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, stdio{strings.NewReader(""), &out, &errb}); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errb.String())
		}
	}
}

// -x refuses every variable the launcher sets for each rank, as a job spec's
// env does (rank.LauncherEnv), before anything starts: in the flags before the
// first program and in a later group's.
func TestEnvFlagRefusesLauncherVariables(t *testing.T) {
	t.Setenv(rank.EnvRuntimeDir, t.TempDir())
	dir := t.TempDir()
	mark := filepath.Join(dir, "ran")
	prog := []string{"sh", "-c", "touch " + mark}
	for _, name := range rank.LauncherEnv() {
		for _, args := range [][]string{
			append([]string{"-x", name + "=7", "-np", "2"}, prog...),
			append([]string{"-x", name, "-np", "1"}, prog...),
			append([]string{"-np", "1", "/bin/true", ":", "-x", name + "=1", "-np", "1"}, prog...),
		} {
			var out, errb bytes.Buffer
			code := run(args, stdio{strings.NewReader(""), &out, &errb})
			want := "-x " + name + ": set by the launcher for each rank; -x may not set it\n"
			if code != 2 || !strings.HasPrefix(errb.String(), "gearrun: ") || !strings.HasSuffix(errb.String(), want) {
				t.Errorf("%v: exit %d, stderr %q; want 2 and %q", args, code, errb.String(), want)
			}
			if exists(mark) {
				t.Fatalf("%v: a rank ran", args)
			}
		}
	}
	// Names that merely look like the contract's pass.
	var out, errb bytes.Buffer
	if code := run([]string{"-x", "GEAR_RANKS=1", "-x", "GEAR_TRANSPORT=tcp", "-np", "1", "/bin/true"}, stdio{strings.NewReader(""), &out, &errb}); code != 0 {
		t.Errorf("exit %d (stderr %q), want 0", code, errb.String())
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		var out, errb bytes.Buffer
		if code := run([]string{arg}, stdio{strings.NewReader(""), &out, &errb}); code != 0 {
			t.Fatalf("%s: exit %d (stderr %q)", arg, code, errb.String())
		}
		if !strings.HasPrefix(out.String(), "gearrun ") || !strings.Contains(out.String(), "go1.") {
			t.Errorf("%s printed %q, want gearrun's version and the Go release", arg, out.String())
		}
	}
}

func TestVersionOf(t *testing.T) {
	const mod = "github.com/gear-rl/gear"
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "gearrun (devel) (revision unknown), go1.26 linux/amd64"},
		{"go run", &debug.BuildInfo{Main: debug.Module{Path: mod, Version: "(devel)"}},
			"gearrun (devel) (module " + mod + ", revision unknown), go1.26 linux/amd64"},
		{"go install @v0.3.0", &debug.BuildInfo{Main: debug.Module{Path: mod, Version: "v0.3.0"}},
			"gearrun v0.3.0 (module " + mod + ", revision unknown), go1.26 linux/amd64"},
		{"go install @latest of an untagged commit", &debug.BuildInfo{Main: debug.Module{Path: mod, Version: "v0.0.0-20261125021500-7b9c7f85b26c"}},
			"gearrun v0.0.0-20261125021500-7b9c7f85b26c (module " + mod + ", revision 7b9c7f85b26c), go1.26 linux/amd64"},
		{"pseudo-version after a tag", &debug.BuildInfo{Main: debug.Module{Path: mod, Version: "v0.3.1-0.20261125021500-0123456789ab"}},
			"gearrun v0.3.1-0.20261125021500-0123456789ab (module " + mod + ", revision 0123456789ab), go1.26 linux/amd64"},
		{"go build in a modified checkout", &debug.BuildInfo{
			Main:     debug.Module{Path: mod, Version: "v0.0.0-20261125021500-7b9c7f85b26c+dirty"},
			Settings: vcs("7b9c7f85b26c5d1e2f3a4b5c6d7e8f9a0b1c2d3e", "true")},
			"gearrun v0.0.0-20261125021500-7b9c7f85b26c+dirty (module " + mod + ", revision 7b9c7f85b26c, modified), go1.26 linux/amd64"},
		{"a prerelease tag is not a pseudo-version", &debug.BuildInfo{Main: debug.Module{Path: mod, Version: "v1.0.0-rc1"}},
			"gearrun v1.0.0-rc1 (module " + mod + ", revision unknown), go1.26 linux/amd64"},
	} {
		if got := versionOf(c.bi, "go1.26 linux/amd64"); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}

// A gearrun built in a checkout names the checkout's commit.
func TestVersionOfACheckoutBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gearrun")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout (git rev-parse HEAD: %v)", err)
	}
	// The go command stamps a build with its revision only where the
	// checkout's .git is a directory: never in a linked worktree (git
	// worktree add), whose .git is a file.
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("git rev-parse --show-toplevel: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git")); err != nil || !fi.IsDir() {
		t.Skip("a linked git worktree (.git is a file): the go command records no VCS revision there")
	}
	bin := filepath.Join(t.TempDir(), "gearrun")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "(module github.com/gear-rl/gear, revision " + string(head[:12])
	if !strings.HasPrefix(string(out), "gearrun v") || !strings.Contains(string(out), want) {
		t.Fatalf("gearrun --version printed %q, want a module version and %q", out, want)
	}
}

func TestExitCodes(t *testing.T) {
	t.Setenv(rank.EnvRuntimeDir, t.TempDir())
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"-np", "2", "/bin/true"}, 0},
		{[]string{"-np", "2", "sh", "-c", "exit $((GEAR_RANK * 4))"}, 4},
		{[]string{"-np", "1", "sh", "-c", "kill -SEGV $$"}, 128 + 11},
		{[]string{"-np", "1", "/no/such/program"}, 127},
		{[]string{"-np", "1", "--timeout", "300ms", "sleep", "10"}, 124},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, stdio{strings.NewReader(""), &out, &errb}); code != c.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", c.args, code, c.code, errb.String())
		}
	}
}

func TestClean(t *testing.T) {
	shm, rt := t.TempDir(), t.TempDir()
	lock, err := rank.LockJob(rt, "alive-job", true)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	for _, name := range []string{
		rank.SegmentName("alive-job", "a"),
		rank.SegmentName("gone-job", "a"),
		rank.SegmentName("gone-job", "b"),
		rank.SegmentName(rank.LocalJobID(), "mine"),
		rank.SegmentName("local-999999999", "dead"),
		"not-gear",
	} {
		os.WriteFile(filepath.Join(shm, name), nil, 0o600)
	}
	os.WriteFile(filepath.Join(rt, "gone-job.lock"), nil, 0o600)
	var out, errb bytes.Buffer
	if code := run([]string{"clean", "--shm-dir", shm, "--runtime-dir", rt}, stdio{nil, &out, &errb}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, gone := range []string{"gear.gone-job.a", "gear.gone-job.b", "gear.local-999999999.dead"} {
		if !strings.Contains(out.String(), "removed segment "+gone) || exists(filepath.Join(shm, gone)) {
			t.Errorf("%s not removed; output:\n%s", gone, out.String())
		}
	}
	for _, kept := range []string{rank.SegmentName("alive-job", "a"), rank.SegmentName(rank.LocalJobID(), "mine"), "not-gear"} {
		if !exists(filepath.Join(shm, kept)) {
			t.Errorf("%s removed although its job lives", kept)
		}
	}
	if exists(filepath.Join(rt, "gone-job.lock")) || !exists(filepath.Join(rt, "alive-job.lock")) {
		t.Error("stale lock not removed, or live lock removed")
	}
}

func TestLauncherLeavesNothingBehind(t *testing.T) {
	rt := t.TempDir()
	t.Setenv(rank.EnvRuntimeDir, rt)
	job := fmt.Sprintf("leak-%d", os.Getpid())
	seg := filepath.Join("/dev/shm", rank.SegmentName(job, "x"))
	var out, errb bytes.Buffer
	code := run([]string{"--job-id", job, "-np", "2", "sh", "-c", "touch " + seg + "; echo $GEAR_RDZV_ADDR"},
		stdio{strings.NewReader(""), &out, &errb})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if exists(seg) {
		os.Remove(seg)
		t.Fatal("the job's segment was not removed")
	}
	if entries, _ := os.ReadDir(rt); len(entries) != 0 {
		t.Fatalf("runtime dir not empty: %v", entries)
	}
	addr := strings.TrimPrefix(strings.SplitN(out.String(), "\n", 2)[0], "[0] ")
	addr = strings.TrimPrefix(addr, "[1] ")
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("coordinator %s still listening", addr)
	}
}
