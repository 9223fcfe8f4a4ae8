package roles_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"
)

func startPolicy(t *testing.T, ctx context.Context, srv *roles.InferenceServer) (stop func()) {
	t.Helper()
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- rolestest.ServePolicy(pctx, srv, func() uint64 { return 7 }, tagged)
	}()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// inferPair starts the inference stream "pi" of 16-byte observations and
// actions on rank 0 of w and dials it from rank 1; both are closed when the
// test ends.
func inferPair(t *testing.T, ctx context.Context, w *collectivetest.World) (*roles.InferenceServer, *roles.InferenceClient) {
	t.Helper()
	srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", roles.InferenceConfig{ObsBytes: 16, ActBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := roles.DialInference(ctx, w.Bootstrap(1), "pi", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// TestInferenceLostServer: the coordinator's news that the policy worker died
// fails its actor's Infer at once, naming the policy worker, even while the
// actor waits for a reply.
func TestInferenceLostServer(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		w := rolestest.World(t, 2, layout)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, c := inferPair(t, ctx, w)
		// Nobody serves: the request waits until the loss is announced.
		go func() {
			time.Sleep(50 * time.Millisecond)
			w.Lose(0, "exited with status 3")
		}()
		_, err := c.Infer(ctx, make([]byte, 16), make([]byte, 16))
		var lost *roles.LostError
		if !errors.As(err, &lost) || lost.Rank != 0 || !errors.Is(err, roles.ErrLost) {
			t.Fatalf("Infer: %v, want a *LostError for rank 0", err)
		}
		if want := "roles: policy worker rank 0 lost: exited with status 3"; err.Error() != want {
			t.Fatalf("Infer: %q, want %q", err, want)
		}
		// And stays failed.
		if _, err := c.Infer(ctx, make([]byte, 16), make([]byte, 16)); !errors.As(err, &lost) {
			t.Fatalf("second Infer: %v", err)
		}
	})
}

// servedOnce makes a policy worker and an actor on a world of layout, has
// the worker answer one Infer, and stops it (the server stays open). The
// context ends with the test.
func servedOnce(t *testing.T, layout string) (context.Context, *roles.InferenceServer, *roles.InferenceClient, []byte) {
	t.Helper()
	w := rolestest.World(t, 2, layout)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	srv, c := inferPair(t, ctx, w)
	stop := startPolicy(t, ctx, srv)
	act := make([]byte, 16)
	if _, err := c.Infer(ctx, make([]byte, 16), act); err != nil {
		t.Fatal(err)
	}
	stop()
	return ctx, srv, c, act
}

// TestInferenceServerClose: a policy worker that closes its stream makes its
// actors' calls fail with ErrPeerClosed, not hang.
func TestInferenceServerClose(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		ctx, srv, c, act := servedOnce(t, layout)
		go func() {
			time.Sleep(50 * time.Millisecond)
			srv.Close()
		}()
		_, err := c.Infer(ctx, make([]byte, 16), act)
		if !errors.Is(err, roles.ErrPeerClosed) || !strings.Contains(err.Error(), "policy worker rank 0") {
			t.Fatalf("Infer after the server closed: %v", err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Next(ctx); !errors.Is(err, roles.ErrClosed) {
			t.Fatalf("Next after Close: %v", err)
		}
	})
}

// TestInferenceCancelThenContinue: an Infer cut short by its context leaves the
// client usable: the next call drops the late reply and gets its own.
func TestInferenceCancelThenContinue(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		w := rolestest.World(t, 2, layout)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv, c := inferPair(t, ctx, w)
		obs, act := make([]byte, 16), make([]byte, 16)
		obs[0] = 1
		short, cancelShort := context.WithTimeout(ctx, 30*time.Millisecond)
		_, err := c.Infer(short, obs, act)
		cancelShort()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Infer with nobody serving: %v, want the deadline", err)
		}
		// The policy starts now and answers the abandoned request first.
		stop := startPolicy(t, ctx, srv)
		defer stop()
		obs[0] = 2
		want := make([]byte, 16)
		tagged(1, obs, want)
		v, err := c.Infer(ctx, obs, act)
		if err != nil {
			t.Fatal(err)
		}
		if string(act) != string(want) || v != 7 {
			t.Fatalf("reply %x version %d, want %x version 7", act, v, want)
		}
	})
}

