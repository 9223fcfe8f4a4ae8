package dist

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/replay"
	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"
	"github.com/gear-rl/gear/sample"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quick is a short run: the CI recipe, stopped after frames frames.
func quick(frames int64) Config {
	c := DefaultConfig()
	c.Agent = agent.QuickConfig()
	c.MaxFrames, c.TargetReturn, c.Window = frames, 0, 20
	return c
}

// runRanks runs Run on every rank of an in-process world, rank i with
// roles[i], and returns each rank's result and error.
func runRanks(t *testing.T, w *collectivetest.World, ranks []string, cfg Config, hooks Hooks) ([]Result, []error) {
	t.Helper()
	return runBoots(t, func(i int) collective.Bootstrap { return w.Bootstrap(i) }, ranks, cfg, hooks)
}

// runBoots is runRanks with rank i's bootstrap from boot(i).
func runBoots(t *testing.T, boot func(int) collective.Bootstrap, ranks []string, cfg Config, hooks Hooks) ([]Result, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := make([]Result, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, role := range ranks {
		wg.Go(func() { res[i], errs[i] = Run(ctx, boot(i), role, cfg, hooks) })
	}
	wg.Wait()
	return res, errs
}

// checkRatio checks the rate limiter's work: samples kept to
// SamplesPerInsert per frame inserted beyond the minimum size, within the
// error buffer and a batch.
func checkRatio(t *testing.T, p Progress, c Config) {
	t.Helper()
	spi, eb := c.RateLimit()
	want := spi * float64(p.Inserts-int64(c.Agent.LearningStarts))
	if d := math.Abs(float64(p.Samples) - want); d > eb+float64(c.Agent.BatchSize) {
		t.Errorf("%d samples for %d inserts: %.0f off the ratio %g, more than the error buffer %g", p.Samples, p.Inserts, d, spi, eb)
	}
}

// One trainer, two inline actors writing straight into its shard: the run
// trains, keeps the ratio, and every rank ends cleanly when the frames run out.
func TestInlineActorsWriteIntoTheShard(t *testing.T) {
	w := rolestest.World(t, 3, rolestest.OneHost)
	cfg := quick(3000)
	var episodes int
	var last Progress
	hooks := Hooks{OnEpisode: func(p Progress) { episodes++; last = p }}
	res, errs := runRanks(t, w, []string{RoleTrainer, RoleActor, RoleActor}, cfg, hooks)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d (%s): %v", i, res[i].Role, err)
		}
	}
	p := res[0].Progress
	t.Logf("%d episodes, %d frames, %d gradient steps, %d inserts, %d samples, lag %.1f, mean return %.1f",
		p.Episodes, p.Frames, p.GradSteps, p.Inserts, p.Samples, p.Lag, p.MeanReturn)
	if p.Frames < 2900 || p.GradSteps < 1000 || p.Episodes != episodes || last.Episodes != episodes || p.Actors != 2 {
		t.Fatalf("progress %+v after %d episodes", p, episodes)
	}
	if res[0].Solved {
		t.Fatal("solved without a target")
	}
	checkRatio(t, p, cfg)
	if p.Lag < 0 || p.Lag > 200 {
		t.Errorf("policy lag %.1f versions", p.Lag)
	}
}

// A policy worker serving two actors on hosts of their own: inference and
// parameters over TCP, transitions through the sample stream.
func TestPolicyWorkerAcrossHosts(t *testing.T) {
	w := rolestest.World(t, 4, rolestest.EachAlone)
	cfg := quick(2000)
	res, errs := runRanks(t, w, []string{RoleTrainer, RolePolicy, RoleActor, RoleActor}, cfg, Hooks{})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d (%s): %v", i, res[i].Role, err)
		}
	}
	p := res[0].Progress
	t.Logf("%d episodes, %d frames, %d gradient steps, lag %.1f", p.Episodes, p.Frames, p.GradSteps, p.Lag)
	if p.Frames < 1900 || p.GradSteps < 500 || p.Episodes < 10 {
		t.Fatalf("progress %+v", p)
	}
	checkRatio(t, p, cfg)
}

