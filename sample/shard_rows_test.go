package sample

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// prioritized is a prioritized selector of exponent 1.
func prioritized(t *testing.T) Selector {
	t.Helper()
	p, err := NewPrioritized(1)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// rowPriority is the priority the row of key's item holds in the shard.
func rowPriority(t *testing.T, st *ShardTable, sh *store.Shard, key uint64) (table, row float64) {
	t.Helper()
	it, ok := st.Get(key)
	if !ok {
		t.Fatalf("key %d not in the table", key)
	}
	rs, err := sh.Status(store.Ref{Index: it.Index, Seq: it.Seq})
	if err != nil {
		t.Fatal(err)
	}
	return it.Priority, rs.Priority
}

// TestShardTableRowKeepsACommittedKeysPriority: a commit of a key the table
// holds changes the item's priority (Reverb's insert of an existing key), and
// the item's row takes it too, so that a checkpoint gives it back. The row
// kept the first priority: a restored table had it.
func TestShardTableRowKeepsACommittedKeysPriority(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := func() Config { return Config{Sampler: prioritized(t), Remover: NewFIFO()} }
	st, sh := shardTable(t, 8, cfg())
	for _, p := range []float64{1, 9} {
		if _, err := st.Insert(ctx, 1, p, fill(1)); err != nil {
			t.Fatal(err)
		}
	}
	if tp, rp := rowPriority(t, st, sh, 1); tp != 9 || rp != 9 {
		t.Fatalf("after the second commit of key 1: table %v, row %v; want 9 and 9", tp, rp)
	}
	rt := restoreTable(t, ctx, st.Checkpoint, cfg())
	waitFor(t, "the restored item", func() bool { return rt.Info().Size == 1 })
	if it, _ := rt.Get(1); it.Priority != 9 {
		t.Fatalf("restored key 1: priority %v, want 9", it.Priority)
	}
}

// TestShardTableRowFollowsConcurrentUpdates: MutatePriorities from several
// goroutines on one key leave the row with the table's priority. The row was
// written after the table's lock was let go, so the last writer of the row
// was not always the last of the table.
func TestShardTableRowFollowsConcurrentUpdates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, sh := shardTable(t, 8, Config{Sampler: prioritized(t), Remover: NewFIFO()})
	if _, err := st.Insert(ctx, 1, 1, fill(1)); err != nil {
		t.Fatal(err)
	}
	const goroutines, rounds, updates = 4, 2000, 50
	for round := range rounds {
		var start, done sync.WaitGroup
		start.Add(1)
		for g := range goroutines {
			done.Go(func() {
				start.Wait()
				for i := range updates {
					if err := st.MutatePriorities([]Update{{Key: 1, Priority: float64((round*goroutines+g)*updates + i)}}, nil); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		start.Done()
		done.Wait()
		if tp, rp := rowPriority(t, st, sh, 1); tp != rp {
			t.Fatalf("round %d: table priority %v, row %v", round, tp, rp)
		}
	}
}

// TestRestoredRowsCountSamplesAtTheRatio: rows a table admits again count
// SamplesPerInsert samples each in all, not that number rounded per row: 8
// rows at 0.5 count 4 (rounded, 8, which left the limiter unable to sample
// until 8 more inserts), at 1.5 count 12 (16), at 0.25 count 2 (0).
func TestRestoredRowsCountSamplesAtTheRatio(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, _ := shardTable(t, 16, Config{})
	for k := range uint64(8) {
		if _, err := st.Insert(ctx, k, 1, fill(k)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		spi  float64
		want int64
	}{{0.5, 4}, {1.5, 12}, {0.25, 2}, {1, 8}} {
		// An error buffer that lets a table of 2 inserts and no sample
		// sample: the restored rows leave the balance where it was, so the
		// restored table samples at once.
		rl, err := SampleToInsertRatio(c.spi, 2, 2*c.spi+1)
		if err != nil {
			t.Fatal(err)
		}
		rt := restoreTable(t, ctx, st.Checkpoint, Config{Name: "restored", Sampler: NewUniform(), Remover: NewFIFO(), RateLimit: rl})
		waitFor(t, "the restored rows", func() bool { return rt.Info().Size == 8 })
		if i := rt.Info(); i.Inserts != 8 || i.Samples != c.want {
			t.Errorf("spi %v: inserts %d, samples %d; want 8 and %d", c.spi, i.Inserts, i.Samples, c.want)
		}
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := rt.Sample(sctx, 1); err != nil {
			t.Errorf("spi %v: the restored table at its ratio cannot sample: %v", c.spi, err)
		}
		scancel()
	}
}

// detachingOwnerEnv names, in the environment of this test binary run as a
// child, the shard that detachingOwner makes.
const detachingOwnerEnv = "GEAR_SAMPLE_TEST_DETACHING_OWNER"

// detachingSpec is the layout of detachingOwner's shard.
func detachingSpec() store.Spec {
	spec := storetest.Spec(8)
	spec.Remover = store.RemoverNone
	return spec
}

// detachingConfig is the table of detachingOwner and of the owner after it.
func detachingConfig() Config {
	return Config{Name: "detached", Sampler: NewFIFO(), Remover: NewFIFO(), MaxTimesSampled: 3}
}

// detachingOwner, in a child process, makes the shard name and a table over
// it, inserts keys 0 and 1, samples key 0 twice, closes the table and leaves
// the shard (Detach) for another process to open. It returns the exit status.
func detachingOwner(name string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sh, err := store.Create(name, detachingSpec())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	st, err := NewShardTable(sh, detachingConfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for k := range uint64(2) {
		if _, err := st.Insert(ctx, k, 1, func(p store.Pending) error { storetest.Fill(p, k); return nil }); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	for range 2 {
		if b, err := st.Sample(ctx, 1); err != nil || b.Items[0].Key != 0 {
			fmt.Fprintln(os.Stderr, "sample:", b, err)
			return 2
		}
	}
	if err := st.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := sh.Detach(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// TestShardTableCloseWritesTimesSampled: an owner that closes its table and
// leaves the shard (Detach) hands the items' times sampled to the next owner
// (store.Open, in another process), as a checkpoint does; the rows kept 0.
func TestShardTableCloseWritesTimesSampled(t *testing.T) {
	name := storetest.Name(t, "detached")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), detachingOwnerEnv+"="+name)
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = store.Remove(name)
		t.Fatalf("owner process: %v\n%s", err, out)
	}
	again, err := store.Open(name, detachingSpec())
	if err != nil {
		_ = store.Remove(name)
		t.Fatal(err)
	}
	t.Cleanup(func() { again.Close() })
	rt, err := NewShardTable(again, detachingConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	for k, want := range []int64{2, 0} {
		if it, ok := rt.Get(uint64(k)); !ok || it.TimesSampled != want {
			t.Fatalf("key %d after the owner left: %+v %v, want sampled %d times", k, it, ok, want)
		}
	}
}
