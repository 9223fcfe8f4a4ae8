package sample

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// TestDistLimiterExact: three ranks insert and sample at once under a
// SampleToInsertRatio limiter, with deletes of every kind (max_times_sampled,
// the remover of a full shard, MutatePriorities). Every global state that the
// shards' shares of the insert room are given from, at every sync and after every
// collective sample, must be one the limiter allows: the last insert was
// admitted (size <= min_size, or inserts*spi - samples <= max_diff), and the
// samples kept inserts*spi - samples >= min_diff.
func TestDistLimiterExact(t *testing.T) {
	const ranks, batches = 3, 150
	rl, err := SampleToInsertRatio(2, 4, 6)
	if err != nil {
		t.Fatal(err)
	}
	locals := make([]Local, ranks)
	for r := range ranks {
		tb, err := NewTable(Config{Name: "exact", MaxSize: 6, Sampler: NewUniform(), Remover: NewFIFO(),
			MaxTimesSampled: 3, RateLimit: rl, Seed: uint64(r)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tb.Close() })
		locals[r] = tb
	}
	var mu sync.Mutex
	var bad []string
	states, full := 0, 0
	check := func(r int, g *globalState) {
		ins, smp, del := g.lim.Counts()
		diff := float64(ins)*rl.SamplesPerInsert - float64(smp)
		mu.Lock()
		defer mu.Unlock()
		states++
		if !g.lim.CanInsert(0) {
			bad = append(bad, fmt.Sprintf("rank %d: inserts %d, samples %d, deletes %d: size %d > min_size %d and inserts*spi - samples = %v > max_diff %v",
				r, ins, smp, del, ins-del, rl.MinSize, diff, rl.MaxDiff))
		}
		if smp > 0 && diff < rl.MinDiff {
			bad = append(bad, fmt.Sprintf("rank %d: inserts %d, samples %d: inserts*spi - samples = %v < min_diff %v", r, ins, smp, diff, rl.MinDiff))
		}
		if !g.lim.CanInsert(1) {
			full++
		}
	}
	runDist(t, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
		d.observe = func(g *globalState) { check(r, g) }
		ictx, stop := context.WithCancel(ctx)
		defer stop()
		inserted := make(chan error, 1)
		go func() {
			for k := uint64(r) << 32; ; k++ {
				if err := d.Local().Insert(ictx, k, 1, 0); err != nil {
					if ictx.Err() != nil {
						err = nil
					}
					inserted <- err
					return
				}
			}
		}()
		var sampleErr error
		for i := range batches {
			b, err := d.Sample(ctx, 4)
			if err != nil {
				sampleErr = err
				break
			}
			if i%2 != r%2 {
				continue
			}
			// Delete one of this rank's sampled items that is still there.
			for _, x := range b.Items {
				if x.Index/d.Capacity() == r && !x.Deleted {
					if err := d.Local().MutatePriorities(nil, []uint64{x.Key}); err != nil {
						sampleErr = err
					}
					break
				}
			}
			if sampleErr != nil {
				break
			}
		}
		stop()
		if err := <-inserted; err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if sampleErr != nil {
			return sampleErr
		}
		return d.Sync(ctx)
	})
	for _, b := range bad[:min(len(bad), 10)] {
		t.Error(b)
	}
	if len(bad) > 0 {
		t.Fatalf("%d of %d global states break the limiter", len(bad), states)
	}
	// The inserts must have used up the room at times, or the bound was never
	// put to the test.
	if full == 0 {
		t.Fatalf("none of %d global states had the insert room used up", states)
	}
	t.Logf("%d global states checked, %d with the insert room used up", states, full)
}
