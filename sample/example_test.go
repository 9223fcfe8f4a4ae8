package sample_test

import (
	"context"
	"fmt"

	"github.com/gear-rl/gear/sample"
)

// A table with FIFO selectors, max_times_sampled 1 and a Queue limiter is a queue:
// the fourth insert would wait for a sample, and items come out in order.
func ExampleQueue() {
	ctx := context.Background()
	q, err := sample.NewTable(sample.Config{
		Name: "queue", MaxSize: 3,
		Sampler: sample.NewFIFO(), Remover: sample.NewFIFO(),
		MaxTimesSampled: 1, RateLimit: sample.Queue(3),
	})
	if err != nil {
		panic(err)
	}
	defer q.Close()
	for key := range uint64(3) {
		if err := q.Insert(ctx, key, 1, 0); err != nil {
			panic(err)
		}
	}
	fmt.Println("can insert a 4th:", q.Info().Limiter.CanInsert)
	batch, err := q.Sample(ctx, 10) // a flexible batch: all three
	if err != nil {
		panic(err)
	}
	for _, s := range batch {
		fmt.Println(s.Key, s.Deleted)
	}
	// Output:
	// can insert a 4th: false
	// 0 true
	// 1 true
	// 2 true
}

// Prioritized sampling returns each pick's probability p^c / sum p^c.
func ExampleNewPrioritized() {
	ctx := context.Background()
	p, _ := sample.NewPrioritized(1)
	t, _ := sample.NewTable(sample.Config{Name: "per", MaxSize: 10, Sampler: p, Remover: sample.NewFIFO(), Seed: 1})
	defer t.Close()
	_ = t.Insert(ctx, 7, 3, 0)
	_ = t.Insert(ctx, 8, 1, 0)
	_ = t.Insert(ctx, 9, 0, 0) // never sampled
	batch, _ := t.Sample(ctx, 1000)
	counts := map[uint64]int{}
	prob := map[uint64]float64{}
	for _, s := range batch {
		counts[s.Key]++
		prob[s.Key] = s.Probability
	}
	fmt.Printf("key 7: p=%.2f, key 8: p=%.2f, key 9 sampled %d times\n", prob[7], prob[8], counts[9])
	// Output:
	// key 7: p=0.75, key 8: p=0.25, key 9 sampled 0 times
}
