package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
)

// The shared suite: every collective, element type, reduction and size, over every
// transport and world size, against a serial reference. Inputs are small integers
// (in every element type), so that every reduction order gives the exact result.

var worldSizes = []int{1, 2, 3, 4, 7}

var allOps = []collective.Op{collective.Sum, collective.Prod, collective.Min, collective.Max}

// tunings: the defaults, and tiny chunks with every algorithm switched to its
// large-message form, so that small buffers cross many frames, wrap around the
// shared-memory rings and fill them.
func tunings() map[string]collective.Tuning {
	tiny := collective.DefaultTuning()
	tiny.ChunkBytes = 256
	tiny.RingBytes = 1408
	tiny.SmallAllReduce = 0
	tiny.SmallBroadcast = 0
	return map[string]collective.Tuning{"default": collective.DefaultTuning(), "tiny": tiny}
}

// counts: zero, one, odd, not divisible by the world size, and (default tuning)
// many chunks.
func counts(n int, tuning string) []int {
	if tuning == "tiny" {
		return []int{0, 1, 13, 100*n + 1, 3001}
	}
	return []int{0, 1, 13, 1000*n + 1, manyCount}
}

type rankFunc = func(ctx context.Context, c *collective.Comm) error

// caseList returns every (name, rank function) of the matrix for one world size
// and one count.
func caseList(n, count int) []struct {
	name string
	fn   rankFunc
} {
	var out []struct {
		name string
		fn   rankFunc
	}
	add := func(name string, fn rankFunc) {
		out = append(out, struct {
			name string
			fn   rankFunc
		}{name, fn})
	}
	numeric[float32](add, n, count, allReduceCase[float32], reduceCase[float32], reduceScatterCase[float32])
	numeric[float64](add, n, count, allReduceCase[float64], reduceCase[float64], reduceScatterCase[float64])
	numeric[int32](add, n, count, allReduceCase[int32], reduceCase[int32], reduceScatterCase[int32])
	numeric[int64](add, n, count, allReduceCase[int64], reduceCase[int64], reduceScatterCase[int64])
	moving[byte](add, n, count)
	moving[float32](add, n, count)
	moving[float64](add, n, count)
	moving[int32](add, n, count)
	moving[int64](add, n, count)
	add("Barrier", func(ctx context.Context, c *collective.Comm) error { return c.Barrier(ctx) })
	return out
}

func numeric[T collective.Number](add func(string, rankFunc), n, count int,
	ar func(int, collective.Op) rankFunc, red func(int, collective.Op, int) rankFunc, rs func(int, collective.Op) rankFunc) {
	tn := collectivetest.TypeName[T]()
	for _, op := range allOps {
		add(fmt.Sprintf("AllReduce/%s/%v", tn, op), ar(count, op))
		add(fmt.Sprintf("ReduceScatter/%s/%v", tn, op), rs(count, op))
		for _, root := range roots(n) {
			add(fmt.Sprintf("Reduce/%s/%v/root=%d", tn, op, root), red(count, op, root))
		}
	}
}

func moving[T collective.Elem](add func(string, rankFunc), n, count int) {
	tn := collectivetest.TypeName[T]()
	for _, root := range roots(n) {
		add(fmt.Sprintf("Broadcast/%s/root=%d", tn, root), broadcastCase[T](count, root))
		add(fmt.Sprintf("Gather/%s/root=%d", tn, root), gatherCase[T](count, root))
		add(fmt.Sprintf("Scatter/%s/root=%d", tn, root), scatterCase[T](count, root))
	}
	add(fmt.Sprintf("AllGather/%s", tn), allGatherCase[T](count))
	add(fmt.Sprintf("AllGather/%s/in-place", tn), allGatherInPlaceCase[T](count))
	add(fmt.Sprintf("AllToAll/%s", tn), allToAllCase[T](count))
	add(fmt.Sprintf("SendRecv/%s", tn), sendRecvCase[T](count))
}

func roots(n int) []int {
	if n == 1 {
		return []int{0}
	}
	return []int{0, n - 1}
}

func allReduceCase[T collective.Number](count int, op collective.Op) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		buf := make([]T, count)
		collectivetest.Fill(buf, c.Rank(), 0)
		if err := collective.AllReduce(ctx, c, buf, op); err != nil {
			return err
		}
		return collectivetest.Compare("AllReduce", buf, collectivetest.References[T](c.Size(), op))
	}
}

