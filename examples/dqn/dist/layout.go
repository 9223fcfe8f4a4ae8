package dist

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/gear-rl/gear/examples/dqn/replay"
	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/sample/reverb"
	"github.com/gear-rl/gear/store"
)

// A row of the replay shard is one n-step transition, in six columns.
const (
	colObs = iota
	colAction
	colReward
	colDiscount
	colNextObs
	colVersion
	numCols
)

// columnNames are the shard's columns, in order, as Collect takes them.
var columnNames = []string{"obs", "action", "reward", "discount", "next_obs", "version"}

// Columns returns the replay shard's columns for observations of obsSize
// values: obs and next_obs (float32 × obsSize), action (int32), reward (the
// discounted n-step return, float32), discount (γ^k, 0 after termination,
// float32) and version (the parameter version that chose the action, int64).
// Each holds one frame: a row is one transition.
func Columns(obsSize int) []store.Column {
	obs := []int{obsSize}
	return []store.Column{
		{Name: columnNames[colObs], DType: store.Float32, Shape: obs, Length: 1},
		{Name: columnNames[colAction], DType: store.Int32, Length: 1},
		{Name: columnNames[colReward], DType: store.Float32, Length: 1},
		{Name: columnNames[colDiscount], DType: store.Float32, Length: 1},
		{Name: columnNames[colNextObs], DType: store.Float32, Shape: obs, Length: 1},
		{Name: columnNames[colVersion], DType: store.Int64, Length: 1},
	}
}

// shardSpec is the layout of a trainer's shard: the table's capacity plus
// slack rows for writers in flight and commits not yet admitted, and no
// remover of its own (the table decides evictions).
func shardSpec(obsSize, capacity, slack int) store.Spec {
	return store.Spec{Capacity: capacity + slack, Columns: Columns(obsSize), Remover: store.RemoverNone}
}

// writeRow fills a row allocated in the shard with transition t, in place.
func writeRow(p store.Pending, t replay.Transition, version uint64) error {
	obs, err := store.Block[float32](p, colObs)
	if err != nil {
		return err
	}
	next, err := store.Block[float32](p, colNextObs)
	if err != nil {
		return err
	}
	if len(obs) != len(t.Obs) || len(next) != len(t.NextObs) {
		return fmt.Errorf("dist: observations of %d and %d values for a shard of %d", len(t.Obs), len(t.NextObs), len(obs))
	}
	action, err := store.Block[int32](p, colAction)
	if err != nil {
		return err
	}
	reward, err := store.Block[float32](p, colReward)
	if err != nil {
		return err
	}
	discount, err := store.Block[float32](p, colDiscount)
	if err != nil {
		return err
	}
	ver, err := store.Block[int64](p, colVersion)
	if err != nil {
		return err
	}
	copy(obs, t.Obs)
	copy(next, t.NextObs)
	action[0], reward[0], discount[0], ver[0] = t.Action, t.Reward, t.Discount, int64(version)
	return nil
}

// decodeRows copies Collect's column buffers for items [0, n) into batch rows
// [at, at+n) and the versions into versions[at:].
func decodeRows(bufs [][]byte, n, at int, b *replay.Batch, versions []uint64) {
	d := b.ObsSize
	floats(b.Obs[at*d:(at+n)*d], bufs[colObs])
	floats(b.NextObs[at*d:(at+n)*d], bufs[colNextObs])
	floats(b.Rewards[at:at+n], bufs[colReward])
	floats(b.Discounts[at:at+n], bufs[colDiscount])
	for i := range n {
		b.Actions[at+i] = int32(binary.LittleEndian.Uint32(bufs[colAction][4*i:]))
		versions[at+i] = binary.LittleEndian.Uint64(bufs[colVersion][8*i:])
	}
}

// floats decodes little-endian float32s from src into dst.
func floats(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// A sample-stream record is a chunk of transitions: a count (u32), then per
// transition its key (u64), version (u64), action (i32), reward and discount
// (f32), obs and next obs (f32 × obsSize), little-endian.
const chunkHeader = 4

func transitionBytes(obsSize int) int { return 8 + 8 + 4 + 4 + 4 + 8*obsSize }

// chunkWriter packs transitions into sample-stream records.
type chunkWriter struct {
	obsSize, max int
	n            int
	buf          []byte
	newest       uint64
}

func newChunkWriter(obsSize, max int) *chunkWriter {
	return &chunkWriter{obsSize: obsSize, max: max, buf: make([]byte, chunkHeader, chunkHeader+max*transitionBytes(obsSize))}
}

func (w *chunkWriter) full() bool { return w.n >= w.max }

func (w *chunkWriter) add(key, version uint64, t replay.Transition) {
	b := w.buf
	b = binary.LittleEndian.AppendUint64(b, key)
	b = binary.LittleEndian.AppendUint64(b, version)
	b = binary.LittleEndian.AppendUint32(b, uint32(t.Action))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(t.Reward))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(t.Discount))
	for _, v := range t.Obs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	for _, v := range t.NextObs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	w.buf = b
	w.n++
	w.newest = max(w.newest, version)
}

