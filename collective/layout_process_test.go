package collective_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"
)

// Layout-aware reduction with real rank processes: six ranks placed as gearrun
// --gmi-per-gpu 3 --topology examples/topologies/a100-2x.toml places them (two
// virtual A100s, three MPS shares each), so that every rank gets its device
// binding and GEAR_GMI_LAYOUT from the launcher, and builds its layout from
// the environment.

// a100x2Binder binds six ranks at three per GPU on the two A100s of the
// example topology, as gearrun does.
func a100x2Binder(t *testing.T) launchtest.Option {
	t.Helper()
	topo, err := gmi.LoadTopology(filepath.Join("..", "examples", "topologies", "a100-2x.toml"))
	if err != nil {
		t.Fatal(err)
	}
	_, devs, err := launch.BindGPUs(topo, "", []launch.GPUGroup{{NP: 6, Req: gmi.PlanRequest{GMIPerGPU: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	return launchtest.Binder(launch.BinderFunc(func(r launch.RankSpec) (launch.Device, error) { return devs[r.Rank], nil }))
}

func TestProcessLayout(t *testing.T) {
	launchtest.RunRanks(t, 6, func(t *testing.T, w *rank.World) {
		if got := os.Getenv(rank.EnvGMILayout); got != "[[0,1,2],[3,4,5]]" {
			t.Fatalf("rank %d: %s=%q", w.Rank(), rank.EnvGMILayout, got)
		}
		if got, want := os.Getenv(rank.EnvCUDAVisibleDevices), strconv.Itoa(w.Rank()/3); got != want {
			t.Fatalf("rank %d: %s=%q, want %q", w.Rank(), rank.EnvCUDAVisibleDevices, got, want)
		}
		c := openComm(t, w)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for _, s := range layoutStrategies {
			var opts []collective.LayoutOption
			if s != "" {
				opts = append(opts, collective.WithStrategy(s))
			}
			l, err := collective.LayoutFromEnv(ctx, c, opts...)
			if err != nil {
				t.Fatalf("rank %d: %s: %v", w.Rank(), strategyName(s), err)
			}
			if s == "" && l.Strategy() != gmi.Hierarchical {
				t.Fatalf("rank %d: Algorithm 1 chose %s for 2 GPUs x 3 GMIs", w.Rank(), l.Strategy())
			}
			for _, count := range []int{13, 300001} {
				buf := make([]float32, count)
				collectivetest.Fill(buf, w.Rank(), 0)
				if err := collective.LayoutAllReduce(ctx, l, buf, collective.Sum); err != nil {
					t.Fatalf("rank %d: %s: %v", w.Rank(), l.Strategy(), err)
				}
				if err := collectivetest.Compare(fmt.Sprintf("%s count %d", l.Strategy(), count), buf, collectivetest.References[float32](6, collective.Sum)); err != nil {
					t.Fatalf("rank %d: %v", w.Rank(), err)
				}
			}
			l.Close()
		}
	}, a100x2Binder(t))
}

// A rank killed in the middle of a layout AllReduce: the others return
// *LostError naming it within 2 s, whichever step they wait in.
func TestProcessLayoutKilledRank(t *testing.T) {
	for _, s := range []gmi.Strategy{gmi.MultiRing, gmi.Hierarchical} {
		t.Run(string(s), func(t *testing.T) {
			var stamp string
			if !launchtest.IsRank() {
				stamp = filepath.Join(t.TempDir(), "killed-at")
			}
			launchtest.RunRanks(t, 6, func(t *testing.T, w *rank.World) {
				signal.Ignore(syscall.SIGTERM) // outlive the launcher's SIGTERM long enough to report
				c := openComm(t, w)
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				l, err := collective.LayoutFromEnv(ctx, c, collective.WithStrategy(s))
				if err != nil {
					t.Fatalf("rank %d: %v", w.Rank(), err)
				}
				defer l.Close()
				file := os.Getenv("GEARTEST_STAMP")
				if w.Rank() == 4 {
					killSoon(file)
				}
				buf := make([]float32, 1<<18)
				for {
					err := collective.LayoutAllReduce(ctx, l, buf, collective.Sum)
					if err == nil {
						continue
					}
					checkLostAfterKill(t, w.Rank(), err, file, 4)
					report(t, w.Rank())
					return
				}
			}, a100x2Binder(t), launchtest.Env("GEARTEST_STAMP="+stamp), expectReports(0, 1, 2, 3, 5))
		})
	}
}
