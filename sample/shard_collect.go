package sample

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/gear-rl/gear/store"
)

// CollectPlan is a collection's columns and window resolved once against a
// shard table's layout (PlanCollect), for CollectBatch to reuse call after
// call: a training loop that collects the same columns of every batch plans
// them once.
type CollectPlan struct {
	st    *ShardTable
	plans []colPlan
	per   int   // bytes per item, all columns
	cols  []int // the columns read, for Shard.Touch
	group int   // items touched ahead of their copies (1: none)
}

// touchBytes bounds the bytes that CollectBatch brings into the cache ahead
// of copying them (a group of items): well within a core's L2;
// maxTouchGroup bounds the items of a group (their indices are on the
// stack).
const (
	touchBytes    = 64 << 10
	maxTouchGroup = 256
)

// PlanCollect resolves columns and w as Collect does, once.
//
// Errors: an unknown column; a bad window; no columns.
func (st *ShardTable) PlanCollect(columns []string, w Window) (*CollectPlan, error) {
	plans, err := planColumns(st.shard, columns, w)
	if err != nil {
		return nil, err
	}
	p := &CollectPlan{st: st, plans: plans}
	touched := 0 // bytes per item that Shard.Touch reads: whole blocks, whatever the window
	for _, c := range plans {
		p.per += c.itemBytes()
		p.cols = append(p.cols, c.col)
		touched += st.shard.BlockBytes(c.col)
	}
	// Small rows are touched in groups: pinning each row is a locked
	// instruction, which waits for the loads before it, so rows copied one
	// after the other take their cache misses one row at a time. Large
	// ones stream through the hardware's own prefetch.
	p.group = 1
	if touched <= 4<<10 {
		p.group = min(maxTouchGroup, max(1, touchBytes/touched))
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
	if p.per*n < parallelCopyBytes { // a closure for forEachParallel would allocate
		return st.collectRange(ctx, p, b, dst, 0, n)
	}
	return forEachParallel(n, p.per*n, func(lo, hi int) error {
		return st.collectRange(ctx, p, b, dst, lo, hi)
	})
}

// collectRange is CollectBatch of items [lo, hi) of b.
func (st *ShardTable) collectRange(ctx context.Context, p *CollectPlan, b *Batch, dst [][]byte, lo, hi int) error {
	var touched uint64
	var rows [maxTouchGroup]int
	nextGroup := lo // the first item of the next group to touch
	for k := lo; k < hi; k++ {
		if k&63 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("sample: table %q: collect: %w", st.t.name, err)
			}
		}
		if p.group > 1 && k == nextGroup {
			// The next group's rows, all loads in flight together.
			nextGroup = min(hi, k+p.group)
			idx := rows[:nextGroup-k]
			for j := range idx {
				idx[j] = b.Items[k+j].Index
			}
			touched += st.shard.Touch(idx, p.cols)
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
	loadSink.Add(touched)
	return nil
}

// loadSink keeps what the loads ahead of use read (the collect's touch pass,
// the admissions' key-cell reads), so that the compiler keeps the loads.
var loadSink atomic.Uint64

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
	for i := range plans {
		p := &plans[i]
		ib := p.itemBytes()
		p.copyBlock(dst[i][k*ib:(k+1)*ib], v.Block(p.col))
	}
}