// TestInferenceSizesAndSlots: oversized observations and wrong action buffers
// are refused; a server with every slot taken refuses another local client.
func TestInferenceSizesAndSlots(t *testing.T) {
	w := rolestest.World(t, 3, rolestest.OneHost)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", roles.InferenceConfig{ObsBytes: 8, ActBytes: 4, Slots: 1}, roles.WithTransport(roles.TransportShm))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := roles.DialInference(ctx, w.Bootstrap(1), "pi", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if o, a := c.Sizes(); o != 8 || a != 4 {
		t.Fatalf("sizes %d, %d", o, a)
	}
	if _, err := c.Infer(ctx, make([]byte, 9), make([]byte, 4)); !errors.Is(err, roles.ErrTooLarge) {
		t.Fatalf("9-byte observation: %v", err)
	}
	if _, err := c.Infer(ctx, make([]byte, 8), make([]byte, 5)); err == nil {
		t.Fatal("5-byte action buffer accepted")
	}
	if _, err := roles.DialInference(ctx, w.Bootstrap(2), "pi", 0); !errors.Is(err, roles.ErrNoSlot) {
		t.Fatalf("second client on one slot: %v", err)
	}
	// The slot comes back on Close.
	c.Close()
	c2, err := roles.DialInference(ctx, w.Bootstrap(2), "pi", 0)
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	if _, err := c.Infer(ctx, make([]byte, 8), make([]byte, 4)); !errors.Is(err, roles.ErrClosed) {
		t.Fatalf("Infer after Close: %v", err)
	}
	for _, bad := range []roles.InferenceConfig{{ObsBytes: 0, ActBytes: 1}, {ObsBytes: 1, ActBytes: 1, MaxBatch: -1}, {ObsBytes: 1, ActBytes: 1, Slots: -2}} {
		if _, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "bad", bad); err == nil {
			t.Errorf("config %+v accepted", bad)
		}
	}
	if _, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "no/slash", roles.InferenceConfig{ObsBytes: 1, ActBytes: 1}); err == nil {
		t.Error("name with a slash accepted")
	}
}

// TestInferenceFlushOnDelay: with two clients attached and only one asking, the
// batch goes out after MaxDelay with one request; with both asking it goes out
// with both, without waiting for MaxBatch.
func TestInferenceFlushOnDelay(t *testing.T) {
	w := rolestest.World(t, 3, rolestest.OneHost)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", roles.InferenceConfig{ObsBytes: 16, ActBytes: 16, MaxBatch: 64, MaxDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var clients [2]*roles.InferenceClient
	for i := range clients {
		if clients[i], err = roles.DialInference(ctx, w.Bootstrap(i+1), "pi", 0); err != nil {
			t.Fatal(err)
		}
		defer clients[i].Close()
	}
	if n := srv.Clients(); n != 2 {
		t.Fatalf("Clients() = %d, want 2", n)
	}
	infer := func(c *roles.InferenceClient) chan error {
		ch := make(chan error, 1)
		go func() {
			obs := make([]byte, 16)
			_, err := c.Infer(ctx, obs, make([]byte, 16))
			ch <- err
		}()
		return ch
	}
	one := infer(clients[0])
	b, err := srv.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != 1 || b.Client(0) != 1 {
		t.Fatalf("batch of %d (first client %d), want 1 request of rank 1", b.Len(), b.Client(0))
	}
	if err := b.Reply(make([]byte, 16), 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Reply(make([]byte, 16), 1); err == nil {
		t.Fatal("second Reply accepted")
	}
	if err := <-one; err != nil {
		t.Fatal(err)
	}
	a, c := infer(clients[0]), infer(clients[1])
	b, err = srv.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for b.Len() < 2 {
		// The second request came after the first had waited MaxDelay.
		if err := b.Reply(make([]byte, 16*b.Len()), 2); err != nil {
			t.Fatal(err)
		}
		if b, err = srv.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.Gather(nil); len(got) != 2*16 {
		t.Fatalf("Gather: %d bytes", len(got))
	}
	if err := b.Reply(make([]byte, 15), 2); err == nil {
		t.Fatal("short actions accepted")
	}
	if err := b.Reply(make([]byte, 32), 2); err != nil {
		t.Fatal(err)
	}
	if err := <-a; err != nil {
		t.Fatal(err)
	}
	if err := <-c; err != nil {
		t.Fatal(err)
	}
}

// TestInferenceServerCloseStays: once a policy worker closed its stream, every
// later Infer of its actors fails with ErrPeerClosed, never with a lost
// server's error, whether the actor was waiting or idle when it closed.
func TestInferenceServerCloseStays(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		ctx, srv, c, act := servedOnce(t, layout)
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			_, err := c.Infer(ctx, make([]byte, 16), act)
			if !errors.Is(err, roles.ErrPeerClosed) || errors.Is(err, roles.ErrLost) || !strings.Contains(err.Error(), "policy worker rank 0") {
				t.Fatalf("Infer %d after the server closed: %v", i, err)
			}
		}
		if _, err := c.InferMany(ctx, make([]byte, 16), 1, act); !errors.Is(err, roles.ErrPeerClosed) {
			t.Fatalf("InferMany after the server closed: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	})
}
