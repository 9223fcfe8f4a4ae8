package launchtest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
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
