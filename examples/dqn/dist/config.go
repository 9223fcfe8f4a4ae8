package dist

import (
	"fmt"
	"time"

	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/sample"
)

// Ways for actors to hand transitions to their trainer (Config.Samples).
const (
	// SamplesAuto writes straight into the trainer's shard when the actor is on
	// the trainer's host, and uses the sample stream otherwise.
	SamplesAuto = "auto"
	// SamplesStream always pushes transitions through the sample stream; the
	// trainer inserts them.
	SamplesStream = "stream"
)

// Config is a distributed run. The trainer that publishes parameters shares
// its Config with every other rank through the world's key-value exchange, so
// that actors and policy workers need no hyperparameters of their own.
type Config struct {
	// Agent holds the learning recipe. Agent.BatchSize is the global batch:
	// each of T trainers samples BatchSize/T per gradient step.
	Agent agent.Config `json:"agent"`
	// Seed fixes the initial weights (equal on every trainer) and seeds every
	// rank's own random source (exploration, resets, sampling).
	Seed uint64 `json:"seed"`
	// MaxFrames stops the run after this many environment frames (0: no limit).
	MaxFrames int64 `json:"max_frames"`
	// TargetReturn stops the run once the mean return of the last Window
	// episodes (of all actors) reaches it; 0 never does.
	TargetReturn float64 `json:"target_return"`
	// Window is the number of episodes the mean return is taken over.
	Window int `json:"window"`

	// ParamEvery is K: actors and policy workers take the newest parameters at
	// most every K of their steps (inference batches for a policy worker), and
	// actors read their trainer's status as often.
	ParamEvery int `json:"param_every"`
	// PublishEvery is the number of gradient steps between two published
	// parameter versions.
	PublishEvery int `json:"publish_every"`

	// Table is the replay table's name.
	Table string `json:"table"`
	// Sampler and Remover are the table's selectors, by sample's names
	// (sample.SelectorNames): "prioritized" (with Agent.PriorityExponent)
	// and "fifo" by default. A job spec's [table] sets them.
	Sampler string `json:"sampler"`
	Remover string `json:"remover"`
	// SamplesPerInsert is the rate limiter's target ratio (0: the recipe's,
	// BatchSize·GradSteps/TrainEvery). Inserts count environment frames.
	SamplesPerInsert float64 `json:"samples_per_insert"`
	// ErrorBuffer is how far, in samples, the ratio may stray before the
	// limiter blocks inserts (actors) or samples (trainers); 0 picks
	// 100·SamplesPerInsert.
	ErrorBuffer float64 `json:"error_buffer"`
	// Backlog is the number of commits an actor writing straight into its
	// trainer's shard may have ahead of the table's admission before it waits.
	Backlog int `json:"backlog"`
	// Samples says how actors hand over transitions: SamplesAuto or SamplesStream.
	Samples string `json:"samples"`
	// Chunk is the number of transitions per sample-stream record.
	Chunk int `json:"chunk"`
	// TCP makes every stream use TCP, as across hosts (for measurements).
	TCP bool `json:"tcp"`

	// EnvsPerActor is K: every actor steps a ring of K environments, and
	// through a policy worker sends their K observations in one request and
	// steps each with its action.
	EnvsPerActor int `json:"envs_per_actor"`
	// InferBatch and InferDelay are the policy workers' batching: a batch is
	// answered when it holds InferBatch observations (0: one request of
	// EnvsPerActor observations per actor served), when every actor served
	// has a request in it, or once the actors missing from it are overdue by
	// their own pace (roles.InferenceServer.Next); InferDelay bounds the wait.
	InferBatch int           `json:"infer_batch"`
	InferDelay time.Duration `json:"infer_delay"`

	// Bench, when positive, makes the run a throughput measurement: no rate
	// limit beyond the minimum size, a fixed exploration rate (Agent.EpsEnd),
	// no learning target; environment frames per second are measured for
	// Bench after BenchWarmup.
	Bench       time.Duration `json:"bench"`
	BenchWarmup time.Duration `json:"bench_warmup"`

	// CheckpointEvery is the period of each trainer's shard checkpoints to the
	// job's checkpoint directory (GEAR_CHECKPOINT_DIR), and of the parameter
	// checkpoint beside them; 0 writes no shard checkpoints. A restarted job
	// restores from them what shared memory no longer holds (docs/dqn.md).
	CheckpointEvery time.Duration `json:"checkpoint_every"`
	// Generation is the job's restart count, set by the first trainer: replay
	// keys of one generation never meet those of rows an earlier one left.
	Generation int `json:"generation"`
}

// DefaultConfig returns the distributed version of agent.DefaultConfig with
// the full run's stopping rule (mean return 475 over 100 episodes).
func DefaultConfig() Config {
	return Config{
		Agent:        agent.DefaultConfig(),
		Seed:         1,
		MaxFrames:    300_000,
		TargetReturn: 475,
		Window:       100,
		ParamEvery:   8,
		PublishEvery: 1,
		Table:        "replay",
		Sampler:      sample.KindPrioritized.String(),
		Remover:      sample.KindFIFO.String(),
		Backlog:      64,
		Samples:      SamplesAuto,
		Chunk:        8,
		EnvsPerActor: 1,
		InferDelay:   time.Millisecond,
		BenchWarmup:  2 * time.Second,
	}
}

