package dist

import (
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

// A restarted job (GEAR_RESTART_COUNT above 0) keeps its replay and its
// parameters:
//
//   - A trainer whose shard is still in shared memory (same host, the
//     launcher kept the job's segments) takes it over (store.Open): every
//     committed row is there, rows half-written by dead actors are reclaimed,
//     and the table admits every row at once.
//   - Otherwise it restores its shard from the checkpoint that it (or the
//     trainer of its index in the previous generation) wrote every
//     CheckpointEvery to the job's checkpoint directory.
//   - With fewer trainers than the checkpoints were written by, trainer i of
//     n also merges the checkpoints of the old trainers j >= n with j mod n
//     == i into its shard, which is made large enough for all of them, so
//     that no checkpointed row is dropped.
//   - The first trainer resumes the parameters and their version from the
//     parameter checkpoint beside the shards, and the other trainers take
//     both from it.

// checkpointDir is the job's checkpoint directory ("" for none).
func checkpointDir(b collective.Bootstrap) string {
	if w, ok := b.(interface{ CheckpointDir() string }); ok {
		return w.CheckpointDir()
	}
	return ""
}

// restartCount is the job's generation (0 for the first).
func restartCount(b collective.Bootstrap) int {
	if w, ok := b.(interface{ RestartCount() int }); ok {
		return w.RestartCount()
	}
	return 0
}

// actorKeyBase is the first replay key of actor index in generation gen: keys
// of one generation never meet those of the rows an earlier one left.
func actorKeyBase(gen, index int) uint64 {
	return uint64(gen&0xff)<<56 | uint64(index+1)<<40
}

// shardCheckpoint is the path of trainer index's shard checkpoint.
func shardCheckpoint(dir, table string, index int) string {
	return filepath.Join(dir, fmt.Sprintf("%s.shard.%d.ckpt", table, index))
}

// paramCheckpoint is the path of the parameter checkpoint.
func paramCheckpoint(dir string) string { return filepath.Join(dir, thetaName+".param") }

// checkpointLabel records who wrote a shard checkpoint: the generation, the
// number of trainers and the trainer's index.
func checkpointLabel(gen, trainers, index int) uint64 {
	return uint64(uint32(gen))<<32 | uint64(uint16(trainers))<<16 | uint64(uint16(index))
}

func describeLabel(l uint64) string {
	return fmt.Sprintf("generation %d, trainer %d of %d", l>>32, uint16(l), uint16(l>>16))
}

// orphans lists the shard checkpoints in dir of trainers j >= trainers with
// j mod trainers == index: those this trainer takes over.
func orphans(dir, table string, trainers, index int) []string {
	if dir == "" {
		return nil
	}
	paths, _ := filepath.Glob(filepath.Join(dir, table+".shard.*.ckpt"))
	var out []string
	for _, p := range paths {
		s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), table+".shard."), ".ckpt")
		j, err := strconv.Atoi(s)
		if err == nil && j >= trainers && j%trainers == index {
			out = append(out, p)
		}
	}
	return out
}

