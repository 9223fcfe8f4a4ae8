// Command obsjob is a small job for the tests of gearrun top and gearrun
// --trace: each rank owns a replay shard and its table; an actor goroutine
// inserts 400-byte rows, and the learner samples batches under a
// samples-per-insert rate limiter and averages a number with every rank
// (AllReduce) after each batch, so that the ranks' tables grow and their
// collective calls line up.
//
//	gearrun -np 4 --trace job.json obsjob -steps 50
//	gearrun -np 2 obsjob -duration 30s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

var (
	capacity *int
	failGen  int // rank 1 fails in generations below it
)

func main() {
	steps := flag.Int("steps", 0, "learner steps (sample and AllReduce) before the rank ends (0: until -duration)")
	duration := flag.Duration("duration", 30*time.Second, "how long the rank runs at most")
	batch := flag.Int("batch", 8, "items per sample")
	pace := flag.Duration("pace", time.Millisecond, "the actor's pause between inserts")
	capacity = flag.Int("capacity", 1<<15, "rows of each rank's shard (the table holds 64 fewer)")
	failGens := flag.Int("fail-generations", 0, "rank 1 exits with status 3 after its steps in the first N generations (GEAR_RESTART_COUNT < N)")
	flag.Parse()
	failGen = *failGens
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	if err := run(ctx, *steps, *batch, *pace); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "obsjob:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, steps, batch int, pace time.Duration) error {
	w, err := rank.Init(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	comm, err := w.CommContext(ctx)
	if err != nil {
		return err
	}
	spec := store.Spec{Capacity: *capacity, Remover: store.RemoverNone,
		Columns: []store.Column{{Name: "obs", DType: store.Float32, Shape: []int{100}, Length: 1}}}
	shard, err := store.CreateOrOpen(rank.SegmentName(w.JobID(), fmt.Sprintf("obsjob.replay.%d", w.Rank())), spec)
	if err != nil {
		return err
	}
	defer shard.Close()
	limit, err := sample.SampleToInsertRatio(4, 16, 64)
	if err != nil {
		return err
	}
	st, err := sample.NewShardTable(shard, sample.Config{Name: "replay", MaxSize: *capacity - 64,
		Sampler: sample.NewUniform(), Remover: sample.NewFIFO(), RateLimit: limit, Seed: uint64(w.Rank())})
	if err != nil {
		return err
	}
	defer st.Close()

	actx, stopActor := context.WithCancel(ctx)
	actorDone := make(chan error, 1)
	go func() { actorDone <- act(actx, st, pace) }()
	defer func() { stopActor(); <-actorDone }()

	b := &sample.Batch{}
	defer b.Release()
	buf := []float64{0}
	for i := 0; steps == 0 || i < steps; i++ {
		if err := st.SampleInto(ctx, b, batch); err != nil {
			return err
		}
		buf[0] = float64(len(b.Items))
		if err := collective.AllReduce(ctx, comm, buf, collective.Sum); err != nil {
			return err
		}
	}
	if err := comm.Barrier(ctx); err != nil {
		return err
	}
	if w.Rank() == 1 && w.RestartCount() < failGen {
		fmt.Fprintf(os.Stderr, "obsjob: rank 1 fails in generation %d\n", w.RestartCount())
		os.Exit(3)
	}
	return nil
}

// act inserts rows until ctx ends.
func act(ctx context.Context, st *sample.ShardTable, pace time.Duration) error {
	for key := uint64(0); ; key++ {
		_, err := st.Insert(ctx, key, 1, func(p store.Pending) error {
			row := p.Block(0)
			for i := range row {
				row[i] = byte(key)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if pace > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pace):
			}
		}
	}
}
