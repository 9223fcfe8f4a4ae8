package jobs

import (
	"errors"
	"fmt"

	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

// Build returns what the table describes, in the terms of the packages that
// implement it: the layout of one of its shards and the configuration of the
// table over it. t's defaults must be filled in (Load, Parse or SetDefaults);
// shards is the number of shards the table spans (the ranks that hold one, at
// least 1). Validate accepts exactly the tables Build builds, with shards the
// job's world size; the errors are the same *FieldErrors, joined.
//
// The store spec has Capacity+1 rows, the one beyond the table's max size being
// for a writer in flight (sample.NewShardTable needs it), and no remover of its
// own (store.RemoverNone: the table decides evictions); a program whose writers
// run further ahead adds rows. Each column holds TrajectoryLength frames.
//
// The sample config holds two fresh selectors, which the table built from it
// owns: call Build again for another table. Its MaxSize is Capacity (one
// shard's) and its RateLimit is the whole table's, over every shard, as
// sample.NewDistTable takes it; a program that runs its shards as separate
// tables divides it among them. Name, MaxSize, Sampler, Remover,
// MaxTimesSampled and RateLimit are set; the caller sets Seed and the rest.
func (t *Table) Build(shards int) (store.Spec, sample.Config, error) {
	if shards < 1 {
		return store.Spec{}, sample.Config{}, fmt.Errorf("jobs: table %q over %d shards: want at least 1", t.Name, shards)
	}
	v := &validator{}
	spec, cfg := v.table(t, shards)
	if err := errors.Join(v.errs...); err != nil {
		return store.Spec{}, sample.Config{}, err
	}
	return spec, cfg, nil
}