// openShard makes the trainer's shard for this generation: taken over from
// shared memory, restored from its checkpoint, or new, with the orphaned
// checkpoints merged in. It returns the shard, the table's maximum size and
// a line that says what it found.
func (r *rankRun) openShard(ctx context.Context, name string, spec store.Spec, maxSize int) (*store.Shard, int, []string, string, error) {
	dir := checkpointDir(r.b)
	ti, nt := r.trainerIndex(r.me), len(r.plan.Trainers)
	own := ""
	if dir != "" {
		own = shardCheckpoint(dir, r.cfg.Table, ti)
	}
	orph := orphans(dir, r.cfg.Table, nt, ti)
	if len(orph) == 0 {
		s, err := store.Open(name, spec)
		if err == nil {
			return s, maxSize, nil, fmt.Sprintf("re-attached shard %s: %d committed rows", name, s.Stats().Committed), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, 0, nil, "", err
		}
		if own != "" {
			if info, err := store.ReadCheckpointInfo(own); err == nil {
				s, err := store.Restore(ctx, own, name, store.WithSpec(spec))
				if err != nil {
					return nil, 0, nil, "", err
				}
				return s, maxSize, nil, fmt.Sprintf("restored shard %s from %s (%s): %d committed rows", name, own, describeLabel(info.Label), s.Stats().Committed), nil
			}
		}
		s, err = store.Create(name, spec)
		return s, maxSize, nil, "", err
	}
	// Room for this trainer's rows and each orphan's.
	grow := 1 + len(orph)
	big := spec
	big.Capacity = spec.Capacity + (grow-1)*maxSize
	bigName := fmt.Sprintf("%s.g%d", name, restartCount(r.b))
	s, err := store.Create(bigName, big)
	if err != nil {
		return nil, 0, nil, "", err
	}
	fail := func(err error) (*store.Shard, int, []string, string, error) {
		s.Close()
		return nil, 0, nil, "", err
	}
	var parts []string
	if old, err := store.Open(name, spec); err == nil {
		n, err := s.MergeFrom(ctx, old)
		old.Close()
		if err != nil {
			return fail(err)
		}
		parts = append(parts, fmt.Sprintf("%d rows of shard %s", n, name))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fail(err)
	} else if _, err := os.Stat(own); err == nil {
		n, err := s.MergeCheckpoint(ctx, own)
		if err != nil {
			return fail(err)
		}
		parts = append(parts, fmt.Sprintf("%d rows of %s", n, own))
	}
	for _, p := range orph {
		info, err := store.ReadCheckpointInfo(p)
		if err != nil {
			return fail(err)
		}
		n, err := s.MergeCheckpoint(ctx, p)
		if err != nil {
			return fail(err)
		}
		parts = append(parts, fmt.Sprintf("%d rows of %s (%s)", n, p, describeLabel(info.Label)))
	}
	return s, grow * maxSize, orph, fmt.Sprintf("merged into shard %s: %s; %d committed rows", bigName, strings.Join(parts, ", "), s.Stats().Committed), nil
}

// resumeParams resumes the parameters from the parameter checkpoint when the
// job has a checkpoint directory: the first trainer (theta, its publisher)
// reads it and keeps it up to date from then on; every trainer then takes the
// parameters and the version to publish above from the first. It returns that
// version (0 for a fresh start).
//
// With a trainer state from the last generation (ts), the first trainer's
// online parameters are the state's, which are as new as its last
// checkpoint, and every trainer takes its target network and Adam's moments
// from it, so that learning goes on where it stopped.
func (r *rankRun) resumeParams(ctx context.Context, theta *roles.Publisher, l *agent.CPULearner, ts *trainerState) (uint64, error) {
	dir := checkpointDir(r.b)
	if dir == "" {
		return 0, nil
	}
	var base uint64
	if theta != nil {
		every := r.cfg.CheckpointEvery
		if every <= 0 {
			every = time.Second
		}
		path := paramCheckpoint(dir)
		c, found, err := theta.CheckpointTo(path, every)
		if err != nil {
			return 0, err
		}
		if found {
			if err := l.Online().SetParams(c.Params); err != nil {
				return 0, err
			}
			base = c.Reserved
			r.hooks.Logf("trainer %d: parameters of version %d resumed from %s; versions go on from %d", r.trainerIndex(r.me), c.Version, path, base+1)
		}
		if ts != nil {
			if err := l.Online().SetParams(ts.Online); err != nil {
				return 0, fmt.Errorf("trainer state: %w", err)
			}
		}
	}
	if ts != nil {
		if err := l.SetState(ts.Learner); err != nil {
			return 0, err
		}
		r.hooks.Logf("trainer %d: learner resumed: %d gradient steps, Adam step %d; table counts %d inserts, %d samples", r.trainerIndex(r.me), ts.Learner.GradSteps, ts.Learner.Adam.Steps, ts.Inserts, ts.Samples)
	}
	if r.comm != nil {
		root := r.trainerIndex(r.plan.Publisher)
		v := []int64{int64(base)}
		if err := collective.Broadcast(ctx, r.comm, v, root); err != nil {
			return 0, fmt.Errorf("parameter version broadcast: %w", err)
		}
		if err := collective.Broadcast(ctx, r.comm, l.Online().Params(), root); err != nil {
			return 0, fmt.Errorf("parameter broadcast: %w", err)
		}
		base = uint64(v[0])
	}
	if ts != nil {
		return base, nil // the target network is the state's
	}
	return base, l.Target().CopyFrom(l.Online())
}

