package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/gmi"
)

// Layout-aware reduction: the three strategies of GMI-DRL section 4.1 on
// virtual GPUs (mappings with no device behind them), in process over every
// transport, against the serial reference; the device path against a device
// of Go memory (layout_device_test.go); failures. The same with real
// processes, the mapping set by the launcher from a topology file, is
// TestProcessLayout; the device path on CUDA and NCCL is tested in package
// github.com/gear-rl/gear/collective/nccl.

var layoutMappings = []struct {
	name string
	m    gmi.Mapping
}{
	{"2x3", gmi.Mapping{{0, 1, 2}, {3, 4, 5}}},
	{"3x2", gmi.Mapping{{0, 1}, {2, 3}, {4, 5}}},
	{"2x2", gmi.Mapping{{0, 1}, {2, 3}}},
	{"uneven-3-2", gmi.Mapping{{0, 1, 2}, {3, 4}}},
	{"uneven-1-3", gmi.Mapping{{0}, {1, 2, 3}}},
	{"uneven-2-1-3", gmi.Mapping{{0, 1}, {2}, {3, 4, 5}}},
	{"one-gpu", gmi.Mapping{{0, 1, 2}}},
	{"one-per-gpu", gmi.Mapping{{0}, {1}, {2}, {3}}},
	{"interleaved", gmi.Mapping{{0, 3}, {1, 4}, {2, 5}}},
	{"one-rank", gmi.Mapping{{0}}},
}

// strategies: "" is Algorithm 1's choice.
var layoutStrategies = []gmi.Strategy{"", gmi.MultiProcess, gmi.MultiRing, gmi.Hierarchical}

func strategyName(s gmi.Strategy) string {
	if s == "" {
		return "auto"
	}
	return string(s)
}

func layoutsOf(t *testing.T, comms []*collective.Comm, m gmi.Mapping, opts ...collective.LayoutOption) []*collective.Layout {
	t.Helper()
	ls, errs := collectivetest.BuildLayouts(t, comms, func(int) gmi.Mapping { return m }, func(int) []collective.LayoutOption { return opts })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: NewLayout: %v", r, err)
		}
	}
	return ls
}

func TestLayoutStrategies(t *testing.T) {
	tiny := tunings()["tiny"]
	for _, tr := range collectivetest.Transports {
		for _, mc := range layoutMappings {
			for _, s := range layoutStrategies {
				if tr != collectivetest.Loopback && mc.name != "2x3" && mc.name != "3x2" && mc.name != "uneven-3-2" {
					continue // the whole matrix on loopback; three layouts on the others
				}
				t.Run(fmt.Sprintf("%s/%s/%s", tr, mc.name, strategyName(s)), func(t *testing.T) {
					n := mc.m.GMIs()
					comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: tr, Tuning: &tiny})
					var opts []collective.LayoutOption
					if s != "" {
						opts = append(opts, collective.WithStrategy(s))
					}
					if s == gmi.MultiRing && !collectivetest.EvenRows(mc.m) {
						_, errs := collectivetest.BuildLayouts(t, comms, func(int) gmi.Mapping { return mc.m }, func(int) []collective.LayoutOption { return opts })
						for r, err := range errs {
							if err == nil || !strings.Contains(err.Error(), "multi-ring needs the same number on every GPU") {
								t.Errorf("rank %d: multi-ring on an uneven layout: %v", r, err)
							}
						}
						return
					}
					ls := layoutsOf(t, comms, mc.m, opts...)
					want := s
					if s == "" {
						want = gmi.ChooseStrategy(mc.m)
					}
					sched, err := gmi.ReductionSchedule(mc.m, want)
					if err != nil {
						t.Fatal(err)
					}
					for r, l := range ls {
						if l.Strategy() != want || l.Mapping().String() != mc.m.String() || len(l.Schedule().Steps) != len(sched.Steps) || l.NCCL() {
							t.Fatalf("rank %d: strategy %s, mapping %s, %d steps, NCCL %v; want %s, %s, %d steps, no NCCL",
								r, l.Strategy(), l.Mapping(), len(l.Schedule().Steps), l.NCCL(), want, mc.m, len(sched.Steps))
						}
					}
					for _, count := range []int{0, 1, 13, 100*n + 1, 3001} {
						collectivetest.EachLayout(t, ls, collectivetest.LayoutCase[float64](count, collective.Sum))
					}
					collectivetest.EachLayout(t, ls, collectivetest.LayoutCase[float32](77, collective.Prod))
					collectivetest.EachLayout(t, ls, collectivetest.LayoutCase[int32](1001, collective.Max))
					collectivetest.EachLayout(t, ls, collectivetest.LayoutCase[int64](5, collective.Min))
				})
			}
		}
	}
}

