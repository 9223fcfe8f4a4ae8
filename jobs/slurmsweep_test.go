package jobs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/gear-rl/gear/rank"
)

// TestSweepNode: the sweep removes every segment of its job (a shard kept
// across restarts, a dead rank's collective segment, its data segment) and
// leaves another job's, which it knows nothing about; it names the node and
// what it removed, and says so also when there was nothing left to remove,
// so that a job's output shows every node it swept.
func TestSweepNode(t *testing.T) {
	shm, runtime := t.TempDir(), t.TempDir()
	job, other := uuid.NewString(), uuid.NewString()
	mine := []string{
		rank.SegmentName(job, "dqn.replay.0"),
		rank.SegmentName(job, "coll.world.r1.5f3a"),
		rank.SegmentName(job, "table.replay.0"),
	}
	theirs := rank.SegmentName(other, "dqn.replay.0")
	for _, n := range append(slices.Clone(mine), theirs) {
		if err := os.WriteFile(filepath.Join(shm, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(rank.EnvSlurmdNodeName, "n2")
	var out strings.Builder
	if err := SweepNode(shm, runtime, job, &out); err != nil {
		t.Fatal(err)
	}
	want := "gearrun: sweep of n2: removed 3 segments (3 of job " + job + ", 0 of ended jobs)\n"
	if out.String() != want {
		t.Errorf("SweepNode said %q, want %q", out.String(), want)
	}
	left, _ := os.ReadDir(shm)
	if len(left) != 1 || left[0].Name() != theirs {
		t.Errorf("left in the shm directory: %v, want only %s", left, theirs)
	}
	out.Reset()
	if err := SweepNode(shm, runtime, job, &out); err != nil {
		t.Fatal(err)
	}
	if want := "gearrun: sweep of n2: removed 0 segments (0 of job " + job + ", 0 of ended jobs)\n"; out.String() != want {
		t.Errorf("second sweep said %q, want %q", out.String(), want)
	}
}
