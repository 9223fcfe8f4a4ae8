package sample

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gear-rl/gear/collective"
)

// globalRand is the random source every rank shares for one call.
func (d *DistTable) globalRand() *rand.Rand {
	return rand.New(rand.NewPCG(d.seed, d.calls*0x9e3779b97f4a7c15+1))
}

// localRand is this rank's random source for one call.
func (d *DistTable) localRand() *rand.Rand {
	return rand.New(rand.NewPCG(d.seed^(uint64(d.rank)+1)*0xbf58476d1ce4e5b9, d.calls*0x94d049bb133111eb+2))
}

// Sample is a collective call that returns the same batch of 1 to n items on
// every rank, selected from all shards with the local table's semantics (a
// flexible batch: it waits for the global rate limiter to allow one sample, then
// takes what it allows, up to n). Items' Index fields are global indices.
// max_times_sampled deletes an item on its shard; a store shard holds the rows of
// such items for collection until the Batch is released, on that rank.
//
// Errors: ErrClosed, on every rank, when a rank closed its table or called Close
// (which wakes a Sample waiting for the rate limiter on that rank); the context's
// error on a rank whose context ended before the batch, and on the others an
// error naming that rank; the communicator's errors.
func (d *DistTable) Sample(ctx context.Context, n int) (*Batch, error) {
	b := &Batch{}
	if err := d.SampleInto(ctx, b, n); err != nil {
		return nil, err
	}
	return b, nil
}

// SampleInto is Sample reusing b (released first).
func (d *DistTable) SampleInto(ctx context.Context, b *Batch, n int) error {
	defer d.t.m.EndSample(d.t.m.Begin(), n)
	// A bad argument travels with the sync, so that every rank fails alike.
	var argErr error
	var flags int64
	if n < 1 {
		argErr = fmt.Errorf("sample: distributed table %q: sample of %d items: want n >= 1", d.t.name, n)
		flags = flagBadArgument
	}
	b.Release()
	b.st = d.st
	d.opMu.Lock()
	defer d.opMu.Unlock()
	t := d.t
	t.mu.Lock()
	defer t.mu.Unlock()
	cctx, stop := graceful(ctx, d.grace)
	defer stop()
	var g *globalState
	allowed := 0
	for {
		var err error
		if g, err = d.syncLocked(ctx, cctx, flags); err != nil {
			return err
		}
		if err := d.flagError(ctx, g, "sample", argErr); err != nil {
			return err
		}
		if allowed = int(g.lim.MaxSamples(int64(n))); allowed > 0 {
			break
		}
		// Close wakes the wait; the next sync tells every rank.
		if ctx.Err() == nil && !d.isClosing() {
			t.blockedSmp++
			t.waitChangeLocked(ctx, d.every, d.closing)
			t.blockedSmp--
		}
	}
	d.calls++
	if cap(b.Items) < allowed {
		b.Items = make([]Sampled, allowed)
	}
	b.Items = b.Items[:allowed]
	var err error
	switch d.mode {
	case ModeSplit:
		err = d.splitDraw(cctx, g, b)
	case ModeCentralized:
		err = d.centralDraw(cctx, g, b)
	case ModeDecentralized:
		err = d.mergeDraw(cctx, g, b)
	}
	if err == nil {
		// Every rank knows what the batch did to the global counts, so every
		// rank gives the same shares of the room it freed, without another
		// exchange: an insert it admits proceeds at once.
		g.lim.Sample(int64(len(b.Items)))
		for _, s := range b.Items {
			if s.Deleted {
				g.lim.Delete(1)
				g.size--
				g.shards[s.Index/d.capacity].size--
			}
		}
		d.giveShares(g)
	}
	t.notify()
	return err
}

// onDeleted is the hook for items a collective sample deletes on this shard.
func (d *DistTable) onDeleted(b *Batch) func(Item) {
	if d.st == nil {
		return nil
	}
	return func(it Item) { d.st.holdAndRelease(b, it) }
}

// pickBytes is the encoded size of one sampled item.
const pickBytes = 64

func encodePick(b []byte, s *Sampled) {
	le.PutUint64(b[0:], uint64(s.Index))
	le.PutUint64(b[8:], s.Key)
	le.PutUint64(b[16:], math.Float64bits(s.Priority))
	le.PutUint64(b[24:], math.Float64bits(s.Probability))
	le.PutUint64(b[32:], uint64(s.TimesSampled))
	le.PutUint64(b[40:], uint64(s.Inserted))
	le.PutUint64(b[48:], s.Seq)
	var flags uint64
	if s.Deleted {
		flags = 1
	}
	le.PutUint64(b[56:], flags|uint64(s.TableSize)<<1)
}