// checkpointShards checkpoints the trainer's shard to dir every
// CheckpointEvery until ctx ends, with a label naming the generation and the
// trainer. Once the first checkpoint holds the rows merged from orphaned
// checkpoints, those files are removed.
func (r *rankRun) checkpointShards(ctx context.Context, shard *store.Shard, dir string, merged []string) error {
	ti, nt := r.trainerIndex(r.me), len(r.plan.Trainers)
	path := shardCheckpoint(dir, r.cfg.Table, ti)
	label := checkpointLabel(restartCount(r.b), nt, ti)
	t := time.NewTicker(r.cfg.CheckpointEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		seq := shard.CommitSeq()
		start := time.Now()
		if err := shard.Checkpoint(ctx, path, store.WithLabel(label)); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("dist: trainer %d: %w", ti, err)
		}
		info, err := store.ReadCheckpointInfo(path)
		if err != nil {
			return fmt.Errorf("dist: trainer %d: %w", ti, err)
		}
		r.hooks.Logf("trainer %d: checkpoint %s: %d rows, commit seq %d, %v", ti, filepath.Base(path), info.Rows, seq, time.Since(start).Round(time.Millisecond))
		for _, p := range merged {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("dist: trainer %d: %w", ti, err)
			}
		}
		merged = nil
	}
}

// trainerState is what a trainer checkpoints beside its shard every
// CheckpointEvery, so that a restarted generation continues the same
// learning instead of starting its optimizer and its table's pacing afresh:
// the online parameters and the learner's state (target network, Adam's
// moments), the rate limiter's counts with the table's size when they
// were taken, and (the publishing trainer's) the episodes counted with the
// ring of their last returns, so that the running mean goes on.
type trainerState struct {
	Online   []float32
	Learner  agent.LearnerState
	Inserts  int64
	Samples  int64
	Size     int
	Label    uint64 // checkpointLabel of the writer
	Trainers int
	Episodes int       // episodes the board counted
	Returns  []float64 // the board's ring of the last Window returns
}

// trainerStateFile is the path of trainer index's state checkpoint.
func trainerStateFile(dir string, index int) string {
	return filepath.Join(dir, fmt.Sprintf("trainer.%d.state", index))
}

// saveTrainerState writes s to path atomically: a reader finds the old file
// or the new one, whole.
func saveTrainerState(path string, s *trainerState) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("dist: trainer state: %w", err)
	}
	tmp := f.Name()
	err = gob.NewEncoder(f).Encode(s)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("dist: trainer state %s: %w", path, err)
	}
	return nil
}

// loadTrainerState reads the state that trainer index, or else the first
// trainer, of an earlier generation left in dir; nil without error when
// there is none (a fresh job, a job without a checkpoint directory).
func loadTrainerState(dir string, index int) (*trainerState, string, error) {
	if dir == "" {
		return nil, "", nil
	}
	for _, i := range []int{index, 0} {
		path := trainerStateFile(dir, i)
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("dist: trainer state: %w", err)
		}
		var s trainerState
		err = gob.NewDecoder(f).Decode(&s)
		f.Close()
		if err != nil {
			return nil, "", fmt.Errorf("dist: trainer state %s: %w", path, err)
		}
		return &s, path, nil
	}
	return nil, "", nil
}

// resumeCounts restores the table's counts that s holds (resumeParams
// restores the learner's state). With nt trainers now and s.Trainers then,
// the counts are scaled so that the job's totals stay.
func (r *rankRun) resumeCounts(st *sample.ShardTable, s *trainerState, nt int) error {
	if s == nil {
		return nil
	}
	ins, smp := s.Inserts, s.Samples
	if s.Trainers > 0 && s.Trainers != nt {
		ins, smp = ins*int64(s.Trainers)/int64(nt), smp*int64(s.Trainers)/int64(nt)
	}
	return st.ResumeCounts(ins, smp, s.Size)
}