// The schedule's reference: gmi.Simulate of the schedule on the same inputs
// gives what the layout gives, and every rank ends with the same bits, for
// floats whose sum depends on the order of the additions.
func TestLayoutMatchesSimulate(t *testing.T) {
	for _, mc := range layoutMappings[:6] {
		for _, s := range []gmi.Strategy{gmi.MultiProcess, gmi.MultiRing, gmi.Hierarchical} {
			if s == gmi.MultiRing && !collectivetest.EvenRows(mc.m) {
				continue
			}
			t.Run(mc.name+"/"+string(s), func(t *testing.T) {
				n := mc.m.GMIs()
				comms, _ := collectivetest.Comms(t, n, collectivetest.Config{Transport: collectivetest.Shm})
				ls := layoutsOf(t, comms, mc.m, collective.WithStrategy(s))
				const count = 5000
				inputs := make([][]float64, n)
				for r := range inputs {
					rng := rand.New(rand.NewPCG(uint64(r), 3))
					inputs[r] = make([]float64, count)
					for i := range inputs[r] {
						inputs[r][i] = rng.NormFloat64() * math.Pow(10, float64(rng.IntN(12)))
					}
				}
				results := make([][]float64, n)
				collectivetest.EachLayout(t, ls, func(ctx context.Context, l *collective.Layout, r int) error {
					results[r] = slices.Clone(inputs[r])
					return collective.LayoutAllReduce(ctx, l, results[r], collective.Sum)
				})
				sim, err := gmi.Simulate(ls[0].Schedule(), inputs)
				if err != nil {
					t.Fatal(err)
				}
				exact := make([]float64, count) // in rank order, for the tolerance
				for r := range inputs {
					for i, x := range inputs[r] {
						exact[i] += x
					}
				}
				for r := range n {
					for i := range results[r] {
						if math.Float64bits(results[r][i]) != math.Float64bits(results[0][i]) {
							t.Fatalf("rank %d element %d is %v, rank 0 has %v", r, i, results[r][i], results[0][i])
						}
						if d := math.Abs(results[r][i] - sim[r][i]); d > 1e-9*math.Abs(exact[i])+1e-300 && d > 1e-3 {
							t.Fatalf("rank %d element %d is %v, the simulated schedule gives %v", r, i, results[r][i], sim[r][i])
						}
					}
				}
			})
		}
	}
}