func decodePick(b []byte, s *Sampled) {
	s.Index = int(le.Uint64(b[0:]))
	s.Key = le.Uint64(b[8:])
	s.Ref = s.Key
	s.Priority = math.Float64frombits(le.Uint64(b[16:]))
	s.Probability = math.Float64frombits(le.Uint64(b[24:]))
	s.TimesSampled = int64(le.Uint64(b[32:]))
	s.Inserted = int64(le.Uint64(b[40:]))
	s.Seq = le.Uint64(b[48:])
	f := le.Uint64(b[56:])
	s.Deleted = f&1 != 0
	s.TableSize = int(f >> 1)
}

// splitDraw: a multinomial over the shards' weights decides which shard draws each
// position; every shard draws its positions locally; an AllGather of the picks
// gives every rank the batch.
func (d *DistTable) splitDraw(ctx context.Context, g *globalState, b *Batch) error {
	t := d.t
	n := len(b.Items)
	weights := make([]float64, d.size)
	var total float64
	for r, s := range g.shards {
		if d.kind == KindUniform || g.weight <= 0 {
			weights[r] = float64(s.size)
		} else {
			weights[r] = s.weight
		}
		total += weights[r]
	}
	positions := assignShards(d.globalRand(), weights, n, d.posBuf[:0])
	d.posBuf = positions
	counts := make([]int, d.size)
	for _, s := range positions {
		counts[s]++
	}
	mine := counts[d.rank]
	most := 0
	for _, c := range counts {
		most = max(most, c)
	}
	if need := most * pickBytes * (1 + d.size); cap(d.drawBuf) < need {
		d.drawBuf = make([]byte, need)
	}
	send := d.drawBuf[:most*pickBytes]
	all := d.drawBuf[len(send) : len(send)*(1+d.size)]
	var drawErr error
	if mine > 0 {
		if cap(d.picks) < mine {
			d.picks = make([]Pick, mine)
		}
		picks := d.picks[:mine]
		if drawErr = t.drawLocked(ctx, d.localRand(), picks); drawErr != nil {
			// The others learn of it from the exchange: a first pick of index -1.
			le.PutUint64(send, ^uint64(0))
		} else {
			// The picks count once every rank's draw has succeeded (below), but
			// the batch shows them counted: a slot picked twice shows 1, then 2.
			scale := weights[d.rank] / total
			if len(d.seen) < len(t.items) {
				d.seen = make([]int64, len(t.items))
			}
			for i, p := range picks {
				it := t.items[p.Slot]
				d.seen[p.Slot]++
				it.TimesSampled += d.seen[p.Slot]
				s := Sampled{Item: it, Probability: p.Probability * scale, TableSize: int(g.size)}
				s.Index = d.rank*d.capacity + it.Index
				encodePick(send[i*pickBytes:], &s)
			}
			for _, p := range picks {
				d.seen[p.Slot] = 0
			}
		}
	}
	if err := collective.AllGather(ctx, d.comm, send, all); err != nil {
		return fmt.Errorf("sample: distributed table %q: split draw: %w", t.name, err)
	}
	for r, c := range counts {
		if c > 0 && le.Uint64(all[r*len(send):]) == ^uint64(0) {
			if r == d.rank {
				return fmt.Errorf("sample: distributed table %q: split draw: %w", t.name, drawErr)
			}
			return fmt.Errorf("sample: distributed table %q: split draw: rank %d's local draw failed", t.name, r)
		}
	}
	if mine > 0 {
		for _, p := range d.picks[:mine] {
			t.applyPickLocked(p.Slot, nil)
		}
	}
	next := make([]int, d.size)
	for i, s := range positions {
		decodePick(all[(int(s)*most+next[s])*pickBytes:], &b.Items[i])
		next[s]++
	}
	return nil
}

// itemBytes is the encoded size of one item sent to the root of a centralized
// selection.
const itemBytes = 48

