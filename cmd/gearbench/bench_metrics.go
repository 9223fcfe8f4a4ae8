package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

// benchMetrics measures what the library's metrics cost, in one run, with
// them off and on in alternate rounds: the latency of an 8-byte AllReduce
// (every rank stops or starts its hooks between rounds, metrics.Publish) and
// the throughput of 400-byte inserts into a shard-backed table (two equal
// tables, one made with metrics and one without, filled in alternate
// rounds). It reports the medians and their ratio. Run it under gearrun,
// which gives every rank its metrics segment: gearrun -np 2 gearbench metrics.
func benchMetrics(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("metrics", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rounds := fs.Int("rounds", 401, "rounds of each, off and on, alternating")
	calls := fs.Int("calls", 500, "AllReduce calls per round (short rounds: the machine's drifts fall on both sides alike)")
	inserts := fs.Int("inserts", 1000, "inserts per round")
	jsonOut := fs.Bool("json", false, "print one JSON object per line")
	aa := fs.Bool("aa", false, "metrics off on both sides (an A/A run): the noise of the measure itself")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx := context.Background()
	c, _, _, closeWorld, err := openWorld(ctx)
	if err != nil {
		return err
	}
	defer closeWorld()
	m := metrics.Current()
	if m == nil {
		return errors.New("gearbench metrics: this rank has no metrics segment: run it under gearrun")
	}
	defer metrics.Publish(m)
	e := emitter{w: out, json: *jsonOut}
	if c.Rank() != 0 {
		e.w = io.Discard
	}

	buf := make([]float32, 2)
	allReduce := func(n int) (float64, error) {
		if err := c.Barrier(ctx); err != nil {
			return 0, err
		}
		start := time.Now()
		for range n {
			if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
				return 0, err
			}
		}
		return float64(time.Since(start).Nanoseconds()) / float64(n), nil
	}
	if _, err := allReduce(*calls); err != nil { // warm up
		return err
	}
	var off, on []float64
	for i := range 2 * *rounds {
		// ABBA order, so that neither side always runs first.
		withMetrics := i%4 == 1 || i%4 == 2
		if withMetrics && !*aa {
			metrics.Publish(m)
		} else {
			metrics.Publish(nil)
		}
		ns, err := allReduce(*calls)
		if err != nil {
			return err
		}
		if withMetrics {
			on = append(on, ns)
		} else {
			off = append(off, ns)
		}
	}
	metrics.Publish(m)
	if err := e.emit(kv{"op", "allreduce"}, kv{"bytes", 8}, kv{"np", c.Size()}, kv{"rounds", *rounds},
		kv{"off_ns", median(off)}, kv{"on_ns", median(on)}, kv{"cost", fmt.Sprintf("%+.2f%%", 100*(median(on)/median(off)-1))}); err != nil {
		return err
	}

	// Inserts: rank-local tables over equal shards, with and without metrics,
	// on rank 0 alone (the others wait in a Barrier), so that no other rank's
	// inserts share the cores with its rounds.
	mk := func(what string) (*sample.ShardTable, func(), error) {
		spec := store.Spec{Capacity: 1 << 16, Remover: store.RemoverNone,
			Columns: []store.Column{{Name: "obs", DType: store.Uint8, Shape: []int{400}, Length: 1}}}
		sh, err := store.Create(rank.SegmentName(jobOf(c), fmt.Sprintf("bench.metrics.%s.%d", what, c.Rank())), spec)
		if err != nil {
			return nil, nil, err
		}
		st, err := sample.NewShardTable(sh, sample.Config{Name: "bench-" + what, Sampler: sample.NewUniform(), Remover: sample.NewFIFO()})
		if err != nil {
			sh.Close()
			return nil, nil, err
		}
		return st, func() { st.Close(); sh.Close() }, nil
	}
	if *aa {
		metrics.Publish(nil)
	}
	tOn, closeOn, err := mk("on")
	metrics.Publish(m)
	if err != nil {
		return err
	}
	defer closeOn()
	metrics.Publish(nil)
	tOff, closeOff, err := mk("off")
	metrics.Publish(m)
	if err != nil {
		return err
	}
	defer closeOff()
	key := uint64(0)
	insert := func(st *sample.ShardTable, n int) (float64, error) {
		start := time.Now()
		for range n {
			key++
			if _, err := st.Insert(ctx, key, 1, func(p store.Pending) error {
				b := p.Block(0)
				b[0], b[len(b)-1] = byte(key), byte(key>>8)
				return nil
			}); err != nil {
				return 0, err
			}
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}
	for _, st := range []*sample.ShardTable{tOff, tOn} { // warm up both
		if _, err := insert(st, *inserts); err != nil {
			return err
		}
	}
	if c.Rank() != 0 {
		return c.Barrier(ctx)
	}
	off, on = off[:0], on[:0]
	for i := range 2 * *rounds {
		withMetrics := i%4 == 1 || i%4 == 2
		st := tOff
		if withMetrics {
			st = tOn
		}
		rate, err := insert(st, *inserts)
		if err != nil {
			return err
		}
		if withMetrics {
			on = append(on, rate)
		} else {
			off = append(off, rate)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	return e.emit(kv{"op", "insert"}, kv{"bytes", 400}, kv{"rounds", *rounds},
		kv{"off_items_per_s", median(off)}, kv{"on_items_per_s", median(on)}, kv{"cost", fmt.Sprintf("%+.2f%%", 100*(1-median(on)/median(off)))})
}

// jobOf is the job ID of c's world.
func jobOf(c *collective.Comm) string {
	if w, ok := c.Bootstrap().(*rank.World); ok {
		return w.JobID()
	}
	return rank.LocalJobID()
}
