package sample

import (
	"context"
	"testing"
)

// BenchmarkTableInsert inserts into a full table of 64Ki items (every insert
// stamps the item with the table's clock and evicts the oldest), with the wall
// clock: the path whose cost the clock adds to.
func BenchmarkTableInsert(b *testing.B) {
	const n = 1 << 16
	tb, err := NewTable(Config{Name: "bench", MaxSize: n, Sampler: NewUniform(), Remover: NewFIFO(), Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer tb.Close()
	ctx := context.Background()
	b.ReportAllocs()
	k := uint64(0)
	for b.Loop() {
		if err := tb.Insert(ctx, k, 1, k); err != nil {
			b.Fatal(err)
		}
		k++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
}
