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

// TestGearrunMaxRestarts: a DQN job (one trainer, one inline actor,
// checkpoints every second) under gearrun --max-restarts 1. Once the trainer
// has checkpointed a few times it is stopped, its shard's committed rows are
// counted and the parameter checkpoint read, and it is killed with SIGKILL.
// gearrun restarts the world; the restarted trainer re-attaches to its shard
// and finds at least those rows, publishes parameters above every version
// the killed one could have published, and the run solves CartPole (mean
// return 475 over 100 episodes). No segment is left.
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
	t.Logf("%d rows committed before the kill, %s; %s", committed, m[0], lastLine(log, "dqn: solved:"))
}

// TestActorLossKeepsLearnerState: when an actor is killed, the trainer is
// told to stop and writes its state (learner, Adam's moments, table counts,
// episodes) as it stops, and the next generation resumes the learner at the
// gradient step it stopped at, not at its last periodic checkpoint (up to
// a second older): nothing of the learning is rewound. The job is then
// stopped with SIGTERM; no segment is left.
func TestActorLossKeepsLearnerState(t *testing.T) {
	if testing.Short() {
		t.Skip("a DQN job under gearrun with a restart")
	}
	gearrun, dqn := binaries(t)
	dir := t.TempDir()
	job := fmt.Sprintf("dqnactorloss-%d", os.Getpid())
	t.Cleanup(func() {
		if left := segmentsLeft(job); len(left) > 0 {
			t.Errorf("segments left: %v", left)
			removeJobSegments(job)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gearrun, "--max-restarts", "1", "--checkpoint-dir", dir, "--job-id", job,
		"-np", "1", dqn, "--role", "trainer", "--seed", "1", "--report-every", "1s", "--checkpoint-every", "1s",
		"--target-return", "1000", ":", "-np", "1", dqn, "--role", "actor")
	cmd.Env = withoutRankEnv()
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf(format+"\n%s", append(args, out.String())...)
	}
	waitFor := func(what string, ok func(string) bool) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); !ok(out.String()); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				fail("no %s in 2 minutes", what)
			}
		}
	}
	// Learning has gone on for a while: some gradient steps past the
	// first state checkpoint.
	waitFor("learning", func(s string) bool { return strings.Count(s, "checkpoint replay.shard.0.ckpt") >= 2 })
	m := regexp.MustCompile(`actor 0: rank 1, pid (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		fail("no actor pid")
	}
	pid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		fail("kill: %v", err)
	}
	stoppedRe := regexp.MustCompile(`trainer 0: state written as it stops: (\d+) gradient steps`)
	resumedRe := regexp.MustCompile(`trainer 0: learner resumed: (\d+) gradient steps`)
	waitFor("resumed learner", func(s string) bool { return resumedRe.MatchString(s) })
	log := out.String()
	stopped, resumed := stoppedRe.FindStringSubmatch(log), resumedRe.FindStringSubmatch(log)
	if stopped == nil {
		fail("the trainer wrote no state as it stopped")
	}
	if stopped[1] != resumed[1] || stopped[1] == "0" {
		fail("stopped at %s gradient steps, the next generation resumed %s", stopped[1], resumed[1])
	}
	if !strings.Contains(log, "restart 1 of 1") {
		fail("gearrun logged no restart")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		fail("SIGTERM: %v", err)
	}
	cmd.Wait()
	t.Logf("%s; %s", stopped[0], resumed[0])
}