func reduceCase[T collective.Number](count int, op collective.Op, root int) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		buf := make([]T, count)
		collectivetest.Fill(buf, c.Rank(), 0)
		if err := collective.Reduce(ctx, c, buf, op, root); err != nil {
			return err
		}
		if c.Rank() == root {
			return collectivetest.Compare("Reduce at root", buf, collectivetest.References[T](c.Size(), op))
		}
		return collectivetest.Compare("Reduce elsewhere (unchanged)", buf, collectivetest.Inputs[T](c.Rank()))
	}
}

func reduceScatterCase[T collective.Number](count int, op collective.Op) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		send := make([]T, count*c.Size())
		collectivetest.Fill(send, c.Rank(), 0)
		recv := make([]T, count)
		if err := collective.ReduceScatter(ctx, c, send, recv, op); err != nil {
			return err
		}
		ref := collectivetest.References[T](c.Size(), op)
		return collectivetest.Compare("ReduceScatter", recv, func(i int) T { return ref(c.Rank()*count + i) })
	}
}

func broadcastCase[T collective.Elem](count, root int) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		buf := make([]T, count)
		collectivetest.Fill(buf, c.Rank(), 0)
		if err := collective.Broadcast(ctx, c, buf, root); err != nil {
			return err
		}
		return collectivetest.Compare("Broadcast", buf, collectivetest.Inputs[T](root))
	}
}

func allGatherCase[T collective.Elem](count int) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		send := make([]T, count)
		collectivetest.Fill(send, c.Rank(), 0)
		recv := make([]T, count*c.Size())
		if err := collective.AllGather(ctx, c, send, recv); err != nil {
			return err
		}
		return collectivetest.Compare("AllGather", recv, func(i int) T { return collectivetest.Input[T](i/max(count, 1), i%max(count, 1)) })
	}
}

func allGatherInPlaceCase[T collective.Elem](count int) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		recv := make([]T, count*c.Size())
		own := recv[c.Rank()*count : (c.Rank()+1)*count]
		collectivetest.Fill(own, c.Rank(), 0)
		if err := collective.AllGather(ctx, c, own, recv); err != nil {
			return err
		}
		return collectivetest.Compare("AllGather in place", recv, func(i int) T { return collectivetest.Input[T](i/max(count, 1), i%max(count, 1)) })
	}
}

func gatherCase[T collective.Elem](count, root int) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		send := make([]T, count)
		collectivetest.Fill(send, c.Rank(), 0)
		var recv []T
		if c.Rank() == root {
			recv = make([]T, count*c.Size())
		}
		if err := collective.Gather(ctx, c, send, recv, root); err != nil {
			return err
		}
		return collectivetest.Compare("Gather", recv, func(i int) T { return collectivetest.Input[T](i/max(count, 1), i%max(count, 1)) })
	}
}

func scatterCase[T collective.Elem](count, root int) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		var send []T
		if c.Rank() == root {
			send = make([]T, count*c.Size())
			collectivetest.Fill(send, root, 0)
		}
		recv := make([]T, count)
		if err := collective.Scatter(ctx, c, send, recv, root); err != nil {
			return err
		}
		in := collectivetest.Inputs[T](root)
		return collectivetest.Compare("Scatter", recv, func(i int) T { return in(c.Rank()*count + i) })
	}
}

func allToAllCase[T collective.Elem](count int) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		n := c.Size()
		send := make([]T, count*n)
		collectivetest.Fill(send, c.Rank(), 0)
		recv := make([]T, count*n)
		if err := collective.AllToAll(ctx, c, send, recv); err != nil {
			return err
		}
		// Block j of recv is block (this rank) of rank j's send.
		return collectivetest.Compare("AllToAll", recv, func(i int) T {
			j, k := i/max(count, 1), i%max(count, 1)
			return collectivetest.Input[T](j, c.Rank()*count+k)
		})
	}
}

// sendRecvCase passes a message around the ring in both directions at once, with
// two tags received in the opposite order of sending.
func sendRecvCase[T collective.Elem](count int) rankFunc {
	return func(ctx context.Context, c *collective.Comm) error {
		n, r := c.Size(), c.Rank()
		if n == 1 {
			return nil
		}
		right, left := (r+1)%n, (r+n-1)%n
		a := make([]T, count)
		b := make([]T, count+1)
		collectivetest.Fill(a, r, 0)
		collectivetest.Fill(b, r, 100)
		if err := collective.Send(ctx, c, a, right, 1); err != nil {
			return err
		}
		if err := collective.Send(ctx, c, b, left, 2); err != nil {
			return err
		}
		gotB := make([]T, count+1)
		if err := collective.Recv(ctx, c, gotB, right, 2); err != nil {
			return err
		}
		gotA := make([]T, count)
		if err := collective.Recv(ctx, c, gotA, left, 1); err != nil {
			return err
		}
		if err := collectivetest.Compare("Recv tag 1", gotA, func(i int) T { return collectivetest.Input[T](left, i) }); err != nil {
			return err
		}
		return collectivetest.Compare("Recv tag 2", gotB, func(i int) T { return collectivetest.Input[T](right, 100+i) })
	}
}

