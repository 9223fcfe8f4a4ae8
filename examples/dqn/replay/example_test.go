package replay_test

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/gear-rl/gear/examples/dqn/replay"
)

// A learner's round trip: insert with a priority, sample with probabilities,
// update priorities from TD errors.
func Example() {
	ctx := context.Background()
	table, err := replay.NewPrioritized(1000, 2, 1, rand.New(rand.NewPCG(3, 2)))
	if err != nil {
		panic(err)
	}
	obs, next := []float32{0, 0}, []float32{0, 0}
	for i, p := range []float64{1, 3} {
		obs[0] = float32(i)
		if _, err := table.Insert(ctx, replay.Transition{Obs: obs, Action: int32(i), Reward: 1, Discount: 0.99, NextObs: next}, p); err != nil {
			panic(err)
		}
	}
	batch := replay.NewBatch(4, 2)
	if err := table.Sample(ctx, batch); err != nil {
		panic(err)
	}
	for i, key := range batch.Keys {
		fmt.Printf("key %d  obs[0] %v  probability %.2f  of %d items\n", key, batch.Obs[2*i], batch.Probabilities[i], batch.TableSize)
	}
	// Key 1 now has priority 3, key 2 priority 1.
	if err := table.UpdatePriorities(ctx, []uint64{1, 2}, []float64{3, 1}); err != nil {
		panic(err)
	}
	if err := table.Sample(ctx, batch); err != nil {
		panic(err)
	}
	fmt.Printf("key %d  probability %.2f\n", batch.Keys[0], batch.Probabilities[0])
	// Output:
	// key 2  obs[0] 1  probability 0.75  of 2 items
	// key 2  obs[0] 1  probability 0.75  of 2 items
	// key 1  obs[0] 0  probability 0.25  of 2 items
	// key 2  obs[0] 1  probability 0.75  of 2 items
	// key 1  probability 0.75
}
