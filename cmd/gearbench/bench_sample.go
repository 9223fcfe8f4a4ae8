package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

// The sampling and collection benchmarks run in one process or in every rank of a
// job started by gearrun; rank 0 prints.
//
//	gearbench sample [--n 1000000] [--batch 1024] [--iters 50] [--json]
//	gearrun -np 4 gearbench sample --json
//	gearbench collect [--sizes 4K,64K,1M] [--items 256] [--iters 20] [--bind none|core|auto] [--json]
//
// sample: N items (split evenly over the ranks) with random priorities; per mode,
// the median time of a batch of B over --iters batches, as items/s (a batch is the
// same on every rank, so this is also the rate per rank): uniform and prioritized
// (exponent 0.6) sample through the table (one process) or the distributed table
// (split draw), topk lists the B highest priorities (Table.Top, DistTable.Top).
// Then priority updates/s: batches of B MutatePriorities on each rank's shard.
//
// collect: every rank fills a store shard with --items trajectories of each size;
// local collects all of them from the rank's own shard, remote (with two ranks or
// more) all of the next rank's; copy is a plain loop of copy() over the same
// blocks into the same buffer, the bound for local collection. With two ranks or
// more, allreduce runs --items AllReduce calls of one trajectory's size on the
// same communicator, in turn with the others, and its line gives their bus
// bandwidth (nccl-tests' algbw x 2(n-1)/n): the transport's own bandwidth at
// that size, which the remote lines' busbw_share compares with (on one host
// the remote line reads the peer's shard in place whatever the transport;
// remote_transport is the path through the communicator, as across hosts).

type worldHandle struct {
	w    *rank.World
	comm *collective.Comm
}

func (h worldHandle) rank() int { return h.comm.Rank() }
func (h worldHandle) size() int { return h.comm.Size() }

func (h worldHandle) close() {
	h.comm.Close()
	h.w.Close()
}

func openSampleWorld(ctx context.Context) (worldHandle, error) {
	w, err := rank.Init(ctx)
	if err != nil {
		return worldHandle{}, err
	}
	c, err := collective.New(ctx, w, collective.WithTransport(os.Getenv(rank.EnvTransport)))
	if err != nil {
		w.Close()
		return worldHandle{}, err
	}
	return worldHandle{w: w, comm: c}, nil
}

// agree turns each rank's error into one outcome on every rank.
func agree(ctx context.Context, c *collective.Comm, err error) error {
	flag := []int32{0}
	if err != nil {
		flag[0] = 1
	}
	if cerr := collective.AllReduce(ctx, c, flag, collective.Max); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	if flag[0] != 0 {
		return errors.New("another rank failed")
	}
	return nil
}

