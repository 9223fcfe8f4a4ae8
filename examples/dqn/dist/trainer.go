package dist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/replay"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

// board is the trainer's state that its goroutines share: the training loop
// writes the learner's side, the episode stream the episodes', and the
// status publisher reads both.
type board struct {
	mu      sync.Mutex
	p       Progress
	returns []float64 // ring of the last Window returns
	sum     float64
	target  float64
	solved  bool
	solvedN int
}

// episode records a finished episode and reports the progress and whether
// the run is solved now.
// frames and elapsed update the run's counts, which the training loop
// updates only once learning has started. Once the run is solved, the
// episodes that actors still finish before they hear of it are not counted:
// the episode count and the running mean stay those that solved it, which
// the run reports (a later short episode put the mean of a solved run below
// its target).
func (bd *board) episode(ep agent.Episode, frames int64, elapsed time.Duration) (Progress, bool) {
	bd.mu.Lock()
	defer bd.mu.Unlock()
	bd.p.Frames, bd.p.Elapsed = max(bd.p.Frames, frames), max(bd.p.Elapsed, elapsed)
	if bd.solved {
		return bd.p, true
	}
	w := len(bd.returns)
	slot := bd.p.Episodes % w
	bd.sum += ep.Return - bd.returns[slot]
	bd.returns[slot] = ep.Return
	bd.p.Episodes++
	bd.p.Return, bd.p.Length = ep.Return, ep.Length
	n := float64(min(bd.p.Episodes, w))
	bd.p.MeanReturn = bd.sum / n
	if !bd.solved && bd.target > 0 && bd.p.Episodes >= w && bd.p.MeanReturn >= bd.target {
		bd.solved, bd.solvedN = true, bd.p.Episodes
	}
	return bd.p, bd.solved
}

// save returns the episodes the board has counted and the ring of their
// last returns, for a trainer state checkpoint.
func (bd *board) save() (episodes int, returns []float64) {
	bd.mu.Lock()
	defer bd.mu.Unlock()
	return bd.p.Episodes, slices.Clone(bd.returns)
}

// resume puts back the episodes and the ring of returns that save gave an
// earlier generation, so that the episode count and the running mean go on
// from where they were; a ring of another window is ignored.
func (bd *board) resume(episodes int, returns []float64) {
	bd.mu.Lock()
	defer bd.mu.Unlock()
	if episodes <= 0 || len(returns) != len(bd.returns) {
		return
	}
	copy(bd.returns, returns)
	bd.p.Episodes, bd.sum = episodes, 0
	n := min(episodes, len(returns))
	for i := range n {
		bd.sum += returns[i]
	}
	bd.p.MeanReturn = bd.sum / float64(n)
	if !bd.solved && bd.target > 0 && episodes >= len(returns) && bd.p.MeanReturn >= bd.target {
		bd.solved, bd.solvedN = true, episodes
	}
}

func (bd *board) snapshot() Progress {
	bd.mu.Lock()
	defer bd.mu.Unlock()
	return bd.p
}

