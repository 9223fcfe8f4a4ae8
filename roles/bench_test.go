package roles_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"
)

var benchLayouts = []struct{ name, layout string }{{"shm", rolestest.OneHost}, {"tcp", rolestest.EachAlone}}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkInferenceRoundTrip: one actor, batches of one: the time from Infer's
// call to its return, through the policy worker's Next and Reply.
func BenchmarkInferenceRoundTrip(b *testing.B) {
	for _, l := range benchLayouts {
		b.Run(l.name, func(b *testing.B) {
			w := rolestest.World(b, 2, l.layout)
			ctx := context.Background()
			srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", roles.InferenceConfig{ObsBytes: 256, ActBytes: 16, MaxBatch: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			pctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() { rolestest.ServePolicy(pctx, srv, func() uint64 { return 1 }, tagged) })
			defer func() { stop(); wg.Wait() }()
			c, err := roles.DialInference(ctx, w.Bootstrap(1), "pi", 0)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			roundTrips(b, ctx, c, 256)
		})
	}
}

// BenchmarkInferenceBatch: eight actors in a loop against one policy worker that
// batches them, each request carrying k observations: requests and
// observations per second, and the mean batch.
func BenchmarkInferenceBatch(b *testing.B) {
	const actors = 8
	for _, l := range benchLayouts {
		for _, k := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/actors=%d/k=%d", l.name, actors, k), func(b *testing.B) {
				w := rolestest.World(b, actors+1, l.layout)
				ctx := context.Background()
				srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", roles.InferenceConfig{ObsBytes: 256, ActBytes: 16, MaxBatch: actors * k, MaxRequestObs: k, MaxDelay: time.Millisecond})
				if err != nil {
					b.Fatal(err)
				}
				defer srv.Close()
				var batches atomic.Int64
				pctx, stop := context.WithCancel(ctx)
				var wg sync.WaitGroup
				wg.Go(func() {
					rolestest.ServePolicy(pctx, srv, func() uint64 { return uint64(batches.Add(1)) }, tagged)
				})
				defer func() { stop(); wg.Wait() }()
				clients := make([]*roles.InferenceClient, actors)
				for i := range clients {
					if clients[i], err = roles.DialInference(ctx, w.Bootstrap(i+1), "pi", 0); err != nil {
						b.Fatal(err)
					}
					defer clients[i].Close()
				}
				var next atomic.Int64
				b.ResetTimer()
				batches.Store(0)
				var g sync.WaitGroup
				for _, c := range clients {
					g.Go(func() {
						obs, act := make([]byte, 256*k), make([]byte, 16*k)
						for next.Add(1) <= int64(b.N) {
							if _, err := c.InferMany(ctx, obs, k, act); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				g.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
				b.ReportMetric(float64(b.N*k)/b.Elapsed().Seconds(), "observations/s")
				b.ReportMetric(float64(b.N)/float64(max(batches.Load(), 1)), "requests/batch")
			})
		}
	}
}

// BenchmarkParamPublish: the publisher's cost of making a version visible.
func BenchmarkParamPublish(b *testing.B) {
	for _, size := range []int{64 << 10, 4 << 20} {
		b.Run("bytes="+sizeName(size), func(b *testing.B) {
			w := rolestest.World(b, 1, rolestest.OneHost)
			ctx := context.Background()
			n := size / 4
			pub, err := roles.NewPublisher(ctx, w.Bootstrap(0), "theta", n)
			if err != nil {
				b.Fatal(err)
			}
			defer pub.Close()
			params := filled(n, 1)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := range b.N {
				if err := pub.Publish(ctx, uint64(i+1), params); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParamFetch: a reader taking a new version, over each transport (the
// publish before each fetch is not timed).
func BenchmarkParamFetch(b *testing.B) {
	for _, l := range benchLayouts {
		for _, size := range []int{64 << 10, 4 << 20} {
			b.Run(fmt.Sprintf("%s/bytes=%s", l.name, sizeName(size)), func(b *testing.B) {
				w := rolestest.World(b, 2, l.layout)
				ctx := context.Background()
				n := size / 4
				pub, r := paramPair(b, ctx, w, n, 1)
				params := filled(n, 1)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := range b.N {
					b.StopTimer()
					if err := pub.Publish(ctx, uint64(i+1), params); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if v, err := r.Latest(ctx); err != nil || v != uint64(i+1) {
						b.Fatalf("Latest: %d, %v", v, err)
					}
				}
			})
		}
	}
}

// BenchmarkSamplePush: one actor pushing trajectories to a trainer that drains
// them: bandwidth through the bounded queue.
func BenchmarkSamplePush(b *testing.B) {
	for _, l := range benchLayouts {
		for _, size := range []int{4 << 10, 256 << 10} {
			b.Run(fmt.Sprintf("%s/bytes=%s", l.name, sizeName(size)), func(b *testing.B) {
				w := rolestest.World(b, 2, l.layout)
				ctx := context.Background()
				recv, err := roles.NewSampleReceiver(ctx, w.Bootstrap(0), "traj", roles.SampleConfig{MaxRecordBytes: size})
				if err != nil {
					b.Fatal(err)
				}
				defer recv.Close()
				s, err := roles.DialSamples(ctx, w.Bootstrap(1), "traj", 0)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				var wg sync.WaitGroup
				wg.Go(func() {
					for range b.N {
						if _, err := recv.Recv(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
				data := make([]byte, size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := range b.N {
					if err := s.Push(ctx, roles.Record{Version: uint64(i), Data: data}); err != nil {
						b.Fatal(err)
					}
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
			})
		}
	}
}

// BenchmarkInferenceRoundTripProcess: as BenchmarkInferenceRoundTrip, with the
// policy worker in a child process, as in a job: the wake-ups cross processes.
func BenchmarkInferenceRoundTripProcess(b *testing.B) {
	for _, tc := range []struct {
		name string
		tr   roles.Transport
	}{{"shm", roles.TransportShm}, {"tcp", roles.TransportTCP}} {
		b.Run(tc.name, func(b *testing.B) {
			dir := b.TempDir()
			job := fmt.Sprintf("bench-rt-%d-%s", os.Getpid(), tc.name)
			b.Cleanup(func() { collectivetest.CheckNoSegments(b, job) })
			_, stop := startChildPolicy(b, dir, job, tc.tr, "serve")
			defer stop()
			ctx := context.Background()
			boot := &rolestest.DirBootstrap{Dir: dir, RankID: 1, WorldLen: 2, HostID: "host0", Job: job}
			c, err := roles.DialInference(ctx, boot, "pi", 0, roles.WithTransport(tc.tr))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			roundTrips(b, ctx, c, 16)
			stop()
			// The killed child could not remove its segment.
			for _, name := range collectivetest.Segments(job) {
				os.Remove("/dev/shm/" + name)
			}
		})
	}
}

// roundTrips times b.N inference round trips of c with observations of
// obsLen bytes, and reports microseconds per round trip.
func roundTrips(b *testing.B, ctx context.Context, c *roles.InferenceClient, obsLen int) {
	obs, act := make([]byte, obsLen), make([]byte, 16)
	b.ResetTimer()
	for range b.N {
		if _, err := c.Infer(ctx, obs, act); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/roundtrip")
}
