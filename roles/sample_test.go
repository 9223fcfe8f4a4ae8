package roles_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"

	"golang.org/x/sync/errgroup"
)

// record builds actor a's i-th trajectory: a, i, then bytes drawn from a seed of
// both, n bytes in all.
func record(a, i, n int) []byte {
	b := make([]byte, n)
	binary.LittleEndian.PutUint32(b, uint32(a))
	binary.LittleEndian.PutUint32(b[4:], uint32(i))
	rng := rand.New(rand.NewPCG(uint64(a), uint64(i)))
	for k := 8; k < n; k++ {
		b[k] = byte(rng.Uint32())
	}
	return b
}

// TestSampleStreamDelivers: four actors push trajectories of random sizes
// (wrapping the queues many times); the trainer receives every one, whole and in
// order for each actor, with its sender's rank and version, over both transports.
func TestSampleStreamDelivers(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, want roles.Transport) {
		const actors, each, maxRec = 4, 300, 3000
		w := rolestest.World(t, actors+1, layout)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		recv, err := roles.NewSampleReceiver(ctx, w.Bootstrap(0), "traj", roles.SampleConfig{MaxRecordBytes: maxRec, QueueBytes: 3 * 4096})
		if err != nil {
			t.Fatal(err)
		}
		defer recv.Close()

		g, gctx := errgroup.WithContext(ctx)
		for a := 1; a <= actors; a++ {
			g.Go(func() error {
				s, err := roles.DialSamples(gctx, w.Bootstrap(a), "traj", 0)
				if err != nil {
					return err
				}
				defer s.Close()
				if s.Transport() != want {
					return fmt.Errorf("actor %d uses %s, want %s", a, s.Transport(), want)
				}
				var sink roles.Sink = s
				rng := rand.New(rand.NewPCG(uint64(a), 9))
				for i := range each {
					n := 8 + rng.IntN(maxRec-8+1)
					if err := sink.Insert(gctx, roles.Record{Version: uint64(1000*a + i), Data: record(a, i, n)}); err != nil {
						return fmt.Errorf("actor %d record %d: %w", a, i, err)
					}
				}
				return nil
			})
		}
		next := map[int]int{}
		var sizes []int
		serveCtx, stopServe := context.WithCancel(ctx)
		defer stopServe()
		g.Go(func() error {
			err := recv.Serve(serveCtx, roles.SinkFunc(func(_ context.Context, rec roles.Record) error {
				a := int(binary.LittleEndian.Uint32(rec.Data))
				i := int(binary.LittleEndian.Uint32(rec.Data[4:]))
				if a != rec.Actor {
					return fmt.Errorf("record of actor %d arrived as actor %d's", a, rec.Actor)
				}
				if i != next[a] {
					return fmt.Errorf("actor %d: record %d arrived, want %d", a, i, next[a])
				}
				if rec.Version != uint64(1000*a+i) {
					return fmt.Errorf("actor %d record %d: version %d", a, i, rec.Version)
				}
				if string(rec.Data) != string(record(a, i, len(rec.Data))) {
					return fmt.Errorf("actor %d record %d: %d bytes differ", a, i, len(rec.Data))
				}
				next[a]++
				sizes = append(sizes, len(rec.Data))
				if len(sizes) == actors*each {
					stopServe()
				}
				return nil
			}))
			if errors.Is(err, context.Canceled) && ctx.Err() == nil {
				return nil // all received
			}
			return err
		})
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		if len(sizes) != actors*each {
			t.Fatalf("%d records received, want %d", len(sizes), actors*each)
		}
	})
}