// A layout over a communicator of some of the world's ranks: the mapping lists
// world ranks (as GEAR_GMI_LAYOUT does for an MPMD group), and errors name ranks
// of that communicator.
func TestLayoutOfSplit(t *testing.T) {
	comms, w := collectivetest.Comms(t, 8, collectivetest.Config{Transport: collectivetest.Shm})
	subs := make([]*collective.Comm, 8)
	t.Cleanup(func() { collectivetest.CloseAll(subs) })
	collectivetest.EachRank(t, 8, func(ctx context.Context, r int) error {
		var err error
		subs[r], err = comms[r].Split(ctx, min(r/2, 1), r) // {0,1} and {2,...,7}
		return err
	})
	learners := subs[2:]
	m := gmi.Mapping{{2, 3, 4}, {5, 6, 7}}
	ls := layoutsOf(t, learners, m)
	if ls[0].Strategy() != gmi.Hierarchical {
		t.Fatalf("strategy %s", ls[0].Strategy())
	}
	collectivetest.EachLayout(t, ls, collectivetest.LayoutCase[float32](1000, collective.Sum))
	// World rank 6 dies while the others reduce: every other learner gets
	// *LostError naming rank 4 of the learners' communicator (world rank 6).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, 6)
	var wg sync.WaitGroup
	for r, l := range ls {
		if r != 4 {
			wg.Go(func() { errs[r] = collective.LayoutAllReduce(ctx, l, make([]float32, 10), collective.Sum) })
		}
	}
	time.Sleep(20 * time.Millisecond)
	w.Lose(6, "killed")
	wg.Wait()
	for r, err := range errs {
		if r == 4 {
			continue
		}
		var le *collective.LostError
		if !errors.As(err, &le) || le.Rank != 4 || le.WorldRank != 6 {
			t.Errorf("learner %d: %v, want rank 4 (world rank 6) lost", r, err)
		}
	}
	if err := ls[0].Err(); !errors.Is(err, collective.ErrRankLost) {
		t.Errorf("Err() = %v", err)
	}
	// The layout of a mapping that does not name the communicator's ranks.
	_, berrs := collectivetest.BuildLayouts(t, subs[:2], func(int) gmi.Mapping { return gmi.Mapping{{0}, {2}} }, func(int) []collective.LayoutOption { return nil })
	for r, err := range berrs {
		if err == nil || !strings.Contains(err.Error(), "names world ranks [0 2], but the communicator's ranks are world ranks [0 1]") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestLayoutFromEnv(t *testing.T) {
	comms, _ := collectivetest.Comms(t, 6, collectivetest.Config{})
	t.Setenv(gmi.EnvGMILayout, "[[0,1],[2,3],[4,5]]")
	ls := make([]*collective.Layout, 6)
	collectivetest.EachRank(t, 6, func(ctx context.Context, r int) (err error) {
		ls[r], err = collective.LayoutFromEnv(ctx, comms[r])
		return err
	})
	for _, l := range ls {
		defer l.Close()
	}
	if ls[0].Strategy() != gmi.MultiRing || ls[0].Mapping().String() != "[[0,1],[2,3],[4,5]]" {
		t.Fatalf("from %s: %s, %s", gmi.EnvGMILayout, ls[0].Strategy(), ls[0].Mapping())
	}
	collectivetest.EachLayout(t, ls, collectivetest.LayoutCase[int64](50, collective.Sum))

	t.Setenv(gmi.EnvGMILayout, "")
	collectivetest.EachRank(t, 6, func(ctx context.Context, r int) (err error) {
		l, err := collective.LayoutFromEnv(ctx, comms[r])
		if err != nil {
			return err
		}
		defer l.Close()
		if l.Strategy() != gmi.MultiProcess || l.Mapping().String() != "[[0,1,2,3,4,5]]" {
			return fmt.Errorf("without a layout: %s, %s", l.Strategy(), l.Mapping())
		}
		return collectivetest.LayoutCase[float32](9, collective.Max)(ctx, l, r)
	})

	t.Setenv(gmi.EnvGMILayout, "[[0,1],[2,3],[4]]")
	collectivetest.EachRank(t, 6, func(ctx context.Context, r int) error {
		_, err := collective.LayoutFromEnv(ctx, comms[r])
		if err == nil || !strings.Contains(err.Error(), "names world ranks [0 1 2 3 4], but the communicator's ranks are world ranks [0 1 2 3 4 5]") {
			return fmt.Errorf("a layout of 5 ranks on 6: %v", err)
		}
		return nil
	})
	t.Setenv(gmi.EnvGMILayout, "[[0,1],[2,3],[4,x]]")
	collectivetest.EachRank(t, 6, func(ctx context.Context, r int) error {
		_, err := collective.LayoutFromEnv(ctx, comms[r])
		if err == nil || !strings.HasPrefix(err.Error(), "collective: GEAR_GMI_LAYOUT: gmi: mapping") {
			return fmt.Errorf("an unreadable layout: %v", err)
		}
		return nil
	})
}

// Ranks that build different layouts all fail, naming both.
func TestLayoutDisagreement(t *testing.T) {
	comms, _ := collectivetest.Comms(t, 4, collectivetest.Config{})
	_, errs := collectivetest.BuildLayouts(t, comms, func(r int) gmi.Mapping {
		if r == 3 {
			return gmi.Mapping{{0, 2}, {1, 3}}
		}
		return gmi.Mapping{{0, 1}, {2, 3}}
	}, func(int) []collective.LayoutOption { return nil })
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "collective: ranks disagree on the layout") ||
			!strings.Contains(err.Error(), "layout [[0,1],[2,3]], strategy multi-ring") || !strings.Contains(err.Error(), "layout [[0,2],[1,3]], strategy multi-ring") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// Another strategy on one rank.
	_, errs = collectivetest.BuildLayouts(t, comms, func(r int) gmi.Mapping { return gmi.Mapping{{0, 1}, {2, 3}} }, func(r int) []collective.LayoutOption {
		if r == 1 {
			return []collective.LayoutOption{collective.WithStrategy(gmi.Hierarchical)}
		}
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "strategy hierarchical") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// An invalid mapping on one rank: every rank fails.
	_, errs = collectivetest.BuildLayouts(t, comms, func(r int) gmi.Mapping {
		if r == 0 {
			return gmi.Mapping{{0, 1}, {2, 2}}
		}
		return gmi.Mapping{{0, 1}, {2, 3}}
	}, func(int) []collective.LayoutOption { return nil })
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "GMI 2 on GPU 1 and again on GPU 1") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// Failures: mismatched lengths, a context that ends, Close during a call.
func TestLayoutFailures(t *testing.T) {
	m := gmi.Mapping{{0, 1, 2}, {3, 4, 5}}
	for _, s := range []gmi.Strategy{gmi.MultiProcess, gmi.MultiRing, gmi.Hierarchical} {
		t.Run("mismatch/"+string(s), func(t *testing.T) {
			comms, _ := collectivetest.Comms(t, 6, collectivetest.Config{Transport: collectivetest.Shm})
			ls := layoutsOf(t, comms, m, collective.WithStrategy(s))
			errs := make([]error, 6)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for r, l := range ls {
				wg.Go(func() {
					errs[r] = collective.LayoutAllReduce(ctx, l, make([]float32, 13+r/4), collective.Sum)
				})
			}
			wg.Wait()
			for r, err := range errs {
				var me *collective.MismatchError
				if !errors.As(err, &me) || !strings.Contains(err.Error(), "13 elements") || !strings.Contains(err.Error(), "14 elements") {
					t.Fatalf("rank %d: %v, want a mismatch of 13 and 14 elements", r, err)
				}
				// Ranks of the layout's communicator: one of 0-3 and one of 4-5.
				lo, hi := min(me.Rank, me.PeerRank), max(me.Rank, me.PeerRank)
				if lo < 0 || lo > 3 || hi < 4 || hi > 5 {
					t.Errorf("rank %d: %v names ranks %d and %d", r, err, me.Rank, me.PeerRank)
				}
				if again := collective.LayoutAllReduce(ctx, ls[r], make([]float32, 13), collective.Sum); again != err {
					t.Errorf("rank %d: next call %v, want the same error", r, again)
				}
			}
		})
	}
	t.Run("deadline", func(t *testing.T) {
		comms, _ := collectivetest.Comms(t, 6, collectivetest.Config{Transport: collectivetest.Shm})
		ls := layoutsOf(t, comms, m, collective.WithStrategy(gmi.Hierarchical))
		errs := make([]error, 6)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		short, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel2()
		var wg sync.WaitGroup
		for r, l := range ls {
			if r == 5 {
				continue // late: rank 3 waits for it, rank 0 for rank 3
			}
			c := ctx
			if r == 0 {
				c = short
			}
			wg.Go(func() { errs[r] = collective.LayoutAllReduce(c, l, make([]float64, 100), collective.Sum) })
		}
		wg.Wait()
		if !errors.Is(errs[0], context.DeadlineExceeded) || !strings.Contains(errs[0].Error(), `collective: layout AllReduce(sum, float64, 100 elements) as call 1, hierarchical step "`) {
			t.Errorf("rank 0: %v, want its deadline naming the call and the step", errs[0])
		}
		errs[5] = collective.LayoutAllReduce(ctx, ls[5], make([]float64, 100), collective.Sum)
		for r := 1; r < 6; r++ {
			var ae *collective.AbortError
			if !errors.As(errs[r], &ae) || ae.Rank != 0 || !strings.Contains(ae.Cause, "deadline exceeded") {
				t.Errorf("rank %d: %v, want rank 0's deadline", r, errs[r])
			}
		}
	})
	t.Run("close", func(t *testing.T) {
		comms, _ := collectivetest.Comms(t, 4, collectivetest.Config{Transport: collectivetest.Shm})
		ls := layoutsOf(t, comms, gmi.Mapping{{0, 1}, {2, 3}})
		done := make(chan error, 1)
		go func() {
			done <- collective.LayoutAllReduce(context.Background(), ls[0], make([]int32, 5), collective.Sum)
		}()
		time.Sleep(20 * time.Millisecond)
		if err := ls[0].Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, collective.ErrClosed) {
				t.Errorf("the call in progress: %v, want ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close left the call waiting")
		}
		if err := collective.LayoutAllReduce(context.Background(), ls[0], make([]int32, 5), collective.Sum); !errors.Is(err, collective.ErrClosed) {
			t.Errorf("after Close: %v", err)
		}
		if err := ls[0].Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		// The parent communicator is the caller's, and still works.
		collectivetest.EachRank(t, 4, func(ctx context.Context, r int) error {
			return collective.AllReduce(ctx, comms[r], make([]float32, 3), collective.Sum)
		})
	})
}
