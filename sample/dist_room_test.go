package sample

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// endedContext is a context that has already ended: an insert given it succeeds
// only if the rate limiter (or the shard's share of the global room) admits it
// without waiting at all.
func endedContext(ctx context.Context) context.Context {
	c, cancel := context.WithCancel(ctx)
	cancel()
	return c
}

// TestDistSampleFreesRoomAtOnce: a Queue table full of items; a collective
// sample takes (and deletes) one item per rank; every rank then inserts one
// item at once, in the same goroutine, without another sync: the room the sample
// freed is split among the ranks on every rank alike. One insert more must wait.
// At one rank this is the program that works with a plain Table.
func TestDistSampleFreesRoomAtOnce(t *testing.T) {
	for _, ranks := range []int{1, 3} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			mk := func() (Selector, Selector) { return NewFIFO(), NewFIFO() }
			locals := localTables(t, ranks, nil, mk, 1, Queue(int64(3*ranks)), counterClock())
			runDist(t, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
				key := uint64(r) * 10
				for range 3 {
					if err := d.Local().Insert(ctx, key, 1, 0); err != nil {
						return err
					}
					key++
				}
				b, err := d.Sample(ctx, ranks)
				if err != nil {
					return err
				}
				// A failure is kept until the end, so that every rank makes
				// every collective call.
				var fail error
				switch {
				case len(b.Items) != ranks:
					fail = fmt.Errorf("batch of %d, want %d", len(b.Items), ranks)
				case ranks == 1 && b.Items[0].Key != 0:
					fail = fmt.Errorf("queue gave key %d, want the first item, 0", b.Items[0].Key)
				}
				for _, x := range b.Items {
					if !x.Deleted {
						fail = fmt.Errorf("pick %+v not deleted (max_times_sampled 1)", x)
					}
				}
				if err := d.Local().Insert(endedContext(ctx), key, 1, 0); err != nil {
					fail = fmt.Errorf("insert into the room the sample freed: %w", err)
				}
				key++
				// The queue is full again: one insert more must wait.
				if err := d.Local().Insert(endedContext(ctx), key, 1, 0); !errors.Is(err, context.Canceled) {
					fail = fmt.Errorf("insert beyond the room: %v, want it to wait (context.Canceled)", err)
				}
				if err := d.Sync(ctx); err != nil {
					return err
				}
				if info := d.Info(); fail == nil && (info.Size != int64(3*ranks) || info.Limiter.CanInsert) {
					return fmt.Errorf("after the inserts: %d items, can insert %v; want %d items, a full queue", info.Size, info.Limiter.CanInsert, 3*ranks)
				}
				return fail
			})
		})
	}
}

// TestDistLocalDeleteFreesRoom: MutatePriorities deletes, which are local, grow
// the insert room of their own shard at once, by what they add to the global
// room, and nobody else's until the next sync. The limiter admits inserts only
// while the table holds at most MinSize items (max_diff 0), so each delete
// frees one insert.
func TestDistLocalDeleteFreesRoom(t *testing.T) {
	for _, ranks := range []int{1, 3} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			rl := RateLimit{SamplesPerInsert: 1, MinSize: int64(2 * ranks), MinDiff: 0, MaxDiff: 0}
			mk := func() (Selector, Selector) { return NewUniform(), NewFIFO() }
			locals := localTables(t, ranks, nil, mk, 0, rl, nil)
			runDist(t, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
				key := uint64(r) * 10
				for range 2 {
					if err := d.Local().Insert(ctx, key, 1, 0); err != nil {
						return err
					}
					key++
				}
				// Rank 0 deletes an item of its own and inserts again at
				// once; the other ranks deleted nothing and must wait. A
				// failure is kept until the end, so that every rank makes
				// every collective call.
				var fail error
				if r == 0 {
					if err := d.Local().MutatePriorities(nil, []uint64{0}); err != nil {
						return err
					}
				}
				err := d.Local().Insert(endedContext(ctx), key, 1, 0)
				switch {
				case r == 0 && err != nil:
					fail = fmt.Errorf("insert after a local delete: %w", err)
				case r != 0 && !errors.Is(err, context.Canceled):
					fail = fmt.Errorf("insert on a rank that deleted nothing: %v, want it to wait (context.Canceled)", err)
				}
				key++
				if err := d.Sync(ctx); err != nil {
					return err
				}
				if info := d.Info(); fail == nil && (info.Size != int64(2*ranks) || info.Limiter.CanInsert) {
					fail = fmt.Errorf("after rank 0's delete and insert: %d items, can insert %v; want %d, none", info.Size, info.Limiter.CanInsert, 2*ranks)
				}
				// Every rank deletes one item at once: each may insert one.
				if err := d.Local().MutatePriorities(nil, []uint64{uint64(r)*10 + 1}); err != nil {
					return err
				}
				if err := d.Local().Insert(endedContext(ctx), key, 1, 0); err != nil && fail == nil {
					fail = fmt.Errorf("insert after a local delete on every rank: %w", err)
				}
				key++
				if err := d.Local().Insert(endedContext(ctx), key, 1, 0); !errors.Is(err, context.Canceled) && fail == nil {
					fail = fmt.Errorf("second insert after one delete: %v, want it to wait (context.Canceled)", err)
				}
				if err := d.Sync(ctx); err != nil {
					return err
				}
				if info := d.Info(); fail == nil && (info.Size != int64(2*ranks) || info.Limiter.CanInsert) {
					fail = fmt.Errorf("after every rank's delete and insert: %d items, can insert %v; want %d, none", info.Size, info.Limiter.CanInsert, 2*ranks)
				}
				return fail
			})
		})
	}
}

// TestDistCloseWakesSample: a collective Sample waits on an empty Queue table;
// another goroutine closes the distributed table on one rank. The sample there
// returns ErrClosed, the other ranks' samples return an error naming that rank,
// and Close returns.
func TestDistCloseWakesSample(t *testing.T) {
	for _, ranks := range []int{1, 3} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			mk := func() (Selector, Selector) { return NewFIFO(), NewFIFO() }
			locals := localTables(t, ranks, nil, mk, 1, Queue(3), nil)
			closer := ranks / 2
			runDist(t, locals, nil, func(ctx context.Context, r int, d *DistTable) error {
				closed := make(chan error, 1)
				if r == closer {
					go func() {
						// Close once the sample waits for items that never come.
						if err := pollUntil("a waiting sample", func() bool { return d.Local().Info().BlockedSamples == 1 }); err != nil {
							closed <- err
							return
						}
						closed <- d.Close()
					}()
				}
				_, err := d.Sample(ctx, 1)
				switch {
				case !errors.Is(err, ErrClosed):
					return fmt.Errorf("sample: %v, want ErrClosed", err)
				case !strings.Contains(err.Error(), fmt.Sprintf("rank %d", closer)):
					return fmt.Errorf("sample: %v, want an error naming rank %d", err, closer)
				}
				if r == closer {
					if err := <-closed; err != nil {
						return fmt.Errorf("close: %w", err)
					}
				}
				// Every rank's next collective call fails the same way.
				if err := d.Sync(ctx); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", closer)) {
					return fmt.Errorf("sync after close: %v, want ErrClosed naming rank %d", err, closer)
				}
				return nil
			})
		})
	}
}
