package collective_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"
)

// Failures with real rank processes, started by launchtest: a rank killed with
// SIGKILL in the middle of an AllReduce, mismatched calls, and a context deadline,
// over shared memory and over TCP. Each rank reports "GEARTEST <rank> ok" once its
// checks pass; the launching side checks the reports (the job as a whole fails,
// as a killed rank makes it).

// processTransports: the automatic choice (shared memory on one host) and TCP
// forced through the launcher-to-rank contract.
var processTransports = []string{"", collective.TransportTCP}

func transportName(tr string) string {
	if tr == "" {
		return "shm"
	}
	return tr
}

// openComm builds the world communicator in a rank process.
func openComm(t *testing.T, w *rank.World) *collective.Comm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := collective.New(ctx, w, collective.WithTransport(os.Getenv(rank.EnvTransport)))
	if err != nil {
		t.Fatalf("collective.New: %v", err)
	}
	return c
}

func report(t *testing.T, r int) { fmt.Printf("GEARTEST %d ok\n", r) }

// expectReports accepts a job whose ranks (want) all reported success.
func expectReports(want ...int) launchtest.Option {
	return launchtest.ExpectFailure(func(res *launch.Result, out string) error {
		for _, r := range want {
			if !strings.Contains(out, fmt.Sprintf("GEARTEST %d ok", r)) {
				return fmt.Errorf("rank %d did not report success", r)
			}
		}
		return nil
	})
}

// killSoon kills this rank process with SIGKILL in 300ms, after it writes the
// time of its death into file.
func killSoon(file string) {
	go func() {
		time.Sleep(300 * time.Millisecond)
		os.WriteFile(file, []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), 0o600)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}()
}

// checkLostAfterKill checks the error err of rank me's call that failed while
// rank victim was being killed (see killSoon): it must come after the kill, be
// a *LostError naming victim, and come within 2 s.
func checkLostAfterKill(t *testing.T, me int, err error, file string, victim int) {
	t.Helper()
	b, rerr := os.ReadFile(file)
	ns, _ := strconv.ParseInt(string(b), 10, 64)
	if rerr != nil || ns == 0 {
		t.Fatalf("rank %d: %v before rank %d was killed", me, err, victim)
	}
	took := time.Since(time.Unix(0, ns))
	t.Logf("rank %d: %v, %v after the kill", me, err, took)
	var le *collective.LostError
	if !errors.As(err, &le) || le.Rank != victim {
		t.Fatalf("rank %d: %v, want rank %d lost", me, err, victim)
	}
	if took > 2*time.Second {
		t.Fatalf("rank %d: the error came %v after the kill", me, took)
	}
}

func TestProcessKilledRank(t *testing.T) {
	for _, tr := range processTransports {
		t.Run(transportName(tr), func(t *testing.T) {
			var stamp string
			if !launchtest.IsRank() {
				stamp = filepath.Join(t.TempDir(), "killed-at")
			}
			launchtest.RunRanks(t, 3, func(t *testing.T, w *rank.World) {
				// Outlive the launcher's SIGTERM to the survivors long enough to
				// report.
				signal.Ignore(syscall.SIGTERM)
				c := openComm(t, w)
				defer c.Close()
				file := os.Getenv("GEARTEST_STAMP")
				buf := make([]float32, 4<<20)
				if w.Rank() == 1 {
					killSoon(file)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for {
					err := collective.AllReduce(ctx, c, buf, collective.Sum)
					if err == nil {
						continue
					}
					checkLostAfterKill(t, w.Rank(), err, file, 1)
					report(t, w.Rank())
					return
				}
			}, launchtest.Env("GEAR_TRANSPORT="+tr, "GEARTEST_STAMP="+stamp), expectReports(0, 2))
		})
	}
}

func TestProcessMismatch(t *testing.T) {
	for _, tr := range processTransports {
		for _, tc := range []struct {
			name  string
			fn    func(ctx context.Context, c *collective.Comm) error
			names []string
		}{
			{"length", func(ctx context.Context, c *collective.Comm) error {
				return collective.AllReduce(ctx, c, make([]float64, 1000+c.Rank()/2), collective.Sum)
			}, []string{"AllReduce(sum, float64, 1000 elements)", "AllReduce(sum, float64, 1001 elements)"}},
			{"operation", func(ctx context.Context, c *collective.Comm) error {
				buf := make([]int32, 64)
				if c.Rank() == 2 {
					return collective.Broadcast(ctx, c, buf, 0)
				}
				return collective.AllReduce(ctx, c, buf, collective.Max)
			}, []string{"AllReduce(max, int32, 64 elements)", "Broadcast(int32, 64 elements, root 0)"}},
		} {
			t.Run(transportName(tr)+"/"+tc.name, func(t *testing.T) {
				launchtest.RunRanks(t, 3, func(t *testing.T, w *rank.World) {
					c := openComm(t, w)
					defer c.Close()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					err := tc.fn(ctx, c)
					if err == nil {
						err = c.Barrier(ctx)
					}
					if !errors.Is(err, collective.ErrMismatch) {
						t.Fatalf("rank %d: %v, want a mismatch", w.Rank(), err)
					}
					for _, name := range tc.names {
						if !strings.Contains(err.Error(), name) {
							t.Fatalf("rank %d: %q does not name %q", w.Rank(), err, name)
						}
					}
				}, launchtest.Env("GEAR_TRANSPORT="+tr))
			})
		}
	}
}

func TestProcessDeadline(t *testing.T) {
	for _, tr := range processTransports {
		t.Run(transportName(tr), func(t *testing.T) {
			launchtest.RunRanks(t, 2, func(t *testing.T, w *rank.World) {
				c := openComm(t, w)
				defer c.Close()
				buf := make([]float32, 1<<20)
				if w.Rank() == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
					defer cancel()
					start := time.Now()
					err := collective.AllReduce(ctx, c, buf, collective.Sum)
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("rank 0: %v, want the deadline", err)
					}
					if took := time.Since(start); took > time.Second {
						t.Fatalf("rank 0: the deadline of 300ms returned after %v", took)
					}
				} else {
					time.Sleep(time.Second)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err := collective.AllReduce(ctx, c, buf, collective.Sum)
				if w.Rank() == 1 && err == nil {
					err = c.Barrier(ctx)
				}
				if w.Rank() == 1 && !errors.Is(err, collective.ErrAborted) && !errors.Is(err, collective.ErrMismatch) {
					t.Fatalf("rank 1: %v, want rank 0's failure", err)
				}
				if w.Rank() == 0 && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("rank 0, after the deadline: %v, want the first error again", err)
				}
				t.Logf("rank %d: %v", w.Rank(), err)
			}, launchtest.Env("GEAR_TRANSPORT="+tr))
		})
	}
}
