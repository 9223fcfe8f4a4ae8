package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
)

// Failures within one process: mismatched calls, ended contexts, lost ranks and
// Close, over every transport. The same over real processes is in
// process_test.go.

// errorsOf runs fns (one per rank) and returns their errors.
func errorsOf(t *testing.T, comms []*collective.Comm, fn func(ctx context.Context, c *collective.Comm) error) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := collectivetest.Each(ctx, comms, fn)
	if errs == nil {
		t.Fatal("every rank succeeded")
	}
	return errs
}

func TestMismatch(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		for _, tc := range []struct {
			name  string
			fn    func(ctx context.Context, c *collective.Comm) error
			names []string // every rank's error names both calls
		}{
			{"length", func(ctx context.Context, c *collective.Comm) error {
				buf := make([]float32, 10+c.Rank()/2)
				return collective.AllReduce(ctx, c, buf, collective.Sum)
			}, []string{"AllReduce(sum, float32, 10 elements)", "AllReduce(sum, float32, 11 elements)"}},
			{"length-ring", func(ctx context.Context, c *collective.Comm) error {
				buf := make([]float32, 100000+c.Rank()/2)
				return collective.AllReduce(ctx, c, buf, collective.Sum)
			}, []string{"100000 elements", "100001 elements"}},
			{"operation", func(ctx context.Context, c *collective.Comm) error {
				buf := make([]float32, 10)
				if c.Rank() == 2 {
					return collective.Broadcast(ctx, c, buf, 0)
				}
				return collective.AllReduce(ctx, c, buf, collective.Sum)
			}, []string{"AllReduce(sum, float32, 10 elements)", "Broadcast(float32, 10 elements, root 0)"}},
			{"type", func(ctx context.Context, c *collective.Comm) error {
				if c.Rank() == 0 {
					return collective.AllReduce(ctx, c, make([]int64, 10), collective.Sum)
				}
				return collective.AllReduce(ctx, c, make([]float64, 10), collective.Sum)
			}, []string{"AllReduce(sum, int64, 10 elements)", "AllReduce(sum, float64, 10 elements)"}},
			{"reduction", func(ctx context.Context, c *collective.Comm) error {
				op := collective.Sum
				if c.Rank() == 1 {
					op = collective.Max
				}
				return collective.AllReduce(ctx, c, make([]int32, 10), op)
			}, []string{"AllReduce(sum, int32, 10 elements)", "AllReduce(max, int32, 10 elements)"}},
			{"root", func(ctx context.Context, c *collective.Comm) error {
				return collective.Broadcast(ctx, c, make([]byte, 10), min(c.Rank(), 1))
			}, []string{"root 0", "root 1"}},
		} {
			t.Run(tr+"/"+tc.name, func(t *testing.T) {
				comms, _ := collectivetest.Comms(t, 3, collectivetest.Config{Transport: tr})
				// A rank whose part of the mismatched call needs nothing from the
				// others (a broadcast root) may finish it; its next call fails.
				errs := errorsOf(t, comms, func(ctx context.Context, c *collective.Comm) error {
					if err := tc.fn(ctx, c); err != nil {
						return err
					}
					return c.Barrier(ctx)
				})
				for r, err := range errs {
					if !errors.Is(err, collective.ErrMismatch) {
						t.Errorf("rank %d: %v, want a mismatch", r, err)
						continue
					}
					for _, name := range tc.names {
						if !strings.Contains(err.Error(), name) {
							t.Errorf("rank %d: %q does not name %q", r, err, name)
						}
					}
					// The communicator refuses further calls with the same cause.
					again := comms[r].Barrier(context.Background())
					if again == nil || again.Error() != err.Error() {
						t.Errorf("rank %d: after the mismatch Barrier says %v, want %v", r, again, err)
					}
				}
			})
		}
	}
}

