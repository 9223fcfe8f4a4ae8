package sample

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/store"
)

// pinRow pins local row idx for reading: a table item is pinned in the shard
// (own: the caller calls v.Done); a row held by a batch is pinned already (the
// batch's View, not the caller's to end). v is the pinned row, for its blocks
// and its reference.
func (st *ShardTable) pinRow(idx int) (v store.View, own bool, err error) {
	if idx < 0 || idx >= st.shard.Capacity() {
		return store.View{}, false, fmt.Errorf("sample: table %q: index %d out of range [0, %d)", st.t.name, idx, st.shard.Capacity())
	}
	if it, ok := st.t.itemAt(idx); ok {
		if v, err := st.shard.Read(store.Ref{Index: idx, Seq: it.Seq}); err == nil {
			return v, true, nil
		}
	}
	st.mu.Lock()
	v, ok := st.held[int32(idx)]
	st.mu.Unlock()
	if !ok {
		return store.View{}, false, fmt.Errorf("sample: table %q: index %d holds no item: %w", st.t.name, idx, ErrEvicted)
	}
	return v, false, nil
}

// Collect is a collective call: every rank passes its own indices (global, as in
// a distributed Batch's items) and the same columns and window, and gets one
// contiguous buffer per column in the order of its indices, laid out as
// ShardTable.Collect lays them out. Local rows are copied straight from shared
// memory (by several goroutines for large batches); the rows of peers on this
// host are copied straight from the peers' shard segments, which the first
// Collect attaches (see SetCollectInPlace), under pins of this rank's own;
// the rows of peers on other hosts are sent by their owners, block by block
// from their shared memory, through the communicator, and received in place.
// A row must hold an item of its shard or belong to a batch
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
	if err := d.learnPeers(cctx); err != nil {
		return nil, err
	}
	if a.err == nil {
		for owner, ks := range byOwner {
			if len(ks) > 0 && d.inPlace(owner) != nil {
				a.row[2+owner] |= inPlaceBit
			}
		}
	}
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
		var from *store.Shard
		if a.row[2+peer]&inPlaceBit != 0 {
			from = d.peers[peer].s
		}
		// Rows read in place are copied while the exchange goes on.
		copyRows := func(held []heldRow) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				copyHeld(held, plans, dst, per)
			}()
		}
		err := d.swapRows(cctx, peer, asked, byOwner[peer], indices, plans, dst, from, a.readsInPlace(peer, d.rank), copyRows)
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
	d.counts.local.Add(uint64(len(byOwner[d.rank])))
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
	all     []int64 // every rank's row, after agreeCollect
}

