package collective

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
)

// Split divides the communicator: the ranks that pass the same color form a new
// communicator, ranked by key (ties by rank in this one). A rank passing Undefined
// (or any negative color) gets nil. Every rank must call Split; the new
// communicators have transports of their own, so they may be used concurrently
// with this one and with each other. Close each one when done.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	x, err := c.begin(ctx, header{kind: kindSplit, dtype: Bytes})
	if err != nil {
		return nil, err
	}
	x.h.algo = algoRing
	sub, err := c.split(x, color, key)
	return sub, c.end(x, err)
}

func (c *Comm) split(x *call, color, key int) (*Comm, error) {
	c.splits++
	var mine [16]byte
	binary.LittleEndian.PutUint64(mine[:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(mine[8:], uint64(int64(key)))
	all := make([]byte, 16*c.size)
	copy(all[16*c.rank:], mine[:])
	x.base = 0
	if err := ringAllGather(x, c.all(), all, 16); err != nil {
		return nil, err
	}
	colorOf := func(r int) int { return int(int64(binary.LittleEndian.Uint64(all[16*r:]))) }
	keyOf := func(r int) int { return int(int64(binary.LittleEndian.Uint64(all[16*r+8:]))) }
	var members []int
	if color >= 0 {
		for r := range c.size {
			if colorOf(r) == color {
				members = append(members, r)
			}
		}
		slices.SortStableFunc(members, func(a, b int) int { return cmp.Compare(keyOf(a), keyOf(b)) })
	}
	ex := &commExchange{x: x, c: c, base: 1 << 20}
	var sub *Comm
	var tt *tcpTransport
	info := peerInfo{}
	if color >= 0 {
		world := make([]int, len(members))
		for i, m := range members {
			world[i] = c.world[m]
		}
		id := fmt.Sprintf("%s.%dc%d", c.id, c.splits, color)
		sub = newComm(id, slices.Index(members, c.rank), len(members), world, c.boot, c.cfg)
		sub.local, sub.cpuRanks = c.local, c.cpuRanks
		var err error
		info, tt, err = sub.prepare()
		if err != nil {
			return nil, err
		}
	}
	blob, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("collective: encode details: %w", err)
	}
	blobs, err := ex.allGather(x.ctx, blob)
	if err != nil {
		if tt != nil {
			tt.close(nil)
		}
		return nil, err
	}
	var infos []peerInfo
	for _, m := range members {
		var in peerInfo
		if err := json.Unmarshal(blobs[m], &in); err != nil {
			return nil, fmt.Errorf("collective: details of rank %d: %w", m, err)
		}
		infos = append(infos, in)
	}
	if sub == nil {
		// Not a member: take part in the barriers of the others' set up.
		if err := ex.barrier(x.ctx); err != nil {
			return nil, err
		}
		return nil, ex.barrier(x.ctx)
	}
	if err := sub.connect(x.ctx, ex, infos, tt); err != nil {
		for _, t := range sub.trans {
			t.close(nil)
		}
		if tt != nil {
			tt.close(nil)
		}
		return nil, err
	}
	sub.start()
	return sub, nil
}

// commExchange runs the exchanges of a Split on the parent communicator, as part
// of the parent's Split call.
type commExchange struct {
	x    *call
	c    *Comm
	base uint32
}

// allGather gathers blobs of any length: their lengths first, then the blobs
// padded to the longest.
func (e *commExchange) allGather(ctx context.Context, blob []byte) ([][]byte, error) {
	n := e.c.size
	lens := make([]byte, 8*n)
	binary.LittleEndian.PutUint64(lens[8*e.c.rank:], uint64(len(blob)))
	e.x.base = e.base
	e.base += 1 << 16
	if err := ringAllGather(e.x, e.c.all(), lens, 8); err != nil {
		return nil, err
	}
	longest := 0
	for r := range n {
		longest = max(longest, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	all := make([]byte, longest*n)
	copy(all[longest*e.c.rank:], blob)
	e.x.base = e.base
	e.base += 1 << 16
	if err := ringAllGather(e.x, e.c.all(), all, longest); err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for r := range n {
		l := int(binary.LittleEndian.Uint64(lens[8*r:]))
		out[r] = all[longest*r : longest*r+l]
	}
	return out, nil
}

func (e *commExchange) barrier(ctx context.Context) error {
	e.x.base = e.base
	e.base += 1 << 16
	return dissemination(e.x, e.c.all())
}
