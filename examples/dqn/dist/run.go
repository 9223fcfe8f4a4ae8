package dist

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/cartpole"
	"github.com/gear-rl/gear/internal/clock"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/roles"
)

// Role names, as roles.DefaultNames has them.
const (
	RoleActor   = "actor"
	RolePolicy  = "policy"
	RoleTrainer = "trainer"
)

// Names of the streams and keys of a run.
const (
	thetaName       = "theta"           // parameter service of the network
	inferName       = "dqn-pi"          // inference stream
	transitionsName = "dqn-transitions" // sample stream of transitions
	episodesName    = "dqn-episodes"    // sample stream of finished episodes
	keyConfig       = "dqn/config"
	keyRolePrefix   = "dqn/role/"
	keyShardPrefix  = "dqn/shard/"
)

// Hooks are what a run reports to, and takes from, its caller. Every field
// may be nil.
type Hooks struct {
	// OnStart is called on the publishing trainer once the run is wired,
	// before training; an error aborts the run.
	OnStart func(Start) error
	// OnEpisode is called on the publishing trainer after every episode of any
	// actor, from one goroutine at a time.
	OnEpisode func(Progress)
	// Logf prints a line about this rank (what it serves, how it ended).
	Logf func(format string, args ...any)
	// Env makes an environment (cartpole.New when nil).
	Env func() agent.Env
	// Clock is the clock (the wall clock when nil).
	Clock clock.Clock
}

// Start describes a run to its publishing trainer.
type Start struct {
	Config                     Config
	Trainers, Actors, Policies int
}

// Progress is the state of a run, as the publishing trainer sees it.
type Progress struct {
	agent.Progress
	// Lag is the policy lag of the transitions trained on: how many parameter
	// versions were published between the one that chose a transition's
	// action and the commit of the transition (a moving average).
	Lag float64
	// Actors is the number of actors.
	Actors int
}

// Result is how a rank's part of a run ended.
type Result struct {
	// Role is the rank's role.
	Role string
	// On the publishing trainer: the run's state at the end, whether it
	// stopped because it reached the target return, and in a benchmark the
	// frames inserted during the measured span and its length.
	Progress       Progress
	Solved         bool
	SolvedEpisodes int
	BenchFrames    int64
	BenchElapsed   time.Duration
}

// BenchFramesPerSecond returns the environment frames per second measured
// by a benchmark run.
func (r Result) BenchFramesPerSecond() float64 {
	if r.BenchElapsed <= 0 {
		return 0
	}
	return float64(r.BenchFrames) / r.BenchElapsed.Seconds()
}

