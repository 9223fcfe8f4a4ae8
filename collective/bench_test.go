package collective_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
)

// BenchmarkAllReduce runs AllReduce (float32, sum) between goroutine ranks of this
// process over each transport. gearbench measures separate processes; this one is
// for quick comparisons while changing the code. SetBytes is the buffer size, so
// MB/s is the algorithm bandwidth.
func BenchmarkAllReduce(b *testing.B) {
	for _, tr := range []string{collectivetest.Shm, collectivetest.TCP, collectivetest.Loopback} {
		for _, np := range []int{2, 4} {
			comms, _ := collectivetest.Comms(b, np, collectivetest.Config{Transport: tr})
			for _, size := range []int{8, 1 << 10, 64 << 10, 1 << 20, 16 << 20} {
				b.Run(fmt.Sprintf("%s/np=%d/bytes=%d", tr, np, size), func(b *testing.B) {
					b.SetBytes(int64(size))
					n := b.N
					errs := collectivetest.Each(context.Background(), comms, func(ctx context.Context, c *collective.Comm) error {
						buf := make([]float32, size/4)
						for range n {
							if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
								return err
							}
						}
						return nil
					})
					if errs != nil {
						b.Fatal(errs)
					}
				})
			}
		}
	}
}
