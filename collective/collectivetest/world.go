package collectivetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/gear-rl/gear/collective"
)

// World is an in-process rendezvous for n ranks: a shared key-value store, host
// identities, and news of lost ranks. It implements what rank.World does for a
// real job, for ranks that are goroutines of one process.
type World struct {
	n     int
	hosts []string
	job   string

	mu      sync.Mutex
	kv      map[string][]byte
	changed chan struct{} // closed and replaced on every Set
	lost    map[int]string
	fns     map[int]func(int, string)
	nextFn  int
}

// NewWorld returns a world of n ranks. hosts gives each rank's host identity
// (ranks with equal hosts may share memory); with none, all ranks are on "host0".
func NewWorld(n int, hosts ...string) *World {
	if len(hosts) == 0 {
		hosts = make([]string, n)
		for i := range hosts {
			hosts[i] = "host0"
		}
	}
	if len(hosts) != n {
		panic(fmt.Sprintf("collectivetest: %d hosts for %d ranks", len(hosts), n))
	}
	var b [6]byte
	rand.Read(b[:])
	return &World{
		n: n, hosts: slices.Clone(hosts), job: "test-" + hex.EncodeToString(b[:]),
		kv: map[string][]byte{}, changed: make(chan struct{}), lost: map[int]string{}, fns: map[int]func(int, string){},
	}
}

// JobID is the world's job ID: shared-memory segments of its communicators are
// named "gear.<JobID>.*".
func (w *World) JobID() string { return w.job }

// Bootstrap returns rank's view of the world.
func (w *World) Bootstrap(rank int) collective.Bootstrap {
	if rank < 0 || rank >= w.n {
		panic(fmt.Sprintf("collectivetest: rank %d of %d", rank, w.n))
	}
	return &bootstrap{w: w, rank: rank}
}

// Lose tells every rank's OnLost callbacks that rank died, as a coordinator
// would.
func (w *World) Lose(rank int, reason string) {
	w.mu.Lock()
	if _, ok := w.lost[rank]; ok {
		w.mu.Unlock()
		return
	}
	w.lost[rank] = reason
	fns := slices.Collect(maps.Values(w.fns))
	w.mu.Unlock()
	for _, fn := range fns {
		fn(rank, reason)
	}
}

// Keys returns the keys set so far, sorted.
func (w *World) Keys() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Sorted(maps.Keys(w.kv))
}

type bootstrap struct {
	w    *World
	rank int
}

var _ collective.Bootstrap = (*bootstrap)(nil)

func (b *bootstrap) Rank() int     { return b.rank }
func (b *bootstrap) Size() int     { return b.w.n }
func (b *bootstrap) Host() string  { return b.w.hosts[b.rank] }
func (b *bootstrap) JobID() string { return b.w.job }

func (b *bootstrap) Set(ctx context.Context, key string, value []byte) error {
	w := b.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.kv[key]; ok {
		return fmt.Errorf("collectivetest: key %q set twice", key)
	}
	w.kv[key] = slices.Clone(value)
	close(w.changed)
	w.changed = make(chan struct{})
	return nil
}

func (b *bootstrap) Wait(ctx context.Context, key string) ([]byte, error) {
	w := b.w
	for {
		w.mu.Lock()
		v, ok := w.kv[key]
		ch := w.changed
		w.mu.Unlock()
		if ok {
			return slices.Clone(v), nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("collectivetest: wait for %q: %w", key, ctx.Err())
		}
	}
}

func (b *bootstrap) OnLost(fn func(rank int, reason string)) (unregister func()) {
	w := b.w
	w.mu.Lock()
	id := w.nextFn
	w.nextFn++
	w.fns[id] = fn
	lost := maps.Clone(w.lost)
	w.mu.Unlock()
	for r, why := range lost {
		fn(r, why)
	}
	return func() {
		w.mu.Lock()
		delete(w.fns, id)
		w.mu.Unlock()
	}
}
