package sample

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// bigSpec has rows large enough to travel block by block (64 KiB of obs).
func bigSpec(capacity int) store.Spec {
	return store.Spec{Capacity: capacity, Remover: store.RemoverNone, Columns: []store.Column{
		{Name: "obs", DType: store.Float32, Shape: []int{64, 64}, Length: 4},
		{Name: "act", DType: store.Int32, Shape: []int{2}, Length: 4},
		{Name: "meta", DType: store.Int64, Shape: []int{4}, Length: 1},
	}}
}

// shardLocals makes one store-backed shard table per rank, of configuration
// cfg() (fresh selectors), rank r holding keys r*1000 + 0..n-1.
func shardLocals(t *testing.T, ranks, n int, spec store.Spec, cfg func() Config) ([]Local, []*store.Shard) {
	t.Helper()
	locals := make([]Local, ranks)
	shards := make([]*store.Shard, ranks)
	for r := range ranks {
		shards[r] = storetest.Create(t, spec)
		st, err := NewShardTable(shards[r], cfg(), WithPollInterval(200*time.Microsecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		for k := range uint64(n) {
			if _, err := st.Insert(context.Background(), uint64(r)*1000+k, 1, fill(uint64(r)*1000+k)); err != nil {
				t.Fatal(err)
			}
		}
		locals[r] = st
	}
	return locals, shards
}

// checkItems checks that item k of whole-row buffers bufs (columns cols, all
// the spec's) holds payload keys[k].
func checkItems(bufs [][]byte, sh *store.Shard, keys []uint64) error {
	for k, want := range keys {
		if err := collectedItem(sh, bufs, k, want); err != nil {
			return err
		}
	}
	return nil
}

// TestCollectInPlaceMatchesTransport: three ranks of one host read each
// other's rows in place (the counters say so), and get the same bytes, whole
// and through windows, as when the rows come through the transport; small rows
// (packed on the transport) and large ones, rows held by batches among them.
func TestCollectInPlaceMatchesTransport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spec     store.Spec
		maxTimes int64
	}{
		{"small", storetest.Spec(16), 0},
		{"large-held", bigSpec(16), 1},
	} {
		for _, tr := range collectivetest.Transports {
			t.Run(tc.name+"/"+tr, func(t *testing.T) {
				const ranks = 3
				spec := tc.spec
				spec.Remover = store.RemoverNone
				locals, shards := shardLocals(t, ranks, 6, spec, func() Config {
					return Config{Name: "inplace", Sampler: NewUniform(), Remover: NewFIFO(), MaxTimesSampled: tc.maxTimes}
				})
				runDistOver(t, tr, locals, []DistOption{WithSeed(3)}, func(ctx context.Context, r int, d *DistTable) error {
					b, err := d.Sample(ctx, 9)
					if err != nil {
						return err
					}
					defer b.Release()
					// Every rank collects the whole batch, its order reversed on
					// odd ranks.
					var idx []int
					var keys []uint64
					for _, x := range b.Items {
						idx = append(idx, x.Index)
						keys = append(keys, x.Key)
					}
					if r%2 == 1 {
						slices.Reverse(idx)
						slices.Reverse(keys)
					}
					remote := 0
					for _, i := range idx {
						if i/d.Capacity() != r {
							remote++
						}
					}
					windows := []Window{{}, {Offset: 1, Length: 5, Pad: PadTail}, {Offset: 2, Length: 3, Pad: PadHead}}
					var inPlace [][][]byte
					before := d.CollectStats()
					for _, w := range windows {
						bufs, err := d.Collect(ctx, idx, testColumns, w)
						if err != nil {
							return err
						}
						inPlace = append(inPlace, bufs)
					}
					after := d.CollectStats()
					if got, want := after.InPlace-before.InPlace, uint64(remote*len(windows)); got != want || after.Transport != before.Transport {
						return fmt.Errorf("in place: %+v then %+v, want %d more rows read in place and none through the transport", before, after, want)
					}
					if err := checkItems(inPlace[0], shards[0], keys); err != nil {
						return err
					}
					d.SetCollectInPlace(false)
					defer d.SetCollectInPlace(true)
					for i, w := range windows {
						bufs, err := d.Collect(ctx, idx, testColumns, w)
						if err != nil {
							return err
						}
						for c := range bufs {
							if !slices.Equal(bufs[c], inPlace[i][c]) {
								return fmt.Errorf("window %+v, column %d: the transport gives other bytes than the reads in place", w, c)
							}
						}
					}
					if got := d.CollectStats(); got.Transport-after.Transport != uint64(remote*len(windows)) || got.InPlace != after.InPlace {
						return fmt.Errorf("through the transport: %+v then %+v", after, got)
					}
					// Ranks may differ: rank 1 alone has its rows sent.
					d.SetCollectInPlace(r != 1)
					before = d.CollectStats()
					bufs, err := d.Collect(ctx, idx, testColumns, windows[2])
					if err != nil {
						return err
					}
					for c := range bufs {
						if !slices.Equal(bufs[c], inPlace[2][c]) {
							return fmt.Errorf("column %d: other bytes when only rank 1 reads through the transport", c)
						}
					}
					after = d.CollectStats()
					if inPlace := after.InPlace - before.InPlace; (r == 1) != (inPlace == 0) && remote > 0 {
						return fmt.Errorf("rank %d read %d rows in place with rank 1 alone reading through the transport", r, inPlace)
					}
					return nil
				})
			})
		}
	}
}

