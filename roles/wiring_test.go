package roles_test

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"
)

func TestPlanSmall(t *testing.T) {
	// Ranks: policy 0-1, actors 2-6, trainers 7-8.
	tab := rolestest.Table("policy", 2, "actor", 5, "trainer", 2)
	w, err := roles.Plan(tab, roles.DefaultNames)
	if err != nil {
		t.Fatal(err)
	}
	want := roles.Wiring{
		Names:        roles.DefaultNames,
		Actors:       []int{2, 3, 4, 5, 6},
		Policies:     []int{0, 1},
		Trainers:     []int{7, 8},
		ActorPolicy:  []int{0, 1, 0, 1, 0},
		ActorTrainer: []int{7, 8, 7, 8, 7},
		Publisher:    7,
		ParamReaders: []int{0, 1},
	}
	if !reflect.DeepEqual(w, want) {
		t.Fatalf("Plan:\n got %+v\nwant %+v", w, want)
	}
	if w.Inline() {
		t.Error("Inline with policy workers")
	}
	if p, ok := w.PolicyOf(5); !ok || p != 1 {
		t.Errorf("PolicyOf(5) = %d, %v", p, ok)
	}
	if tr, ok := w.TrainerOf(6); !ok || tr != 7 {
		t.Errorf("TrainerOf(6) = %d, %v", tr, ok)
	}
	if _, ok := w.PolicyOf(0); ok {
		t.Error("PolicyOf a policy worker")
	}
	if got := w.ClientsOf(0); !slices.Equal(got, []int{2, 4, 6}) {
		t.Errorf("ClientsOf(0) = %v", got)
	}
	if got := w.ClientsOf(8); !slices.Equal(got, []int{3, 5}) {
		t.Errorf("ClientsOf(8) = %v", got)
	}
	if w.RoleOf(8) != "trainer" || w.RoleOf(9) != "" {
		t.Errorf("RoleOf: %q %q", w.RoleOf(8), w.RoleOf(9))
	}
	// Plain data: it survives JSON.
	b, _ := json.Marshal(w)
	var back roles.Wiring
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, w) {
		t.Fatalf("JSON round trip: %v\n%s", err, b)
	}
}

func TestPlanInline(t *testing.T) {
	w, err := roles.Plan(rolestest.Table("actor", 3, "trainer", 1), roles.DefaultNames)
	if err != nil {
		t.Fatal(err)
	}
	if !w.Inline() || w.ActorPolicy != nil || !slices.Equal(w.ParamReaders, []int{0, 1, 2}) || w.Publisher != 3 {
		t.Fatalf("inline plan %+v", w)
	}
	if _, ok := w.PolicyOf(0); ok {
		t.Error("an inline actor has a policy worker")
	}
}

func TestPlanErrors(t *testing.T) {
	for _, tc := range []struct {
		tab  roles.Table
		want string
	}{
		{rolestest.Table("trainer", 1), `no "actor" ranks`},
		{rolestest.Table("actor", 2), `no "trainer" ranks`},
		{roles.Table{"actor": {0, 1}, "trainer": {1}}, `rank 1 is both "actor" and "trainer"`},
		{roles.Table{"actor": {-1}, "trainer": {1}}, `lists rank -1`},
	} {
		if _, err := roles.Plan(tc.tab, roles.DefaultNames); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Plan(%v): %v, want %q", tc.tab, err, tc.want)
		}
	}
}

// TestPlanProperties: for random tables, every actor has exactly one policy
// worker and one trainer of the table, servers' loads differ by at most one,
// ClientsOf partitions the actors, and the plan is the same every time.
func TestPlanProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		na, np, nt := 1+rng.IntN(40), rng.IntN(6), 1+rng.IntN(5)
		// Ranks of all roles shuffled over the world.
		ranks := rng.Perm(na + np + nt)
		tab := roles.Table{"actor": ranks[:na], "policy": ranks[na : na+np], "trainer": ranks[na+np:]}
		if np == 0 {
			delete(tab, "policy")
		}
		w, err := roles.Plan(tab, roles.DefaultNames)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := roles.Plan(tab, roles.DefaultNames)
		if !reflect.DeepEqual(w, again) {
			t.Fatal("Plan is not deterministic")
		}
		check := func(servers []int, of func(int) (int, bool)) {
			load := map[int]int{}
			for _, a := range w.Actors {
				s, ok := of(a)
				if !ok || !slices.Contains(servers, s) {
					t.Fatalf("actor %d served by %d (%v) not among %v", a, s, ok, servers)
				}
				load[s]++
			}
			lo, hi := na, 0
			total := 0
			for _, s := range servers {
				lo, hi = min(lo, load[s]), max(hi, load[s])
				clients := w.ClientsOf(s)
				total += len(clients)
				for _, c := range clients {
					if got, _ := of(c); got != s {
						t.Fatalf("ClientsOf(%d) lists %d, served by %d", s, c, got)
					}
				}
			}
			if hi-lo > 1 || total != na {
				t.Fatalf("loads from %d to %d, %d clients listed for %d actors", lo, hi, total, na)
			}
		}
		check(w.Trainers, w.TrainerOf)
		if np > 0 {
			check(w.Policies, w.PolicyOf)
		} else if !w.Inline() {
			t.Fatal("no policy workers, not inline")
		}
	}
}

func TestTableOf(t *testing.T) {
	got := roles.TableOf([]rank.Role{{Name: "actor", Ranks: []int{1, 2}}, {Name: "trainer", Ranks: []int{0}}})
	if !reflect.DeepEqual(got, roles.Table{"actor": {1, 2}, "trainer": {0}}) {
		t.Fatalf("TableOf: %v", got)
	}
	if roles.Assign(7, 3) != 1 || roles.Assign(0, 0) != -1 {
		t.Fatal("Assign")
	}
}
