package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// BenchmarkInsert measures Allocate, copy, Commit in one goroutine, into a shard
// that is full (every insert evicts the oldest row) or kept empty (the row is
// released right away).
func BenchmarkInsert(b *testing.B) {
	for _, size := range []int{400, 4 << 10, 64 << 10, 1 << 20} {
		for _, mode := range []string{"evict", "release"} {
			b.Run(fmt.Sprintf("bytes=%d/%s", size, mode), func(b *testing.B) {
				capacity := max((64<<20)/((size+63)&^63), 64)
				s := storetest.Create(b, store.Spec{Capacity: capacity, Columns: []store.Column{
					{Name: "data", DType: store.Uint8, Shape: []int{size}, Length: 1},
				}})
				src := make([]byte, size)
				ctx := context.Background()
				put := func() store.Ref {
					p, err := s.Allocate(ctx)
					if err != nil {
						b.Fatal(err)
					}
					copy(p.Block(0), src)
					ref, err := p.Commit(1)
					if err != nil {
						b.Fatal(err)
					}
					return ref
				}
				if mode == "evict" {
					for range capacity {
						put()
					}
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					ref := put()
					if mode == "release" {
						if err := s.Release(ref); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
			})
		}
	}
}