// Run runs this rank's part of a distributed DQN job: role is "trainer",
// "actor" or "policy", and every rank of b must call Run. The ranks learn
// each other's roles through b's key-value exchange and wire themselves with
// roles.Plan; the trainer that publishes parameters (the first) shares cfg
// with everyone, so the other ranks' cfg is ignored.
//
// A trainer returns when the run is solved, out of frames, or done
// measuring (Result.Solved tells), an actor or policy worker when the
// trainers end the run. A rank whose peer dies returns an error naming the
// peer.
func Run(ctx context.Context, b collective.Bootstrap, role string, cfg Config, hooks Hooks) (Result, error) {
	if hooks.Env == nil {
		hooks.Env = func() agent.Env { return cartpole.New() }
	}
	if hooks.Logf == nil {
		hooks.Logf = func(string, ...any) {}
	}
	res := Result{Role: role}
	table, err := exchangeRoles(ctx, b, role)
	if err != nil {
		return res, err
	}
	plan, err := roles.Plan(table, roles.DefaultNames)
	if err != nil {
		return res, fmt.Errorf("dist: %w", err)
	}
	if b.Rank() == plan.Publisher {
		if err := cfg.Validate(len(plan.Trainers)); err != nil {
			return res, err
		}
		cfg.Generation = restartCount(b)
		blob, err := json.Marshal(cfg)
		if err != nil {
			return res, fmt.Errorf("dist: encode config: %w", err)
		}
		if err := b.Set(ctx, keyConfig, blob); err != nil {
			return res, fmt.Errorf("dist: share config: %w", err)
		}
	} else {
		blob, err := b.Wait(ctx, keyConfig)
		if err != nil {
			return res, fmt.Errorf("dist: wait for the trainer's config: %w", err)
		}
		cfg = Config{}
		if err := json.Unmarshal(blob, &cfg); err != nil {
			return res, fmt.Errorf("dist: decode config: %w", err)
		}
	}
	r := &rankRun{b: b, me: b.Rank(), role: role, plan: plan, cfg: cfg, hooks: hooks}
	if cfg.TCP {
		r.opts = []roles.Option{roles.WithTransport(roles.TransportTCP)}
	}
	ctx, stopWatch := r.watchLost(ctx)
	defer stopWatch()

	// The trainers' communicator: collective.New is collective over the
	// whole world, so every rank builds it when there are several trainers.
	if len(plan.Trainers) > 1 {
		var copts []collective.Option
		if cfg.TCP {
			copts = append(copts, collective.WithTransport(collective.TransportTCP))
		}
		world, err := collective.New(ctx, b, copts...)
		if err != nil {
			return res, r.explain(ctx, fmt.Errorf("dist: world communicator: %w", err))
		}
		defer world.Close()
		color := collective.Undefined
		if role == RoleTrainer {
			color = 0
		}
		if r.comm, err = world.Split(ctx, color, b.Rank()); err != nil {
			return res, r.explain(ctx, fmt.Errorf("dist: trainers' communicator: %w", err))
		}
		if r.comm != nil {
			defer r.comm.Close()
		}
	}

	switch role {
	case RoleTrainer:
		err = r.trainer(ctx, &res)
	case RoleActor:
		err = r.actor(ctx)
	case RolePolicy:
		err = r.policy(ctx)
	}
	return res, r.explain(ctx, err)
}

// exchangeRoles publishes this rank's role and returns every rank's.
func exchangeRoles(ctx context.Context, b collective.Bootstrap, role string) (roles.Table, error) {
	switch role {
	case RoleActor, RolePolicy, RoleTrainer:
	default:
		return nil, fmt.Errorf("dist: role %q: want %q, %q or %q", role, RoleTrainer, RoleActor, RolePolicy)
	}
	if err := b.Set(ctx, keyRolePrefix+strconv.Itoa(b.Rank()), []byte(role)); err != nil {
		return nil, fmt.Errorf("dist: publish role: %w", err)
	}
	t := roles.Table{}
	for r := range b.Size() {
		v, err := b.Wait(ctx, keyRolePrefix+strconv.Itoa(r))
		if err != nil {
			return nil, fmt.Errorf("dist: wait for the role of rank %d: %w", r, err)
		}
		t[string(v)] = append(t[string(v)], r)
	}
	return t, nil
}

// rankRun is one rank's part of a run.
type rankRun struct {
	b     collective.Bootstrap
	me    int
	role  string
	plan  roles.Wiring
	cfg   Config
	hooks Hooks
	opts  []roles.Option
	comm  *collective.Comm // the trainers' communicator; nil with one trainer

	lostMu sync.Mutex
	lost   error         // the first peer lost
	lostCh chan struct{} // closed when lost is set
}

// who names a world rank by its role: "policy worker rank 3".
func (r *rankRun) who(rank int) string {
	switch r.plan.RoleOf(rank) {
	case RolePolicy:
		return "policy worker rank " + strconv.Itoa(rank)
	case "":
		return "rank " + strconv.Itoa(rank)
	default:
		return r.plan.RoleOf(rank) + " rank " + strconv.Itoa(rank)
	}
}

