package rank_test

import (
	"context"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"
)

// TestWorldAndRoleComms runs an MPMD job of real processes: the world
// communicator sums every world rank, and each role's communicator sums the world
// ranks of that role only, ranked by role rank.
func TestWorldAndRoleComms(t *testing.T) {
	launchtest.RunRanks(t, 5, func(t *testing.T, w *rank.World) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		world, err := w.CommContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		again, err := w.CommContext(ctx)
		if err != nil || again != world {
			t.Fatalf("CommContext again = %p, %v; want the same communicator %p", again, err, world)
		}
		sum := []int64{int64(w.Rank())}
		if err := collective.AllReduce(ctx, world, sum, collective.Sum); err != nil {
			t.Fatal(err)
		}
		if sum[0] != 0+1+2+3+4 {
			t.Errorf("world allreduce = %d, want 10", sum[0])
		}
		role, err := w.RoleComm(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if role.Size() != w.RoleSize() || role.Rank() != w.RoleRank() {
			t.Errorf("role communicator: rank %d of %d, want role rank %d of %d",
				role.Rank(), role.Size(), w.RoleRank(), w.RoleSize())
		}
		sum[0] = int64(w.Rank())
		if err := collective.AllReduce(ctx, role, sum, collective.Sum); err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{"actor": 0 + 1 + 2, "trainer": 3 + 4}[w.Role()]
		if sum[0] != want {
			t.Errorf("role %s allreduce = %d, want %d", w.Role(), sum[0], want)
		}
	}, launchtest.Roles("actor", 3, "trainer", 2))
}