// Actors stepping rings of environments through a policy worker, on one host
// (shared memory) and on hosts of their own (TCP): each request carries the
// observations of an actor's whole ring, the policy worker's batches count
// them, and the run trains and keeps the ratio.
func TestPolicyWorkerRingOfEnvs(t *testing.T) {
	for _, l := range []struct {
		name, layout string
		k            int
	}{{"shm", rolestest.OneHost, 4}, {"tcp", rolestest.EachAlone, 3}} {
		t.Run(l.name, func(t *testing.T) {
			w := rolestest.World(t, 4, l.layout)
			cfg := quick(3000)
			cfg.EnvsPerActor = l.k
			var mu sync.Mutex
			var lines []string
			hooks := Hooks{Logf: func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				lines = append(lines, fmt.Sprintf(format, args...))
			}}
			res, errs := runRanks(t, w, []string{RoleTrainer, RolePolicy, RoleActor, RoleActor}, cfg, hooks)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("rank %d (%s): %v", i, res[i].Role, err)
				}
			}
			p := res[0].Progress
			t.Logf("%d episodes, %d frames, %d gradient steps, lag %.1f", p.Episodes, p.Frames, p.GradSteps, p.Lag)
			if p.Frames < 2900 || p.GradSteps < 500 || p.Episodes < 10 {
				t.Fatalf("progress %+v", p)
			}
			checkRatio(t, p, cfg)
			var batches, reqs, obs int
			for _, line := range lines {
				fmt.Sscanf(line, "policy worker: %d batches of %d requests and %d observations", &batches, &reqs, &obs)
			}
			if batches == 0 || obs != l.k*reqs {
				t.Fatalf("policy worker: %d batches of %d requests and %d observations, want %d observations per request (log %q)", batches, reqs, obs, l.k, lines)
			}
		})
	}
	bad := quick(100)
	bad.EnvsPerActor = 0
	if err := bad.Validate(1); err == nil || !strings.Contains(err.Error(), "EnvsPerActor") {
		t.Errorf("EnvsPerActor 0: %v", err)
	}
	bad.EnvsPerActor, bad.InferBatch = 8, 4
	if err := bad.Validate(1); err == nil || !strings.Contains(err.Error(), "InferBatch") {
		t.Errorf("InferBatch 4 with 8 environments per actor: %v", err)
	}
}

// Two data-parallel trainers: each its own shard and actors, gradients
// averaged by all-reduce, the first deciding when to stop.
func TestTwoTrainers(t *testing.T) {
	w := rolestest.World(t, 4, rolestest.OneHost)
	cfg := quick(3000)
	res, errs := runRanks(t, w, []string{RoleTrainer, RoleTrainer, RoleActor, RoleActor}, cfg, Hooks{})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d (%s): %v", i, res[i].Role, err)
		}
	}
	p := res[0].Progress
	if p.Frames < 2900 || p.GradSteps < 1000 {
		t.Fatalf("progress %+v", p)
	}
}

// A run that reaches its target stops, and says so on the publishing trainer.
func TestStopsWhenSolved(t *testing.T) {
	w := rolestest.World(t, 2, rolestest.OneHost)
	cfg := quick(50_000)
	cfg.TargetReturn, cfg.Window = 60, 10
	res, errs := runRanks(t, w, []string{RoleTrainer, RoleActor}, cfg, Hooks{})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d (%s): %v", i, res[i].Role, err)
		}
	}
	r := res[0]
	if !r.Solved || r.SolvedEpisodes < 10 || r.Progress.MeanReturn < 60 || r.Progress.Frames >= 50_000 {
		t.Fatalf("result %+v", r)
	}
}

// A benchmark measures frames per second for the time asked.
func TestBench(t *testing.T) {
	w := rolestest.World(t, 3, rolestest.OneHost)
	cfg := quick(0)
	cfg.Bench, cfg.BenchWarmup = 300*time.Millisecond, 200*time.Millisecond
	res, errs := runRanks(t, w, []string{RoleTrainer, RolePolicy, RoleActor}, cfg, Hooks{})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d (%s): %v", i, res[i].Role, err)
		}
	}
	r := res[0]
	if r.BenchElapsed < cfg.Bench || r.BenchFrames <= 0 || r.BenchFramesPerSecond() <= 0 || r.Solved {
		t.Fatalf("result %+v", r)
	}
}

// A policy worker that dies is an error for its actor, naming it; the
// trainer fails too instead of waiting for frames that will not come.
func TestLostPolicyWorker(t *testing.T) {
	w := rolestest.World(t, 3, rolestest.OneHost)
	cfg := quick(1 << 40)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policyCtx, killPolicy := context.WithCancel(ctx)
	defer killPolicy()
	errs := make([]error, 3)
	started := make(chan struct{})
	var once sync.Once
	hooks := Hooks{OnEpisode: func(p Progress) {
		if p.Episodes == 5 {
			once.Do(func() { close(started) })
		}
	}}
	var wg sync.WaitGroup
	for i, role := range []string{RoleTrainer, RolePolicy, RoleActor} {
		c := ctx
		if role == RolePolicy {
			c = policyCtx
		}
		wg.Go(func() { _, errs[i] = Run(c, w.Bootstrap(i), role, cfg, hooks) })
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("no episodes")
	}
	// The world reports the policy worker's process gone, and its goroutine
	// ends (a killed process closes nothing, but the streams' own checks
	// must not beat the news here).
	w.Lose(1, "killed by SIGKILL")
	killPolicy()
	wg.Wait()
	if errs[2] == nil || !strings.Contains(errs[2].Error(), "policy worker rank 1 lost: killed by SIGKILL") || !errors.Is(errs[2], roles.ErrLost) {
		t.Fatalf("actor: %v, want an error naming policy worker rank 1", errs[2])
	}
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "policy worker rank 1 lost") {
		t.Fatalf("trainer: %v, want an error naming policy worker rank 1", errs[0])
	}
}