// take returns the record (valid until the next add) and starts a new one.
func (w *chunkWriter) take() []byte {
	binary.LittleEndian.PutUint32(w.buf, uint32(w.n))
	out := w.buf
	w.buf = w.buf[:chunkHeader]
	w.n, w.newest = 0, 0
	return out
}

// chunkTransition is one decoded transition of a record; Obs and NextObs are
// the decoder's buffers, overwritten by the next one.
type chunkTransition struct {
	Key, Version uint64
	replay.Transition
}

// decodeChunk calls fn for each transition of record data.
func decodeChunk(data []byte, obsSize int, fn func(chunkTransition) error) error {
	if len(data) < chunkHeader {
		return fmt.Errorf("dist: sample record of %d bytes: no header", len(data))
	}
	n := int(binary.LittleEndian.Uint32(data))
	size := transitionBytes(obsSize)
	if len(data) != chunkHeader+n*size {
		return fmt.Errorf("dist: sample record of %d bytes for %d transitions of %d bytes", len(data), n, size)
	}
	t := chunkTransition{Transition: replay.Transition{Obs: make([]float32, obsSize), NextObs: make([]float32, obsSize)}}
	p := data[chunkHeader:]
	for range n {
		t.Key = binary.LittleEndian.Uint64(p)
		t.Version = binary.LittleEndian.Uint64(p[8:])
		t.Action = int32(binary.LittleEndian.Uint32(p[16:]))
		t.Reward = math.Float32frombits(binary.LittleEndian.Uint32(p[20:]))
		t.Discount = math.Float32frombits(binary.LittleEndian.Uint32(p[24:]))
		floats(t.Obs, p[28:28+4*obsSize])
		floats(t.NextObs, p[28+4*obsSize:28+8*obsSize])
		if err := fn(t); err != nil {
			return err
		}
		p = p[size:]
	}
	return nil
}

// ApplyTable takes the replay table of a job spec's [table] section into c,
// building it as every program does (jobs.Table.Build, over shards shards:
// the job's world size, as gearrun validate checks it): its name, capacity
// (per trainer shard), sampler and remover (any of sample's, the prioritized
// ones with priority_exponent) and rate limiter (min_size_to_sample becomes
// the frames collected before learning starts). The table must describe this
// program's rows exactly: the columns of Columns(obsSize), trajectory_length
// 1, no max_times_sampled, and a sample_to_insert_ratio limiter, which paces
// the actors. checkpoint_every, when set, is the period of the shard
// checkpoints (Config.CheckpointEvery).
func ApplyTable(c *Config, t *jobs.Table, shards, obsSize int) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("dist: job spec [table] %q: "+format, append([]any{t.Name}, args...)...)
	}
	spec, tc, err := t.Build(shards)
	if err != nil {
		return fail("%w", err)
	}
	switch {
	case t.TrajectoryLength != 1:
		return fail("trajectory_length %d, want 1 (a row is one n-step transition)", t.TrajectoryLength)
	case tc.MaxTimesSampled != 0:
		return fail("max_times_sampled %d, want 0", tc.MaxTimesSampled)
	case t.RateLimiter.Kind == jobs.LimiterMinSize:
		return fail("rate_limiter.kind %q: the distributed run paces actors with %q", t.RateLimiter.Kind, jobs.LimiterSampleToInsertRatio)
	case t.RateLimiter.Kind != jobs.LimiterSampleToInsertRatio:
		return fail("rate_limiter.kind %q, want %q", t.RateLimiter.Kind, jobs.LimiterSampleToInsertRatio)
	}
	want := Columns(obsSize)
	if len(spec.Columns) != len(want) {
		return fail("%d columns, want %d (%v)", len(spec.Columns), len(want), columnNames)
	}
	for i, col := range spec.Columns {
		w := want[i]
		if col.Name != w.Name || col.DType != w.DType || !slices.Equal(col.Shape, w.Shape) {
			return fail("column %d is %q %s %s, want %q %s %s", i, col.Name, col.DType, store.FormatShape(col.Shape), w.Name, w.DType, store.FormatShape(w.Shape))
		}
	}
	c.Table = tc.Name
	c.Agent.ReplayCapacity = tc.MaxSize
	c.Sampler, c.Remover = tc.Sampler, tc.Remover
	if tc.Sampler == reverb.Prioritized || tc.Remover == reverb.Prioritized {
		c.Agent.PriorityExponent = t.PriorityExponent
	}
	rl := t.RateLimiter
	c.SamplesPerInsert = rl.SamplesPerInsert
	c.ErrorBuffer = rl.ErrorBuffer
	c.Agent.LearningStarts = rl.MinSizeToSample
	if t.CheckpointEvery < 0 {
		return fail("checkpoint_every %v, want >= 0", t.CheckpointEvery)
	}
	if t.CheckpointEvery > 0 {
		c.CheckpointEvery = t.CheckpointEvery.D()
	}
	return nil
}
