//go:build linux

package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"
)

// The host's board (board_linux.go): consecutive calls of different sizes and
// types, calls that leave the board between board calls, mismatches between a
// board call and a call on frames, a rank that closes while its peers wait on
// the board, and a board call whose context ends.

// boardComms builds n in-process ranks over shared memory whose AllReduce of
// up to 64 KiB runs on the board, and fails t if they do not use it.
func boardComms(t *testing.T, n int) ([]*collective.Comm, *collectivetest.World) {
	t.Helper()
	tuning := collective.DefaultTuning()
	tuning.BoardBytes = 64 << 10
	comms, w := collectivetest.Comms(t, n, collectivetest.Config{Transport: collectivetest.Shm, Tuning: &tuning})
	for r, c := range comms {
		if got := c.BoardBytes(); got != 64<<10 {
			t.Fatalf("rank %d: board of %d bytes, want %d", r, got, 64<<10)
		}
	}
	return comms, w
}

// boardStep is one call of a sequence every rank makes in the same order.
type boardStep struct {
	name string
	fn   rankFunc
}

// boardSequence returns steps calls drawn from seed: AllReduce of every type
// and reduction at sizes from 0 to the board's 64 KiB (and one past it, which
// leaves the board), Barriers, and Broadcasts on frames between them.
func boardSequence(n, steps int, seed uint64) []boardStep {
	rng := rand.New(rand.NewPCG(seed, 1))
	var out []boardStep
	for range steps {
		op := allOps[rng.IntN(len(allOps))]
		var count int
		switch rng.IntN(4) {
		case 0:
			count = rng.IntN(4) // 0 to 3 elements
		case 1:
			count = 1 + rng.IntN(300)
		default:
			count = 1 + rng.IntN(8192) // up to 64 KiB of float64
		}
		switch k := rng.IntN(7); k {
		case 0:
			out = append(out, boardStep{fmt.Sprintf("AllReduce/float32/%v/%d", op, count), allReduceCase[float32](count, op)})
		case 1:
			out = append(out, boardStep{fmt.Sprintf("AllReduce/float64/%v/%d", op, count), allReduceCase[float64](count, op)})
		case 2:
			out = append(out, boardStep{fmt.Sprintf("AllReduce/int32/%v/%d", op, count), allReduceCase[int32](count, op)})
		case 3:
			out = append(out, boardStep{fmt.Sprintf("AllReduce/int64/%v/%d", op, count), allReduceCase[int64](count, op)})
		case 4:
			out = append(out, boardStep{"Barrier", func(ctx context.Context, c *collective.Comm) error { return c.Barrier(ctx) }})
		case 5:
			// 64 KiB and one element more: the last call on the board and the
			// first past it.
			count = 16384 + rng.IntN(2)
			out = append(out, boardStep{fmt.Sprintf("AllReduce/float32/%v/%d", op, count), allReduceCase[float32](count, op)})
		case 6:
			root := rng.IntN(n)
			out = append(out, boardStep{fmt.Sprintf("Broadcast/int32/root=%d/%d", root, count), broadcastCase[int32](count, root)})
		}
	}
	return out
}