func TestBadRolesAndConfig(t *testing.T) {
	w := rolestest.World(t, 1, rolestest.OneHost)
	ctx := context.Background()
	if _, err := Run(ctx, w.Bootstrap(0), "learner", DefaultConfig(), Hooks{}); err == nil || !strings.Contains(err.Error(), `role "learner"`) {
		t.Errorf("unknown role: %v", err)
	}
	w = rolestest.World(t, 1, rolestest.OneHost)
	if _, err := Run(ctx, w.Bootstrap(0), RoleTrainer, DefaultConfig(), Hooks{}); err == nil || !strings.Contains(err.Error(), `no "actor" ranks`) {
		t.Errorf("no actors: %v", err)
	}
	for _, c := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Agent.BatchSize = 63 }, "Agent.BatchSize = 63"},
		{func(c *Config) { c.ParamEvery = 0 }, "ParamEvery"},
		{func(c *Config) { c.Samples = "pigeon" }, "Samples"},
		{func(c *Config) { c.ErrorBuffer = 10 }, "ErrorBuffer"},
		{func(c *Config) { c.Window = 0 }, "Window"},
		{func(c *Config) { c.Agent.LR = 0 }, "LR"},
	} {
		cfg := DefaultConfig()
		c.edit(&cfg)
		if err := cfg.Validate(2); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate: %v, want an error naming %s", err, c.want)
		}
	}
}

func TestStatusRoundTrip(t *testing.T) {
	s := status{Admitted: 1<<40 + 12345, Frames: 299_999, GradSteps: 1<<24 - 1, Theta: 1 << 24, MaxPriority: 3.5, Stop: true}
	v := make([]float32, statusLen)
	s.encode(v)
	got, err := decodeStatus(v)
	if err != nil || got != s {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, s)
	}
	v[statusMaxPrio] = 0
	if _, err := decodeStatus(v); err == nil {
		t.Fatal("max priority 0 accepted")
	}
	if _, err := decodeStatus(v[:3]); err == nil {
		t.Fatal("short status accepted")
	}
}

func TestChunkRoundTrip(t *testing.T) {
	w := newChunkWriter(2, 3)
	for i := range 3 {
		f := float32(i)
		w.add(uint64(100+i), uint64(7+i), replay.Transition{Obs: []float32{f, -f}, Action: int32(i % 2), Reward: 1.5 * f, Discount: 0.99, NextObs: []float32{f + 1, -f - 1}})
	}
	if !w.full() || w.newest != 9 {
		t.Fatalf("full %v, newest %d", w.full(), w.newest)
	}
	data := w.take()
	var got []string
	err := decodeChunk(data, 2, func(c chunkTransition) error {
		got = append(got, fmt.Sprint(c.Key, c.Version, c.Obs, c.Action, c.Reward, c.Discount, c.NextObs))
		return nil
	})
	want := "[100 7 [0 -0] 0 0 0.99 [1 -1] 101 8 [1 -1] 1 1.5 0.99 [2 -2] 102 9 [2 -2] 0 3 0.99 [3 -3]]"
	if err != nil || fmt.Sprint(got) != want {
		t.Fatalf("decoded %v, %v; want %s", got, err, want)
	}
	if err := decodeChunk(data[:len(data)-1], 2, func(chunkTransition) error { return nil }); err == nil {
		t.Fatal("truncated record accepted")
	}
	if w.n != 0 || len(w.take()) != chunkHeader {
		t.Fatal("take did not start a new record")
	}
}

func TestVersionQueue(t *testing.T) {
	q := &versionQueue{buf: make([]uint64, 2)}
	next := uint64(0)
	for i := range 50 {
		for range i % 5 {
			q.push(uint64(i*10 + q.n))
		}
		for q.n > 1 {
			v := q.pop()
			if v < next {
				t.Fatalf("popped %d after %d", v, next)
			}
			next = v
		}
	}
}

