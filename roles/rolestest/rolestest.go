// Package rolestest helps test code that uses package roles: in-process worlds
// whose ranks are goroutines (over collectivetest's Bootstrap), roles tables
// written as counts, and a policy loop that answers an inference stream with a
// function.
//
// In order: World(t, hosts) (or Hosts for the layouts), then roles' servers and
// clients on the world's Bootstraps, each rank on its own goroutine; the world
// checks at the end of the test that no shared memory of its job is left.
package rolestest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/roles"
)

// Layouts of a world's hosts.
const (
	OneHost   = "one-host"   // every rank on one host: shared memory between all
	EachAlone = "each-alone" // every rank on a host of its own: TCP between all
)

// Hosts returns the host identities of n ranks laid out as layout.
func Hosts(n int, layout string) []string {
	hosts := make([]string, n)
	for i := range hosts {
		switch layout {
		case EachAlone:
			hosts[i] = fmt.Sprintf("host%d", i)
		default:
			hosts[i] = "host0"
		}
	}
	return hosts
}

// World returns an in-process world of n ranks laid out as layout, and checks
// when t ends that the job left no shared-memory segments behind (run after the
// cleanups registered later, which close the streams).
func World(t testing.TB, n int, layout string) *collectivetest.World {
	t.Helper()
	w := collectivetest.NewWorld(n, Hosts(n, layout)...)
	t.Cleanup(func() { collectivetest.CheckNoSegments(t, w.JobID()) })
	return w
}

// Table builds a roles table from names and counts, numbering ranks in order:
// Table("policy", 1, "actor", 8) puts the policy worker on rank 0 and the actors
// on ranks 1 to 8.
func Table(nameCount ...any) roles.Table {
	t := roles.Table{}
	next := 0
	for i := 0; i+1 < len(nameCount); i += 2 {
		name, count := nameCount[i].(string), nameCount[i+1].(int)
		for range count {
			t[name] = append(t[name], next)
			next++
		}
	}
	return t
}

// ServePolicy answers srv's batches with policy (called once per request, with
// the observation and the action to fill) and version, until ctx ends or srv is
// closed; it returns nil then. It returns the first error otherwise.
func ServePolicy(ctx context.Context, srv *roles.InferenceServer, version func() uint64, policy func(client int, obs, act []byte)) error {
	a := srv.Config().ActBytes
	var acts []byte
	for {
		b, err := srv.Next(ctx)
		if err != nil {
			if errors.Is(err, roles.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		if need := b.Len() * a; cap(acts) < need {
			acts = make([]byte, need)
		} else {
			acts = acts[:need]
			clear(acts)
		}
		for i := range b.Len() {
			policy(b.Client(i), b.Obs(i), acts[i*a:(i+1)*a])
		}
		if err := b.Reply(acts, version()); err != nil {
			if errors.Is(err, roles.ErrClosed) {
				return nil
			}
			return err
		}
	}
}
