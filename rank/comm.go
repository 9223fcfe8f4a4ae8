package rank

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/gear-rl/gear/collective"
)

// comms holds the communicators a World builds on demand.
type comms struct {
	mu    sync.Mutex
	world *collective.Comm
	role  *collective.Comm
}

// CommContext returns the world communicator, built on first use with the
// transport that GEAR_TRANSPORT names (automatic when unset). Building it is
// collective: every rank must call CommContext before any of them can use it,
// and ctx bounds the wait for the others (the caller gives it a deadline, such
// as the world's rendezvous timeout, so that a rank that never comes gives an
// error). Later calls return the same communicator. The World owns it and
// closes it in Close.
func (w *World) CommContext(ctx context.Context) (*collective.Comm, error) {
	if err := w.checkOpen(); err != nil {
		return nil, err
	}
	w.comms.mu.Lock()
	defer w.comms.mu.Unlock()
	if w.comms.world != nil {
		return w.comms.world, nil
	}
	c, err := collective.New(ctx, w, collective.WithTransport(os.Getenv(EnvTransport)))
	if err != nil {
		return nil, err
	}
	w.comms.world = c
	return c, nil
}

// RoleComm returns the communicator of the caller's role: the ranks of the world
// whose GEAR_ROLE equals the caller's, ordered by world rank (so its ranks are the
// role ranks). Building it splits the world communicator, which is collective over
// the whole world: every rank of every role must call RoleComm. The World owns it.
func (w *World) RoleComm(ctx context.Context) (*collective.Comm, error) {
	world, err := w.CommContext(ctx)
	if err != nil {
		return nil, err
	}
	w.comms.mu.Lock()
	defer w.comms.mu.Unlock()
	if w.comms.role != nil {
		return w.comms.role, nil
	}
	color := -1
	for i, r := range w.Roles() {
		if r.Name == w.Role() {
			color = i
		}
	}
	if color < 0 {
		return nil, fmt.Errorf("rank: role %q of rank %d is not in the world's roles table", w.Role(), w.Rank())
	}
	c, err := world.Split(ctx, color, w.Rank())
	if err != nil {
		return nil, err
	}
	w.comms.role = c
	return c, nil
}

// closeComms closes the communicators built by CommContext and RoleComm.
func (w *World) closeComms() {
	w.comms.mu.Lock()
	defer w.comms.mu.Unlock()
	if w.comms.role != nil {
		w.comms.role.Close()
	}
	if w.comms.world != nil {
		w.comms.world.Close()
	}
}
