package collective

import "context"

// Bootstrap is what a communicator needs from the rendezvous that assembled its
// world: the caller's place in it, a key-value exchange visible to every rank of the
// world, the host identity, and news of ranks that died. rank.World implements it;
// package collectivetest has an in-process implementation for tests.
//
// New also uses two optional methods, found by type assertion:
//
//	JobID() string      // names the job's shared-memory segments "gear.<JobID>.*"
//	ListenHost() string // the address other hosts reach this rank at (TCP)
//
// Without JobID, segments are named after the process ("gear.local-<pid>.*");
// without ListenHost (and WithListenHost), TCP listens on 127.0.0.1, which serves
// a world on one host only.
//
// New keeps keys under "collective/<communicator>/" for itself: the details ranks
// exchange while they connect, and one key per communicator on which a rank whose
// communicator fails publishes the cause.
type Bootstrap interface {
	// Rank is the caller's index in the world.
	Rank() int
	// Size is the number of ranks in the world.
	Size() int
	// Host is the caller's host identity: ranks whose Host is equal share memory
	// (/dev/shm) and may use the shared-memory transport.
	Host() string
	// Set publishes value under key to every rank of the world. Keys are
	// write-once per world; setting a key twice is an error.
	Set(ctx context.Context, key string, value []byte) error
	// Wait blocks until key has been set by some rank and returns its value.
	Wait(ctx context.Context, key string) ([]byte, error)
	// OnLost registers fn to be called (from another goroutine) once for every rank
	// that the world learns has died, with the reason as the coordinator saw it.
	// The returned function unregisters fn.
	OnLost(fn func(rank int, reason string)) (unregister func())
}
