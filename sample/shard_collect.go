package sample

import (
	"context"
	"fmt"

	"github.com/gear-rl/gear/store"
)

// CollectPlan is a collection's columns and window resolved once against a
// shard table's layout (PlanCollect), for CollectBatch to reuse call after
// call: a training loop that collects the same columns of every batch plans
// them once.
type CollectPlan struct {
	st    *ShardTable
	plans []colPlan
	per   int // bytes per item, all columns
}

// PlanCollect resolves columns and w as Collect does, once.
//
// Errors: an unknown column; a bad window; no columns.
func (st *ShardTable) PlanCollect(columns []string, w Window) (*CollectPlan, error) {
	plans, err := planColumns(st.shard, columns, w)
	if err != nil {
		return nil, err
	}
	p := &CollectPlan{st: st, plans: plans}
	for _, c := range plans {
		p.per += c.itemBytes()
	}
	return p, nil
}

// ItemBytes is the number of bytes one item takes in column i's buffer.
func (p *CollectPlan) ItemBytes(i int) int { return p.plans[i].itemBytes() }

// CollectBatch copies the items of b, in order, into dst (one buffer per
// planned column, each of at least len(b.Items) * ItemBytes(i) bytes, which
// the caller provides: nothing is allocated). It reads each row by the
// item's reference (index and insertion sequence), without a look-up in the
// table; a row the sample deleted is read through the batch's pin.
//
// Errors: ErrClosed; a short buffer; ErrEvicted, wrapped, for a row
// evicted since the sample (the remover may take an item the batch does not
// hold: sample again); the context's error.
func (st *ShardTable) CollectBatch(ctx context.Context, p *CollectPlan, b *Batch, dst [][]byte) error {
	if p.st != st {
		return fmt.Errorf("sample: table %q: collect with a plan of table %q", st.t.name, p.st.t.name)
	}
	if len(dst) != len(p.plans) {
		return fmt.Errorf("sample: table %q: collect of %d columns into %d buffers", st.t.name, len(p.plans), len(dst))
	}
	n := len(b.Items)
	for i, c := range p.plans {
		if len(dst[i]) < n*c.itemBytes() {
			return fmt.Errorf("sample: table %q: collect of %d items: buffer %d holds %d bytes, want %d", st.t.name, n, i, len(dst[i]), n*c.itemBytes())
		}
	}
	return forEachParallel(n, p.per*n, func(lo, hi int) error {
		for k := lo; k < hi; k++ {
			if k&63 == 0 {
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("sample: table %q: collect: %w", st.t.name, err)
				}
			}
			it := &b.Items[k]
			v, err := st.shard.Read(store.Ref{Index: it.Index, Seq: it.Seq})
			if err == nil {
				copyView(p.plans, dst, k, v)
				v.Done()
				continue
			}
			if err := st.copyHeld(it.Index, p.plans, dst, k); err != nil {
				return err
			}
		}
		return nil
	})
}

// copyHeld copies row idx, pinned by a batch whose sample deleted it, into
// item k of dst.
func (st *ShardTable) copyHeld(idx int, plans []colPlan, dst [][]byte, k int) error {
	st.mu.Lock()
	v, ok := st.held[int32(idx)]
	closed := st.closed
	st.mu.Unlock()
	if closed {
		return st.t.errClosed("collect")
	}
	if !ok {
		return fmt.Errorf("sample: table %q: collect: index %d: %w", st.t.name, idx, ErrEvicted)
	}
	copyView(plans, dst, k, v)
	return nil
}

// copyView is copyItem reading v's blocks (no method value made per row).
func copyView(plans []colPlan, dst [][]byte, k int, v store.View) {
	for i, p := range plans {
		ib := p.itemBytes()
		out := dst[i][k*ib : (k+1)*ib]
		src := v.Block(p.col)
		n := p.avail * p.frameBytes
		copy(out[p.readAt:p.readAt+n], src[p.first*p.frameBytes:])
		clear(out[p.zeroAt : p.zeroAt+ib-n])
	}
}
