package main

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"
)

const (
	envKills     = "GEARRUN_TEST_KILLS"     // rank 1 kills itself while GEAR_RESTART_COUNT is below it
	envStraggle  = "GEARRUN_TEST_STRAGGLE"  // rank 1 of generation 0 leaves a straggler behind
	envStraggler = "GEARRUN_TEST_STRAGGLER" // this process is that straggler
	stragglerOut = "straggler.out"          // what the straggler's join got
	gen1Joined   = "gen1"                   // generation 1 has assembled
	shardName    = "store.elastic.shard.1"  // rank 1's segment, kept across restarts
	waitFor      = underLoad                // bound on the helpers' waits
)

// elasticHelper is a rank of a job with restarts: it joins, prints its
// generation, world size and checkpoint directory, and passes a barrier.
// Rank 1 makes a replay shard in shared memory in generation 0, checks in
// every later one that it survived, and kills itself with SIGKILL while the
// generation is below $GEARRUN_TEST_KILLS.
func elasticHelper(r int, dir string) int {
	if os.Getenv(envStraggler) != "" {
		return straggler(dir)
	}
	ctx := context.Background()
	w, err := rank.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	defer w.Close()
	gen := w.RestartCount()
	fmt.Printf("rank %d gen %d size %d ckpt %s torch %s/%s\n", r, gen, w.Size(), w.CheckpointDir(),
		os.Getenv(rank.EnvTorchRestartCount), os.Getenv(rank.EnvTorchMaxRestarts))
	seg := rank.SegmentName(w.JobID(), shardName)
	if r == 1 {
		if gen == 0 {
			spec := store.Spec{Capacity: 16, Columns: []store.Column{{Name: "obs", DType: store.Float32, Shape: []int{4}, Length: 1}}}
			if _, err := store.Create(seg, spec); err != nil {
				fmt.Fprintln(os.Stderr, "shard:", err)
				return 1
			}
		} else if !exists(filepath.Join("/dev/shm", seg)) {
			fmt.Fprintf(os.Stderr, "generation %d: shard %s lost\n", gen, seg)
			return 1
		}
	}
	if os.Getenv(envStraggle) != "" {
		switch {
		case gen == 0 && r == 1:
			if err := startStraggler(dir); err != nil {
				fmt.Fprintln(os.Stderr, "straggler:", err)
				return 1
			}
		case gen == 1 && r == 0:
			writeFile(dir, gen1Joined, os.Getpid())
			for deadline := time.Now().Add(waitFor); !exists(filepath.Join(dir, stragglerOut)); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					fmt.Fprintln(os.Stderr, "no word from the straggler")
					return 1
				}
			}
		}
	}
	// Every rank has printed its line before rank 1 dies: the launcher's stop
	// could otherwise reach rank 0 before its line.
	if err := w.Barrier(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "barrier:", err)
		return 1
	}
	kills, _ := strconv.Atoi(os.Getenv(envKills))
	if r == 1 && gen < kills {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if err := w.Barrier(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "barrier:", err)
		return 1
	}
	return 0
}

// startStraggler starts a copy of this rank, with its environment, in a
// session of its own, so that it outlives the generation the launcher stops.
func startStraggler(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envStraggler+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	writeFile(dir, "straggler.pid", cmd.Process.Pid)
	return cmd.Process.Release()
}

// straggler waits for generation 1 to assemble, then joins with generation
// 0's contract and writes what the coordinator said.
func straggler(dir string) int {
	for deadline := time.Now().Add(waitFor); !exists(filepath.Join(dir, gen1Joined)); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return 1
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	msg := "joined"
	w, err := rank.Init(ctx)
	if err != nil {
		msg = err.Error()
	} else {
		w.Close()
	}
	tmp := filepath.Join(dir, stragglerOut+".tmp")
	os.WriteFile(tmp, []byte(msg), 0o644)
	os.Rename(tmp, filepath.Join(dir, stragglerOut))
	return 0
}

// runElastic runs gearrun with the elastic helper on 2 ranks and returns its
// exit code, stdout and stderr.
func runElastic(t *testing.T, dir, job string, env []string, args ...string) (int, string, string) {
	t.Helper()
	args = append([]string{"--job-id", job, "--grace", "2s"}, args...)
	cmd := gearrunCmd(t, "elastic", append([]string{envDir + "=" + dir}, env...), append(args, "-np", "2")...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if m, _ := filepath.Glob(filepath.Join("/dev/shm", rank.SegmentName(job, "*"))); len(m) != 0 {
		for _, s := range m {
			os.Remove(s)
		}
		t.Errorf("segments left after the job: %v", m)
	}
	return exitCode(err), out.String(), errb.String()
}

var restartLine = regexp.MustCompile(`(?m)^gearrun: restart (\d) of 2: rank 1 \(pid \d+\) killed by SIGKILL$`)

// gearrun --max-restarts 2 with rank 1 killed by SIGKILL twice: the third
// generation finishes and gearrun exits 0; rank 1's shard in /dev/shm
// survives both restarts and is gone after the job; the checkpoint directory
// (by default under $XDG_STATE_HOME) is the same for every generation, kept
// after the job, and removed by gearrun clean --checkpoints.
func TestMaxRestarts(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	job := fmt.Sprintf("restarts-%d", os.Getpid())
	code, out, errs := runElastic(t, dir, job, []string{envKills + "=2", "XDG_STATE_HOME=" + state}, "--max-restarts", "2")
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s\nstdout:\n%s", code, errs, out)
	}
	if m := restartLine.FindAllStringSubmatch(errs, -1); len(m) != 2 || m[0][1] != "1" || m[1][1] != "2" {
		t.Fatalf("want restart lines 1 and 2 of 2; stderr:\n%s", errs)
	}
	ckpt := filepath.Join(state, "gear", "checkpoints", job)
	for gen := range 3 {
		for r := range 2 {
			want := fmt.Sprintf("[%d] rank %d gen %d size 2 ckpt %s torch %d/2", r, r, gen, ckpt, gen)
			if !strings.Contains(out, want+"\n") {
				t.Errorf("no %q in the output:\n%s", want, out)
			}
		}
	}
	if !exists(ckpt) {
		t.Fatalf("checkpoint directory %s not kept after the job", ckpt)
	}
	var cout, cerr bytes.Buffer
	clean := func() int {
		cout.Reset()
		cerr.Reset()
		cmd := exec.Command(os.Args[0], "clean", "--checkpoints", job)
		cmd.Env = append(os.Environ(), envAsGearrun+"=1", "XDG_STATE_HOME="+state)
		cmd.Stdout, cmd.Stderr = &cout, &cerr
		return exitCode(cmd.Run())
	}
	if c := clean(); c != 0 || cout.String() != "removed checkpoints "+ckpt+"\n" || exists(ckpt) {
		t.Fatalf("gearrun clean --checkpoints: exit %d, %q %q", c, cout.String(), cerr.String())
	}
	if c := clean(); c != 1 || !strings.Contains(cerr.String(), job) {
		t.Fatalf("gearrun clean --checkpoints of a job without checkpoints: exit %d, %q; want 1 and an error naming %s", c, cerr.String(), job)
	}
}