func TestContextEnds(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		t.Run(tr+"/deadline", func(t *testing.T) {
			comms, _ := collectivetest.Comms(t, 2, collectivetest.Config{Transport: tr})
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := collective.AllReduce(ctx, comms[0], make([]float32, 100), collective.Sum)
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("AllReduce returned %v after the deadline", took-200*time.Millisecond)
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "AllReduce(sum, float32, 100 elements)") {
				t.Fatalf("rank 0: %v, want the deadline naming the call", err)
			}
			// The other rank, calling late, hears of it. (Its AllReduce may succeed:
			// rank 0 sent its part before the deadline.)
			collective.AllReduce(context.Background(), comms[1], make([]float32, 100), collective.Sum)
			err1 := comms[1].Barrier(context.Background())
			if !errors.Is(err1, collective.ErrAborted) || !strings.Contains(err1.Error(), "rank 0") || !strings.Contains(err1.Error(), "deadline") {
				t.Fatalf("rank 1: %v, want rank 0's failure", err1)
			}
			if again := comms[0].Barrier(context.Background()); again == nil || again.Error() != err.Error() {
				t.Fatalf("rank 0 after the deadline: %v, want %v", again, err)
			}
		})
		t.Run(tr+"/cancel", func(t *testing.T) {
			comms, _ := collectivetest.Comms(t, 3, collectivetest.Config{Transport: tr})
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			start := time.Now()
			errs := errorsOf(t, comms[:2], func(_ context.Context, c *collective.Comm) error {
				// Rank 2 never calls.
				buf := make([]float32, 1<<20)
				return collective.AllReduce(ctx, c, buf, collective.Sum)
			})
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("cancelled calls returned after %v", took)
			}
			for r, err := range errs {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, collective.ErrAborted) {
					t.Errorf("rank %d: %v", r, err)
				}
			}
			// Rank 2 hears of the cancellation, or finds the abandoned call's
			// frames first.
			if err := comms[2].Barrier(context.Background()); !errors.Is(err, collective.ErrAborted) && !errors.Is(err, collective.ErrMismatch) {
				t.Errorf("rank 2: %v", err)
			}
		})
	}
}

func TestLostRank(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		t.Run(tr, func(t *testing.T) {
			comms, w := collectivetest.Comms(t, 3, collectivetest.Config{Transport: tr})
			var lostAt time.Time
			var once sync.Once
			errs := errorsOf(t, comms, func(ctx context.Context, c *collective.Comm) error {
				if c.Rank() == 2 {
					time.Sleep(100 * time.Millisecond)
					once.Do(func() { lostAt = time.Now() })
					w.Lose(2, "killed by SIGKILL")
					return errors.New("rank 2 played dead")
				}
				buf := make([]float64, 1<<18)
				for {
					if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
						if took := time.Since(lostAt); took > 2*time.Second {
							return fmt.Errorf("error %v after %v", err, took)
						}
						return err
					}
				}
			})
			for r, err := range errs[:2] {
				var le *collective.LostError
				if !errors.As(err, &le) || le.Rank != 2 || !strings.Contains(err.Error(), "lost rank 2: killed by SIGKILL") {
					t.Errorf("rank %d: %v, want rank 2 lost", r, err)
				}
			}
		})
	}
}

func TestClose(t *testing.T) {
	for _, tr := range collectivetest.Transports {
		t.Run(tr, func(t *testing.T) {
			comms, _ := collectivetest.Comms(t, 2, collectivetest.Config{Transport: tr})
			done := make(chan error)
			go func() { done <- collective.AllReduce(context.Background(), comms[0], make([]int32, 5), collective.Sum) }()
			time.Sleep(50 * time.Millisecond)
			comms[0].Close()
			comms[0].Close()
			select {
			case err := <-done:
				if !errors.Is(err, collective.ErrClosed) {
					t.Fatalf("AllReduce during Close: %v, want ErrClosed", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("AllReduce still blocked after Close")
			}
			if err := comms[0].Barrier(context.Background()); !errors.Is(err, collective.ErrClosed) {
				t.Fatalf("Barrier after Close: %v", err)
			}
			// The peer learns that rank 0 is gone. (Its first AllReduce may
			// succeed: rank 0 sent its part before it closed.)
			collective.AllReduce(context.Background(), comms[1], make([]int32, 5), collective.Sum)
			err := comms[1].Barrier(context.Background())
			if !errors.Is(err, collective.ErrRankLost) && !errors.Is(err, collective.ErrAborted) {
				t.Fatalf("peer of a closed rank: %v", err)
			}
		})
	}
}

func TestBadArguments(t *testing.T) {
	comms, _ := collectivetest.Comms(t, 2, collectivetest.Config{})
	errs := errorsOf(t, comms, func(ctx context.Context, c *collective.Comm) error {
		recv := make([]float32, 3) // want 4
		if c.Rank() == 1 {
			recv = make([]float32, 4)
		}
		return collective.AllGather(ctx, c, make([]float32, 2), recv)
	})
	if !strings.Contains(errs[0].Error(), "recv has 3 elements, want 4") {
		t.Errorf("rank 0: %v", errs[0])
	}
	if !errors.Is(errs[1], collective.ErrAborted) || !strings.Contains(errs[1].Error(), "recv has 3 elements") {
		t.Errorf("rank 1: %v", errs[1])
	}
}
