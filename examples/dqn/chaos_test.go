package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The chaos harness's short form, as CI runs it: scripts/chaos.sh with a
// fixed seed and two events (each a SIGKILL or a SIGSTOP past the heartbeat
// timeout of a random rank) on the DQN elastic job
// (examples/jobs/dqn-elastic.toml). The harness checks after each event that
// the restarted trainer found every row the trainer had reported and that
// parameter versions went on above the resumed one, and at the end the exit
// code, that no process of the job is left and no segment in /dev/shm, and
// that the run solved CartPole; it exits 0 only when all held, and prints a
// line per event and its verdict.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a full DQN run under the chaos harness")
	}
	gearrun, _ := binaries(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	work := t.TempDir()
	cmd := exec.CommandContext(ctx, "bash", "scripts/chaos.sh", "--seed", "7", "--events", "2",
		"--expect", "dqn: solved", "examples/jobs/dqn-elastic.toml")
	cmd.Dir = root
	// Events 4 to 8 s apart, so that both happen before the job, which
	// resumes its running mean across restarts, solves CartPole.
	cmd.Env = append(withoutRankEnv(), "GEARRUN="+gearrun, "CHAOS_DIR="+work, "TMPDIR="+work, "CHAOS_GAP=4")
	out, err := cmd.CombinedOutput()
	t.Logf("chaos.sh:\n%s", out)
	if err != nil {
		if log, rerr := os.ReadFile(filepath.Join(work, "output.log")); rerr == nil {
			t.Logf("the job's output:\n%s", log)
		}
		t.Fatalf("chaos.sh: %v", err)
	}
	events := regexp.MustCompile(`(?m)^chaos: +\d+s event \d+: .*: ok$`).FindAllString(string(out), -1)
	if len(events) != 2 {
		t.Errorf("%d events held, want 2", len(events))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "verdict: PASS") || !strings.Contains(last, "exit 0") {
		t.Errorf("last line %q, want a PASS verdict with exit 0", last)
	}
}
