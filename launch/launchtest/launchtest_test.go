package launchtest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSixtyFourRanks: 64 real processes rendezvous (on whatever cores there are),
// exchange a key each and pass a barrier.
func TestSixtyFourRanks(t *testing.T) {
	launchtest.RunRanks(t, 64, func(t *testing.T, w *rank.World) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if w.Size() != 64 || len(w.Peers()) != 64 {
			t.Fatalf("size %d peers %d", w.Size(), len(w.Peers()))
		}
		if err := w.Set(ctx, fmt.Sprintf("pid/%d", w.Rank()), []byte(fmt.Sprint(os.Getpid()))); err != nil {
			t.Fatal(err)
		}
		next := (w.Rank() + 1) % w.Size()
		v, err := w.Wait(ctx, fmt.Sprintf("pid/%d", next))
		if err != nil {
			t.Fatal(err)
		}
		if string(v) != fmt.Sprint(w.Peers()[next].PID) {
			t.Fatalf("rank %d published pid %s, the table says %d", next, v, w.Peers()[next].PID)
		}
		if err := w.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRolesReachRanks(t *testing.T) {
	launchtest.RunRanks(t, 3, func(t *testing.T, w *rank.World) {
		want := map[int][2]any{0: {"actor", 0}, 1: {"actor", 1}, 2: {"trainer", 0}}[w.Rank()]
		if w.Role() != want[0] || w.RoleRank() != want[1] {
			t.Fatalf("rank %d: role %q/%d, want %v", w.Rank(), w.Role(), w.RoleRank(), want)
		}
		roles := w.Roles()
		if len(roles) != 2 || roles[0].Size() != 2 || roles[1].Size() != 1 {
			t.Fatalf("roles %+v", roles)
		}
	}, launchtest.Roles("actor", 2, "trainer", 1))
}

func TestFailingRankFailsTheJob(t *testing.T) {
	launchtest.RunRanks(t, 2, func(t *testing.T, w *rank.World) {
		if w.Rank() == 1 {
			t.Error("rank 1 fails on purpose")
		}
		// Rank 0 waits for a key nobody sets: rank 1's death must end the wait.
		if w.Rank() == 0 {
			_, err := w.Wait(context.Background(), "never")
			if err == nil {
				t.Error("Wait returned without an error")
			}
		}
	}, launchtest.ExpectFailure(func(res *launch.Result, out string) error {
		if res.FailedRank != 1 || res.ExitCode != 1 {
			return fmt.Errorf("failed rank %d exit %d, want rank 1 exit 1", res.FailedRank, res.ExitCode)
		}
		if !strings.Contains(out, "rank 1 fails on purpose") {
			return fmt.Errorf("rank 1's message is missing")
		}
		return nil
	}))
}

// TestStoppedRankIsRestarted: a rank stopped by SIGSTOP (a hung process, as
// the chaos harness makes them) while its peer goes on without collectives
// is found lost by the heartbeat, and the launcher, whose process list still
// shows it running, stops the world and restarts it: the job ends with 0
// after one restart, instead of waiting for the stopped rank forever.
func TestStoppedRankIsRestarted(t *testing.T) {
	ckpt := ""
	if !launchtest.IsRank() {
		ckpt = t.TempDir()
	}
	launchtest.RunRanks(t, 2, func(t *testing.T, w *rank.World) {
		if w.RestartCount() > 0 {
			return
		}
		if w.Rank() == 1 {
			syscall.Kill(os.Getpid(), syscall.SIGSTOP) // takes effect a moment later
		}
		time.Sleep(time.Minute) // no collective: nothing fails on rank 0, nor does rank 1 leave
	}, launchtest.Timeout(40*time.Second), launchtest.Tune(func(r *launch.Request, o *launch.Options) {
		r.MaxRestarts, r.CheckpointDir = 1, ckpt
		r.HeartbeatInterval, r.HeartbeatTimeout = 200*time.Millisecond, 1200*time.Millisecond
		o.Grace = time.Second
	}), launchtest.ExpectFailure(func(res *launch.Result, output string) error {
		if res.ExitCode != 0 || res.Restarts != 1 {
			return fmt.Errorf("exit %d after %d restarts (%s), want 0 after 1", res.ExitCode, res.Restarts, res.Cause)
		}
		if !strings.Contains(output, "launchtest: restart 1 of 1: rank 1 (pid ") || !strings.Contains(output, ") lost: ") {
			return fmt.Errorf("no restart line naming rank 1 lost")
		}
		return nil
	}))
}