func TestLagMeter(t *testing.T) {
	var m lagMeter
	m.record(0, 1)  // before any commit: version 1
	m.record(10, 3) // commits 0-9 done, version 3 newest
	m.record(10, 4) // no commit since: the newest version is updated
	m.record(25, 6)
	for _, c := range []struct{ seq, want uint64 }{{0, 1}, {9, 1}, {10, 4}, {24, 4}, {25, 6}, {1000, 6}} {
		if got := m.newestAt(c.seq); got != c.want {
			t.Errorf("newestAt(%d) = %d, want %d", c.seq, got, c.want)
		}
	}
	if got := m.mean([]uint64{12, 30}, []uint64{2, 6}); got != 1 {
		t.Errorf("mean lag %v, want (2+0)/2 = 1", got)
	}
}

func TestApplyTable(t *testing.T) {
	table := func() *jobs.Table {
		return &jobs.Table{
			Name: "replay", Capacity: 1000, TrajectoryLength: 1, Sampler: "prioritized", PriorityExponent: 0.5, Remover: "fifo",
			Columns: []jobs.Column{
				{Name: "obs", DType: "float32", Shape: []int{4}}, {Name: "action", DType: "int32"}, {Name: "reward", DType: "float32"},
				{Name: "discount", DType: "float32"}, {Name: "next_obs", DType: "float32", Shape: []int{4}}, {Name: "version", DType: "int64"},
			},
			RateLimiter: jobs.RateLimiter{Kind: jobs.LimiterSampleToInsertRatio, MinSizeToSample: 500, SamplesPerInsert: 16, ErrorBuffer: 800},
		}
	}
	c := DefaultConfig()
	if err := ApplyTable(&c, table(), 2, 4); err != nil {
		t.Fatal(err)
	}
	if c.Agent.ReplayCapacity != 1000 || c.Agent.PriorityExponent != 0.5 || c.Agent.LearningStarts != 500 || c.SamplesPerInsert != 16 || c.ErrorBuffer != 800 ||
		c.Sampler != "prioritized" || c.Remover != "fifo" {
		t.Fatalf("config %+v", c)
	}
	tb := table()
	tb.CheckpointEvery = jobs.Duration(10 * time.Second)
	if err := ApplyTable(&c, tb, 2, 4); err != nil || c.CheckpointEvery != 10*time.Second {
		t.Fatalf("checkpoint_every: %v, %v", c.CheckpointEvery, err)
	}
	// Every sampler and remover of sample's builds the trainer's table.
	for _, name := range sample.SelectorNames() {
		for _, role := range []string{"sampler", "remover"} {
			tb := table()
			k, _ := sample.ParseKind(name)
			if role == "sampler" {
				tb.Sampler = name
			} else {
				tb.Remover = name
			}
			if tb.Sampler != "prioritized" && tb.Remover != "prioritized" {
				tb.PriorityExponent = 0
			}
			c := DefaultConfig()
			if err := ApplyTable(&c, tb, 2, 4); err != nil {
				t.Errorf("%s %q: %v", role, name, err)
				continue
			}
			sampler, remover, err := c.selectors()
			if err != nil {
				t.Errorf("%s %q: the trainer's selectors: %v", role, name, err)
				continue
			}
			got := sampler
			if role == "remover" {
				got = remover
			}
			if got.Kind() != k {
				t.Errorf("%s %q: the trainer builds a %s", role, name, got.Kind())
			}
			if err := c.Validate(1); err != nil {
				t.Errorf("%s %q: %v", role, name, err)
			}
		}
	}
	for _, bad := range []struct {
		edit func(*jobs.Table)
		want string
	}{
		{func(t *jobs.Table) { t.Columns[4].Shape = []int{3} }, `column 4 is "next_obs" float32 3, want "next_obs" float32 4`},
		{func(t *jobs.Table) { t.Columns = t.Columns[:5] }, "5 columns, want 6"},
		{func(t *jobs.Table) { t.TrajectoryLength = 2 }, "trajectory_length 2"},
		{func(t *jobs.Table) { t.Sampler = "random" }, `table.sampler: "random": want one of`},
		{func(t *jobs.Table) { t.Remover = "uniform" }, ""},
		{func(t *jobs.Table) { t.Columns[1].DType = "bytes" }, `table.columns[1].dtype`},
		{func(t *jobs.Table) { t.RateLimiter = jobs.RateLimiter{Kind: jobs.LimiterMinSize, MinSizeToSample: 1} }, `rate_limiter.kind "min_size"`},
	} {
		tb := table()
		bad.edit(tb)
		err := ApplyTable(&c, tb, 2, 4)
		if bad.want == "" {
			if err != nil {
				t.Errorf("ApplyTable: %v", err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ApplyTable: %v, want %q", err, bad.want)
		}
	}
}
