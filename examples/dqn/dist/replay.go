package dist

import (
	"context"
	"errors"
	"fmt"

	"github.com/gear-rl/gear/examples/dqn/replay"
	"github.com/gear-rl/gear/sample"
)

// shardReplay is a trainer's learner-side view of its sample.ShardTable: full
// batches of collected transitions, each with the probability it was drawn
// with, and priority updates by key.
type shardReplay struct {
	st       *sample.ShardTable
	sb       sample.Batch
	idx      []int
	seqs     []uint64
	bufs     [][]byte
	versions []uint64 // the parameter version of each row of the last batch
	updates  []sample.Update
}

func newShardReplay(st *sample.ShardTable, batch int) *shardReplay {
	return &shardReplay{
		st:       st,
		idx:      make([]int, batch),
		seqs:     make([]uint64, batch),
		versions: make([]uint64, batch),
		updates:  make([]sample.Update, batch),
	}
}

// maxCollectTries bounds the resampling of batches whose rows the table's
// remover took between the sample and the copy.
const maxCollectTries = 8

// sample fills b with b.Len() transitions. The table samples a flexible batch,
// as many as its rate limiter allows at once; sample asks again until b is
// full, so it waits, until ctx ends, while the limiter holds samples back
// (actors behind). The rows are then copied out of the shard. When the table
// is full, its remover may evict a sampled row before the copy; a batch that
// lost a row is drawn again.
func (r *shardReplay) sample(ctx context.Context, b *replay.Batch) error {
	n := b.Len()
	for try := 0; ; try++ {
		for got := 0; got < n; {
			if err := r.st.SampleInto(ctx, &r.sb, n-got); err != nil {
				return err
			}
			for i, it := range r.sb.Items {
				k := got + i
				b.Keys[k], b.Probabilities[k], b.Priorities[k] = it.Key, it.Probability, it.Priority
				r.idx[k], r.seqs[k] = it.Index, it.Seq
				b.TableSize = it.TableSize
			}
			got += len(r.sb.Items)
		}
		bufs, err := r.st.CollectInto(ctx, r.bufs, r.idx, columnNames, sample.Window{})
		if err == nil {
			r.bufs = bufs
			if r.intact(b.Keys) {
				decodeRows(bufs, n, 0, b, r.versions)
				return nil
			}
		} else if ctx.Err() != nil || errors.Is(err, sample.ErrClosed) {
			return err
		}
		if try+1 == maxCollectTries {
			if err == nil {
				err = errors.New("rows evicted while collecting")
			}
			return fmt.Errorf("dist: replay: %d batches in a row lost rows before they were collected: %w", maxCollectTries, err)
		}
	}
}

// intact reports whether every sampled item is still in the table, in the
// row it was sampled from. Rows leave the table only by eviction, and a row
// is reused only after its item left; so an item still in place after the
// copy was copied whole.
func (r *shardReplay) intact(keys []uint64) bool {
	for i, k := range keys {
		it, ok := r.st.Get(k)
		if !ok || it.Index != r.idx[i] || it.Seq != r.seqs[i] {
			return false
		}
	}
	return true
}

// updatePriorities sets the priorities of the items of keys (those still in
// the table).
func (r *shardReplay) updatePriorities(keys []uint64, priorities []float64) error {
	u := r.updates[:len(keys)]
	for i, k := range keys {
		u[i] = sample.Update{Key: k, Priority: priorities[i]}
	}
	return r.st.MutatePriorities(u, nil)
}