// TestSampleBackPressure: a trainer that stops receiving stops its actor once
// the actor's queue is full, and lets it go on as records are released.
func TestSampleBackPressure(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		// Records of 48 bytes take 64 each: four fill the 256-byte queue.
		ctx, recv, s := samplePair(t, layout, roles.SampleConfig{MaxRecordBytes: 100, QueueBytes: 256})
		push := func(i int, d time.Duration) error {
			pctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return s.Push(pctx, roles.Record{Version: uint64(i), Data: record(1, i, 48)})
		}
		for i := range 4 {
			if err := push(i, 10*time.Second); err != nil {
				t.Fatalf("push %d: %v", i, err)
			}
		}
		if err := push(4, 50*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("push into a full queue: %v, want the deadline", err)
		}
		rec, err := recv.Recv(ctx)
		if err != nil || rec.Version != 0 {
			t.Fatalf("Recv: %v %v", rec.Version, err)
		}
		// The record Recv returned still holds its room.
		if err := push(4, 50*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("push while the trainer holds the record: %v, want the deadline", err)
		}
		done := make(chan error, 1)
		go func() { done <- push(4, 10*time.Second) }()
		if rec, err = recv.Recv(ctx); err != nil || rec.Version != 1 {
			t.Fatalf("Recv: %v %v", rec.Version, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("push after a release: %v", err)
		}
		for want := uint64(2); want <= 4; want++ {
			rec, err := recv.Recv(ctx)
			if err != nil || rec.Version != want || string(rec.Data) != string(record(1, int(want), 48)) {
				t.Fatalf("Recv: version %d (want %d), %v", rec.Version, want, err)
			}
		}
		if err := s.Push(ctx, roles.Record{Data: make([]byte, 101)}); !errors.Is(err, roles.ErrTooLarge) {
			t.Fatalf("101-byte record: %v", err)
		}
		short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancelShort()
		if _, err := recv.Recv(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Recv of an empty stream: %v", err)
		}
	})
}

// TestSampleTrainerGone: an actor blocked on a full queue fails at once when
// its trainer is reported lost, and with ErrPeerClosed when it closes.
func TestSampleTrainerGone(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		w := rolestest.World(t, 3, layout)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cfg := roles.SampleConfig{MaxRecordBytes: 100, QueueBytes: 256}
		lostRecv, err := roles.NewSampleReceiver(ctx, w.Bootstrap(0), "traj", cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer lostRecv.Close()
		closedRecv, err := roles.NewSampleReceiver(ctx, w.Bootstrap(1), "traj", cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer closedRecv.Close()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for trainer := range 2 {
			s, err := roles.DialSamples(ctx, w.Bootstrap(2), "traj", trainer)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			wg.Go(func() {
				for i := 0; ; i++ {
					if err := s.Push(ctx, roles.Record{Data: make([]byte, 48)}); err != nil {
						errs[trainer] = err
						return
					}
				}
			})
		}
		time.Sleep(50 * time.Millisecond)
		w.Lose(0, "exited with status 2")
		closedRecv.Close()
		wg.Wait()
		var lost *roles.LostError
		if !errors.As(errs[0], &lost) || !strings.Contains(errs[0].Error(), "roles: trainer rank 0 lost: exited with status 2") {
			t.Errorf("push to a lost trainer: %v", errs[0])
		}
		if !errors.Is(errs[1], roles.ErrPeerClosed) || !strings.Contains(errs[1].Error(), "trainer rank 1") {
			t.Errorf("push to a closed trainer: %v", errs[1])
		}
	})
}

// TestSamplePushAfterTrainerClose: a Push made after the trainer's Close
// returned fails with ErrPeerClosed, every time, rather than losing the record
// samplePair makes a sample receiver (rank 0) of cfg and a sender (rank 1)
// on a world of layout, both closed at the end of the test, as is the
// context.
func samplePair(t *testing.T, layout string, cfg roles.SampleConfig) (context.Context, *roles.SampleReceiver, *roles.SampleSender) {
	t.Helper()
	w := rolestest.World(t, 2, layout)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	recv, err := roles.NewSampleReceiver(ctx, w.Bootstrap(0), "traj", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { recv.Close() })
	s, err := roles.DialSamples(ctx, w.Bootstrap(1), "traj", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return ctx, recv, s
}

// without a word, though the sender still holds credit.
func TestSamplePushAfterTrainerClose(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		ctx, recv, s := samplePair(t, layout, roles.SampleConfig{MaxRecordBytes: 100})
		if err := s.Push(ctx, roles.Record{Version: 1, Data: record(1, 0, 40)}); err != nil {
			t.Fatal(err)
		}
		if rec, err := recv.Recv(ctx); err != nil || rec.Version != 1 {
			t.Fatalf("Recv: version %d, %v", rec.Version, err)
		}
		if err := recv.Close(); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			err := s.Push(ctx, roles.Record{Version: 2, Data: record(1, 1+i, 40)})
			if !errors.Is(err, roles.ErrPeerClosed) || !strings.Contains(err.Error(), "trainer rank 0") {
				t.Fatalf("Push %d after the trainer closed: %v", i, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	})
}
