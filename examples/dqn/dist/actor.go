package dist

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/replay"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/store"
)

// actor runs an actor: it steps its ring of EnvsPerActor environments in turn,
// takes actions from its own copy of the policy (inline) or from a policy
// worker (one request for the whole ring), and hands every n-step
// transition, with the parameter version that chose its action, to its
// trainer's table: written straight into the trainer's shard when on its
// host, pushed through the sample stream otherwise. Finished episodes go to
// the publishing trainer.
func (r *rankRun) actor(ctx context.Context) error {
	cfg := r.cfg
	a := cfg.Agent
	// The ring: one agent.Actor (environment and n-step accumulator) per
	// environment; the first one's network is the inline policy of all.
	k := cfg.EnvsPerActor
	rng := r.rng(2)
	ring := make([]*agent.Actor, k)
	var obsSize, numActions int
	for e := range ring {
		env := r.hooks.Env()
		obsSize, numActions = env.ObsSize(), env.NumActions()
		var err error
		if ring[e], err = agent.NewActor(env, agent.LayerSizes(a, obsSize, numActions), a.NStep, a.Gamma, rng); err != nil {
			return err
		}
	}
	act := ring[0]
	index := slices.Index(r.plan.Actors, r.me)
	trainer, _ := r.plan.TrainerOf(r.me)

	// The trainer's status: pacing, max priority, exploration clock, stop.
	statusR, err := roles.NewReader(ctx, r.b, statusName(trainer), 1, r.opts...)
	if err != nil {
		return err
	}
	defer statusR.Close()
	var s status
	held := uint64(0) // status version decoded
	takeStatus := func() error {
		if v := statusR.Version(); v != held {
			if s, err = decodeStatus(statusR.Params()); err != nil {
				return err
			}
			held = v
		}
		return nil
	}
	if _, err := statusR.Wait(ctx, 1); err != nil {
		return r.actorEnd(err)
	}
	if err := takeStatus(); err != nil {
		return err
	}

	// The policy: parameters (inline) or a policy worker.
	var theta *roles.Reader
	var inf *roles.InferenceClient
	policy, viaWorker := r.plan.PolicyOf(r.me)
	mode := "inline inference"
	if viaWorker {
		if inf, err = roles.DialInference(ctx, r.b, inferName, policy, r.opts...); err != nil {
			return r.actorEnd(err)
		}
		defer inf.Close()
		mode = r.who(policy)
	} else {
		if theta, err = roles.NewReader(ctx, r.b, thetaName, cfg.ParamEvery, r.opts...); err != nil {
			return err
		}
		defer theta.Close()
		if _, err := theta.Wait(ctx, 1); err != nil {
			return r.actorEnd(err)
		}
		if err := act.SetParams(theta.Params()); err != nil {
			return err
		}
	}

	// Where transitions go.
	blob, err := r.b.Wait(ctx, keyShardPrefix+fmt.Sprint(trainer))
	if err != nil {
		return fmt.Errorf("dist: actor: wait for the shard of %s: %w", r.who(trainer), err)
	}
	var si shardInfo
	if err := json.Unmarshal(blob, &si); err != nil {
		return fmt.Errorf("dist: actor: shard of %s: %w", r.who(trainer), err)
	}
	var shard *store.Shard
	var stream *roles.SampleSender
	var chunk *chunkWriter
	path := "straight into shard " + si.Name
	if cfg.Samples == SamplesAuto && !cfg.TCP && si.Host == r.b.Host() {
		if shard, err = store.Attach(ctx, si.Name); err != nil {
			return fmt.Errorf("dist: actor: %w", err)
		}
		defer shard.Close()
		if err := checkColumns(shard, obsSize); err != nil {
			return err
		}
	} else {
		if stream, err = roles.DialSamples(ctx, r.b, transitionsName, trainer, r.opts...); err != nil {
			return r.actorEnd(err)
		}
		defer stream.Close()
		chunk = newChunkWriter(obsSize, cfg.Chunk)
		path = fmt.Sprintf("through the sample stream (%s)", stream.Transport())
	}
	episodes, err := roles.DialSamples(ctx, r.b, episodesName, r.plan.Publisher, r.opts...)
	if err != nil {
		return r.actorEnd(err)
	}
	defer episodes.Close()
	r.hooks.Logf("actor %d: rank %d, pid %d, %s, %s, transitions to %s %s", index, r.me, pid, plural(k, "environment"), mode, r.who(trainer), path)

	// Each step becomes the first step of one transition, emitted in order:
	// the versions of each environment's steps wait in a queue for their
	// transitions.
	versions := make([]*versionQueue, k)
	for e := range versions {
		versions[e] = &versionQueue{buf: make([]uint64, a.NStep+1)}
	}
	key := actorKeyBase(cfg.Generation, index)
	backlog := uint64(cfg.Backlog * max(1, len(r.actorsOf(trainer))))
	var lastSeq uint64
	committed := false
	emitFrom := func(versions *versionQueue, t replay.Transition) error {
		v := versions.pop()
		if shard == nil {
			chunk.add(key, v, t)
			key++
			if chunk.full() {
				return stream.Push(ctx, roles.Record{Version: chunk.newest, Data: chunk.take()})
			}
			return nil
		}
		p, err := shard.Allocate(ctx)
		if err != nil {
			return err
		}
		if err := writeRow(p, t, v); err != nil {
			_ = p.Abort()
			return err
		}
		ref, err := p.CommitKey(key, s.MaxPriority)
		if err != nil {
			return err
		}
		key++
		lastSeq, committed = ref.Seq, true
		return nil
	}

	emits := make([]func(replay.Transition) error, k)
	for e := range emits {
		emits[e] = func(t replay.Transition) error { return emitFrom(versions[e], t) }
	}

	obsBytes := make([]byte, 4*obsSize*k)
	actBytes := make([]byte, 4*k)
	actions := make([]int, k)
	var epRecord []byte
	version := uint64(1)
	if theta != nil {
		version = theta.Version()
	}
	var frames, checked int64 = 0, -1
	for {
		// Parameters and status at most every ParamEvery frames.
		if frames/int64(cfg.ParamEvery) != checked {
			checked = frames / int64(cfg.ParamEvery)
			if theta != nil {
				fresh, err := theta.MaybeRefresh(ctx, frames)
				if err != nil {
					return r.actorEnd(err)
				}
				if fresh {
					if err := act.SetParams(theta.Params()); err != nil {
						return err
					}
					version = theta.Version()
				}
			}
			if _, err := statusR.Latest(ctx); err != nil {
				return r.actorEnd(err)
			}
			if err := takeStatus(); err != nil {
				return err
			}
		}
		if s.Stop {
			return r.stopped(ctx, s, trainer)
		}
		eps := r.epsilon(s.Frames)
		switch {
		case inf == nil:
			for e, env := range ring {
				actions[e] = act.Act(env.Observe(), eps)
			}
		case k == 1 && eps > 0 && rng.Float64() < eps:
			actions[0] = rng.IntN(numActions) // no need to ask
		default:
			for e, env := range ring {
				for i, v := range env.Observe() {
					binary.LittleEndian.PutUint32(obsBytes[4*(e*obsSize+i):], math.Float32bits(v))
				}
			}
			var err error
			if version, err = inf.InferMany(ctx, obsBytes, k, actBytes); err != nil {
				return r.actorEnd(err)
			}
			for e := range ring {
				actions[e] = int(int32(binary.LittleEndian.Uint32(actBytes[4*e:])))
				if k > 1 && eps > 0 && rng.Float64() < eps {
					actions[e] = rng.IntN(numActions)
				}
			}
		}
		anyEnded := false
		for e, env := range ring {
			// Pacing: wait while this shard's unadmitted commits exceed the backlog.
			for shard != nil && committed && lastSeq+1 > s.Admitted+backlog && !s.Stop {
				if _, err := statusR.Wait(ctx, statusR.Version()+1); err != nil {
					return r.actorEnd(err)
				}
				if err := takeStatus(); err != nil {
					return err
				}
			}
			if s.Stop {
				return r.stopped(ctx, s, trainer)
			}
			versions[e].push(version)
			ep, ended, err := env.StepAction(actions[e], emits[e])
			if err != nil {
				return r.actorEnd(err)
			}
			frames++
			if !ended {
				continue
			}
			anyEnded = true
			epRecord = encodeEpisode(epRecord, ep)
			if err := episodes.Push(ctx, roles.Record{Version: version, Data: epRecord}); err != nil {
				return r.actorEnd(err)
			}
		}
		if anyEnded && chunk != nil && chunk.n > 0 {
			if err := stream.Push(ctx, roles.Record{Version: chunk.newest, Data: chunk.take()}); err != nil {
				return r.actorEnd(err)
			}
		}
	}
}

