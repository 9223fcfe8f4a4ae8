package sample

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/store"
)

// Same-host collection in place: a rank reads the rows it collects from a peer
// of its host straight from the peer's shard segment, attached by name, as
// GEAR's zero-copy collection does, instead of having the peer send them
// through the communicator. The owner still decides which rows it gives, and
// pins them, exactly as for the transport; it tells the reader each row's
// insertion sequence, the reader pins the rows under its own handle
// (store.Shard.ReadHeld, which also takes rows a batch holds after deleting
// them), says so, and the owner drops its pins. The reader copies under its own
// pins, which its handle's pin journal gives back if it dies.

// CollectStats counts the rows a rank collected, by the way they came.
type CollectStats struct {
	Local     uint64 // from this rank's own shard
	InPlace   uint64 // read in place from the shard of a peer on this host
	Transport uint64 // sent by their owner through the communicator
}

type collectCounters struct{ local, inPlace, transport atomic.Uint64 }

// CollectStats returns how many rows Collect has given this rank, by path,
// since the table was made (rows an owner could not give are not counted).
func (d *DistTable) CollectStats() CollectStats {
	return CollectStats{Local: d.counts.local.Load(), InPlace: d.counts.inPlace.Load(), Transport: d.counts.transport.Load()}
}

// SetCollectInPlace chooses whether this rank reads the rows of peers on its
// host in place (the default) or has them sent through the communicator, from
// the next Collect on. Ranks may choose differently: every Collect tells each
// owner how its rows are read. It does not affect CollectDevice.
func (d *DistTable) SetCollectInPlace(on bool) {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.inPlaceOff = !on
}

// peerShard is what a rank knows of another rank's shard for collection in
// place.
type peerShard struct {
	name  string       // segment name; "" when the rank is on another host
	owner int          // the segment's creator, as its owner read it from the header
	s     *store.Shard // attached; nil until tried, or when attaching failed
	tried bool
}

// peerRecord is the fixed-size record each rank gives about its shard: the
// name's length, the creator's pid, the name.
const peerRecord = 16 + 255

// learnPeers runs once, in the first Collect of every rank: the ranks share
// their shard segments' names, and each keeps those of the ranks on its host.
func (d *DistTable) learnPeers(ctx context.Context) error {
	if d.peers != nil || d.size == 1 {
		return nil
	}
	d.peers = make([]peerShard, d.size)
	mine := make([]byte, peerRecord)
	name := d.st.shard.Name()
	if info, err := store.Inspect(name); err == nil && len(name) <= 255 {
		binary.LittleEndian.PutUint16(mine, uint16(len(name)))
		binary.LittleEndian.PutUint64(mine[8:], uint64(info.OwnerPID))
		copy(mine[16:], name)
	}
	all := make([]byte, peerRecord*d.size)
	if err := collective.AllGather(ctx, d.comm, mine, all); err != nil {
		return fmt.Errorf("sample: distributed table %q: collect: %w", d.t.name, err)
	}
	var host []int
	for _, h := range d.comm.Hosts() {
		if slices.Contains(h, d.rank) {
			host = h
		}
	}
	for _, r := range host {
		rec := all[r*peerRecord : (r+1)*peerRecord]
		if r == d.rank {
			continue
		}
		n := int(binary.LittleEndian.Uint16(rec))
		d.peers[r] = peerShard{name: string(rec[16 : 16+n]), owner: int(binary.LittleEndian.Uint64(rec[8:]))}
	}
	return nil
}

// inPlace returns the attached shard of rank r when this rank reads r's rows
// in place, attaching it the first time; nil when r's rows come through the
// communicator: r is this rank or on another host, collection in place is
// off, or r's segment cannot be attached here or is not the one r has (another
// /dev/shm).
func (d *DistTable) inPlace(r int) *store.Shard {
	if d.inPlaceOff || d.peers == nil || r == d.rank || d.peers[r].name == "" {
		return nil
	}
	p := &d.peers[r]
	if p.tried {
		return p.s
	}
	p.tried = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := store.Attach(ctx, p.name, store.WithSpec(d.st.shard.Spec()))
	if err != nil {
		return nil
	}
	if info, err := store.Inspect(p.name); err != nil || info.OwnerPID != p.owner || p.owner == 0 {
		_ = s.Close()
		return nil
	}
	p.s = s
	return s
}

// closePeers closes the attached shards of the peers.
func (d *DistTable) closePeers() error {
	var first error
	for i := range d.peers {
		if s := d.peers[i].s; s != nil {
			if err := s.Close(); err != nil && first == nil {
				first = err
			}
			d.peers[i].s = nil
		}
	}
	return first
}

// inPlaceBit marks, in the count of rows a rank wants from an owner that
// agreeCollect shares, that the rank reads them in place.
const inPlaceBit = 1 << 62

// heldRow is a row of a peer, pinned by this rank, to be copied into item k.
type heldRow struct {
	k int
	v store.View
}

// copyHeld copies rows read in place into their items and unpins them.
func copyHeld(rows []heldRow, plans []colPlan, dst [][]byte, per int) {
	_ = forEachParallel(len(rows), per*len(rows), func(lo, hi int) error {
		for _, r := range rows[lo:hi] {
			copyItem(plans, dst, r.k, r.v.Block)
			r.v.Done()
		}
		return nil
	})
}
