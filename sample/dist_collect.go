package sample

import (
	"context"
	"fmt"
	"sync"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/store"
)

// pinRow pins local row idx for reading: a table item is pinned in the shard; a
// row held by a batch is pinned already. done unpins what pinRow pinned.
func (st *ShardTable) pinRow(idx int) (block func(col int) []byte, done func(), err error) {
	if idx < 0 || idx >= st.shard.Capacity() {
		return nil, nil, fmt.Errorf("sample: table %q: index %d out of range [0, %d)", st.t.name, idx, st.shard.Capacity())
	}
	if it, ok := st.t.itemAt(idx); ok {
		if v, err := st.shard.Read(store.Ref{Index: idx, Seq: it.Seq}); err == nil {
			return v.Block, v.Done, nil
		}
	}
	st.mu.Lock()
	v, ok := st.held[int32(idx)]
	st.mu.Unlock()
	if !ok {
		return nil, nil, fmt.Errorf("sample: table %q: index %d holds no item (deleted since it was sampled?)", st.t.name, idx)
	}
	return v.Block, func() {}, nil
}

// Collect is a collective call: every rank passes its own indices (global, as in
// a distributed Batch's items) and the same columns and window, and gets one
// contiguous buffer per column in the order of its indices, laid out as
// ShardTable.Collect lays them out. Local rows are copied straight from shared
// memory (by several goroutines for large batches); remote rows are sent by their
// owners, block by block from their shared memory, through the communicator, and
// received in place. A row must hold an item of its shard or belong to a batch
// not yet released on its owner; release batches after the Collect calls that
// read them.
//
// Errors, the same on every rank when they come from arguments: columns or windows
// that differ between ranks, an unknown column, a bad window, an index out of
// range; then per rank: an index whose owner has no item there; the
// communicator's errors.
func (d *DistTable) Collect(ctx context.Context, indices []int, columns []string, w Window) ([][]byte, error) {
	return d.CollectInto(ctx, nil, indices, columns, w)
}

// CollectInto is Collect reusing dst's buffers where they are large enough.
func (d *DistTable) CollectInto(ctx context.Context, dst [][]byte, indices []int, columns []string, w Window) ([][]byte, error) {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	name := d.t.name
	if d.st == nil {
		return nil, errNoShard
	}
	a := d.collectArgs(indices, columns, w)
	plans, byOwner := a.plans, a.byOwner
	per := 0
	for _, p := range plans {
		per += p.itemBytes()
	}
	// Local rows are copied while the ranks agree and exchange.
	var wg sync.WaitGroup
	var localErr error
	if a.err == nil {
		dst = allocOut(dst, plans, len(indices))
		if mine := byOwner[d.rank]; len(mine) > 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				localErr = forEachParallel(len(mine), per*len(mine), func(lo, hi int) error {
					for _, k := range mine[lo:hi] {
						if err := d.st.copyRow(indices[k]%d.capacity, plans, dst, k); err != nil {
							return err
						}
					}
					return nil
				})
			}()
		}
	}
	defer wg.Wait()
	wants, err := d.agreeCollect(cctx, a)
	if err != nil {
		return nil, err
	}

	var missing error
	xerr := d.exchange(cctx, func(peer int, first bool) error {
		ask := make([]int64, len(byOwner[peer]))
		for i, k := range byOwner[peer] {
			ask[i] = int64(indices[k] % d.capacity)
		}
		asked := make([]int64, wants(peer, d.rank))
		if first {
			if err := sendIf(cctx, d.comm, ask, peer, tagCollectRequest); err != nil {
				return err
			}
			if err := recvIf(cctx, d.comm, asked, peer, tagCollectRequest); err != nil {
				return err
			}
		} else {
			if err := recvIf(cctx, d.comm, asked, peer, tagCollectRequest); err != nil {
				return err
			}
			if err := sendIf(cctx, d.comm, ask, peer, tagCollectRequest); err != nil {
				return err
			}
		}
		err := d.swapRows(cctx, peer, asked, byOwner[peer], indices, plans, dst)
		if err != nil && missing == nil && !isCommErr(err) {
			missing = err
			return nil
		}
		return err
	})
	wg.Wait()
	switch {
	case xerr != nil:
		return nil, fmt.Errorf("sample: distributed table %q: collect: %w", name, xerr)
	case localErr != nil:
		return nil, localErr
	case missing != nil:
		return nil, missing
	}
	return dst, nil
}

