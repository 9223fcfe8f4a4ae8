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
	if t.closed || d.isClosing() {
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
	d.giveShares(g)
	return g, nil
}

// giveShares gives this shard (t.mu held) its share of the global insert room of
// g, which every rank knows alike: the state of a sync, or that state after a
// collective sample, with no insert on any shard since the shard's own counts went
// into the sync (every rank holds its table's lock from its sync to here). From
// now on the shard admits share inserts, plus what its own deletes free (distRoom).
// The shares sum to at most the room, so the ranks together never insert beyond
// what the global limiter allows.
func (d *DistTable) giveShares(g *globalState) {
	if d.observe != nil {
		d.observe(g)
	}
	if d.closed {
		return // the local table is a table of its own again
	}
	t := d.t
	t.share = d.shareOf(g)
	t.room = distRoom{global: g.lim, base: g.lim.MaxInserts(unlimitedRoom), deletes: t.limiter.deletes}
	t.notify()
}

// unlimitedRoom stands for a room no shard will use up.
const unlimitedRoom = 1 << 40

// distRoom is what a shard's own deletes (MutatePriorities, the remover of a
// full shard) add to its insert room until the next share is given. Only the
// limiter's min_size condition looks at deletes: k more deletes grow the global
// room of the state the shares came from by
//
//	freed(k) = room(deletes + k) - room(deletes)
//	         = max(free + k, ratio) - max(free, ratio)   (free, ratio: the room of either condition)
//
// and the shard may insert that much more. freed is convex in k and zero at 0,
// hence superadditive: the sum of what every shard's deletes free on their own is
// at most what all those deletes free together, so the global limiter stays
// exact, though it learns of the deletes only at the next sync. Another shard's
// room grows by them only then.
type distRoom struct {
	global  RateLimiter // the global counts the share came from
	base    int64       // their room
	deletes int64       // this shard's deletes then
	at, got int64       // freed's last answer: at deletes, got room
}

// freed is the room this shard's deletes have freed, given its delete count now.
func (r *distRoom) freed(deletes int64) int64 {
	k := deletes - r.deletes
	if k <= 0 {
		return 0
	}
	if deletes != r.at {
		after := r.global
		after.Delete(k)
		r.at, r.got = deletes, after.MaxInserts(unlimitedRoom)-r.base
	}
	return r.got
}

// shareOf splits the global insert room among the shards in proportion to their
// waiting inserts (evenly when none wait), the same way on every rank.
func (d *DistTable) shareOf(g *globalState) int64 {
	const unlimited = unlimitedRoom
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