// TestCollectInPlaceOtherHosts: ranks on other hosts send their rows through
// the transport, ranks on this one are read in place.
func TestCollectInPlaceOtherHosts(t *testing.T) {
	const ranks = 3
	spec := bigSpec(8)
	locals, shards := shardLocals(t, ranks, 4, spec, func() Config { return Config{Name: "hosts", Sampler: NewUniform(), Remover: NewFIFO()} })
	comms, _ := collectivetest.Comms(t, ranks, collectivetest.Config{Transport: collectivetest.TCP, Hosts: []string{"a", "a", "b"}, Timeout: 60 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) error {
		r := c.Rank()
		d, err := NewDistTable(ctx, c, locals[r])
		if err != nil {
			return err
		}
		defer d.Close()
		var idx []int
		var keys []uint64
		for owner := range ranks {
			for k := range 4 {
				idx = append(idx, owner*d.Capacity()+k)
				keys = append(keys, uint64(owner)*1000+uint64(k))
			}
		}
		bufs, err := d.Collect(ctx, idx, testColumns, Window{})
		if err != nil {
			return err
		}
		if err := checkItems(bufs, shards[0], keys); err != nil {
			return err
		}
		want := CollectStats{Local: 4, InPlace: 4, Transport: 4}
		if r == 2 {
			want = CollectStats{Local: 4, Transport: 8}
		}
		if got := d.CollectStats(); got != want {
			return fmt.Errorf("rank %d collected %+v, want %+v", r, got, want)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestCollectInPlaceWhileReplaced: while a writer on rank 0 keeps inserting
// into a full table (every insert deletes the oldest item, and its row is
// written again), rank 1 collects rank 0's rows in place. A row must never be
// torn or overwritten while read: every row collected holds a whole payload,
// the sampled one whenever a batch holds it; a row deleted between the sample
// and the collection is the transport's error, naming the index.
func TestCollectInPlaceWhileReplaced(t *testing.T) {
	for _, maxTimes := range []int64{0, 1} {
		t.Run(fmt.Sprintf("max_times_sampled=%d", maxTimes), func(t *testing.T) {
			testCollectWhileReplaced(t, maxTimes)
		})
	}
}

func testCollectWhileReplaced(t *testing.T, maxTimes int64) {
	const size, rounds = 12, 60
	spec := bigSpec(size + 4)
	cfg := func() Config {
		return Config{Name: "replaced", MaxSize: size, Sampler: NewUniform(), Remover: NewFIFO(), MaxTimesSampled: maxTimes, RateLimit: MinSize(1)}
	}
	locals, shards := shardLocals(t, 2, size, spec, cfg)
	var next atomic.Uint64
	next.Store(100)
	stop := make(chan struct{})
	var writer sync.WaitGroup
	var writerErr error
	writer.Add(1)
	go func() {
		defer writer.Done()
		st := locals[0].localShard()
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := next.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_, err := st.Insert(ctx, k, 1, fill(k))
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				writerErr = err
				return
			}
		}
	}()
	var deleted, whole atomic.Int64
	runDist(t, locals, []DistOption{WithSeed(9)}, func(ctx context.Context, r int, d *DistTable) error {
		for range rounds {
			b, err := d.Sample(ctx, 4)
			if err != nil {
				return err
			}
			var idx []int
			var keys []uint64
			if r == 1 {
				for _, x := range b.Items {
					if x.Index/d.Capacity() == 0 {
						idx = append(idx, x.Index)
						keys = append(keys, x.Key)
					}
				}
			}
			bufs, err := d.Collect(ctx, idx, testColumns, Window{})
			b.Release()
			if err != nil {
				if r == 1 && maxTimes == 0 && errors.Is(err, ErrEvicted) && strings.Contains(err.Error(), "holds no item there") {
					deleted.Add(1)
					continue
				}
				return err
			}
			for k := range idx {
				blocks := make([][]byte, len(bufs))
				for c := range bufs {
					n := shards[0].BlockBytes(c)
					blocks[c] = bufs[c][k*n : (k+1)*n]
				}
				id, err := storetest.Check(blocks)
				if err != nil {
					return fmt.Errorf("index %d: %v", idx[k], err)
				}
				// Without max_times_sampled the row may hold a later item, admitted
				// into the row after the sampled one was deleted: still whole.
				if id != keys[k] && (maxTimes != 0 || id < keys[k]) {
					return fmt.Errorf("index %d holds payload %d, sampled %d", idx[k], id, keys[k])
				}
				whole.Add(1)
			}
		}
		if r == 1 && d.CollectStats().InPlace == 0 {
			return errors.New("no row was read in place")
		}
		return nil
	})
	close(stop)
	writer.Wait()
	if writerErr != nil {
		t.Fatal(writerErr)
	}
	t.Logf("%d rows whole, %d collections of deleted rows; %d inserts", whole.Load(), deleted.Load(), next.Load()-100)
	if next.Load()-100 < rounds {
		t.Fatalf("the writer inserted only %d rows during %d rounds", next.Load()-100, rounds)
	}
}

// TestProcessCollectInPlace: two rank processes of one host, each with a store
// shard and a writer replacing its rows, collect each other's rows in place.
func TestProcessCollectInPlace(t *testing.T) {
	launchtest.RunRanks(t, 2, func(t *testing.T, w *rank.World) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c, err := collective.New(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		me := w.Rank()
		const size = 12
		sh, err := store.Create(rank.SegmentName(w.JobID(), fmt.Sprintf("sample.inplace.%d", me)), bigSpec(size+4))
		if err != nil {
			t.Fatal(err)
		}
		defer sh.Close()
		st, err := NewShardTable(sh, Config{Name: "proc", MaxSize: size, Sampler: NewUniform(), Remover: NewFIFO(), MaxTimesSampled: 1},
			WithPollInterval(200*time.Microsecond))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		for k := range uint64(size) {
			if _, err := st.Insert(ctx, uint64(me)*1_000_000+k, 1, fill(uint64(me)*1_000_000+k)); err != nil {
				t.Fatal(err)
			}
		}
		d, err := NewDistTable(ctx, c, st, WithSeed(4))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		stop := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			k := uint64(me)*1_000_000 + size
			for {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				ictx, icancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, err := st.Insert(ictx, k, 1, fill(k))
				icancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					done <- err
					return
				}
				k++
			}
		}()
		for round := range 40 {
			b, err := d.Sample(ctx, 6)
			if err != nil {
				t.Fatal(err)
			}
			var idx []int
			var keys []uint64
			for _, x := range b.Items {
				if x.Index/d.Capacity() != me {
					idx = append(idx, x.Index)
					keys = append(keys, x.Key)
				}
			}
			bufs, err := d.Collect(ctx, idx, testColumns, Window{})
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if err := checkItems(bufs, sh, keys); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			b.Release()
		}
		close(stop)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if s := d.CollectStats(); s.InPlace == 0 || s.Transport != 0 {
			t.Fatalf("rank %d collected %+v: want every remote row read in place", me, s)
		}
	})
}