// centralDraw: every shard sends its items to the root, which samples from all of
// them as one table would and broadcasts the batch; every shard then applies the
// picks of its own items.
func (d *DistTable) centralDraw(ctx context.Context, g *globalState, b *Batch) error {
	t := d.t
	cctx := ctx
	mineBytes := make([]byte, 0, int(g.shards[d.rank].size)*itemBytes)
	for slot, ok := range t.live {
		if ok {
			it := &t.items[slot]
			var e [itemBytes]byte
			le.PutUint64(e[0:], uint64(slot))
			le.PutUint64(e[8:], it.Key)
			le.PutUint64(e[16:], math.Float64bits(it.Priority))
			le.PutUint64(e[24:], uint64(it.TimesSampled))
			le.PutUint64(e[32:], uint64(it.Inserted))
			le.PutUint64(e[40:], it.Seq)
			mineBytes = append(mineBytes, e[:]...)
		}
	}
	n := len(b.Items)
	out := make([]byte, 8+n*pickBytes)
	if d.rank != d.root {
		if err := collective.Send(cctx, d.comm, mineBytes, d.root, tagCentral); err != nil {
			return fmt.Errorf("sample: distributed table %q: centralized draw: %w", t.name, err)
		}
	}
	var rootErr error
	if d.rank == d.root {
		var got int
		got, rootErr = d.rootDraw(cctx, g, mineBytes, b.Items)
		if rootErr != nil {
			le.PutUint64(out, ^uint64(0)) // tells the others
		} else {
			le.PutUint64(out, uint64(got))
			for i := range got {
				encodePick(out[8+i*pickBytes:], &b.Items[i])
			}
		}
	}
	if err := collective.Broadcast(cctx, d.comm, out, d.root); err != nil {
		return fmt.Errorf("sample: distributed table %q: centralized draw: %w", t.name, err)
	}
	if le.Uint64(out) == ^uint64(0) {
		if rootErr != nil {
			return rootErr
		}
		return fmt.Errorf("sample: distributed table %q: centralized draw: the draw at root %d failed", t.name, d.root)
	}
	got := int(le.Uint64(out))
	b.Items = b.Items[:got]
	hook := d.onDeleted(b)
	for i := range got {
		s := &b.Items[i]
		decodePick(out[8+i*pickBytes:], s)
		if s.Index/d.capacity == d.rank {
			t.applyPickLocked(s.Index%d.capacity, hook)
		}
	}
	return nil
}

// rootDraw receives every shard's items and samples from them with a table of
// the same configuration, whose slots are the global indices.
func (d *DistTable) rootDraw(ctx context.Context, g *globalState, mine []byte, dst []Sampled) (int, error) {
	t := d.t
	var sampler Selector = NewUniform()
	if d.kind == KindPrioritized {
		p, err := NewPrioritized(d.exponent)
		if err != nil {
			return 0, err
		}
		sampler = p
	}
	tmp, err := newTable(Config{Name: t.name, MaxSize: int(max(g.size, 1)), Sampler: sampler, Remover: NewFIFO(),
		MaxTimesSampled: d.maxTimes, RateLimit: d.rl, Source: rand.NewPCG(d.seed, d.calls*0x9e3779b97f4a7c15+1),
		Selection: t.selection})
	if err != nil {
		return 0, err
	}
	defer tmp.Close()
	tmp.rows = true
	slot := 0
	for r := range d.size {
		buf := mine
		if r != d.rank {
			buf = make([]byte, int(g.shards[r].size)*itemBytes)
			if err := collective.Recv(ctx, d.comm, buf, r, tagCentral); err != nil {
				return 0, fmt.Errorf("sample: distributed table %q: centralized draw: items of rank %d: %w", t.name, r, err)
			}
		}
		for o := 0; o+itemBytes <= len(buf); o += itemBytes {
			e := buf[o:]
			tmp.load(slot, Item{Index: r*d.capacity + int(le.Uint64(e[0:])), Key: le.Uint64(e[8:]),
				Priority: math.Float64frombits(le.Uint64(e[16:])), TimesSampled: int64(le.Uint64(e[24:])),
				Inserted: int64(le.Uint64(e[32:])), Seq: le.Uint64(e[40:])})
			slot++
		}
	}
	tmp.limiter = g.lim
	// The global limiter allowed len(dst) samples, so the temporary table takes
	// them without waiting; ctx is for a device selection's draws.
	if !tmp.limiter.CanSample(1) {
		return 0, fmt.Errorf("sample: distributed table %q: centralized draw at the root: internal error: the limiter refuses the batch it allowed", t.name)
	}
	got, err := tmp.sampleInto(ctx, dst, nil)
	if err != nil {
		return 0, fmt.Errorf("sample: distributed table %q: centralized draw at the root: %w", t.name, err)
	}
	for i := range got {
		dst[i].TableSize = int(g.size)
		dst[i].Ref = dst[i].Key
	}
	return got, nil
}
