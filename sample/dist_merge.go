package sample

import (
	"context"
	"fmt"
	"math"

	"github.com/gear-rl/gear/collective"
)

// mergeDraw: every shard offers the head of its order, enough of it to fill the
// batch; every rank merges the heads the same way.
func (d *DistTable) mergeDraw(ctx context.Context, g *globalState, b *Batch) error {
	t := d.t
	n := len(b.Items)
	k := n
	if d.maxTimes == 0 {
		k = 1 // the first item takes every pick
	}
	var bestErr error
	d.slots, bestErr = t.bestLocked(ctx, k, d.slots[:0])
	send := make([]byte, 8+n*candidateBytes)
	var budgets int64
	count := 0
	for _, slot := range d.slots {
		if budgets >= int64(n) {
			break
		}
		it := &t.items[slot]
		c := candidate{Shard: int32(d.rank), Slot: int32(slot), Key: it.Key, Priority: it.Priority,
			Inserted: it.Inserted, TimesSampled: it.TimesSampled, Seq: it.Seq, Budget: math.MaxInt64}
		if d.maxTimes > 0 {
			c.Budget = d.maxTimes - it.TimesSampled
		}
		budgets += min(c.Budget, int64(n))
		c.encode(send[8+count*candidateBytes:])
		count++
	}
	le.PutUint64(send, uint64(count))
	if bestErr != nil {
		le.PutUint64(send, badCount)
	}
	all := make([]byte, len(send)*d.size)
	if err := collective.AllGather(ctx, d.comm, send, all); err != nil {
		return fmt.Errorf("sample: distributed table %q: decentralized draw: %w", t.name, err)
	}
	if err := d.candidatesFailed(all, len(send), "decentralized draw", bestErr); err != nil {
		return err
	}
	lists := decodeLists(all, len(send), d.size)
	lim := g.lim
	picks := mergeOrdered(d.kind, lists, n, &lim, nil)
	b.Items = b.Items[:len(picks)]
	hook := d.onDeleted(b)
	used := make([]int64, d.size)
	for i, p := range picks {
		c := &lists[p.List][p.Index]
		used[p.List]++
		s := &b.Items[i]
		*s = Sampled{Item: Item{Key: c.Key, Ref: c.Key, Priority: c.Priority, TimesSampled: c.TimesSampled + used[p.List],
			Inserted: c.Inserted, Seq: c.Seq, Index: int(c.Shard)*d.capacity + int(c.Slot)}, Probability: 1, TableSize: int(g.size), Deleted: p.Deleted}
		if p.Deleted {
			used[p.List] = 0
		}
		if int(c.Shard) == d.rank {
			t.applyPickLocked(int(c.Slot), hook)
		}
	}
	return nil
}

// Top is a collective call that returns, on every rank, the first k distinct items
// of the global order (GEAR's decentralized top-k for a MaxHeap sampler): every
// shard offers its first k, and every rank merges them the same way. It samples
// nothing: no counts, no rate limiter, no times sampled. Items' Index fields are
// global indices.
//
// Errors: a sampler without an order; ErrClosed; the communicator's errors.
func (d *DistTable) Top(ctx context.Context, k int) ([]Item, error) {
	if !d.ordered() || k < 1 {
		return nil, fmt.Errorf("sample: distributed table %q: top %d: want k >= 1 and a FIFO, LIFO or heap sampler (have %v)", d.t.name, k, d.kind)
	}
	d.opMu.Lock()
	defer d.opMu.Unlock()
	t := d.t
	t.mu.Lock()
	if d.isClosing() || t.closed {
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: top on distributed table %q", ErrClosed, t.name)
	}
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	var bestErr error
	d.slots, bestErr = t.bestLocked(ctx, k, d.slots[:0])
	send := make([]byte, 8+k*candidateBytes)
	le.PutUint64(send, uint64(len(d.slots)))
	if bestErr != nil {
		le.PutUint64(send, badCount)
	}
	for i, slot := range d.slots {
		it := &t.items[slot]
		c := candidate{Shard: int32(d.rank), Slot: int32(slot), Key: it.Key, Priority: it.Priority,
			Inserted: it.Inserted, TimesSampled: it.TimesSampled, Seq: it.Seq, Budget: 1}
		c.encode(send[8+i*candidateBytes:])
	}
	t.mu.Unlock()
	all := make([]byte, len(send)*d.size)
	if err := collective.AllGather(cctx, d.comm, send, all); err != nil {
		return nil, fmt.Errorf("sample: distributed table %q: top: %w", t.name, err)
	}
	if err := d.candidatesFailed(all, len(send), "top", bestErr); err != nil {
		return nil, err
	}
	lists := decodeLists(all, len(send), d.size)
	picks := mergeOrdered(d.kind, lists, k, nil, nil)
	out := make([]Item, len(picks))
	for i, p := range picks {
		c := &lists[p.List][p.Index]
		out[i] = Item{Key: c.Key, Ref: c.Key, Priority: c.Priority, TimesSampled: c.TimesSampled,
			Inserted: c.Inserted, Seq: c.Seq, Index: int(c.Shard)*d.capacity + int(c.Slot)}
	}
	return out, nil
}

// badCount, as a candidate block's count, says that the rank could not list its
// candidates.
const badCount = ^uint64(0)

// candidatesFailed returns an error, the same decision on every rank, when a
// rank's candidate block says it could not list its candidates; mine is this
// rank's own failure.
func (d *DistTable) candidatesFailed(all []byte, block int, op string, mine error) error {
	for r := range d.size {
		if le.Uint64(all[r*block:]) != badCount {
			continue
		}
		if r == d.rank && mine != nil {
			return fmt.Errorf("sample: distributed table %q: %s: %w", d.t.name, op, mine)
		}
		return fmt.Errorf("sample: distributed table %q: %s: rank %d could not list its candidates", d.t.name, op, r)
	}
	return nil
}

// decodeLists reads every rank's candidate block (a count, then candidates).
func decodeLists(all []byte, block, ranks int) [][]candidate {
	lists := make([][]candidate, ranks)
	for r := range ranks {
		blk := all[r*block:]
		c := int(le.Uint64(blk))
		lists[r] = make([]candidate, c)
		for i := range c {
			lists[r][i].decode(blk[8+i*candidateBytes:])
		}
	}
	return lists
}