// collectArgs is one rank's side of a collective collection: the column plans,
// the positions of the items each owner gives (in order), and the row every rank
// shares before the exchange: an error flag, a digest of the columns and window,
// and how many rows it wants from every rank. err is this rank's argument error;
// a caller may set it, for failures of its own, before agreeCollect.
type collectArgs struct {
	plans   []colPlan
	byOwner [][]int
	row     []int64
	err     error
}

func (d *DistTable) collectArgs(indices []int, columns []string, w Window) *collectArgs {
	a := &collectArgs{row: make([]int64, 2+d.size), byOwner: make([][]int, d.size)}
	a.plans, a.err = planColumns(d.st.shard, columns, w)
	a.row[1] = int64(hashSpec(fmt.Sprintf("%q %+v", columns, w)))
	for k, idx := range indices {
		if idx < 0 || idx >= d.size*d.capacity {
			if a.err == nil {
				a.err = fmt.Errorf("sample: distributed table %q: collect: index %d out of range [0, %d)", d.t.name, idx, d.size*d.capacity)
			}
			continue
		}
		a.row[2+idx/d.capacity]++
		a.byOwner[idx/d.capacity] = append(a.byOwner[idx/d.capacity], k)
	}
	return a
}

// agreeCollect shares every rank's collectArgs row, so that an argument error on
// any rank fails the call on every rank, and returns how many rows each rank wants
// from each owner.
func (d *DistTable) agreeCollect(ctx context.Context, a *collectArgs) (wants func(from, owner int) int, err error) {
	if a.err != nil {
		a.row[0] = 1
	}
	m, n := d.size, len(a.row)
	all := make([]int64, n*m)
	if err := collective.AllGather(ctx, d.comm, a.row, all); err != nil {
		return nil, fmt.Errorf("sample: distributed table %q: collect: %w", d.t.name, err)
	}
	for r := range m {
		v := all[r*n:]
		switch {
		case v[0] != 0 && a.err != nil:
			return nil, a.err
		case v[0] != 0:
			return nil, fmt.Errorf("sample: distributed table %q: collect: rank %d's arguments are bad", d.t.name, r)
		case v[1] != all[1]:
			return nil, fmt.Errorf("sample: distributed table %q: collect: rank %d asks for other columns or another window than rank 0", d.t.name, r)
		}
	}
	return func(from, owner int) int { return int(all[from*n+2+owner]) }, nil
}

// exchange runs fn once with every other rank, in rounds of disjoint pairs (the
// circle method), so that every pair's blocking sends and receives meet; in each
// pair the lower rank goes first.
func (d *DistTable) exchange(ctx context.Context, fn func(peer int, first bool) error) error {
	n := d.size
	if n%2 == 1 {
		n++ // a bye
	}
	for round := range n - 1 {
		var peer int
		switch {
		case d.rank == n-1:
			peer = round
		case d.rank == round:
			peer = n - 1
		default:
			peer = ((2*round-d.rank)%(n-1) + (n - 1)) % (n - 1)
		}
		if peer >= d.size || peer == d.rank {
			continue
		}
		if err := fn(peer, d.rank < peer); err != nil {
			return err
		}
	}
	return nil
}

// stageBelow is the row size under which remote rows travel packed, one message
// per column and peer, rather than one message per block: for small rows the cost
// of a message outweighs that of the extra copies (gearbench collect, two ranks
// on one host: packed 1.6 GB/s at 4 KiB and 3 GB/s at 8 KiB against 1.1 and 1.8
// block by block; block by block 6 GB/s at 16 KiB against 3.8 packed).
const stageBelow = 16 << 10

// stage returns a buffer of n bytes, reusing *keep: a fresh buffer of
// megabytes costs page faults on every call. Buffers up to maxKeptStage are
// kept for the next call.
func stage(keep *[]byte, n int) []byte {
	if cap(*keep) >= n {
		return (*keep)[:n]
	}
	b := make([]byte, n)
	if n <= maxKeptStage {
		*keep = b
	}
	return b
}

// maxKeptStage bounds the staging buffers a distributed table keeps between
// Collect calls.
const maxKeptStage = 16 << 20

func staged(plans []colPlan) bool {
	n := 0
	for _, p := range plans {
		n += p.avail * p.frameBytes
	}
	return n < stageBelow
}

// missingRow marks, in a status message, a row its owner could not read.
type missingRow struct{ err error }

func (e missingRow) Error() string { return e.err.Error() }

func isCommErr(err error) bool {
	_, ok := err.(missingRow)
	return !ok
}

