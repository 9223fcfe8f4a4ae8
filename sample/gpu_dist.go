package sample

import (
	"context"
	"fmt"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/cuda"
)

// Tags of the host messages of CollectDevice (row lists and row status; the rows
// themselves travel over NCCL).
const (
	tagDeviceRequest = 0x5a100 + iota
	tagDeviceStatus
)

// stageAlign aligns the staging areas of a distributed device collection, so
// that the gather kernel moves 16 bytes per load wherever the rows allow it.
const stageAlign = 256

// ItemBytes is ShardTable.ItemBytes of the local shard: buffer i of a collection
// of n items holds n*ItemBytes[i] bytes.
func (d *DistTable) ItemBytes(columns []string, w Window) ([]int, error) {
	if d.st == nil {
		return nil, errNoShard
	}
	return d.st.ItemBytes(columns, w)
}

// CollectDevice is Collect into device memory, a collective call: every rank
// passes its own global indices, the same columns and window, and device buffers
// (dst[i] of at least len(indices)*ItemBytes(columns, w)[i] bytes), and gets its
// items in the order of its indices, laid out as Collect lays them out. Local
// rows are read by the zero-copy gather kernel straight from the shard's shared
// memory (registered by ShardTable.RegisterDevice on every rank). Remote rows
// come from their owners over the NCCL communicator of WithNCCL, in the pairwise
// rounds of Collect: the requester sends its row list and the owner a status
// byte per row over the table's communicator; the owner gathers the rows' windows
// into a device staging buffer with the same kernel and sends them with
// ncclSend; the requester receives them with ncclRecv into staging. When any row
// is remote, a last gather of device memory puts every row, padded, into its
// place in dst. All the device work runs on stream s, which must belong to the
// registered device (so must the NCCL communicator); CollectDevice returns once
// dst holds the items.
//
// Ownership: dst is the caller's, written only from s and not after
// CollectDevice returns. If ctx ends during device work, the call returns an
// error, the communicator may be aborted (see cuda.NCCLComm), the work goes on
// writing dst until s passes it, and the rows read stay pinned until the next
// device collection or UnregisterDevice. On an error dst's contents are
// unspecified.
//
// Errors, the same on every rank when they come from arguments: columns or
// windows that differ between ranks, an unknown column, a bad window, a wrong
// number of buffers, an index out of range, a rank without a registered device
// or (with more than one rank) without an NCCL communicator; then per rank: an
// index whose owner has no item there; the communicators' and the driver's
// errors. A device or NCCL failure on one rank during the exchange leaves the
// others waiting until their contexts end and the cancel grace (WithCancelGrace)
// passes.
func (d *DistTable) CollectDevice(ctx context.Context, s cuda.Stream, dst []cuda.DevicePtr, indices []int, columns []string, w Window) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	name := d.t.name
	if d.st == nil {
		return errNoShard
	}
	const op = "collect on device"
	a := d.collectArgs(indices, columns, w)
	var g *deviceTables
	if a.err == nil && len(dst) != len(a.plans) {
		a.err = fmt.Errorf("sample: distributed table %q: %s: %d buffers for %d columns", name, op, len(dst), len(a.plans))
	}
	if a.err == nil {
		g, a.err = d.st.device(op)
	}
	if a.err == nil && d.nccl == nil && d.size > 1 {
		a.err = fmt.Errorf("sample: distributed table %q: %s: no NCCL communicator for the remote rows (WithNCCL)", name, op)
	}
	if a.err == nil {
		g.mu.Lock()
		defer g.mu.Unlock()
		if err := g.wait(ctx); err != nil {
			a.err = fmt.Errorf("sample: distributed table %q: %s: %w", name, op, err)
		}
	}
	wants, err := d.agreeCollect(cctx, a)
	if err != nil {
		return err
	}
	x := &deviceExchange{d: d, g: g, s: s, plans: a.plans, byOwner: a.byOwner, indices: indices, wants: wants}
	if err := x.run(cctx, dst); err != nil {
		return g.abandon(ctx, s, fmt.Errorf("sample: distributed table %q: %s: %w", name, op, err))
	}
	if err := g.finish(ctx, s); err != nil {
		return fmt.Errorf("sample: distributed table %q: %s: %w", name, op, err)
	}
	switch {
	case x.localErr != nil:
		return x.localErr
	case x.missing != nil:
		return x.missing
	}
	return nil
}