// trainer runs a trainer: it owns a replay shard and its table, learns from
// it, averages gradients with the other trainers, publishes parameters (the
// first trainer) and its status, and ends the run.
func (r *rankRun) trainer(ctx context.Context, res *Result) (err error) {
	cfg := r.cfg
	a := cfg.Agent
	env := r.hooks.Env()
	obsSize, numActions := env.ObsSize(), env.NumActions()
	nt := len(r.plan.Trainers)
	publisher := r.me == r.plan.Publisher
	myActors := r.actorsOf(r.me)

	// Each trainer learns from batches of BatchSize/nt; equal seeds give every
	// trainer the same initial network.
	la := a
	la.BatchSize = a.BatchSize / nt
	seed := cfg.Seed
	learner, err := agent.NewLearner(la, obsSize, numActions, randFor(seed, 1))
	if err != nil {
		return err
	}

	// The shard and its table. Inserts count frames: with nt trainers each
	// table sees 1/nt of the frames and gives 1/nt of the samples, so the
	// ratio stays; the minimum size is split likewise.
	slack := max(1024, 2*len(myActors)*(cfg.Backlog+cfg.Chunk))
	name := rank.SegmentName(jobID(r.b), fmt.Sprintf("dqn.%s.%d", cfg.Table, r.me))
	shard, maxSize, merged, found, err := r.openShard(ctx, name, shardSpec(obsSize, a.ReplayCapacity, slack), a.ReplayCapacity)
	if err != nil {
		return fmt.Errorf("dist: trainer: %w", err)
	}
	defer func() {
		// Under a launcher that restarts the world (a checkpoint directory)
		// a trainer leaves its shard for the next generation, every
		// committed row in it, whether it was stopped for a restart or its
		// run is over: a rank lost after this trainer solved restarts the
		// world too, and its trainer re-attaches the shard. The launcher
		// removes the job's segments when the job ends for good
		// (docs/elastic.md, "What survives a restart").
		if checkpointDir(r.b) != "" {
			shard.Detach()
			return
		}
		shard.Close()
	}()
	name = shard.Name()
	if found != "" {
		r.hooks.Logf("trainer %d: %s", r.trainerIndex(r.me), found)
	}
	minSize := int64(max(1, (a.LearningStarts+nt-1)/nt, la.BatchSize))
	limit := sample.MinSize(minSize)
	if cfg.Bench == 0 {
		if limit, err = sample.SampleToInsertRatio(cfg.spi(), minSize, cfg.errorBuffer()); err != nil {
			return fmt.Errorf("dist: trainer: %w", err)
		}
	}
	sampler, remover, err := cfg.selectors()
	if err != nil {
		return fmt.Errorf("dist: trainer: %w", err)
	}
	st, err := sample.NewShardTable(shard, sample.Config{
		Name: cfg.Table, MaxSize: maxSize, Sampler: sampler, Remover: remover,
		RateLimit: limit, Seed: seed ^ uint64(r.me)<<32,
	}, sample.WithPollInterval(500*time.Microsecond))
	if err != nil {
		return fmt.Errorf("dist: trainer: %w", err)
	}
	defer st.Close()
	var ts *trainerState
	if restartCount(r.b) > 0 {
		var path string
		if ts, path, err = loadTrainerState(checkpointDir(r.b), r.trainerIndex(r.me)); err != nil {
			return err
		}
		if ts != nil {
			if err := r.resumeCounts(st, ts, nt); err != nil {
				return fmt.Errorf("dist: trainer: %w", err)
			}
			r.hooks.Logf("trainer %d: trainer state resumed from %s (%s)", r.trainerIndex(r.me), path, describeLabel(ts.Label))
		}
	}
	info, _ := json.Marshal(shardInfo{Name: name, Host: r.b.Host()})
	if err := r.b.Set(ctx, keyShardPrefix+fmt.Sprint(r.me), info); err != nil {
		return fmt.Errorf("dist: trainer: publish shard: %w", err)
	}

	// Streams: status (every trainer), parameters and episodes (the
	// publisher), and the sample stream for actors that cannot write into the
	// shard (another host, or Samples = "stream").
	statusPub, err := roles.NewPublisher(ctx, r.b, statusName(r.me), statusLen, r.opts...)
	if err != nil {
		return err
	}
	defer statusPub.Close()
	var theta *roles.Publisher
	var episodes *roles.SampleReceiver
	if publisher {
		if theta, err = roles.NewPublisher(ctx, r.b, thetaName, len(learner.Online().Params()), r.opts...); err != nil {
			return err
		}
		defer theta.Close()
	}
	base, err := r.resumeParams(ctx, theta, learner, ts)
	if err != nil {
		return fmt.Errorf("dist: trainer: %w", err)
	}
	if publisher {
		if err := theta.Publish(ctx, base+1, learner.Online().Params()); err != nil {
			return err
		}
		if episodes, err = roles.NewSampleReceiver(ctx, r.b, episodesName, roles.SampleConfig{
			MaxRecordBytes: episodeBytes, Senders: max(16, len(r.plan.Actors)),
		}, r.opts...); err != nil {
			return err
		}
		defer episodes.Close()
	}
	// Each sender gets the smallest queue (two records): the transitions
	// waiting in it are behind the newest parameters.
	recordBytes := chunkHeader + cfg.Chunk*transitionBytes(obsSize)
	transitions, err := roles.NewSampleReceiver(ctx, r.b, transitionsName, roles.SampleConfig{
		MaxRecordBytes: recordBytes, QueueBytes: 2 * align64(16+recordBytes), Senders: max(16, len(myActors)),
	}, r.opts...)
	if err != nil {
		return err
	}
	defer transitions.Close()

	if publisher && r.hooks.OnStart != nil {
		if err := r.hooks.OnStart(Start{Config: cfg, Trainers: nt, Actors: len(r.plan.Actors), Policies: len(r.plan.Policies)}); err != nil {
			return err
		}
	}
	start := r.hooks.Clock.Now()
	bd := &board{returns: make([]float64, cfg.Window), target: cfg.TargetReturn}
	bd.p.Actors = len(r.plan.Actors)
	if ts != nil && publisher && ts.Episodes > 0 {
		bd.resume(ts.Episodes, ts.Returns)
		p := bd.snapshot()
		r.hooks.Logf("trainer %d: episodes resumed: %d, mean return %.1f", r.trainerIndex(r.me), p.Episodes, p.MeanReturn)
	}
	var maxPrio atomic.Uint64 // float64 bits: the priority of new transitions
	maxPrio.Store(math.Float64bits(learner.MaxPriority()))

	// stopNow ends the sampling wait of the training loop when the run is over.
	runCtx, stopNow := context.WithCancel(ctx)
	defer stopNow()
	g, gctx := errgroup.WithContext(runCtx)
	// The status publisher.
	statusDone := make(chan struct{})
	var statusVersion atomic.Uint64
	var thetaVersion atomic.Uint64
	thetaVersion.Store(base + 1)
	var gradSteps atomic.Uint64
	var frames atomic.Uint64
	vec := make([]float32, statusLen)
	// publishStatus is called by the status goroutine, and before and after it.
	publishStatus := func(stop, failed bool) error {
		s := status{
			Admitted: st.Info().Admitted, Frames: frames.Load(), GradSteps: gradSteps.Load(),
			Theta: thetaVersion.Load(), MaxPriority: math.Float64frombits(maxPrio.Load()), Stop: stop, Failed: failed,
		}
		s.encode(vec)
		return statusPub.Publish(ctx, statusVersion.Add(1), vec)
	}
	if err := publishStatus(false, false); err != nil {
		return err
	}
	g.Go(func() error {
		defer close(statusDone)
		step := uint64(max(1, cfg.Backlog/4))
		last := uint64(0)
		for gctx.Err() == nil {
			wctx, cancel := context.WithTimeout(gctx, time.Millisecond)
			_ = st.WaitAdmitted(wctx, last+step)
			cancel()
			if gctx.Err() != nil {
				return nil
			}
			last = st.Info().Admitted
			if err := publishStatus(false, false); err != nil {
				return err
			}
		}
		return nil
	})
	// The sample stream: insert what remote actors push, waiting for
	// admission, which holds the stream and its actors back.
	g.Go(func() error {
		err := transitions.Serve(gctx, roles.SinkFunc(func(ctx context.Context, rec roles.Record) error {
			return decodeChunk(rec.Data, obsSize, func(t chunkTransition) error {
				_, err := st.Insert(ctx, t.Key, math.Float64frombits(maxPrio.Load()), func(p store.Pending) error {
					return writeRow(p, t.Transition, t.Version)
				})
				return err
			})
		}))
		if gctx.Err() != nil || errors.Is(err, sample.ErrClosed) {
			return nil
		}
		return err
	})
	// Checkpoints of the shard, every CheckpointEvery.
	if r.checkpointing() {
		g.Go(func() error { return r.checkpointShards(gctx, shard, checkpointDir(r.b), merged) })
	}
	// The episode stream.
	if publisher {
		g.Go(func() error {
			for {
				rec, err := episodes.Recv(gctx)
				if err != nil {
					if gctx.Err() != nil || errors.Is(err, roles.ErrClosed) {
						return nil
					}
					return err
				}
				ep, err := decodeEpisode(rec.Data)
				if err != nil {
					return err
				}
				info := st.Info()
				p, solved := bd.episode(ep, max(int64(frames.Load()), info.Inserts*int64(nt)), r.hooks.Clock.Now().Sub(start))
				if r.hooks.OnEpisode != nil {
					r.hooks.OnEpisode(p)
				}
				if solved {
					stopNow()
				}
			}
		})
	}

	r.hooks.Logf("trainer %d of %d: rank %d, pid %d, shard %s (%d rows), %s (%s)",
		r.trainerIndex(r.me), nt, r.me, pid, name, shard.Capacity(), plural(len(myActors), "actor"), r.inferenceMode())
	err = r.train(runCtx, trainLoop{
		learner: learner, rp: newShardReplay(st, la.BatchSize), st: st, shard: shard, bd: bd, theta: theta,
		thetaVersion: &thetaVersion, gradSteps: &gradSteps, frames: &frames, maxPrio: &maxPrio,
		minSize: minSize, start: start, res: res,
	})
	// The run is over: tell the actors, then close the streams (deferred).
	stopNow()
	gerr := g.Wait()
	if serr := publishStatus(true, err != nil || gerr != nil); err == nil && serr != nil && !errors.Is(serr, roles.ErrClosed) {
		err = serr
	}
	if err == nil {
		err = gerr
	}
	res.Progress = bd.snapshot()
	res.Progress.Elapsed = r.hooks.Clock.Now().Sub(start)
	res.Solved, res.SolvedEpisodes = bd.solved, bd.solvedN
	return err
}