// RateLimit returns the rate limiter's samples per insert and error buffer
// (in samples), defaults applied.
func (c *Config) RateLimit() (samplesPerInsert, errorBuffer float64) {
	return c.spi(), c.errorBuffer()
}

// spi returns the rate limiter's samples per insert.
func (c *Config) spi() float64 {
	if c.SamplesPerInsert > 0 {
		return c.SamplesPerInsert
	}
	a := c.Agent
	return float64(a.BatchSize*a.GradSteps) / float64(a.TrainEvery)
}

// errorBuffer returns the rate limiter's error buffer in samples.
func (c *Config) errorBuffer() float64 {
	if c.ErrorBuffer > 0 {
		return c.ErrorBuffer
	}
	return 100 * c.spi()
}

// Validate reports the first field out of range. trainers is the number of
// trainers, whose local batches must divide the global one.
func (c *Config) Validate(trainers int) error {
	if err := c.Agent.Validate(); err != nil {
		return fmt.Errorf("dist: %w", err)
	}
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("dist: config: %s = %v, want %s", field, v, want)
	}
	switch {
	case trainers < 1:
		return bad("trainers", trainers, ">= 1")
	case c.Agent.BatchSize%trainers != 0:
		return bad("Agent.BatchSize", c.Agent.BatchSize, fmt.Sprintf("a multiple of the %d trainers", trainers))
	case c.MaxFrames < 0:
		return bad("MaxFrames", c.MaxFrames, ">= 0")
	case c.TargetReturn < 0:
		return bad("TargetReturn", c.TargetReturn, ">= 0")
	case c.Window < 1:
		return bad("Window", c.Window, ">= 1")
	case c.ParamEvery < 1:
		return bad("ParamEvery", c.ParamEvery, ">= 1")
	case c.CheckpointEvery < 0:
		return bad("CheckpointEvery", c.CheckpointEvery, ">= 0")
	case c.PublishEvery < 1:
		return bad("PublishEvery", c.PublishEvery, ">= 1")
	case c.SamplesPerInsert < 0:
		return bad("SamplesPerInsert", c.SamplesPerInsert, ">= 0")
	case c.ErrorBuffer < 0:
		return bad("ErrorBuffer", c.ErrorBuffer, ">= 0")
	case c.errorBuffer() < 2*max(1, c.spi()):
		return bad("ErrorBuffer", c.ErrorBuffer, fmt.Sprintf("at least twice the samples per insert (%g)", c.spi()))
	case c.Backlog < 1:
		return bad("Backlog", c.Backlog, ">= 1")
	case c.Samples != SamplesAuto && c.Samples != SamplesStream:
		return bad("Samples", fmt.Sprintf("%q", c.Samples), fmt.Sprintf("%q or %q", SamplesAuto, SamplesStream))
	case c.Chunk < 1 || c.Chunk > 1024:
		return bad("Chunk", c.Chunk, "1 to 1024")
	case c.EnvsPerActor < 1 || c.EnvsPerActor > 4096:
		return bad("EnvsPerActor", c.EnvsPerActor, "1 to 4096")
	case c.InferBatch < 0:
		return bad("InferBatch", c.InferBatch, ">= 0")
	case c.InferBatch > 0 && c.InferBatch < c.EnvsPerActor:
		return bad("InferBatch", c.InferBatch, fmt.Sprintf("0 or at least EnvsPerActor (%d): a request carries the observations of every environment of an actor", c.EnvsPerActor))
	case c.InferDelay < 0:
		return bad("InferDelay", c.InferDelay, ">= 0")
	case c.Bench < 0 || c.BenchWarmup < 0:
		return bad("Bench/BenchWarmup", [2]time.Duration{c.Bench, c.BenchWarmup}, ">= 0")
	case c.Table == "":
		return bad("Table", `""`, "a name")
	}
	if _, _, err := c.selectors(); err != nil {
		return fmt.Errorf("dist: config: %w", err)
	}
	return nil
}

// selectors returns fresh selectors for the trainer's table: Sampler and
// Remover built by sample's constructor, the prioritized ones with
// Agent.PriorityExponent.
func (c *Config) selectors() (sampler, remover sample.Selector, err error) {
	build := func(field, name string) (sample.Selector, error) {
		k, err := sample.ParseKind(name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		exp := 0.0
		if k == sample.KindPrioritized {
			exp = c.Agent.PriorityExponent
		}
		s, err := sample.NewSelector(k, exp)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		return s, nil
	}
	if sampler, err = build("Sampler", c.Sampler); err != nil {
		return nil, nil, err
	}
	if remover, err = build("Remover", c.Remover); err != nil {
		return nil, nil, err
	}
	return sampler, remover, nil
}