func TestCollectives(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		for tname, tuning := range tunings() {
			for _, n := range worldSizes {
				t.Run(fmt.Sprintf("%s/%s/np=%d", tr, tname, n), func(t *testing.T) {
					tuning := tuning
					comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: tr, Tuning: &tuning})
					for _, count := range counts(n, tname) {
						for _, tc := range caseList(n, count) {
							errs := collectivetest.Each(context.Background(), comms, tc.fn)
							if errs != nil {
								for r, err := range errs {
									if err != nil {
										t.Errorf("%s count=%d: rank %d: %v", tc.name, count, r, err)
									}
								}
								t.FailNow()
							}
						}
					}
				})
			}
		}
	}
}

// TestBig moves bigBytes buffers through the representative collectives.
func TestBig(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/np=%d", tr, n), func(t *testing.T) {
				comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: tr})
				count := bigBytes / 4
				for _, tc := range []struct {
					name string
					fn   rankFunc
				}{
					{"AllReduce/float32/sum", allReduceCase[float32](count, collective.Sum)},
					{"Broadcast/float32", broadcastCase[float32](count, n-1)},
					{"AllGather/float32", allGatherCase[float32](count / n)},
					{"ReduceScatter/float32/sum", reduceScatterCase[float32](count/n, collective.Sum)},
					{"AllToAll/float32", allToAllCase[float32](count / n)},
				} {
					if errs := collectivetest.Each(context.Background(), comms, tc.fn); errs != nil {
						t.Fatalf("%s: %v", tc.name, errs)
					}
				}
			})
		}
	}
}

// TestBitwiseEqual: reductions of arbitrary floats, whose result depends on the
// order of the additions, still give every rank the same bits.
func TestBitwiseEqual(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		for _, n := range []int{3, 4, 7} {
			t.Run(fmt.Sprintf("%s/np=%d", tr, n), func(t *testing.T) {
				comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: tr})
				for _, count := range []int{7, 5000, 70001} {
					results := make([][]float64, n)
					collectivetest.Each(context.Background(), comms, func(ctx context.Context, c *collective.Comm) error {
						rng := rand.New(rand.NewPCG(uint64(c.Rank()), 9))
						buf := make([]float64, count)
						for i := range buf {
							buf[i] = rng.NormFloat64() * math.Pow(10, float64(rng.IntN(12)))
						}
						err := collective.AllReduce(ctx, c, buf, collective.Sum)
						results[c.Rank()] = buf
						return err
					})
					for r := 1; r < n; r++ {
						for i := range results[0] {
							if math.Float64bits(results[r][i]) != math.Float64bits(results[0][i]) {
								t.Fatalf("count %d: rank %d element %d is %v, rank 0 has %v", count, r, i, results[r][i], results[0][i])
							}
						}
					}
				}
			})
		}
	}
}

// TestHierarchical: ranks on two and three hosts (shared memory within, TCP
// across) take the hierarchical AllReduce, and still agree with the reference.
func TestHierarchical(t *testing.T) {
	for _, hosts := range [][]string{
		{"a", "a", "b", "b"},
		{"a", "b", "a", "b", "c", "a", "c"},
	} {
		n := len(hosts)
		for _, tr := range []string{collectivetest.Auto, collectivetest.Loopback} {
			t.Run(fmt.Sprintf("%s/np=%d", tr, n), func(t *testing.T) {
				comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: tr, Hosts: hosts})
				if got := comms[0].Hosts(); len(got) != len(slices.Compact(slices.Sorted(slices.Values(hosts)))) {
					t.Fatalf("Hosts() = %v", got)
				}
				for _, count := range []int{0, 1, 13, 1000*n + 1, manyCount} {
					for _, op := range allOps {
						if errs := collectivetest.Each(context.Background(), comms, allReduceCase[int64](count, op)); errs != nil {
							t.Fatalf("count %d %v: %v", count, op, errs)
						}
					}
				}
				if errs := collectivetest.Each(context.Background(), comms, allReduceCase[float32](bigBytes/4, collective.Sum)); errs != nil {
					t.Fatal(errs)
				}
			})
		}
	}
}

