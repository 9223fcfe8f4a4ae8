package roles_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"

	"golang.org/x/sync/errgroup"
)

// filled returns n parameters that all equal the version, so that a copy mixing
// two versions shows.
func filled(n int, v uint64) []float32 {
	p := make([]float32, n)
	for i := range p {
		p[i] = float32(v)
	}
	return p
}

func checkParams(r *roles.Reader) error {
	v := r.Version()
	p := r.Params()
	if v == 0 {
		if p != nil {
			return fmt.Errorf("params without a version")
		}
		return nil
	}
	if len(p) != r.Len() {
		return fmt.Errorf("version %d: %d params, want %d", v, len(p), r.Len())
	}
	for i, x := range p {
		if x != float32(v) {
			return fmt.Errorf("version %d: param %d is %v: a torn copy", v, i, x)
		}
	}
	return nil
}

// TestParamVersionsMonotonic: four goroutines publish versions concurrently
// (stale ones are refused) while three readers on the publisher's host (shared
// memory) and three on other hosts (TCP) refresh; every reader sees versions
// that only grow, each copy whole, and finally the last version.
func TestParamVersionsMonotonic(t *testing.T) {
	const n, last, publishers = 1 << 14, 300, 4
	hosts := []string{"h0", "h0", "h0", "h0", "h1", "h2", "h3"}
	w := collectivetest.NewWorld(len(hosts), hosts...)
	t.Cleanup(func() { collectivetest.CheckNoSegments(t, w.JobID()) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub, err := roles.NewPublisher(ctx, w.Bootstrap(0), "theta", n)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	g, gctx := errgroup.WithContext(ctx)
	var next atomic.Uint64
	var stale, published atomic.Int64
	for p := range publishers {
		g.Go(func() error {
			for {
				v := next.Add(1)
				if v > last {
					return nil
				}
				err := pub.Publish(gctx, v, filled(n, v))
				switch {
				case errors.Is(err, roles.ErrStaleVersion):
					stale.Add(1)
				case err != nil:
					return fmt.Errorf("publisher %d, version %d: %w", p, v, err)
				default:
					published.Add(1)
				}
			}
		})
	}
	for rk := 1; rk < len(hosts); rk++ {
		g.Go(func() error {
			r, err := roles.NewReader(gctx, w.Bootstrap(rk), "theta", 3)
			if err != nil {
				return err
			}
			defer r.Close()
			want := roles.TransportShm
			if hosts[rk] != hosts[0] {
				want = roles.TransportTCP
			}
			if r.Transport() != want {
				return fmt.Errorf("reader %d uses %s, want %s", rk, r.Transport(), want)
			}
			rng := rand.New(rand.NewPCG(uint64(rk), 2))
			seen := uint64(0)
			refreshes := 0
			for step := int64(0); seen < last; step++ {
				var err error
				switch rng.IntN(4) {
				case 0:
					_, err = r.Latest(gctx)
				default:
					var took bool
					took, err = r.MaybeRefresh(gctx, step)
					if took {
						refreshes++
					}
				}
				if err != nil {
					return fmt.Errorf("reader %d: %w", rk, err)
				}
				if v := r.Version(); v < seen {
					return fmt.Errorf("reader %d: version %d after %d", rk, v, seen)
				} else {
					seen = v
				}
				if err := checkParams(r); err != nil {
					return fmt.Errorf("reader %d: %w", rk, err)
				}
				if pub.Version() == last && seen < last {
					// Everything is published: wait for the last one.
					if _, err := r.Wait(gctx, last); err != nil {
						return fmt.Errorf("reader %d: %w", rk, err)
					}
				}
			}
			if r.Version() != last {
				return fmt.Errorf("reader %d ends at version %d, want %d", rk, r.Version(), last)
			}
			return checkParams(r)
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if published.Load()+stale.Load() != last || pub.Version() != last {
		t.Fatalf("%d published + %d stale, last %d; want %d in all", published.Load(), stale.Load(), pub.Version(), last)
	}
	t.Logf("%d versions published, %d refused as stale", published.Load(), stale.Load())
}

// TestParamWaitAndErrors: Wait blocks until a version appears; stale versions
// and wrong lengths are refused; a lost publisher and a closed one make readers
// fail with errors that say so.
func TestParamWaitAndErrors(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, want roles.Transport) {
		w := rolestest.World(t, 3, layout)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pub, r := paramPair(t, ctx, w, 10, 5)
		if r.Transport() != want {
			t.Fatalf("transport %s, want %s", r.Transport(), want)
		}
		if v, err := r.Latest(ctx); err != nil || v != 0 || r.Params() != nil {
			t.Fatalf("before any publish: version %d, params %v, %v", v, r.Params(), err)
		}
		go func() {
			time.Sleep(30 * time.Millisecond)
			pub.Publish(ctx, 1, filled(10, 1))
			time.Sleep(30 * time.Millisecond)
			pub.Publish(ctx, 2, filled(10, 2))
		}()
		if v, err := r.Wait(ctx, 2); err != nil || v != 2 {
			t.Fatalf("Wait(2): %d, %v", v, err)
		}
		if err := checkParams(r); err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish(ctx, 2, filled(10, 2)); !errors.Is(err, roles.ErrStaleVersion) {
			t.Fatalf("republish version 2: %v", err)
		}
		if err := pub.Publish(ctx, 0, filled(10, 0)); !errors.Is(err, roles.ErrStaleVersion) {
			t.Fatalf("publish version 0: %v", err)
		}
		if err := pub.Publish(ctx, 3, filled(9, 3)); err == nil {
			t.Fatal("9 floats accepted by a service of 10")
		}
		// MaybeRefresh takes a new version only every 5 steps.
		if err := pub.Publish(ctx, 3, filled(10, 3)); err != nil {
			t.Fatal(err)
		}
		if took, err := r.MaybeRefresh(ctx, 100); err != nil || !took || r.Version() != 3 {
			t.Fatalf("first MaybeRefresh: %v %v version %d", took, err, r.Version())
		}
		pub.Publish(ctx, 4, filled(10, 4))
		for step := int64(101); step < 105; step++ {
			if took, err := r.MaybeRefresh(ctx, step); err != nil || took {
				t.Fatalf("MaybeRefresh(%d): %v %v", step, took, err)
			}
		}
		if took, err := r.MaybeRefresh(ctx, 105); err != nil || !took || r.Version() != 4 {
			t.Fatalf("MaybeRefresh(105): %v %v version %d", took, err, r.Version())
		}

		// A second reader whose publisher dies.
		r2, err := roles.NewReader(ctx, w.Bootstrap(2), "theta", 1)
		if err != nil {
			t.Fatal(err)
		}
		defer r2.Close()
		go func() {
			time.Sleep(30 * time.Millisecond)
			w.Lose(0, "killed by SIGKILL")
		}()
		_, err = r2.Wait(ctx, 100)
		var lost *roles.LostError
		if !errors.As(err, &lost) || lost.Rank != 0 || !strings.Contains(err.Error(), "parameter publisher rank 0 lost: killed by SIGKILL") {
			t.Fatalf("Wait on a lost publisher: %v", err)
		}
	})
}

// TestParamPublisherClose: readers of a publisher that closes get
// ErrPeerClosed; the publisher refuses to publish after Close.
func TestParamPublisherClose(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		w := rolestest.World(t, 2, layout)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pub, r := paramPair(t, ctx, w, 10, 1)
		go func() {
			time.Sleep(30 * time.Millisecond)
			pub.Close()
		}()
		if _, err := r.Wait(ctx, 1); !errors.Is(err, roles.ErrPeerClosed) {
			t.Fatalf("Wait on a closed publisher: %v", err)
		}
		pub.Close()
		if err := pub.Publish(ctx, 1, filled(10, 1)); !errors.Is(err, roles.ErrClosed) {
			t.Fatalf("Publish after Close: %v", err)
		}
	})
}

// paramPair makes the publisher "theta" of n values on rank 0 of w and a
// reader of it on rank 1 (taking a new version at most every every steps), both closed when the test
// ends.
func paramPair(tb testing.TB, ctx context.Context, w *collectivetest.World, n, every int) (*roles.Publisher, *roles.Reader) {
	tb.Helper()
	pub, err := roles.NewPublisher(ctx, w.Bootstrap(0), "theta", n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pub.Close() })
	r, err := roles.NewReader(ctx, w.Bootstrap(1), "theta", every)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return pub, r
}