func benchSample(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("sample", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := fs.Int("n", 1_000_000, "items over all ranks")
	batch := fs.Int("batch", 1024, "items per batch")
	iters := fs.Int("iters", 50, "timed batches per mode (the median is reported)")
	modes := fs.String("modes", "uniform,prioritized,topk,update", "what to measure")
	jsonOut := fs.Bool("json", false, "print one JSON object per line")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%v (flags: --n N --batch B --iters K --modes LIST --json --timeout D)", err)
	}
	if *n < 1 || *batch < 1 || *iters < 1 {
		return errors.New("--n, --batch and --iters must be at least 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	h, err := openSampleWorld(ctx)
	if err != nil {
		return err
	}
	defer h.close()
	em := emitter{w: out, json: *jsonOut}
	local := *n / h.size()
	if h.rank() < *n%h.size() {
		local++
	}
	for _, mode := range strings.Split(*modes, ",") {
		var sec float64
		var err error
		switch mode {
		case "uniform", "prioritized", "topk":
			sec, err = timeSelection(ctx, h, mode, local, *batch, *iters)
		case "update":
			sec, err = timeUpdates(ctx, h, local, *batch, *iters)
		default:
			err = fmt.Errorf("unknown mode %q (want uniform, prioritized, topk, update)", mode)
		}
		if err := agree(ctx, h.comm, err); err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		if h.rank() != 0 {
			continue
		}
		rate := 0.0
		if sec > 0 {
			rate = float64(*batch) / sec
		}
		unit := "items_per_s"
		if mode == "update" {
			unit = "updates_per_s_per_rank"
		}
		if err := em.emit(kv{"bench", "sample"}, kv{"mode", mode}, kv{"np", h.size()}, kv{"n", *n},
			kv{"batch", *batch}, kv{"seconds", sec}, kv{unit, rate}); err != nil {
			return err
		}
	}
	return nil
}

// newShardTable builds this rank's in-memory shard of the benchmark table.
func newShardTable(mode string, items int, seed uint64) (*sample.Table, error) {
	var sampler sample.Selector
	switch mode {
	case "uniform":
		sampler = sample.NewUniform()
	case "prioritized", "update":
		p, err := sample.NewPrioritized(0.6)
		if err != nil {
			return nil, err
		}
		sampler = p
	case "topk":
		sampler = sample.NewMaxHeap()
	}
	t, err := sample.NewTable(sample.Config{Name: "bench-" + mode, MaxSize: items, Sampler: sampler,
		Remover: sample.NewFIFO(), Seed: seed})
	if err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(seed, 3))
	for k := range uint64(items) {
		if err := t.Insert(context.Background(), k, 0.01+10*r.Float64(), k); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

// timeSelection returns the median seconds per batch.
func timeSelection(ctx context.Context, h worldHandle, mode string, items, batch, iters int) (float64, error) {
	t, err := newShardTable(mode, items, uint64(h.rank()+1))
	if err != nil {
		return 0, err
	}
	defer t.Close()
	var d *sample.DistTable
	if h.size() > 1 {
		if d, err = sample.NewDistTable(ctx, h.comm, t, sample.WithSeed(1)); err != nil {
			return 0, err
		}
		defer d.Close()
	}
	dst := make([]sample.Sampled, batch)
	var b sample.Batch
	var top []sample.Item
	one := func() error {
		var err error
		switch {
		case mode == "topk" && d != nil:
			top, err = d.Top(ctx, batch)
		case mode == "topk":
			top, err = t.Top(batch, top[:0])
		case d != nil:
			err = d.SampleInto(ctx, &b, batch)
			if err == nil && len(b.Items) != batch {
				err = fmt.Errorf("a batch of %d, want %d", len(b.Items), batch)
			}
		default:
			var got int
			got, err = t.SampleInto(ctx, dst)
			if err == nil && got != batch {
				err = fmt.Errorf("a batch of %d, want %d", got, batch)
			}
		}
		if err == nil && mode == "topk" && len(top) != batch {
			err = fmt.Errorf("top %d gave %d", batch, len(top))
		}
		return err
	}
	for range 5 {
		if err := one(); err != nil {
			return 0, err
		}
	}
	times := make([]float64, iters)
	for i := range times {
		if err := h.comm.Barrier(ctx); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if err := one(); err != nil {
			return 0, err
		}
		times[i] = time.Since(t0).Seconds()
	}
	return median(times), nil
}

// timeUpdates returns the median seconds per batch of priority updates on this
// rank's shard.
func timeUpdates(ctx context.Context, h worldHandle, items, batch, iters int) (float64, error) {
	t, err := newShardTable("update", items, uint64(h.rank()+1))
	if err != nil {
		return 0, err
	}
	defer t.Close()
	r := rand.New(rand.NewPCG(9, uint64(h.rank())))
	ups := make([]sample.Update, batch)
	times := make([]float64, iters)
	for i := range times {
		for j := range ups {
			ups[j] = sample.Update{Key: uint64(r.IntN(items)), Priority: 0.01 + 10*r.Float64()}
		}
		if err := h.comm.Barrier(ctx); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if err := t.MutatePriorities(ups, nil); err != nil {
			return 0, err
		}
		times[i] = time.Since(t0).Seconds()
	}
	return median(times), nil
}

func benchCollect(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("collect", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	sizesFlag := fs.String("sizes", "4K,64K,1M", "trajectory sizes in bytes")
	items := fs.Int("items", 256, "trajectories per collection")
	iters := fs.Int("iters", 20, "timed collections per size and kind (the median is reported)")
	jsonOut := fs.Bool("json", false, "print one JSON object per line")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	bind := fs.String("bind", "none", "pin every rank to one core: none, core, or auto (when the host has a core per rank, as gearbench allreduce does)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%v (flags: --sizes LIST --items N --iters K --json --timeout D --bind none|core|auto)", err)
	}
	switch *bind {
	case "auto", "core", "none":
	default:
		return fmt.Errorf("--bind %q: want none, core or auto", *bind)
	}
	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		return err
	}
	if *items < 1 || *iters < 1 {
		return errors.New("--items and --iters must be at least 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	h, err := openSampleWorld(ctx)
	if err != nil {
		return err
	}
	defer h.close()
	if *bind == "core" || *bind == "auto" && h.w.LocalSize() <= runtime.NumCPU() {
		if err := bindToCore(h.w.LocalRank() % runtime.NumCPU()); err != nil {
			return err
		}
	}
	em := emitter{w: out, json: *jsonOut}
	for _, size := range sizes {
		res, err := collectOneSize(ctx, h, size, *items, *iters)
		if err := agree(ctx, h.comm, err); err != nil {
			return fmt.Errorf("size %d: %w", size, err)
		}
		if h.rank() != 0 {
			continue
		}
		total := size * *items
		busbw := 0.0
		if sec, ok := res["allreduce"]; ok && sec > 0 {
			n := float64(h.size())
			busbw = float64(total) / sec * 2 * (n - 1) / n
		}
		for _, kind := range []string{"copy", "local", "remote", "remote_transport", "allreduce"} {
			sec, ok := res[kind]
			if !ok {
				continue
			}
			rate := float64(total) / sec
			fields := []kv{{"bench", "collect"}, {"kind", kind}, {"np", h.size()}, {"items", *items},
				{"bytes", size}, {"seconds", sec}}
			switch {
			case kind == "allreduce":
				fields = append(fields, kv{"busbw", busbw})
			case kind == "remote" || kind == "remote_transport":
				// of_local: against the local collection of the same run.
				fields = append(fields, kv{"bytes_per_s", rate}, kv{"of_local", res["local"] / sec})
				if kind == "remote" {
					fields = append(fields, kv{"in_place", res["in_place"]})
				}
				if busbw > 0 {
					fields = append(fields, kv{"busbw_share", rate / busbw})
				}
			default:
				fields = append(fields, kv{"bytes_per_s", rate})
			}
			if err := em.emit(fields...); err != nil {
				return err
			}
		}
	}
	return nil
}

// collectOneSize fills a shard of this rank with trajectories of size bytes and
// times copy, local and remote collection.
func collectOneSize(ctx context.Context, h worldHandle, size, items, iters int) (map[string]float64, error) {
	spec := store.Spec{Capacity: items + 1, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "traj", DType: store.Uint8, Shape: []int{size}, Length: 1},
	}}
	name := rank.SegmentName(h.w.Info().JobID, fmt.Sprintf("bench-collect.%d.%d", size, h.rank()))
	sh, err := store.Create(name, spec)
	if err != nil {
		return nil, err
	}
	defer sh.Close()
	st, err := sample.NewShardTable(sh, sample.Config{Name: "bench-collect", Sampler: sample.NewUniform(), Remover: sample.NewFIFO()})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	pattern := func(r, k int) byte { return byte(r*31 + k*7 + 1) }
	rows := make([]int, items)
	for k := range items {
		ref, err := st.Insert(ctx, uint64(k), 1, func(p store.Pending) error {
			b := p.Block(0)
			for i := range b {
				b[i] = pattern(h.rank(), k) + byte(i)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		rows[k] = ref.Index
	}
	var d *sample.DistTable
	if h.size() > 1 {
		if d, err = sample.NewDistTable(ctx, h.comm, st); err != nil {
			return nil, err
		}
		defer d.Close()
	}
	check := func(buf []byte, owner int) error {
		for k := range items {
			want := pattern(owner, k)
			got := buf[k*size : (k+1)*size]
			if got[0] != want || got[size-1] != want+byte(size-1) || !bytes.Equal(got[:min(size, 64)], expect(want, min(size, 64))) {
				return fmt.Errorf("item %d of rank %d collected wrong", k, owner)
			}
		}
		return nil
	}
	dst := [][]byte{make([]byte, items*size)}
	cols := []string{"traj"}
	table, stride := sh.ColumnTable(0), sh.BlockStride(0)
	copyAll := func() error {
		for k, row := range rows {
			copy(dst[0][k*size:(k+1)*size], table[row*stride:row*stride+size])
		}
		return nil
	}
	collectFrom := func(owner int) func() error {
		idx := make([]int, items)
		for k, row := range rows { // every shard placed its rows alike
			idx[k] = owner*max(1, capacityOf(d)) + row
		}
		return func() error {
			var err error
			if d == nil {
				dst, err = st.CollectInto(ctx, dst, rows, cols, sample.Window{})
			} else {
				dst, err = d.CollectInto(ctx, dst, idx, cols, sample.Window{})
			}
			return err
		}
	}
	type kind struct {
		name  string
		owner int
		run   func() error
		times []float64
	}
	kinds := []*kind{{name: "copy", owner: h.rank(), run: copyAll}, {name: "local", owner: h.rank(), run: collectFrom(h.rank())}}
	var inPlace float64 // the share of the remote rows read in place
	if h.size() > 1 {
		next := (h.rank() + 1) % h.size()
		remote := collectFrom(next)
		kinds = append(kinds, &kind{name: "remote", owner: next, run: func() error {
			before := d.CollectStats()
			err := remote()
			after := d.CollectStats()
			inPlace = float64(after.InPlace-before.InPlace) / float64(items)
			return err
		}})
		// The same rows sent by their owner through the communicator, as from
		// another host: every rank turns in-place reading off for the call.
		kinds = append(kinds, &kind{name: "remote_transport", owner: next, run: func() error {
			d.SetCollectInPlace(false)
			defer d.SetCollectInPlace(true)
			return remote()
		}})
	}
	var arBuf []float32
	allReduce := func() error {
		for range items {
			if err := collective.AllReduce(ctx, h.comm, arBuf, collective.Sum); err != nil {
				return err
			}
		}
		return nil
	}
	if h.size() > 1 {
		arBuf = make([]float32, size/4)
	}
	// A checked call of each kind, then the kinds take turns, so that they are
	// timed under the same conditions.
	for _, k := range kinds {
		clear(dst[0])
		if err := k.run(); err != nil {
			return nil, err
		}
		if err := check(dst[0], k.owner); err != nil {
			return nil, fmt.Errorf("%s: %w", k.name, err)
		}
	}
	if h.size() > 1 {
		// Not checked: the allreduce benchmark checks AllReduce.
		kinds = append(kinds, &kind{name: "allreduce", run: allReduce})
	}
	for range iters {
		for _, k := range kinds {
			if err := h.comm.Barrier(ctx); err != nil {
				return nil, err
			}
			t0 := time.Now()
			if err := k.run(); err != nil {
				return nil, err
			}
			k.times = append(k.times, time.Since(t0).Seconds())
		}
	}
	res := map[string]float64{}
	for _, k := range kinds {
		res[k.name] = median(k.times)
	}
	if h.size() > 1 {
		res["in_place"] = inPlace
	}
	return res, nil
}

func capacityOf(d *sample.DistTable) int {
	if d == nil {
		return 0
	}
	return d.Capacity()
}

func expect(first byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = first + byte(i)
	}
	return b
}
