package main

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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/store"
)

// lockedBuffer is a bytes.Buffer that ranks' output and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// removeJobSegments removes whatever segments of job id are left.
func removeJobSegments(id string) {
	for _, p := range segmentsLeft(id) {
		_ = store.Remove(filepath.Base(p))
	}
}

// TestTrainerRestartKeepsReplay: a DQN job (one trainer, one inline actor,
// checkpoints every second) runs until it has checkpointed and learned a
// while; its trainer is killed with SIGKILL. The launcher of this first
// generation is told another shared-memory directory, so the job's segments
// stay, as the launcher keeps them while restarts remain. The test counts the
// rows committed in the trainer's shard and reads the parameter checkpoint;
// the second generation (the same job ID, GEAR_RESTART_COUNT=1) re-attaches
// to the shard and finds every one of those rows, resumes the parameters
// above every version published before, and solves CartPole (mean return 475
// over 100 episodes). No segment is left.
func TestTrainerRestartKeepsReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("a full DQN run")
	}
	_, dqn := binaries(t)
	dir := t.TempDir()
	job := fmt.Sprintf("dqnrestart-%d", os.Getpid())
	t.Cleanup(func() {
		if left := segmentsLeft(job); len(left) > 0 {
			t.Errorf("segments left: %v", left)
			removeJobSegments(job)
		}
	})
	plan := func(gen int) *launch.Plan {
		p, err := launch.NewPlan(launch.Request{
			JobID: job,
			Groups: []launch.Group{
				{Role: "trainer", NP: 1, Argv: []string{dqn, "--seed", "1", "--report-every", "1s", "--checkpoint-every", "1s"}},
				{Role: "actor", NP: 1, Argv: []string{dqn}},
			},
			Env: []string{rank.EnvCheckpointDir + "=" + dir, rank.EnvRestartCount + "=" + strconv.Itoa(gen)},
		})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	// Generation 0: kill the trainer once it has checkpointed and trained a while.
	var out0 lockedBuffer
	pids := make(chan int, 2)
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	go func() {
		_, err := launch.Run(ctx, plan(0), launch.Options{Stdout: &out0, Stderr: &out0, BaseEnv: withoutRankEnv(),
			ShmDir: t.TempDir(), Grace: 2 * time.Second,
			OnStart: func(rk, pid int) {
				if rk == 0 {
					pids <- pid
				}
			}})
		done <- err
	}()
	trainer := <-pids
	deadline := time.Now().Add(2 * time.Minute)
	for strings.Count(out0.String(), "checkpoint replay.shard.0.ckpt") < 3 || !strings.Contains(out0.String(), "episode") {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("no checkpoints and episodes in 2 minutes:\n%s", out0.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	if err := syscall.Kill(trainer, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatalf("generation 0 succeeded with its trainer killed:\n%s", out0.String())
	}
	name := rank.SegmentName(job, "dqn.replay.0")
	s, err := store.Attach(ctx, name)
	if err != nil {
		t.Fatalf("the shard after the kill: %v\n%s", err, out0.String())
	}
	before := s.Stats()
	s.Close()
	pc, err := roles.ReadParamCheckpoint(filepath.Join(dir, "theta.param"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("generation 0: trainer killed with %d rows committed (commit seq %d), parameter checkpoint version %d, reserved %d",
		before.Committed, before.Commits, pc.Version, pc.Reserved)
	if before.Committed < 1000 {
		t.Fatalf("only %d rows committed before the kill:\n%s", before.Committed, out0.String())
	}

	// Generation 1.
	var out1 lockedBuffer
	if _, err := launch.Run(ctx, plan(1), launch.Options{Stdout: &out1, Stderr: &out1, BaseEnv: withoutRankEnv(),
		Grace: 2 * time.Second, Timeout: 3 * time.Minute}); err != nil {
		t.Fatalf("generation 1: %v\n%s", err, out1.String())
	}
	log := out1.String()
	m := regexp.MustCompile(`re-attached shard \S+: (\d+) committed rows`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("generation 1 did not re-attach its shard:\n%s", log)
	}
	found, _ := strconv.Atoi(m[1])
	if found < before.Committed {
		t.Fatalf("re-attached %d rows, %d were committed before the kill", found, before.Committed)
	}
	m = regexp.MustCompile(`parameters of version (\d+) resumed from \S+; versions go on from (\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("generation 1 did not resume the parameters:\n%s", log)
	}
	from, _ := strconv.ParseUint(m[2], 10, 64)
	if from <= pc.Reserved || from <= pc.Version {
		t.Fatalf("generation 1 publishes from version %d, generation 0 reserved up to %d", from, pc.Reserved)
	}
	if !strings.Contains(log, "dqn: solved:") {
		t.Fatalf("generation 1 did not solve:\n%s", log)
	}
	t.Logf("generation 1: %d rows re-attached, versions from %d; %s", found, from, lastLine(log, "dqn: solved:"))
	if left := segmentsLeft(job); len(left) > 0 {
		t.Fatalf("segments left after generation 1: %v", left)
	}
}

// lastLine returns the last line of s that contains sub.
func lastLine(s, sub string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], sub) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// TestGearrunMaxRestarts: the same under gearrun --max-restarts 1 (MPMD on the command line): the trainer
// is killed with SIGKILL mid-run, gearrun restarts the job, the restarted
// trainer re-attaches to its shard with at least the rows its predecessor
// checkpointed, and the run solves. No segment is left.
func TestGearrunMaxRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("a full DQN run")
	}
	gearrun, dqn := binaries(t)
	dir := t.TempDir()
	job := fmt.Sprintf("dqnelastic-%d", os.Getpid())
	t.Cleanup(func() {
		if left := segmentsLeft(job); len(left) > 0 {
			t.Errorf("segments left: %v", left)
			removeJobSegments(job)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gearrun, "--max-restarts", "1", "--checkpoint-dir", dir, "--job-id", job,
		"-np", "1", dqn, "--role", "trainer", "--seed", "1", "--report-every", "1s", "--checkpoint-every", "1s",
		":", "-np", "1", dqn, "--role", "actor")
	cmd.Env = withoutRankEnv()
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pidRe := regexp.MustCompile(`trainer 0 of 1: rank 0, pid (\d+)`)
	deadline := time.Now().Add(2 * time.Minute)
	for strings.Count(out.String(), "checkpoint replay.shard.0.ckpt") < 3 {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no checkpoints in 2 minutes:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	m := pidRe.FindStringSubmatch(out.String())
	if m == nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("no trainer pid:\n%s", out.String())
	}
	pid, _ := strconv.Atoi(m[1])
	// The rows committed before the kill: the trainer is stopped, the shard
	// counted, then the trainer killed (actors may commit more meanwhile, never
	// fewer rows are there).
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	sh, err := store.Attach(ctx, rank.SegmentName(job, "dqn.replay.0"))
	if err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		cmd.Wait()
		t.Fatalf("the trainer's shard: %v\n%s", err, out.String())
	}
	committed := sh.Stats().Committed
	sh.Close()
	pc, err := roles.ReadParamCheckpoint(filepath.Join(dir, "theta.param"))
	if err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		cmd.Wait()
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gearrun --max-restarts 1: %v\n%s", err, out.String())
	}
	log := out.String()
	m = regexp.MustCompile(`(?:re-attached|restored) shard \S+.*?: (\d+) committed rows`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("the restarted trainer found no shard:\n%s", log)
	}
	if found, _ := strconv.Atoi(m[1]); found < committed {
		t.Fatalf("the restarted trainer found %d rows, %d were committed before the kill", found, committed)
	}
	if !strings.Contains(log, "restart 1 of 1") {
		t.Fatalf("gearrun logged no restart:\n%s", log)
	}
	m = regexp.MustCompile(`parameters of version (\d+) resumed from \S+; versions go on from (\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("the restarted trainer did not resume the parameters:\n%s", log)
	}
	if from, _ := strconv.ParseUint(m[2], 10, 64); from <= pc.Reserved || from <= pc.Version {
		t.Fatalf("the restarted trainer publishes from version %d, the killed one reached %d (reserved %d)", from, pc.Version, pc.Reserved)
	}
	if !strings.Contains(log, "dqn: solved:") {
		t.Fatalf("not solved after the restart:\n%s", log)
	}
}