// watchLost cancels the returned context when the world reports a rank lost,
// with an error naming it as the cause.
func (r *rankRun) watchLost(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	r.lostCh = make(chan struct{})
	unreg := r.b.OnLost(func(rank int, reason string) {
		err := &lostError{who: r.who(rank), reason: reason}
		r.lostMu.Lock()
		if r.lost == nil {
			r.lost = err
			close(r.lostCh)
		}
		r.lostMu.Unlock()
		cancel(err)
	})
	return ctx, func() { unreg(); cancel(nil) }
}

// lostError says that a peer died.
type lostError struct{ who, reason string }

func (e *lostError) Error() string { return fmt.Sprintf("dist: %s lost: %s", e.who, e.reason) }

// Is makes errors.Is(err, roles.ErrLost) true.
func (e *lostError) Is(target error) bool { return target == roles.ErrLost }

// lostGrace is how long a rank whose context ended waits for the news of a
// lost peer: a launcher stops every rank as soon as one dies, and the news may
// arrive just after the signal. The error then names the peer, not the signal.
const lostGrace = 500 * time.Millisecond

// explain turns err into the error that says why this rank stopped: a lost
// peer if the world reported one, the context's cause otherwise.
func (r *rankRun) explain(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var le *roles.LostError
	if errors.As(err, &le) {
		return err
	}
	if ctx.Err() != nil {
		select {
		case <-r.lostCh:
		case <-time.After(lostGrace):
		}
		r.lostMu.Lock()
		lost := r.lost
		r.lostMu.Unlock()
		if lost != nil {
			return lost
		}
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			return fmt.Errorf("%w (%v)", err, cause)
		}
	}
	return err
}

// endedByPeer reports whether err means that the other end closed its stream
// on purpose: the trainers ended the run.
func endedByPeer(err error) bool {
	return errors.Is(err, roles.ErrPeerClosed)
}

// rng returns this rank's random source for purpose, fixed by the seed.
func (r *rankRun) rng(purpose uint64) *rand.Rand {
	return rand.New(rand.NewPCG(r.cfg.Seed^0x9e3779b97f4a7c15, purpose<<32|uint64(r.me)))
}

// trainerIndex returns the role rank of trainer (world rank) t.
func (r *rankRun) trainerIndex(t int) int { return slices.Index(r.plan.Trainers, t) }

// actorsOf returns the actors (world ranks) whose trainer is t.
func (r *rankRun) actorsOf(t int) []int {
	var out []int
	for i, a := range r.plan.Actors {
		if r.plan.ActorTrainer[i] == t {
			out = append(out, a)
		}
	}
	return out
}

// shardInfo is what a trainer publishes about its shard.
type shardInfo struct {
	Name string `json:"name"`
	Host string `json:"host"`
}

// jobID names the job for shared-memory segments.
func jobID(b collective.Bootstrap) string {
	if j, ok := b.(interface{ JobID() string }); ok && j.JobID() != "" {
		return j.JobID()
	}
	return rank.LocalJobID()
}

// An episode record: return (f64), length (u32), truncated (u8).
const episodeBytes = 13

func encodeEpisode(dst []byte, ep agent.Episode) []byte {
	dst = binary.LittleEndian.AppendUint64(dst[:0], math.Float64bits(ep.Return))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(ep.Length))
	t := byte(0)
	if ep.Truncated {
		t = 1
	}
	return append(dst, t)
}

func decodeEpisode(b []byte) (agent.Episode, error) {
	if len(b) != episodeBytes {
		return agent.Episode{}, fmt.Errorf("dist: episode record of %d bytes, want %d", len(b), episodeBytes)
	}
	ep := agent.Episode{
		Return:    math.Float64frombits(binary.LittleEndian.Uint64(b)),
		Length:    int(binary.LittleEndian.Uint32(b[8:])),
		Truncated: b[12] != 0,
	}
	return ep, nil
}

// pid is this process's id, for log lines that tests and people act on.
var pid = os.Getpid()