// inferenceMode says how actors choose their actions.
func (r *rankRun) inferenceMode() string {
	if r.plan.Inline() {
		return "inline inference"
	}
	return plural(len(r.plan.Policies), "policy worker")
}

// plural says "1 actor", "2 actors".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// saveState checkpoints the trainer's state (trainerState) to the job's
// checkpoint directory once *next has passed, and sets the next time, every
// stateEvery. It runs in the training loop, between two gradient steps, so
// the learner is still.
func (r *rankRun) saveState(t trainLoop, next *time.Time) error {
	if !r.checkpointing() {
		return nil
	}
	now := r.hooks.Clock.Now()
	if now.Before(*next) {
		return nil
	}
	*next = now.Add(stateEvery(r.cfg))
	return r.writeState(t)
}

// checkpointing reports whether the trainer checkpoints its shard and its
// state: the job has a checkpoint directory and checkpoints are on.
func (r *rankRun) checkpointing() bool {
	return checkpointDir(r.b) != "" && r.cfg.CheckpointEvery > 0
}

// stateEvery is the period of the trainer state's checkpoints: at most a
// second, since a trainer killed outright resumes its learner from the last
// one (the state is small: the network, its target and Adam's moments; a
// trainer that is told to stop writes it once more as it stops), and at most
// the shard's CheckpointEvery.
func stateEvery(c Config) time.Duration {
	return min(c.CheckpointEvery, time.Second)
}