// deviceExchange is one rank's part of a distributed device collection, once the
// ranks have agreed on it.
//
// The staging rows live in g.rows, by column: column c's area holds, packed
// (readBytes per row, no padding), first this rank's own rows in the order of
// their positions, then the rows received from each peer in peer order, each
// peer's run starting at the row its first asked-for position would take; then
// the send area, by column, holds the rows served to the current peer. The index
// stage holds the local rows, the final permutation, then every peer's served
// rows.
type deviceExchange struct {
	d       *DistTable
	g       *deviceTables
	s       cuda.Stream
	plans   []colPlan
	byOwner [][]int
	indices []int
	wants   func(from, owner int) int

	recvOff, sendOff []int   // byte offsets, in g.rows, of every column's areas
	perm             []int64 // position -> staged row
	peerBase         []int   // peer -> first staged row of its run
	localErr         error
	missing          error
}

func (x *deviceExchange) run(ctx context.Context, dst []cuda.DevicePtr) error {
	d, g := x.d, x.g
	n := len(x.indices)
	mine := x.byOwner[d.rank]
	direct := len(mine) == n // no remote rows: gather straight into dst
	mostAsked := 0
	x.peerBase = make([]int, d.size)
	next := len(mine)
	for p := range d.size {
		if p == d.rank {
			continue
		}
		a := x.wants(p, d.rank)
		mostAsked = max(mostAsked, a)
		x.peerBase[p] = next
		next += len(x.byOwner[p])
	}
	bytes := 0
	x.recvOff, x.sendOff = make([]int, len(x.plans)), make([]int, len(x.plans))
	if !direct {
		for c, p := range x.plans {
			x.recvOff[c] = bytes
			bytes += roundUp(n*p.readBytes(), stageAlign)
		}
	}
	for c, p := range x.plans {
		x.sendOff[c] = bytes
		bytes += roundUp(mostAsked*p.readBytes(), stageAlign)
	}
	if err := g.reserve(bytes); err != nil {
		return err
	}

	// This rank's rows: pinned, then gathered while the ranks exchange.
	x.perm = make([]int64, n)
	local := make([]int64, len(mine))
	for i, k := range mine {
		row := x.indices[k] % d.capacity
		v, own, err := d.st.pinRow(row)
		if err != nil {
			if x.localErr == nil {
				x.localErr = fmt.Errorf("%w (collect on device)", err)
			}
			continue
		}
		g.pin(v, own)
		local[i] = int64(row)
		x.perm[k] = int64(i)
	}
	if x.localErr == nil && len(mine) > 0 {
		for c, p := range x.plans {
			out, padded := dst[c], true
			if !direct {
				out, padded = g.rows.Add(x.recvOff[c]), false
			}
			if err := d.st.gatherFromShard(g, x.s, out, p, local, padded); err != nil {
				return err
			}
		}
	}

	if err := d.exchange(ctx, func(peer int, first bool) error { return x.pair(ctx, peer, first) }); err != nil {
		return err
	}
	if direct || x.localErr != nil || x.missing != nil {
		return nil
	}
	// Every row is staged: one gather of device memory pads each into place.
	for c, p := range x.plans {
		nb, ib := p.readBytes(), p.itemBytes()
		if nb == 0 {
			if err := g.dev.MemsetAsync(dst[c], 0, n*ib, x.s); err != nil {
				return err
			}
			continue
		}
		spec := cuda.GatherSpec{BlockBytes: nb, Capacity: n, FrameBytes: 1, Length: nb, HeadPad: p.readAt, TailPad: ib - nb - p.readAt}
		if err := g.dev.LaunchGatherHost(x.s, dst[c], g.rows.Add(x.recvOff[c]), x.perm, spec); err != nil {
			return err
		}
	}
	return nil
}