// TestParamPublisherCloseStays: once a reader learned that its publisher
// closed, every later fetch (Latest, MaybeRefresh, Wait) says so again with an
// error matching ErrPeerClosed, never one of a lost publisher.
func TestParamPublisherCloseStays(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		w := rolestest.World(t, 2, layout)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pub, r := paramPair(t, ctx, w, 10, 1)
		if err := pub.Publish(ctx, 1, filled(10, 1)); err != nil {
			t.Fatal(err)
		}
		if v, err := r.Latest(ctx); err != nil || v != 1 {
			t.Fatalf("Latest: %d, %v", v, err)
		}
		if err := pub.Close(); err != nil {
			t.Fatal(err)
		}
		calls := []struct {
			name string
			call func() error
		}{
			{"Latest", func() error { _, err := r.Latest(ctx); return err }},
			{"MaybeRefresh", func() error { _, err := r.MaybeRefresh(ctx, 100); return err }},
			{"Wait", func() error { _, err := r.Wait(ctx, 2); return err }},
			{"Latest again", func() error { _, err := r.Latest(ctx); return err }},
			{"MaybeRefresh again", func() error { _, err := r.MaybeRefresh(ctx, 200); return err }},
		}
		for _, c := range calls {
			err := c.call()
			if !errors.Is(err, roles.ErrPeerClosed) || errors.Is(err, roles.ErrLost) || !strings.Contains(err.Error(), "parameter publisher rank 0") {
				t.Fatalf("%s after the publisher closed: %v", c.name, err)
			}
		}
		if r.Version() != 1 || checkParams(r) != nil {
			t.Fatalf("after the publisher closed: version %d, %v", r.Version(), checkParams(r))
		}
		if err := r.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, err := r.Latest(ctx); !errors.Is(err, roles.ErrClosed) {
			t.Fatalf("Latest after Close: %v", err)
		}
	})
}