// writeState writes the trainer's state now.
func (r *rankRun) writeState(t trainLoop) error {
	dir := checkpointDir(r.b)
	ti, nt := r.trainerIndex(r.me), len(r.plan.Trainers)
	info := t.st.Info()
	s := &trainerState{
		Online: t.learner.Online().Params(), Learner: t.learner.State(),
		Inserts: info.Inserts, Samples: info.Samples, Size: info.Size,
		Label: checkpointLabel(restartCount(r.b), nt, ti), Trainers: nt,
	}
	s.Episodes, s.Returns = t.bd.save()
	return saveTrainerState(trainerStateFile(dir, ti), s)
}

// trainLoop is the training loop's state.
type trainLoop struct {
	learner      *agent.CPULearner
	rp           *shardReplay
	st           *sample.ShardTable
	shard        *store.Shard
	bd           *board
	theta        *roles.Publisher
	thetaVersion *atomic.Uint64
	gradSteps    *atomic.Uint64
	frames       *atomic.Uint64
	maxPrio      *atomic.Uint64
	minSize      int64
	start        time.Time
	res          *Result
}

// train runs gradient steps until the run is over: solved (ctx is then
// canceled by the episode stream), out of frames, or done measuring. With
// several trainers, the first decides and the others learn it through the
// gradient all-reduce, which carries a stop flag and the frame counts.
func (r *rankRun) train(ctx context.Context, t trainLoop) (err error) {
	// A trainer that stops before the run is over (the generation ends:
	// another rank was lost, or the job is stopped) writes its state as it
	// stops, between two gradient steps, so that the next generation
	// resumes the learner where it stopped rather than at the last periodic
	// checkpoint.
	defer func() {
		if t.parentErr(ctx) == nil || !r.checkpointing() {
			return
		}
		if serr := r.writeState(t); serr != nil {
			err = errors.Join(err, serr)
			return
		}
		r.hooks.Logf("trainer %d: state written as it stops: %d gradient steps", r.trainerIndex(r.me), t.learner.GradSteps())
	}()
	cfg := r.cfg
	a := cfg.Agent
	l := t.learner
	batch := replay.NewBatch(a.BatchSize/len(r.plan.Trainers), r.hooks.Env().ObsSize())
	grads := l.Online().Grads()
	var reduce []float32 // grads, then the stop flag and the frames inserted here
	if r.comm != nil {
		reduce = make([]float32, len(grads)+2)
	}
	decider := r.me == r.plan.Publisher
	var lags lagMeter
	var nextState time.Time // when the trainer state is checkpointed next
	var (
		emaInit     bool
		lagInit     bool
		benchFrames uint64
		benchStart  time.Time
		benchOn     bool
	)
	for step := uint64(0); ; step++ {
		info := t.st.Info()
		frames := uint64(info.Inserts)
		if r.comm == nil {
			t.frames.Store(frames)
		} else if step == 0 {
			t.frames.Store(frames * uint64(len(r.plan.Trainers)))
		}
		global := t.frames.Load()
		// The decision to stop, taken by the first trainer.
		stop := false
		if decider {
			switch {
			case ctx.Err() != nil: // solved, or the rank is stopping
				stop = true
			case cfg.MaxFrames > 0 && int64(global) >= cfg.MaxFrames:
				stop = true
			case cfg.Bench > 0:
				now := r.hooks.Clock.Now()
				if !benchOn && now.Sub(t.start) >= cfg.BenchWarmup && int64(info.Size) >= t.minSize {
					benchOn, benchStart, benchFrames = true, now, global
				}
				if benchOn && now.Sub(benchStart) >= cfg.Bench {
					t.res.BenchFrames, t.res.BenchElapsed = int64(global-benchFrames), now.Sub(benchStart)
					stop = true
				}
			}
		}
		if stop && r.comm == nil {
			return t.parentErr(ctx)
		}
		beta := agent.Linear(a.BetaStart, a.BetaEnd, a.BetaFrames, int64(global))
		l.SetLearningRate(a.LearningRate(int64(global)))
		haveBatch := false
		if !stop {
			if err := t.rp.sample(ctx, batch); err != nil {
				if ctx.Err() == nil || !decider {
					return err
				}
				stop = true // the first trainer stops; the others hear it below
				if r.comm == nil {
					return t.parentErr(ctx)
				}
			} else {
				haveBatch = true
			}
		}
		var st agent.Stats
		if haveBatch {
			var err error
			if st, err = l.ComputeGradients(batch, beta); err != nil {
				return err
			}
		}
		if r.comm != nil {
			copy(reduce, grads)
			if !haveBatch {
				clear(reduce[:len(grads)])
			}
			reduce[len(grads)] = 0
			if stop {
				reduce[len(grads)] = 1
			}
			reduce[len(grads)+1] = float32(frames)
			if err := collective.AllReduce(context.WithoutCancel(ctx), r.comm, reduce, collective.Sum); err != nil {
				return fmt.Errorf("dist: trainer: gradient all-reduce: %w", err)
			}
			t.frames.Store(uint64(reduce[len(grads)+1]))
			if reduce[len(grads)] > 0 {
				return t.parentErr(ctx)
			}
			inv := 1 / float32(len(r.plan.Trainers))
			for i := range grads {
				grads[i] = reduce[i] * inv
			}
		}
		if _, err := l.ApplyGradients(); err != nil {
			return err
		}
		if err := r.saveState(t, &nextState); err != nil {
			return err
		}
		if err := t.rp.updatePriorities(batch.Keys, l.Priorities()); err != nil {
			return err
		}
		t.maxPrio.Store(math.Float64bits(l.MaxPriority()))
		gs := uint64(l.GradSteps())
		t.gradSteps.Store(gs)
		if gs%uint64(cfg.PublishEvery) == 0 {
			v := t.thetaVersion.Load() + 1 // every trainer counts the versions
			// Not ctx: the run may be over already, and the other trainers
			// learn that only from the next all-reduce.
			if t.theta != nil {
				if err := t.theta.Publish(context.WithoutCancel(ctx), v, l.Online().Params()); err != nil {
					return err
				}
			}
			t.thetaVersion.Store(v)
		}
		if !decider {
			continue
		}
		lags.record(t.shard.CommitSeq(), t.thetaVersion.Load())
		lag := lags.mean(t.rp.seqs, t.rp.versions)
		t.bd.mu.Lock()
		p := &t.bd.p
		if !emaInit {
			p.Loss, p.MeanQ, emaInit = st.Loss, st.MeanQ, true
		} else {
			p.Loss += 0.01 * (st.Loss - p.Loss)
			p.MeanQ += 0.01 * (st.MeanQ - p.MeanQ)
		}
		if !lagInit {
			p.Lag, lagInit = lag, true
		} else {
			p.Lag += 0.01 * (lag - p.Lag)
		}
		p.Frames, p.GradSteps = max(p.Frames, int64(global)), int64(gs)
		p.Inserts, p.Samples = info.Inserts*int64(len(r.plan.Trainers)), info.Samples*int64(len(r.plan.Trainers))
		p.TableSize = info.Size
		p.Beta = beta
		p.Epsilon = r.epsilon(global)
		p.Elapsed = r.hooks.Clock.Now().Sub(t.start)
		t.bd.mu.Unlock()
	}
}

