package dist

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gear-rl/gear/examples/dqn/agent"
)

// TestOrphans: with 2 trainers left of 5, trainer 0 takes the checkpoints of
// old trainers 2 and 4, trainer 1 that of 3; nobody takes 0 or 1 (their own).
func TestOrphans(t *testing.T) {
	dir := t.TempDir()
	for j := range 5 {
		os.WriteFile(shardCheckpoint(dir, "replay", j), nil, 0o600)
	}
	os.WriteFile(filepath.Join(dir, "other.shard.7.ckpt"), nil, 0o600)
	got0 := orphans(dir, "replay", 2, 0)
	got1 := orphans(dir, "replay", 2, 1)
	want0 := []string{shardCheckpoint(dir, "replay", 2), shardCheckpoint(dir, "replay", 4)}
	if !slices.Equal(got0, want0) || !slices.Equal(got1, []string{shardCheckpoint(dir, "replay", 3)}) {
		t.Fatalf("orphans: %v, %v", got0, got1)
	}
	if o := orphans(dir, "replay", 5, 0); len(o) != 0 {
		t.Fatalf("orphans with as many trainers as checkpoints: %v", o)
	}
}

// TestKeysAndLabels: actors' keys differ across generations and actors, and a
// checkpoint label reads back.
func TestKeysAndLabels(t *testing.T) {
	seen := map[uint64]bool{}
	for gen := range 3 {
		for a := range 4 {
			k := actorKeyBase(gen, a)
			if seen[k] || k&(1<<40-1) != 0 {
				t.Fatalf("key base %x of generation %d, actor %d", k, gen, a)
			}
			seen[k] = true
		}
	}
	if got := describeLabel(checkpointLabel(3, 2, 1)); got != "generation 3, trainer 1 of 2" {
		t.Fatalf("label: %q", got)
	}
}

// TestBoardResume: the episodes and the ring of returns that a trainer
// state checkpoint carries put a new generation's board where the old one
// was: the same episode count and running mean, and the next episode goes
// on from there as it would have in the old generation.
func TestBoardResume(t *testing.T) {
	const window = 4
	old := &board{returns: make([]float64, window), target: 100}
	for i := range 6 {
		old.episode(agent.Episode{Return: float64(10 * (i + 1))}, int64(i), 0)
	}
	dir := t.TempDir()
	s := &trainerState{Trainers: 1}
	s.Episodes, s.Returns = old.save()
	if err := saveTrainerState(trainerStateFile(dir, 0), s); err != nil {
		t.Fatal(err)
	}
	got, _, err := loadTrainerState(dir, 0)
	if err != nil || got == nil {
		t.Fatalf("loadTrainerState: %v, %v", got, err)
	}
	nb := &board{returns: make([]float64, window), target: 100}
	nb.resume(got.Episodes, got.Returns)
	if p, q := nb.snapshot(), old.snapshot(); p.Episodes != 6 || p.MeanReturn != q.MeanReturn || p.MeanReturn != 45 {
		t.Errorf("resumed board: %d episodes, mean %v; want 6, %v (45)", p.Episodes, p.MeanReturn, q.MeanReturn)
	}
	want, _ := old.episode(agent.Episode{Return: 70}, 7, 0)
	p, _ := nb.episode(agent.Episode{Return: 70}, 7, 0)
	if p.Episodes != want.Episodes || p.MeanReturn != want.MeanReturn {
		t.Errorf("next episode: %d, mean %v; want %d, %v", p.Episodes, p.MeanReturn, want.Episodes, want.MeanReturn)
	}
	// A ring of another window, or none (an older checkpoint), leaves the
	// board fresh.
	fresh := &board{returns: make([]float64, window+1)}
	fresh.resume(got.Episodes, got.Returns)
	if p := fresh.snapshot(); p.Episodes != 0 {
		t.Errorf("resume with another window: %d episodes, want 0", p.Episodes)
	}
}

// TestBoardKeepsTheSolvingMean: an episode that ends after the run is solved
// (an actor that had not heard of it yet) changes neither the episode count
// nor the running mean the run reports. A return of 10 after the solving
// ones put the mean of a run solved at 60 at 59.1.
func TestBoardKeepsTheSolvingMean(t *testing.T) {
	bd := &board{returns: make([]float64, 2), target: 60}
	bd.episode(agent.Episode{Return: 70}, 10, 0)
	if _, solved := bd.episode(agent.Episode{Return: 70}, 20, 0); !solved {
		t.Fatal("not solved at a mean of 70 over the window")
	}
	p, solved := bd.episode(agent.Episode{Return: 10}, 30, 0)
	if !solved || p.Episodes != 2 || p.MeanReturn != 70 || p.Frames != 30 || bd.solvedN != 2 {
		t.Fatalf("after a later episode: solved %v, %d episodes, mean %v, %d frames (solved at %d); want 2, 70, 30 (2)",
			solved, p.Episodes, p.MeanReturn, p.Frames, bd.solvedN)
	}
}
