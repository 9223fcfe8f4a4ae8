package roles_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"

	"golang.org/x/sync/errgroup"
)

// layouts runs fn once with every rank on one host (shared memory) and once with
// every rank on a host of its own (TCP).
func layouts(t *testing.T, fn func(t *testing.T, layout string, want roles.Transport)) {
	t.Run("shm", func(t *testing.T) { fn(t, rolestest.OneHost, roles.TransportShm) })
	t.Run("tcp", func(t *testing.T) { fn(t, rolestest.EachAlone, roles.TransportTCP) })
}

// tagged is the test's policy: the action is the observation's tag (actor rank
// and step, the first 12 bytes) followed by a checksum of the whole observation.
func tagged(_ int, obs, act []byte) {
	copy(act, obs[:12])
	var sum uint32
	for _, b := range obs {
		sum = sum*31 + uint32(b)
	}
	binary.LittleEndian.PutUint32(act[12:], sum)
}

// TestInferenceRepliesMatchRequests: 8 actors send tagged observations of random
// lengths to one policy worker that batches them; every actor gets the action
// computed from its own observation, never another's, over both transports.
func TestInferenceRepliesMatchRequests(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, want roles.Transport) {
		const actors, steps, maxBatch = 8, 300, 4
		w := rolestest.World(t, actors+1, layout)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cfg := roles.InferenceConfig{MaxBatch: maxBatch, MaxDelay: 20 * time.Millisecond, ObsBytes: 100, ActBytes: 16}
		srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()

		// The policy replies with one version per batch, so the requests that
		// got a version are that batch.
		var requests, biggest atomic.Int64
		var version atomic.Uint64
		policyCtx, stopPolicy := context.WithCancel(ctx)
		policyDone := make(chan error, 1)
		go func() {
			policyDone <- rolestest.ServePolicy(policyCtx, srv, func() uint64 {
				return version.Add(1)
			}, func(client int, obs, act []byte) {
				if got := int(binary.LittleEndian.Uint32(obs)); got != client {
					t.Errorf("request from rank %d carries the tag of rank %d", client, got)
				}
				tagged(client, obs, act)
			})
		}()

		g, gctx := errgroup.WithContext(ctx)
		var mu sync.Mutex
		perVersion := map[uint64]int{}
		for a := 1; a <= actors; a++ {
			g.Go(func() error {
				c, err := roles.DialInference(gctx, w.Bootstrap(a), "pi", 0)
				if err != nil {
					return err
				}
				defer c.Close()
				if c.Transport() != want {
					return fmt.Errorf("actor %d uses %s, want %s", a, c.Transport(), want)
				}
				rng := rand.New(rand.NewPCG(uint64(a), 1))
				obs := make([]byte, cfg.ObsBytes)
				act, wantAct := make([]byte, cfg.ActBytes), make([]byte, cfg.ActBytes)
				last := uint64(0)
				for step := range steps {
					n := 12 + rng.IntN(cfg.ObsBytes-12+1)
					binary.LittleEndian.PutUint32(obs, uint32(a))
					binary.LittleEndian.PutUint64(obs[4:], uint64(step))
					for i := 12; i < n; i++ {
						obs[i] = byte(rng.Uint32())
					}
					v, err := c.Infer(gctx, obs[:n], act)
					if err != nil {
						return fmt.Errorf("actor %d step %d: %w", a, step, err)
					}
					tagged(a, obs[:n], wantAct)
					if string(act) != string(wantAct) {
						return fmt.Errorf("actor %d step %d: action %x, want %x (rank %d step %d's)", a, step, act, wantAct,
							binary.LittleEndian.Uint32(act), binary.LittleEndian.Uint64(act[4:]))
					}
					if v <= last {
						return fmt.Errorf("actor %d step %d: version %d after %d", a, step, v, last)
					}
					last = v
					requests.Add(1)
					mu.Lock()
					perVersion[v]++
					mu.Unlock()
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		stopPolicy()
		if err := <-policyDone; err != nil {
			t.Fatal(err)
		}
		for _, n := range perVersion {
			if int64(n) > biggest.Load() {
				biggest.Store(int64(n))
			}
			if n > maxBatch {
				t.Errorf("a batch of %d requests, MaxBatch is %d", n, maxBatch)
			}
		}
		if requests.Load() != actors*steps {
			t.Errorf("%d requests answered, want %d", requests.Load(), actors*steps)
		}
		if biggest.Load() < 2 {
			t.Errorf("no batch held more than one request (%d batches)", len(perVersion))
		}
		t.Logf("%d requests in %d batches (mean %.2f, largest %d)", requests.Load(), len(perVersion),
			float64(requests.Load())/float64(len(perVersion)), biggest.Load())
	})
}