// parentErr is what the training loop returns when it stops: nil when the
// run ended (solved, out of frames, done measuring), the rank's own
// context's error otherwise.
func (t trainLoop) parentErr(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	t.bd.mu.Lock()
	solved := t.bd.solved
	t.bd.mu.Unlock()
	if solved {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return ctx.Err()
}

// epsilon is the exploration rate after frames environment frames.
func (r *rankRun) epsilon(frames uint64) float64 {
	a := r.cfg.Agent
	if r.cfg.Bench > 0 {
		return a.EpsEnd
	}
	return agent.Linear(a.EpsStart, a.EpsEnd, a.EpsFrames, int64(frames))
}

// randFor returns a random source for (seed, stream), equal on every rank.
func randFor(seed, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream^0x6a09e667f3bcc909))
}

// lagMeter measures policy lag. After every gradient step it records the
// shard's commit sequence and the newest parameter version; a transition
// committed at sequence s was committed after the last record at or below s,
// so the version newest then is at least that record's: the lag of a
// transition is that version minus the one that chose its action.
type lagMeter struct {
	seqs, versions []uint64
}

func (m *lagMeter) record(commitSeq, version uint64) {
	if n := len(m.seqs); n > 0 && m.seqs[n-1] == commitSeq {
		m.versions[n-1] = version
		return
	}
	m.seqs = append(m.seqs, commitSeq)
	m.versions = append(m.versions, version)
}

// newestAt returns the newest version known to have been published before
// the commit of sequence seq.
func (m *lagMeter) newestAt(seq uint64) uint64 {
	k, _ := slices.BinarySearch(m.seqs, seq+1) // the first record at or after the commit
	if k == 0 {
		return 1
	}
	return m.versions[k-1]
}

// mean returns the mean lag of the transitions committed at seqs and acted
// with versions.
func (m *lagMeter) mean(seqs, versions []uint64) float64 {
	if len(seqs) == 0 {
		return 0
	}
	var sum float64
	for i, s := range seqs {
		if v := m.newestAt(s); v > versions[i] {
			sum += float64(v - versions[i])
		}
	}
	return sum / float64(len(seqs))
}

// align64 rounds n up to a multiple of 64, as the sample stream lays out
// its records.
func align64(n int) int { return (n + 63) &^ 63 }
