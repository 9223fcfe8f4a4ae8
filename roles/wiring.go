package roles

import (
	"fmt"
	"maps"
	"slices"

	"github.com/gear-rl/gear/rank"
)

// Table is a world's roles: role name → the world ranks of the role, in
// role-rank order (the rank of role rank i is Table[role][i]).
type Table map[string][]int

// TableOf converts the roles of a rank.World (World.Roles) into a Table.
func TableOf(roles []rank.Role) Table {
	t := make(Table, len(roles))
	for _, r := range roles {
		t[r.Name] = slices.Clone(r.Ranks)
	}
	return t
}

// Names are the role names that Plan looks up.
type Names struct {
	Actor   string `json:"actor" toml:"actor"`
	Policy  string `json:"policy" toml:"policy"`
	Trainer string `json:"trainer" toml:"trainer"`
}

// DefaultNames are the role names of SRL: "actor", "policy" and "trainer".
var DefaultNames = Names{Actor: "actor", Policy: "policy", Trainer: "trainer"}

// Wiring says which ranks talk to which: the streams of an SRL job. It is plain
// data that every rank computes the same way from the same Table.
type Wiring struct {
	Names Names `json:"names"`
	// The world ranks of each role, in role-rank order.
	Actors   []int `json:"actors"`
	Policies []int `json:"policies,omitempty"`
	Trainers []int `json:"trainers"`
	// ActorPolicy[i] is the policy worker (world rank) serving the inference
	// stream of actor role rank i; nil in inline mode.
	ActorPolicy []int `json:"actor_policy,omitempty"`
	// ActorTrainer[i] is the trainer (world rank) receiving the samples of actor
	// role rank i.
	ActorTrainer []int `json:"actor_trainer"`
	// Publisher is the trainer (world rank) that publishes parameters: trainer
	// role rank 0 (trainers hold equal parameters after each step).
	Publisher int `json:"publisher"`
	// ParamReaders are the ranks that read parameters: the policy workers, or
	// in inline mode the actors.
	ParamReaders []int `json:"param_readers"`
}

// Assign maps client number i (a role rank) to one of servers, round-robin:
// i mod servers. Clients of one server differ in number by at most one
// between servers.
func Assign(i, servers int) int {
	if servers <= 0 {
		return -1
	}
	return i % servers
}

// Plan wires an SRL job: every actor gets a policy worker (round-robin by actor
// role rank, see Assign) unless there are none (inline mode: actors run the
// policy themselves and read parameters), and a trainer (round-robin likewise).
// It fails when there are no actors or no trainers, or when a rank is in two
// roles.
func Plan(t Table, n Names) (Wiring, error) {
	w := Wiring{Names: n, Actors: slices.Clone(t[n.Actor]), Policies: slices.Clone(t[n.Policy]), Trainers: slices.Clone(t[n.Trainer])}
	if len(w.Actors) == 0 {
		return Wiring{}, fmt.Errorf("roles: no %q ranks in the roles table (roles: %v)", n.Actor, slices.Sorted(maps.Keys(t)))
	}
	if len(w.Trainers) == 0 {
		return Wiring{}, fmt.Errorf("roles: no %q ranks in the roles table (roles: %v)", n.Trainer, slices.Sorted(maps.Keys(t)))
	}
	seen := map[int]string{}
	for _, role := range []struct {
		name  string
		ranks []int
	}{{n.Actor, w.Actors}, {n.Policy, w.Policies}, {n.Trainer, w.Trainers}} {
		for _, r := range role.ranks {
			if r < 0 {
				return Wiring{}, fmt.Errorf("roles: role %q lists rank %d", role.name, r)
			}
			if other, dup := seen[r]; dup {
				return Wiring{}, fmt.Errorf("roles: rank %d is both %q and %q", r, other, role.name)
			}
			seen[r] = role.name
		}
	}
	w.ActorTrainer = make([]int, len(w.Actors))
	for i := range w.Actors {
		w.ActorTrainer[i] = w.Trainers[Assign(i, len(w.Trainers))]
	}
	if len(w.Policies) > 0 {
		w.ActorPolicy = make([]int, len(w.Actors))
		for i := range w.Actors {
			w.ActorPolicy[i] = w.Policies[Assign(i, len(w.Policies))]
		}
		w.ParamReaders = slices.Clone(w.Policies)
	} else {
		w.ParamReaders = slices.Clone(w.Actors)
	}
	w.Publisher = w.Trainers[0]
	return w, nil
}

// Inline reports whether actors run the policy themselves (no policy workers):
// they call the policy directly, with parameters from a Reader, and need no
// inference stream.
func (w Wiring) Inline() bool { return len(w.Policies) == 0 }

// PolicyOf returns the policy worker of actor rank r, and false when r is no
// actor or the job is inline.
func (w Wiring) PolicyOf(r int) (int, bool) {
	i := slices.Index(w.Actors, r)
	if i < 0 || w.ActorPolicy == nil {
		return -1, false
	}
	return w.ActorPolicy[i], true
}

// TrainerOf returns the trainer of actor rank r, and false when r is no actor.
func (w Wiring) TrainerOf(r int) (int, bool) {
	i := slices.Index(w.Actors, r)
	if i < 0 {
		return -1, false
	}
	return w.ActorTrainer[i], true
}

// ClientsOf returns the actors (world ranks, ascending role rank) that talk to
// rank r: a policy worker's inference clients, or a trainer's sample senders.
func (w Wiring) ClientsOf(r int) []int {
	var out []int
	for i, a := range w.Actors {
		if w.ActorTrainer[i] == r || w.ActorPolicy != nil && w.ActorPolicy[i] == r {
			out = append(out, a)
		}
	}
	return out
}

// RoleOf returns the role of rank r in the wiring ("" if none).
func (w Wiring) RoleOf(r int) string {
	switch {
	case slices.Contains(w.Actors, r):
		return w.Names.Actor
	case slices.Contains(w.Policies, r):
		return w.Names.Policy
	case slices.Contains(w.Trainers, r):
		return w.Names.Trainer
	}
	return ""
}
