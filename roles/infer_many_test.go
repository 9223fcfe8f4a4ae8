package roles_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"

	"golang.org/x/sync/errgroup"
)

// serveInPlace answers srv's batches until ctx ends, writing each row's action
// (tagged of its observation) straight into the batch's action views, and
// reports every batch's rows and requests on batches.
func serveInPlace(ctx context.Context, srv *roles.InferenceServer, batches chan<- [2]int) error {
	for v := uint64(1); ; v++ {
		b, err := srv.Next(ctx)
		if err != nil {
			if errors.Is(err, roles.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		for i := range b.Len() {
			tagged(b.Client(i), b.Obs(i), b.Action(i))
		}
		if batches != nil {
			batches <- [2]int{b.Len(), b.Requests()}
		}
		if err := b.Send(v); err != nil {
			return err
		}
	}
}

// TestInferManyRepliesInOrder: 4 actors each send requests of 1 to 8 tagged
// observations (of a length that changes from request to request); the policy
// worker batches them (up to 16 observations, so some requests wait for the
// next batch) and writes the actions in place; every actor gets, in order, the
// action of each of its own observations, over both transports.
func TestInferManyRepliesInOrder(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, want roles.Transport) {
		const actors, steps, k, maxBatch = 4, 200, 8, 16
		w := rolestest.World(t, actors+1, layout)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cfg := roles.InferenceConfig{MaxBatch: maxBatch, MaxRequestObs: k, MaxDelay: 20 * time.Millisecond, ObsBytes: 40, ActBytes: 16}
		srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		batches := make(chan [2]int, 1<<16)
		pctx, stop := context.WithCancel(ctx)
		served := make(chan error, 1)
		go func() { served <- serveInPlace(pctx, srv, batches) }()

		g, gctx := errgroup.WithContext(ctx)
		for a := 1; a <= actors; a++ {
			g.Go(func() error {
				c, err := roles.DialInference(gctx, w.Bootstrap(a), "pi", 0)
				if err != nil {
					return err
				}
				defer c.Close()
				if c.Transport() != want || c.MaxRequestObs() != k {
					return fmt.Errorf("actor %d: %s, %d observations per request", a, c.Transport(), c.MaxRequestObs())
				}
				rng := rand.New(rand.NewPCG(uint64(a), 2))
				obs, acts, wantAct := make([]byte, k*cfg.ObsBytes), make([]byte, k*cfg.ActBytes), make([]byte, cfg.ActBytes)
				for step := range steps {
					n := 1 + rng.IntN(k)
					stride := 16 + rng.IntN(cfg.ObsBytes-16+1)
					for j := range n {
						o := obs[j*stride : (j+1)*stride]
						binary.LittleEndian.PutUint32(o, uint32(a))
						binary.LittleEndian.PutUint32(o[4:], uint32(step))
						binary.LittleEndian.PutUint32(o[8:], uint32(j))
						for i := 12; i < stride; i++ {
							o[i] = byte(rng.Uint32())
						}
					}
					if _, err := c.InferMany(gctx, obs[:n*stride], n, acts[:n*cfg.ActBytes]); err != nil {
						return fmt.Errorf("actor %d step %d: %w", a, step, err)
					}
					for j := range n {
						tagged(a, obs[j*stride:(j+1)*stride], wantAct)
						if got := acts[j*cfg.ActBytes : (j+1)*cfg.ActBytes]; string(got) != string(wantAct) {
							return fmt.Errorf("actor %d step %d: action %d of %d is %x, want %x (rank %d step %d observation %d's)", a, step, j, n, got, wantAct,
								binary.LittleEndian.Uint32(got), binary.LittleEndian.Uint32(got[4:]), binary.LittleEndian.Uint32(got[8:]))
						}
					}
				}
				// Requests the stream cannot take.
				if _, err := c.InferMany(gctx, make([]byte, (k+1)*4), k+1, make([]byte, (k+1)*cfg.ActBytes)); !errors.Is(err, roles.ErrTooLarge) {
					return fmt.Errorf("%d observations: %v, want ErrTooLarge", k+1, err)
				}
				if _, err := c.InferMany(gctx, make([]byte, 2*(cfg.ObsBytes+1)), 2, make([]byte, 2*cfg.ActBytes)); !errors.Is(err, roles.ErrTooLarge) {
					return fmt.Errorf("observations of %d bytes: %v, want ErrTooLarge", cfg.ObsBytes+1, err)
				}
				if _, err := c.InferMany(gctx, make([]byte, 7), 2, make([]byte, 2*cfg.ActBytes)); err == nil {
					return errors.New("7 bytes split into 2 observations accepted")
				}
				if _, err := c.InferMany(gctx, make([]byte, 8), 2, make([]byte, cfg.ActBytes)); err == nil {
					return errors.New("room for 1 action for 2 observations accepted")
				}
				if _, err := c.InferMany(gctx, nil, 0, nil); err == nil {
					return errors.New("a request of 0 observations accepted")
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		stop()
		if err := <-served; err != nil {
			t.Fatal(err)
		}
		close(batches)
		multi := 0
		for b := range batches {
			if b[0] > maxBatch {
				t.Errorf("a batch of %d observations, MaxBatch is %d", b[0], maxBatch)
			}
			if b[1] > 1 {
				multi++
			}
		}
		st := srv.Stats()
		if st.Requests != actors*steps {
			t.Errorf("%d requests batched, want %d", st.Requests, actors*steps)
		}
		if multi == 0 || st.Full == 0 {
			t.Errorf("%d batches of several requests, %d full ones: %+v", multi, st.Full, st)
		}
		t.Logf("%+v", st)
	})
}

// paceRig is a policy worker driven by the test and its three actors, each
// sending requests of k observations when told to.
type paceRig struct {
	srv  *roles.InferenceServer
	cfg  roles.InferenceConfig
	send [3]chan int // a request's step number; closing it ends the actor
	errs chan error
}

func newPaceRig(t *testing.T, ctx context.Context, layout string, k int) *paceRig {
	t.Helper()
	w := rolestest.World(t, 4, layout)
	// A minute: a batch that waited for MaxDelay would outlast the test's
	// context, and be counted as cancelled.
	r := &paceRig{cfg: roles.InferenceConfig{MaxBatch: 64, MaxRequestObs: k, MaxDelay: time.Minute, ObsBytes: 16, ActBytes: 16}, errs: make(chan error, 3)}
	var err error
	if r.srv, err = roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", r.cfg); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		// Closing the server ends a request still out (after a failure).
		r.srv.Close()
		for _, ch := range r.send {
			close(ch)
		}
		wg.Wait()
	})
	for i := range r.send {
		r.send[i] = make(chan int)
		c, err := roles.DialInference(ctx, w.Bootstrap(i+1), "pi", 0)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer c.Close()
			a := i + 1
			obs, acts, wantAct := make([]byte, k*16), make([]byte, k*16), make([]byte, 16)
			for step := range r.send[i] {
				for j := range k {
					binary.LittleEndian.PutUint32(obs[j*16:], uint32(a))
					binary.LittleEndian.PutUint32(obs[j*16+4:], uint32(step))
					binary.LittleEndian.PutUint32(obs[j*16+8:], uint32(j))
				}
				_, err := c.InferMany(ctx, obs, k, acts)
				for j := range k {
					tagged(a, obs[j*16:(j+1)*16], wantAct)
					if err == nil && string(acts[j*16:(j+1)*16]) != string(wantAct) {
						err = fmt.Errorf("actor %d step %d: action %d out of order", a, step, j)
					}
				}
				select {
				case r.errs <- err:
				default: // the test failed and stopped reading
				}
			}
		})
	}
	// A TCP client counts once the server's side of its connection runs.
	for r.srv.Clients() < 3 {
		if ctx.Err() != nil {
			t.Fatalf("%d clients attached", r.srv.Clients())
		}
		time.Sleep(time.Millisecond)
	}
	return r
}