func sendIf(ctx context.Context, c *collective.Comm, buf []int64, peer, tag int) error {
	if len(buf) == 0 {
		return nil
	}
	return collective.Send(ctx, c, buf, peer, tag)
}

func recvIf(ctx context.Context, c *collective.Comm, buf []int64, peer, tag int) error {
	if len(buf) == 0 {
		return nil
	}
	return collective.Recv(ctx, c, buf, peer, tag)
}

// swapRows sends peer the rows it asked for (asked: local indices) and takes
// the rows this rank asked peer for into their places in dst, both at once
// (collective.SendRecv): first a status byte per row, then the window of every
// column of every readable row, straight from the pinned blocks into dst.
func (d *DistTable) swapRows(ctx context.Context, peer int, asked []int64, positions []int, indices []int, plans []colPlan, dst [][]byte) error {
	if len(asked) == 0 && len(positions) == 0 {
		return nil
	}
	status := make([]byte, len(asked))
	blocks := make([]func(int) []byte, len(asked))
	dones := make([]func(), 0, len(asked))
	defer func() {
		for _, done := range dones {
			done()
		}
	}()
	for i, r := range asked {
		block, done, err := d.st.pinRow(int(r))
		if err != nil {
			continue
		}
		status[i], blocks[i] = 1, block
		dones = append(dones, done)
	}
	got := make([]byte, len(positions))
	if err := collective.SendRecv(ctx, d.comm, nonEmpty(status), nonEmpty(got), peer, tagCollectStatus); err != nil {
		return err
	}
	var send, recv [][]byte
	packed := make([][]byte, len(plans)) // staged: column c's rows from peer, packed
	staging := staged(plans)
	if staging {
		// Small rows: one message per column, the rows packed in order.
		ok, okIn := len(dones), 0
		for _, st := range got {
			okIn += int(st)
		}
		out := stage(&d.stageOut, ok*packedRow(plans))[:0]
		in := stage(&d.stageIn, okIn*packedRow(plans))
		for c, p := range plans {
			n := p.avail * p.frameBytes
			if n == 0 {
				continue
			}
			if ok > 0 {
				lo := len(out)
				for i := range asked {
					if status[i] != 0 {
						out = append(out, blocks[i](p.col)[p.first*p.frameBytes:p.first*p.frameBytes+n]...)
					}
				}
				send = append(send, out[lo:])
			}
			if okIn > 0 {
				packed[c] = in[:okIn*n]
				recv = append(recv, packed[c])
				in = in[okIn*n:]
			}
		}
	} else {
		for i := range asked {
			if status[i] == 0 {
				continue
			}
			for _, p := range plans {
				if p.avail > 0 {
					send = append(send, blocks[i](p.col)[p.first*p.frameBytes:(p.first+p.avail)*p.frameBytes])
				}
			}
		}
		for i, k := range positions {
			if got[i] == 0 {
				continue
			}
			for c, p := range plans {
				if n := p.avail * p.frameBytes; n > 0 {
					ib := p.itemBytes()
					recv = append(recv, dst[c][k*ib+p.readAt:k*ib+p.readAt+n])
				}
			}
		}
	}
	if err := collective.SendRecv(ctx, d.comm, send, recv, peer, tagCollectData); err != nil {
		return err
	}
	// Unpack (staged), pad, and clear the rows the owner could not read.
	var missing error
	j := 0
	for i, k := range positions {
		for c, p := range plans {
			ib := p.itemBytes()
			out := dst[c][k*ib : (k+1)*ib]
			if got[i] == 0 {
				clear(out)
				continue
			}
			n := p.avail * p.frameBytes
			if staging && n > 0 {
				copy(out[p.readAt:p.readAt+n], packed[c][j*n:(j+1)*n])
			}
			clear(out[p.zeroAt : p.zeroAt+ib-n])
		}
		if got[i] == 0 {
			if missing == nil {
				missing = missingRow{fmt.Errorf("sample: distributed table %q: collect: index %d: rank %d holds no item there (deleted since it was sampled?)", d.t.name, indices[k], peer)}
			}
			continue
		}
		j++
	}
	return missing
}

// nonEmpty is b as a list of one buffer, or no buffers when b is empty.
func nonEmpty(b []byte) [][]byte {
	if len(b) == 0 {
		return nil
	}
	return [][]byte{b}
}

// packedRow is how many bytes one row takes in the staged messages.
func packedRow(plans []colPlan) int {
	n := 0
	for _, p := range plans {
		n += p.avail * p.frameBytes
	}
	return n
}
