package dist

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/roles/rolestest"
	"github.com/gear-rl/gear/store"
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

// restartingBoot is a rank's bootstrap under a launcher that restarts the
// world, as rank.World is under gearrun --max-restarts: the job's ID, the
// generation and the job's checkpoint directory.
type restartingBoot struct {
	collective.Bootstrap
	job, dir string
	gen      int
}

func (b restartingBoot) JobID() string         { return b.job }
func (b restartingBoot) CheckpointDir() string { return b.dir }
func (b restartingBoot) RestartCount() int     { return b.gen }

// TestWorldRestartedAfterTheSolve: under a launcher that restarts the world,
// a trainer whose run is over leaves its shard as one stopped for a restart
// does: a rank lost after the solve (an actor hung before it ended) restarts
// the world too, and the next generation's trainer re-attaches the shard
// with every committed row (docs/elastic.md, "What survives a restart"). The
// job's end removes the shard: the launcher's, here the test's.
func TestWorldRestartedAfterTheSolve(t *testing.T) {
	dir := t.TempDir()
	job := fmt.Sprintf("dqnsolvedrestart-%d", os.Getpid())
	cfg := quick(50_000)
	cfg.TargetReturn, cfg.Window = 60, 10
	shard := rank.SegmentName(job, fmt.Sprintf("dqn.%s.0", cfg.Table))
	t.Cleanup(func() { _ = store.Remove(shard) })
	var mu sync.Mutex
	var lines []string
	generation := func(gen int) []Result {
		t.Helper()
		w := rolestest.World(t, 2, rolestest.OneHost)
		hooks := Hooks{Logf: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, fmt.Sprintf(format, args...))
		}}
		boot := func(i int) collective.Bootstrap {
			return restartingBoot{Bootstrap: w.Bootstrap(i), job: job, dir: dir, gen: gen}
		}
		res, errs := runBoots(t, boot, []string{RoleTrainer, RoleActor}, cfg, hooks)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("generation %d, rank %d (%s): %v", gen, i, res[i].Role, err)
			}
		}
		return res
	}

	if res := generation(0); !res[0].Solved {
		t.Fatalf("generation 0 did not solve: %+v", res[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := store.Attach(ctx, shard)
	if err != nil {
		t.Fatalf("the shard after the solve: %v", err)
	}
	rows := s.Stats().Committed
	s.Close()
	if rows == 0 {
		t.Fatal("the shard holds no committed row after the solve")
	}

	generation(1)
	want := fmt.Sprintf("re-attached shard %s: ", shard)
	i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, want) })
	if i < 0 {
		t.Fatalf("generation 1's trainer did not re-attach the shard of %d rows; its lines:\n%s", rows, strings.Join(lines, "\n"))
	}
	var got int64
	if _, err := fmt.Sscanf(lines[i][strings.Index(lines[i], want)+len(want):], "%d committed rows", &got); err != nil || got < int64(rows) {
		t.Errorf("%q: want at least the %d committed rows generation 0 left (%v)", lines[i], rows, err)
	}
}