// readsInPlace reports whether rank from reads owner's rows in place in this
// call (after agreeCollect).
func (a *collectArgs) readsInPlace(from, owner int) bool {
	n := len(a.row)
	return a.all[from*n+2+owner]&inPlaceBit != 0
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
	a.all = all
	return func(from, owner int) int { return int(all[from*n+2+owner] &^ inPlaceBit) }, nil
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

func (e missingRow) Unwrap() error { return e.err }

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
// the rows this rank asked peer for (positions) into their places in dst, both
// at once (collective.SendRecv): first a status byte per row, then the window
// of every column of every readable row, straight from the pinned blocks into
// dst.
//
// In place: when this rank reads peer's rows in place (from: peer's shard,
// attached here), the status of a row is its insertion sequence, this rank pins
// the readable rows through from and passes them to copyRows (which copies
// and unpins them), and it sends a byte saying so instead of receiving their
// data; when peer reads
// this rank's rows in place (theyRead), this rank sends their sequences instead
// of their data and keeps its own pins until that byte arrives. A row the owner
// cannot give is the same error either way.
func (d *DistTable) swapRows(ctx context.Context, peer int, asked []int64, positions []int, indices []int, plans []colPlan, dst [][]byte,
	from *store.Shard, theyRead bool, copyRows func([]heldRow)) error {
	if len(asked) == 0 && len(positions) == 0 {
		return nil
	}
	width := func(inPlace bool) int {
		if inPlace {
			return 8 // insertion sequence + 1; 0: not readable
		}
		return 1 // 1: readable
	}
	status := make([]byte, len(asked)*width(theyRead))
	blocks := make([]func(int) []byte, len(asked))
	views := make([]store.View, 0, len(asked)) // the rows pinned here, to unpin
	nRead := 0
	defer func() {
		for _, v := range views {
			v.Done()
		}
	}()
	for i, r := range asked {
		v, own, err := d.st.pinRow(int(r))
		if err != nil {
			continue
		}
		blocks[i] = v.Block
		nRead++
		if own {
			views = append(views, v)
		}
		if theyRead {
			binary.LittleEndian.PutUint64(status[8*i:], v.Ref().Seq+1)
		} else {
			status[i] = 1
		}
	}
	got := make([]byte, len(positions)*width(from != nil))
	if err := collective.SendRecv(ctx, d.comm, nonEmpty(status), nonEmpty(got), peer, tagCollectStatus); err != nil {
		return err
	}
	readable := func(i int) bool {
		if from != nil {
			return binary.LittleEndian.Uint64(got[8*i:]) != 0
		}
		return got[i] != 0
	}
	var missing error
	var held []heldRow
	if from != nil {
		// Pin the rows under this rank's handle while their owner holds them.
		for i, k := range positions {
			seq := binary.LittleEndian.Uint64(got[8*i:])
			if seq == 0 {
				continue
			}
			v, err := from.ReadHeld(store.Ref{Index: indices[k] % d.capacity, Seq: seq - 1})
			if err != nil {
				binary.LittleEndian.PutUint64(got[8*i:], 0)
				if missing == nil {
					missing = missingRow{fmt.Errorf("sample: distributed table %q: collect: index %d: reading rank %d's row in place: %w", d.t.name, indices[k], peer, err)}
				}
				continue
			}
			held = append(held, heldRow{k: k, v: v})
		}
		if len(held) > 0 {
			copyRows(held) // under this rank's pins, while the exchange goes on
		}
	}
	sendData, recvData := !theyRead, from == nil
	var send, recv [][]byte
	packed := make([][]byte, len(plans)) // staged: column c's rows from peer, packed
	staging := staged(plans)
	switch {
	case staging:
		// Small rows: one message per column, the rows packed in order.
		ok, okIn := 0, 0
		if sendData {
			ok = nRead
		}
		if recvData {
			for _, st := range got {
				okIn += int(st)
			}
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
	default:
		for i := range asked {
			if !sendData || status[i] == 0 {
				continue
			}
			for _, p := range plans {
				if p.avail > 0 {
					send = append(send, blocks[i](p.col)[p.first*p.frameBytes:(p.first+p.avail)*p.frameBytes])
				}
			}
		}
		for i, k := range positions {
			if !recvData || got[i] == 0 {
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
	if from != nil && len(positions) > 0 {
		send = append(send, []byte{1}) // the rows are pinned here
	}
	var pinned [1]byte
	if theyRead && len(asked) > 0 {
		recv = append(recv, pinned[:])
	}
	if err := collective.SendRecv(ctx, d.comm, send, recv, peer, tagCollectData); err != nil {
		return err
	}
	// Unpack (staged), pad, and clear the rows the owner could not give; rows
	// read in place are copied and padded by the caller.
	j := 0
	for i, k := range positions {
		ok := readable(i)
		if from != nil && ok {
			continue
		}
		for c, p := range plans {
			ib := p.itemBytes()
			out := dst[c][k*ib : (k+1)*ib]
			if !ok {
				clear(out)
				continue
			}
			n := p.avail * p.frameBytes
			if staging && n > 0 {
				copy(out[p.readAt:p.readAt+n], packed[c][j*n:(j+1)*n])
			}
			clear(out[p.zeroAt : p.zeroAt+ib-n])
		}
		if !ok {
			if missing == nil {
				missing = missingRow{fmt.Errorf("sample: distributed table %q: collect: index %d: rank %d holds no item there: %w", d.t.name, indices[k], peer, ErrEvicted)}
			}
			continue
		}
		j++
	}
	d.counts.transport.Add(uint64(j))
	d.counts.inPlace.Add(uint64(len(held)))
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