// pair is one round with peer: row lists and status over the table's
// communicator, in the order Collect uses (the lower rank sends first), then the
// rows both ways in one NCCL group.
func (x *deviceExchange) pair(ctx context.Context, peer int, first bool) error {
	d, g := x.d, x.g
	positions := x.byOwner[peer]
	ask := make([]int64, len(positions))
	for i, k := range positions {
		ask[i] = int64(x.indices[k] % d.capacity)
	}
	asked := make([]int64, x.wants(peer, d.rank))
	status := make([]byte, len(asked))     // of the rows this rank serves
	theirs := make([]byte, len(positions)) // of the rows it asked for
	served := 0
	steps := []func() error{
		func() error { return sendIf(ctx, d.comm, ask, peer, tagDeviceRequest) },
		func() error { return recvIf(ctx, d.comm, asked, peer, tagDeviceRequest) },
		func() error {
			var err error
			if served, err = x.serve(asked, status); err != nil {
				return err
			}
			return sendBytesIf(ctx, d.comm, status, peer, tagDeviceStatus)
		},
		func() error { return recvBytesIf(ctx, d.comm, theirs, peer, tagDeviceStatus) },
	}
	order := []int{0, 1, 2, 3}
	if !first {
		order = []int{1, 0, 3, 2}
	}
	for _, i := range order {
		if err := steps[i](); err != nil {
			return err
		}
	}
	received := 0
	for i, k := range positions {
		if theirs[i] == 0 {
			if x.missing == nil {
				x.missing = fmt.Errorf("sample: distributed table %q: collect on device: index %d: rank %d holds no item there: %w",
					d.t.name, x.indices[k], peer, ErrEvicted)
			}
			continue
		}
		x.perm[k] = int64(x.peerBase[peer] + received)
		received++
	}
	var ops []cuda.P2P
	for c, p := range x.plans {
		nb := p.readBytes()
		if nb > 0 && served > 0 {
			ops = append(ops, cuda.P2P{Send: true, Peer: peer, Buf: g.rows.Add(x.sendOff[c]), Count: served * nb, DType: cuda.Uint8})
		}
		if nb > 0 && received > 0 {
			at := g.rows.Add(x.recvOff[c] + x.peerBase[peer]*nb)
			ops = append(ops, cuda.P2P{Peer: peer, Buf: at, Count: received * nb, DType: cuda.Uint8})
		}
	}
	if len(ops) == 0 {
		return nil
	}
	return d.nccl.SendRecv(ctx, x.s, ops...)
}

// serve pins the rows peer asked for, marks in status those it can read, and
// enqueues the gather of their windows into the send area. It returns how many
// rows it will send.
func (x *deviceExchange) serve(asked []int64, status []byte) (int, error) {
	d, g := x.d, x.g
	rows := make([]int64, 0, len(asked))
	for i, r := range asked {
		v, own, err := d.st.pinRow(int(r))
		if err != nil {
			continue
		}
		g.pin(v, own)
		status[i] = 1
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	for c, p := range x.plans {
		if err := d.st.gatherFromShard(g, x.s, g.rows.Add(x.sendOff[c]), p, rows, false); err != nil {
			return 0, err
		}
	}
	return len(rows), nil
}

func sendBytesIf(ctx context.Context, c *collective.Comm, buf []byte, peer, tag int) error {
	if len(buf) == 0 {
		return nil
	}
	return collective.Send(ctx, c, buf, peer, tag)
}

func recvBytesIf(ctx context.Context, c *collective.Comm, buf []byte, peer, tag int) error {
	if len(buf) == 0 {
		return nil
	}
	return collective.Recv(ctx, c, buf, peer, tag)
}