// A third kill with --max-restarts 2 ends gearrun with the rank's code:
// 137, 128+SIGKILL.
func TestMaxRestartsSpent(t *testing.T) {
	dir := t.TempDir()
	job := fmt.Sprintf("spent-%d", os.Getpid())
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	code, out, errs := runElastic(t, dir, job, []string{envKills + "=3"}, "--max-restarts", "2", "--checkpoint-dir", ckpt)
	if code != 137 {
		t.Fatalf("exit %d, want 137\nstderr:\n%s\nstdout:\n%s", code, errs, out)
	}
	if m := restartLine.FindAllString(errs, -1); len(m) != 2 {
		t.Fatalf("want 2 restart lines; stderr:\n%s", errs)
	}
	if !regexp.MustCompile(`(?m)^gearrun: rank 1 \(pid \d+\) killed by SIGKILL$`).MatchString(errs) {
		t.Fatalf("no final line naming rank 1; stderr:\n%s", errs)
	}
	if !strings.Contains(out, "gen 2 size 2 ckpt "+ckpt) {
		t.Fatalf("no third generation with the checkpoint directory given; stdout:\n%s", out)
	}
}

// A straggler of generation 0 (a copy of rank 1 that escaped the stop) that
// tries to join generation 1 is refused by name: the error it gets and
// gearrun's warning say so, and generation 1 finishes.
func TestStragglerOfOlderGenerationRefused(t *testing.T) {
	dir := t.TempDir()
	job := fmt.Sprintf("straggler-%d", os.Getpid())
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(dir, "straggler.pid")); err == nil {
			if pid, _ := strconv.Atoi(string(b)); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	code, out, errs := runElastic(t, dir, job, []string{envKills + "=1", envStraggle + "=1"},
		"--max-restarts", "1", "--checkpoint-dir", filepath.Join(t.TempDir(), "ckpt"))
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s\nstdout:\n%s", code, errs, out)
	}
	const want = "rank 1 of generation 0 refused: the job is at generation 1"
	got, _ := os.ReadFile(filepath.Join(dir, stragglerOut))
	if !strings.Contains(string(got), want) {
		t.Fatalf("the straggler got %q, want %q", got, want)
	}
	if !regexp.MustCompile(`level=WARN .*` + regexp.QuoteMeta(want)).MatchString(errs) {
		t.Fatalf("gearrun did not warn of the refusal; stderr:\n%s", errs)
	}
}

func TestMaxRestartsFlagErrors(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--max-restarts", "-1", "-np", "1", "true"}, stdio{strings.NewReader(""), &out, &errb}); code != 2 ||
		!strings.Contains(errb.String(), "--max-restarts -1") {
		t.Fatalf("exit %d, %q", code, errb.String())
	}
}

// -np MIN:MAX: MAX ranks on this machine, the bounds in the plan; bad
// bounds and an elastic group of several are errors naming them.
func TestElasticNP(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--dry-run", "--json", "-np", "2:3", "true"}, stdio{strings.NewReader(""), &out, &errb}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var p launch.Plan
	if err := json.Unmarshal(out.Bytes(), &p); err != nil || len(p.Ranks) != 3 || p.MinSize != 2 || p.MaxSize != 3 {
		t.Fatalf("plan %s: %v", out.String(), err)
	}
	out.Reset()
	if code := run([]string{"-np", "2:3", "sh", "-c", `echo "$GEAR_RANK/$GEAR_WORLD_SIZE"`}, stdio{strings.NewReader(""), &out, &errb}); code != 0 ||
		!strings.Contains(out.String(), "[2] 2/3") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-np", "5:4", "true"}, `"5:4": want MIN:MAX with 1 <= MIN <= MAX`},
		{[]string{"-np", "0:4", "true"}, `"0:4": want MIN:MAX with 1 <= MIN <= MAX`},
		{[]string{"-np", "x", "true"}, `"x": want a number of ranks, or MIN:MAX`},
		{[]string{"-np", "2:4", "true", ":", "-np", "1", "true"}, "-np 2:4: an elastic size is for a job of one group"},
	} {
		errb.Reset()
		if code := run(tc.args, stdio{strings.NewReader(""), &out, &errb}); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("gearrun %v: exit %d, %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