// actorEnd maps the error that ended an actor's loop: the trainers or its
// policy worker closing their streams, or the trainer closing its shard, end
// the run cleanly; anything else is an error.
func (r *rankRun) actorEnd(err error) error {
	if err == nil || endedByPeer(err) || errors.Is(err, store.ErrClosed) {
		r.lostMu.Lock()
		lost := r.lost
		r.lostMu.Unlock()
		if lost != nil {
			return lost // a peer died: the run did not end, it broke
		}
		return nil
	}
	return err
}

// stopped is how an actor ends when its trainer says the run is over: cleanly,
// unless the trainer failed; then with the news of a lost peer if the world
// brings it within lostGrace (the trainer often hears it first), else with
// an error naming the trainer.
func (r *rankRun) stopped(ctx context.Context, s status, trainer int) error {
	if !s.Failed {
		return nil
	}
	select {
	case <-r.lostCh:
	case <-time.After(lostGrace):
	case <-ctx.Done():
	}
	r.lostMu.Lock()
	lost := r.lost
	r.lostMu.Unlock()
	if lost != nil {
		return lost
	}
	return fmt.Errorf("dist: %s ended the run with an error", r.who(trainer))
}

// checkColumns checks that an attached shard has this program's rows.
func checkColumns(s *store.Shard, obsSize int) error {
	got, want := s.Spec().Columns, Columns(obsSize)
	if len(got) != len(want) {
		return fmt.Errorf("dist: shard %s has %d columns, want %d", s.Name(), len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Name != w.Name || g.DType != w.DType || g.Length != w.Length || !slices.Equal(g.Shape, w.Shape) {
			return fmt.Errorf("dist: shard %s: column %d is %q %s, want %q %s", s.Name(), i, g.Name, g.Describe(), w.Name, w.Describe())
		}
	}
	return nil
}

// versionQueue is a FIFO of parameter versions, one per step whose transition
// is not emitted yet.
type versionQueue struct {
	buf     []uint64
	head, n int
}

func (q *versionQueue) push(v uint64) {
	if q.n == len(q.buf) {
		grown := make([]uint64, 2*len(q.buf)+1)
		for i := range q.n {
			grown[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = grown, 0
	}
	q.buf[(q.head+q.n)%len(q.buf)] = v
	q.n++
}

// pop removes the oldest version; the queue must not be empty.
func (q *versionQueue) pop() uint64 {
	v := q.buf[q.head]
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return v
}
