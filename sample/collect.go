package sample

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/gear-rl/gear/store"
)

// Pad says where a window puts the zero frames that stand for frames outside the
// trajectory.
type Pad int

const (
	// PadTail puts the frames read first and the zero frames after them.
	PadTail Pad = iota
	// PadHead puts the zero frames first and the frames read after them.
	PadHead
)

// Window selects frames [Offset, Offset+Length) of every trajectory collected. The
// frames of that range that the trajectory has are read in order; the missing
// ones are zero frames, at the tail or the head of the window as Pad says. The
// zero Window reads whole trajectories.
type Window struct {
	Offset, Length int
	Pad            Pad
}

func (w Window) check() error {
	switch {
	case w.Offset < 0:
		return fmt.Errorf("sample: window offset %d: want >= 0", w.Offset)
	case w.Length < 0:
		return fmt.Errorf("sample: window length %d: want >= 0", w.Length)
	case w.Pad != PadTail && w.Pad != PadHead:
		return fmt.Errorf("sample: window pad %d: want PadTail or PadHead", w.Pad)
	}
	return nil
}

// colPlan is how one column is collected: which frames of a block, into how many
// bytes per item.
type colPlan struct {
	col        int
	frameBytes int
	frames     int // frames per item in the output
	first      int // first frame read from the block
	avail      int // frames read from the block
	zeroAt     int // byte offset, within an item, of the zero frames
	readAt     int // byte offset, within an item, of the frames read
}

func (c colPlan) itemBytes() int { return c.frames * c.frameBytes }

// planColumns resolves column names and the window against a shard's layout.
func planColumns(s *store.Shard, columns []string, w Window) ([]colPlan, error) {
	if err := w.check(); err != nil {
		return nil, err
	}
	if len(columns) == 0 {
		return nil, fmt.Errorf("sample: collect: no columns asked for")
	}
	plans := make([]colPlan, len(columns))
	for i, name := range columns {
		col, err := s.Column(name)
		if err != nil {
			return nil, fmt.Errorf("sample: collect: %w", err)
		}
		spec := s.ColumnSpec(col)
		p := colPlan{col: col, frameBytes: spec.FrameBytes(), frames: spec.Length}
		if w.Length > 0 {
			p.frames = w.Length
			p.first = min(w.Offset, spec.Length)
			p.avail = min(spec.Length, w.Offset+w.Length) - p.first
		} else {
			p.avail = spec.Length
		}
		if w.Pad == PadHead {
			p.readAt = (p.frames - p.avail) * p.frameBytes
		} else {
			p.zeroAt = p.avail * p.frameBytes
		}
		plans[i] = p
	}
	return plans, nil
}

// copyItem copies one row's blocks (blocks[i] for plans[i]) into item k of dst.
func copyItem(plans []colPlan, dst [][]byte, k int, block func(col int) []byte) {
	for i := range plans {
		p := &plans[i]
		ib := p.itemBytes()
		p.copyBlock(dst[i][k*ib:(k+1)*ib], block(p.col))
	}
}

// copyBlock copies the window of block src into out (one item of the
// column's buffer), with its padding. A block read whole is one copy, and a
// scalar of 4 or 8 bytes (rewards, actions, flags) one move rather than a
// call.
func (p *colPlan) copyBlock(out, src []byte) {
	if p.first == 0 && p.avail == p.frames {
		switch len(out) {
		case 4:
			*(*[4]byte)(out) = *(*[4]byte)(src)
		case 8:
			*(*[8]byte)(out) = *(*[8]byte)(src)
		default:
			copy(out, src)
		}
		return
	}
	n := p.avail * p.frameBytes
	copy(out[p.readAt:p.readAt+n], src[p.first*p.frameBytes:])
	clear(out[p.zeroAt : p.zeroAt+len(out)-n])
}

// parallelCopyBytes is the batch size from which collection copies rows from
// several goroutines, each taking at least perWorkerBytes: below that a serial
// copy finishes about as soon as the goroutines would be scheduled, and on a busy
// machine sooner.
const (
	parallelCopyBytes = 32 << 20
	perWorkerBytes    = 8 << 20
)

// forEachParallel runs fn(lo, hi) over [0, n) in contiguous parts, on up to
// GOMAXPROCS goroutines when the work is large, and returns the first error.
func forEachParallel(n, bytes int, fn func(lo, hi int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n, max(1, bytes/perWorkerBytes))
	if bytes < parallelCopyBytes || workers < 2 {
		return fn(0, n)
	}
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		lo, hi := w*n/workers, (w+1)*n/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = fn(lo, hi)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// allocOut sizes one output buffer per column for n items, reusing dst's.
func allocOut(dst [][]byte, plans []colPlan, n int) [][]byte {
	if len(dst) != len(plans) {
		dst = make([][]byte, len(plans))
	}
	for i, p := range plans {
		need := n * p.itemBytes()
		if cap(dst[i]) < need {
			dst[i] = make([]byte, need)
		}
		dst[i] = dst[i][:need]
	}
	return dst
}

// Collect reads the given rows of the shard (local indices, as in Item.Index) into
// one contiguous buffer per column, in the order of indices: for column i, item k
// is bytes [k*n, (k+1)*n) of the i-th buffer, n being the window's length in frames
// (the column's length for the zero Window) times the column's frame size. Large
// batches are copied by several goroutines. A row must hold a table item, or
// belong to an unreleased Batch that deleted it.
//
// Errors: ErrClosed; an unknown column; a bad window; an index that holds no item;
// the context's error.
func (st *ShardTable) Collect(ctx context.Context, indices []int, columns []string, w Window) ([][]byte, error) {
	return st.CollectInto(ctx, nil, indices, columns, w)
}

// CollectInto is Collect reusing dst's buffers where they are large enough; it
// returns the buffers, resliced to their lengths.
func (st *ShardTable) CollectInto(ctx context.Context, dst [][]byte, indices []int, columns []string, w Window) ([][]byte, error) {
	plans, err := planColumns(st.shard, columns, w)
	if err != nil {
		return nil, err
	}
	dst = allocOut(dst, plans, len(indices))
	per := 0
	for _, p := range plans {
		per += p.itemBytes()
	}
	err = forEachParallel(len(indices), per*len(indices), func(lo, hi int) error {
		for k := lo; k < hi; k++ {
			if k&63 == 0 {
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("sample: table %q: collect: %w", st.t.name, err)
				}
			}
			if err := st.copyRow(indices[k], plans, dst, k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return dst, nil
}

// copyRow copies local row idx into item k of dst: a table item is pinned for the
// copy; a row held by a batch is already pinned.
func (st *ShardTable) copyRow(idx int, plans []colPlan, dst [][]byte, k int) error {
	if idx < 0 || idx >= st.shard.Capacity() {
		return fmt.Errorf("sample: table %q: collect: index %d out of range [0, %d)", st.t.name, idx, st.shard.Capacity())
	}
	if it, ok := st.t.itemAt(idx); ok {
		v, err := st.shard.Read(store.Ref{Index: idx, Seq: it.Seq})
		if err == nil {
			copyItem(plans, dst, k, v.Block)
			v.Done()
			return nil
		}
	}
	st.mu.Lock()
	v, ok := st.held[int32(idx)]
	closed := st.closed
	st.mu.Unlock()
	if closed {
		return st.t.errClosed("collect")
	}
	if !ok {
		return fmt.Errorf("sample: table %q: collect: index %d holds no item: %w", st.t.name, idx, ErrEvicted)
	}
	copyItem(plans, dst, k, v.Block)
	return nil
}