// TestBoardConsecutiveCalls runs long sequences of board calls of changing
// sizes, types and reductions, with Barriers and calls on frames between them,
// every rank checking every result against the serial reference: a result of
// one size must not leak into the next call (the two result buffers
// alternate), nor a call read a slot a fast rank already filled for the next.
func TestBoardConsecutiveCalls(t *testing.T) {
	for _, n := range []int{3, 4, 7} {
		t.Run(fmt.Sprintf("np=%d", n), func(t *testing.T) {
			comms, _ := boardComms(t, n)
			steps := boardSequence(n, 120, uint64(n))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			errs := collectivetest.Each(ctx, comms, func(ctx context.Context, c *collective.Comm) error {
				for i, s := range steps {
					if err := s.fn(ctx, c); err != nil {
						return fmt.Errorf("call %d, %s: %w", i, s.name, err)
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestBoardMismatch: a board call against another board call, and a board call
// against a call on frames (one element past the board's 64 KiB, a Broadcast):
// every rank names both calls.
func TestBoardMismatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fn    rankFunc
		names []string
	}{
		{"barrier", func(ctx context.Context, c *collective.Comm) error {
			if c.Rank() == 1 {
				return c.Barrier(ctx)
			}
			return collective.AllReduce(ctx, c, make([]int64, 3), collective.Sum)
		}, []string{"AllReduce(sum, int64, 3 elements)", "Barrier"}},
		{"past-the-board", func(ctx context.Context, c *collective.Comm) error {
			return collective.AllReduce(ctx, c, make([]float32, 16384+c.Rank()/2), collective.Sum)
		}, []string{"AllReduce(sum, float32, 16384 elements)", "AllReduce(sum, float32, 16385 elements)"}},
		{"frames", func(ctx context.Context, c *collective.Comm) error {
			buf := make([]int32, 64)
			if c.Rank() == 2 {
				return collective.Broadcast(ctx, c, buf, 0)
			}
			return collective.AllReduce(ctx, c, buf, collective.Max)
		}, []string{"AllReduce(max, int32, 64 elements)", "Broadcast(int32, 64 elements, root 0)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, _ := boardComms(t, 3)
			errs := errorsOf(t, comms, func(ctx context.Context, c *collective.Comm) error {
				// A good board call first, so that the mismatch is not the
				// board's first call.
				if err := collective.AllReduce(ctx, c, make([]float64, 5), collective.Sum); err != nil {
					return err
				}
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
			}
		})
	}
}

// TestBoardPeerCloses: rank 2 closes its communicator while ranks 0 and 1
// wait for it on the board; they learn that it is gone.
func TestBoardPeerCloses(t *testing.T) {
	for _, call := range []string{"AllReduce", "Barrier"} {
		t.Run(call, func(t *testing.T) {
			comms, _ := boardComms(t, 3)
			errs := errorsOf(t, comms, func(ctx context.Context, c *collective.Comm) error {
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				if c.Rank() == 2 {
					time.Sleep(100 * time.Millisecond)
					c.Close()
					return errors.New("rank 2 closed")
				}
				if call == "Barrier" {
					return c.Barrier(ctx)
				}
				return collective.AllReduce(ctx, c, make([]float32, 7), collective.Sum)
			})
			for r, err := range errs[:2] {
				if !errors.Is(err, collective.ErrRankLost) && !errors.Is(err, collective.ErrAborted) {
					t.Errorf("rank %d: %v, want rank 2 lost", r, err)
				} else if !strings.Contains(err.Error(), "rank 2") {
					t.Errorf("rank %d: %v does not name rank 2", r, err)
				}
			}
		})
	}
}

// TestBoardContextEnds: board calls whose context ends while a peer never
// arrives return the context's error naming the call; the rank that comes
// late hears of the failure, and the ranks that failed refuse further calls
// with the same cause.
func TestBoardContextEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, _ := boardComms(t, 3)
			ctx, cancel := tc.end()
			defer cancel()
			// Rank 2 never calls.
			errs := errorsOf(t, comms[:2], func(_ context.Context, c *collective.Comm) error {
				return collective.AllReduce(ctx, c, make([]float32, 100), collective.Sum)
			})
			for r, err := range errs {
				if !errors.Is(err, tc.want) && !errors.Is(err, collective.ErrAborted) {
					t.Errorf("rank %d: %v, want %v", r, err, tc.want)
				}
				if errors.Is(err, tc.want) && !strings.Contains(err.Error(), "AllReduce(sum, float32, 100 elements)") {
					t.Errorf("rank %d: %v does not name the call", r, err)
				}
				if again := comms[r].Barrier(context.Background()); again == nil || again.Error() != err.Error() {
					t.Errorf("rank %d after the failure: %v, want %v", r, again, err)
				}
			}
			// Rank 2, calling late, arrives at a board its peers left: it hears
			// of their failure (or finds their call differs from its own).
			late, lateCancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer lateCancel()
			if err := comms[2].Barrier(late); !errors.Is(err, collective.ErrAborted) && !errors.Is(err, collective.ErrMismatch) {
				t.Errorf("rank 2: %v, want the others' failure", err)
			}
		})
	}
}

// TestProcessKilledOnBoard: three rank processes make small AllReduce calls on
// the board (the default for three ranks on a host) until rank 1 is killed
// with SIGKILL, before, while or after it arrives at a call; ranks 0 and 2
// fail with rank 1 lost.
func TestProcessKilledOnBoard(t *testing.T) {
	var stamp string
	if !launchtest.IsRank() {
		stamp = filepath.Join(t.TempDir(), "killed-at")
	}
	launchtest.RunRanks(t, 3, func(t *testing.T, w *rank.World) {
		signal.Ignore(syscall.SIGTERM)
		c := openComm(t, w)
		defer c.Close()
		if c.BoardBytes() == 0 {
			t.Fatalf("rank %d: three ranks on a host do not use the board", w.Rank())
		}
		file := os.Getenv("GEARTEST_STAMP")
		if w.Rank() == 1 {
			killSoon(file)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		buf := make([]float64, 16)
		for calls := 0; ; calls++ {
			err := collective.AllReduce(ctx, c, buf, collective.Sum)
			if err == nil {
				continue
			}
			if b, rerr := os.ReadFile(file); rerr != nil || len(b) == 0 {
				t.Fatalf("rank %d: call %d: %v before rank 1 was killed", w.Rank(), calls, err)
			}
			var le *collective.LostError
			if !errors.As(err, &le) || le.Rank != 1 {
				t.Fatalf("rank %d: call %d: %v, want rank 1 lost", w.Rank(), calls, err)
			}
			t.Logf("rank %d: call %d: %v", w.Rank(), calls, err)
			report(t, w.Rank())
			return
		}
	}, launchtest.Env("GEARTEST_STAMP="+stamp), expectReports(0, 2))
}