// round has the actors in who send a request each, and serves batches until
// all are answered; it returns the batches' request counts.
func (r *paceRig) round(t *testing.T, ctx context.Context, step int, who ...int) []int {
	t.Helper()
	for _, a := range who {
		r.send[a] <- step
	}
	var sizes []int
	for answered := 0; answered < len(who); {
		b, err := r.srv.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if b.Len() != b.Requests()*r.cfg.MaxRequestObs {
			t.Fatalf("a batch of %d requests has %d rows, want %d each", b.Requests(), b.Len(), r.cfg.MaxRequestObs)
		}
		for i := range b.Len() {
			tagged(b.Client(i), b.Obs(i), b.Action(i))
		}
		if err := b.Send(uint64(step)); err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, b.Requests())
		for range b.Requests() {
			if err := <-r.errs; err != nil {
				t.Fatal(err)
			}
			answered++
		}
	}
	return sizes
}

// TestInferenceFlushWhenAllIn: three actors of unknown pace (in their first and
// second requests) each send a request of 4 observations; with MaxDelay a
// minute away, the batch goes out as soon as all three requests are in it (12
// rows, each request's observations in order).
func TestInferenceFlushWhenAllIn(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r := newPaceRig(t, ctx, layout, 4)
		for step := range 2 {
			if sizes := r.round(t, ctx, step, 0, 1, 2); len(sizes) != 1 || sizes[0] != 3 {
				t.Fatalf("round %d: batches of %v requests, want one of 3", step, sizes)
			}
		}
		if st := r.srv.Stats(); st.AllIn != 2 || st.Batches != 2 || st.Observations != 24 {
			t.Fatalf("stats %+v, want 2 batches of every client (24 observations)", st)
		}
	})
}

// TestInferenceFlushPacedWhenOneIdle: once the three actors' paces are known,
// one goes idle; the batches of the other two go out without it, once it is
// overdue by its own pace, and never wait for MaxDelay (a minute).
func TestInferenceFlushPacedWhenOneIdle(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r := newPaceRig(t, ctx, layout, 2)
		// Two rounds of everyone: a pace is known from a client's second
		// request on; until then batches wait for every client.
		for step := range 2 {
			if sizes := r.round(t, ctx, step, 0, 1, 2); len(sizes) != 1 || sizes[0] != 3 {
				t.Fatalf("round %d: batches of %v requests, want one of 3", step, sizes)
			}
		}
		const rounds = 20
		for step := 2; step < 2+rounds; step++ {
			for _, n := range r.round(t, ctx, step, 0, 1) {
				if n > 2 {
					t.Fatalf("round %d: a batch of %d requests with 2 actors asking", step, n)
				}
			}
		}
		st := r.srv.Stats()
		if st.MaxDelay != 0 || st.Cancelled != 0 || st.Paced < rounds || st.Requests != 3*2+2*rounds {
			t.Fatalf("stats %+v: want every batch of the two actors paced, none after MaxDelay", st)
		}
		t.Logf("%+v", st)
	})
}
