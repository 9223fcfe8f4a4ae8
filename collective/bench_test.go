package collective_test

import (
	"context"
	"fmt"
	"runtime"
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

// TestSmallAllReduceDoesNotAllocate: a small AllReduce over shared memory
// allocates nothing on any rank, for every reduction (TestKernelsAreMadeOnce
// covers the kernels on every transport). Calls that allocated made the garbage
// collector run in the middle of latency-bound loops (its workers then took the
// cores the ranks spin on). Under the race detector waits are slow enough to
// reach the paths that park (and allocate); the test runs without it.
func TestSmallAllReduceDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector slows the waits into the paths that park")
	}
	const calls = 2000
	comms, _ := collectivetest.Comms(t, 2, collectivetest.Config{Transport: collectivetest.Shm})
	run := func() {
		errs := collectivetest.Each(context.Background(), comms, func(ctx context.Context, c *collective.Comm) error {
			f32, i64 := make([]float32, 2), make([]int64, 1)
			for i := range calls {
				op := []collective.Op{collective.Sum, collective.Prod, collective.Min, collective.Max}[i%4]
				if err := collective.AllReduce(ctx, c, f32, op); err != nil {
					return err
				}
				if err := collective.AllReduce(ctx, c, i64, op); err != nil {
					return err
				}
			}
			return nil
		})
		if errs != nil {
			t.Fatal(errs)
		}
	}
	run() // warm up: pools, rings, kernels
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	run()
	runtime.ReadMemStats(&after)
	// Each allows the goroutines it starts a few allocations; the calls
	// themselves none.
	if n := after.Mallocs - before.Mallocs; n > 100 {
		t.Errorf("%d small AllReduce calls on 2 ranks made %d allocations (%.2f per call)", 2*2*calls, n, float64(n)/float64(4*calls))
	}
}
