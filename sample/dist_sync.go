package sample

import (
	"context"
	"fmt"

	"github.com/gear-rl/gear/collective"
)

// globalState is what the last sync learned: every shard's state and the global
// rate limiter.
type globalState struct {
	shards []shardState
	lim    RateLimiter
	size   int64
	weight float64
}

type shardState struct {
	inserts, samples, deletes, size int64
	weight                          float64
	demand                          int64 // inserts waiting for the rate limiter
	flags                           int64
}

const syncFields = 7

// syncLocked exchanges every shard's counts and state (t.mu held), sets the global
// rate limiter and gives this shard its share of the global insert room.
func (d *DistTable) syncLocked(ctx, cctx context.Context, flags int64) (*globalState, error) {
	t := d.t
	ins, smp, del := t.limiter.Counts()
	mine := shardState{inserts: ins, samples: smp, deletes: del, size: int64(t.sampler.Len()), demand: int64(t.blockedIns), flags: flags}
	if p, ok := t.sampler.(*Prioritized); ok {
		mine.weight = p.Total()
	}
	if d.st != nil && d.st.pending() {
		mine.demand++
	}
	if ctx.Err() != nil {
		mine.flags |= flagCancelled
	}
	if t.closed || d.closed {
		mine.flags |= flagClosed
	}
	if len(d.syncBuf) != syncFields*d.size {
		d.syncBuf = make([]float64, syncFields*d.size)
	}
	send := []float64{float64(mine.inserts), float64(mine.samples), float64(mine.deletes), float64(mine.size), mine.weight, float64(mine.demand), float64(mine.flags)}
	if err := collective.AllGather(cctx, d.comm, send, d.syncBuf); err != nil {
		return nil, fmt.Errorf("sample: distributed table %q: sync: %w", t.name, err)
	}
	g := &d.last
	g.shards = g.shards[:0]
	var gi, gs, gd int64
	g.size, g.weight = 0, 0
	for r := range d.size {
		v := d.syncBuf[r*syncFields:]
		s := shardState{inserts: int64(v[0]), samples: int64(v[1]), deletes: int64(v[2]), size: int64(v[3]), weight: v[4], demand: int64(v[5]), flags: int64(v[6])}
		g.shards = append(g.shards, s)
		gi, gs, gd = gi+s.inserts, gs+s.samples, gd+s.deletes
		g.size += s.size
		g.weight += s.weight
	}
	g.lim = RateLimiter{cfg: d.rl}
	g.lim.SetCounts(gi, gs, gd)
	t.share = d.shareOf(g)
	t.notify()
	return g, nil
}

// shareOf splits the global insert room among the shards in proportion to their
// waiting inserts (evenly when none wait), the same way on every rank.
func (d *DistTable) shareOf(g *globalState) int64 {
	const unlimited = 1 << 40
	room := g.lim.MaxInserts(unlimited)
	if room >= unlimited {
		return unlimited
	}
	var demand int64
	for _, s := range g.shards {
		demand += s.demand
	}
	shares := make([]int64, d.size)
	given := int64(0)
	for r, s := range g.shards {
		if demand == 0 {
			shares[r] = room / int64(d.size)
		} else {
			shares[r] = int64(float64(room) * float64(s.demand) / float64(demand))
		}
		given += shares[r]
	}
	for r := 0; given < room; r = (r + 1) % d.size {
		if demand == 0 || g.shards[r].demand > 0 {
			shares[r]++
			given++
		}
	}
	return shares[d.rank]
}

// Sync is a collective call that refreshes the global counts and the shards'
// shares of the insert room (Sample does it too).
//
// Errors: the communicator's; ErrClosed.
func (d *DistTable) Sync(ctx context.Context) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.t.mu.Lock()
	defer d.t.mu.Unlock()
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	g, err := d.syncLocked(ctx, cctx, 0)
	if err != nil {
		return err
	}
	return d.flagError(ctx, g, "sync", nil)
}

// flagError turns a rank's cancellation or closing, seen by every rank in the same
// sync, into the same decision everywhere.
func (d *DistTable) flagError(ctx context.Context, g *globalState, op string, argErr error) error {
	for r, s := range g.shards {
		switch {
		case s.flags&flagBadArgument != 0:
			if r == d.rank && argErr != nil {
				return argErr
			}
			return fmt.Errorf("sample: distributed table %q: %s: rank %d's arguments are bad", d.t.name, op, r)
		case s.flags&flagClosed != 0:
			return fmt.Errorf("%w: %s on distributed table %q: rank %d closed its shard", ErrClosed, op, d.t.name, r)
		case s.flags&flagCancelled != 0:
			if r == d.rank {
				return fmt.Errorf("sample: distributed table %q: %s: %w", d.t.name, op, ctx.Err())
			}
			return fmt.Errorf("sample: distributed table %q: %s: abandoned: rank %d's context ended", d.t.name, op, r)
		}
	}
	return nil
}
