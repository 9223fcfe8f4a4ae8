package jobs

import (
	"errors"
	"fmt"

	"github.com/gear-rl/gear/sample/reverb"
	"github.com/gear-rl/gear/store"
)

// Build returns what the table describes, in the terms of the packages that
// implement it: the layout of one of its shards, and the table over it as
// package reverb describes it, which sample.NewConfig turns into a
// sample.Config (jobs stays free of sample's GPU binding, so that gearrun
// links none). t's defaults must be filled in (Load, Parse or SetDefaults);
// shards is the number of shards the table spans (the ranks that hold one, at
// least 1). Validate accepts exactly the tables Build builds, with shards the
// job's world size; the errors are the same *FieldErrors, joined.
//
// The store spec has Capacity+1 rows, the one beyond the table's max size being
// for a writer in flight (sample.NewShardTable needs it), and no remover of its
// own (store.RemoverNone: the table decides evictions); a program whose writers
// run further ahead adds rows. Each column holds TrajectoryLength frames.
//
// The table's MaxSize is Capacity (one shard's) and its Limit is the whole
// table's, over every shard, as sample.NewDistTable takes it; a program that
// runs its shards as separate tables divides it among them. The selectors
// are named by their own names ("maxheap" for "max_heap"), with the
// exponent each takes.
func (t *Table) Build(shards int) (store.Spec, reverb.Table, error) {
	if shards < 1 {
		return store.Spec{}, reverb.Table{}, fmt.Errorf("jobs: table %q over %d shards: want at least 1", t.Name, shards)
	}
	v := &validator{}
	spec, rt := v.table(t, shards)
	if err := errors.Join(v.errs...); err != nil {
		return store.Spec{}, reverb.Table{}, err
	}
	return spec, rt, nil
}