// TestSplit: communicators split from the world, used at the same time as the
// world and as each other, from goroutines of every rank.
func TestSplit(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		t.Run(tr, func(t *testing.T) {
			const n = 7
			collectivetest.Run(t, n, collectivetest.Config{Transport: tr}, func(ctx context.Context, c *collective.Comm) error {
				// Odd and even ranks, each group ranked in reverse.
				sub, err := c.Split(ctx, c.Rank()%2, -c.Rank())
				if err != nil {
					return err
				}
				defer sub.Close()
				wantSize := (n + 1 - c.Rank()%2) / 2
				if sub.Size() != wantSize {
					return fmt.Errorf("sub size %d, want %d", sub.Size(), wantSize)
				}
				if sub.WorldRank(sub.Rank()) != c.Rank() {
					return fmt.Errorf("sub rank %d maps to world rank %d, want %d", sub.Rank(), sub.WorldRank(sub.Rank()), c.Rank())
				}
				// A second split: rank 0 alone is left out.
				color := 0
				if c.Rank() == 0 {
					color = collective.Undefined
				}
				rest, err := c.Split(ctx, color, 0)
				if err != nil {
					return err
				}
				if (rest == nil) != (c.Rank() == 0) {
					return fmt.Errorf("rank %d: Split with color %d gave %v", c.Rank(), color, rest)
				}
				if rest != nil {
					defer rest.Close()
				}
				var wg sync.WaitGroup
				errs := make([]error, 3)
				run := func(i int, comm *collective.Comm) {
					defer wg.Done()
					for it := range 20 {
						buf := make([]int64, 1000+it*997)
						for j := range buf {
							buf[j] = int64(comm.WorldRank(comm.Rank()) + j)
						}
						if err := collective.AllReduce(ctx, comm, buf, collective.Sum); err != nil {
							errs[i] = err
							return
						}
						var sumRanks int64
						for r := range comm.Size() {
							sumRanks += int64(comm.WorldRank(r))
						}
						for j, v := range buf {
							if want := sumRanks + int64(comm.Size()*j); v != want {
								errs[i] = fmt.Errorf("communicator %d iteration %d: element %d is %d, want %d", i, it, j, v, want)
								return
							}
						}
					}
				}
				wg.Add(2)
				go run(0, c)
				go run(1, sub)
				if rest != nil {
					wg.Add(1)
					go run(2, rest)
				}
				wg.Wait()
				return errors.Join(errs...)
			})
		})
	}
}

// TestP2PAmongCollectives: messages sent before a collective are received after
// it, and large messages sent both ways at once do not deadlock.
func TestP2PAmongCollectives(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		t.Run(tr, func(t *testing.T) {
			tuning := collective.DefaultTuning()
			collectivetest.Run(t, 2, collectivetest.Config{Transport: tr, Tuning: &tuning}, func(ctx context.Context, c *collective.Comm) error {
				peer := 1 - c.Rank()
				msg := make([]int32, 50000)
				collectivetest.Fill(msg, c.Rank(), 0)
				if c.Rank() == 0 {
					if err := collective.Send(ctx, c, msg, peer, 7); err != nil {
						return err
					}
				}
				buf := make([]float32, 3000)
				collectivetest.Fill(buf, c.Rank(), 0)
				if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
					return err
				}
				if err := collectivetest.Compare("AllReduce", buf, func(i int) float32 { return collectivetest.Reference[float32](2, i, collective.Sum) }); err != nil {
					return err
				}
				if c.Rank() == 1 {
					got := make([]int32, len(msg))
					if err := collective.Recv(ctx, c, got, peer, 7); err != nil {
						return err
					}
					if err := collectivetest.Compare("Recv", got, func(i int) int32 { return collectivetest.Input[int32](0, i) }); err != nil {
						return err
					}
				}
				// Both send 4 MiB first, then receive: far more than a ring holds.
				big := make([]byte, 4<<20)
				collectivetest.Fill(big, c.Rank(), 0)
				if err := collective.Send(ctx, c, big, peer, 1); err != nil {
					return err
				}
				got := make([]byte, len(big))
				if err := collective.Recv(ctx, c, got, peer, 1); err != nil {
					return err
				}
				return collectivetest.Compare("Recv big", got, func(i int) byte { return collectivetest.Input[byte](peer, i) })
			})
		})
	}
}
