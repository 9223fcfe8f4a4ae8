package roles_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"
)

// wantPeerClosed fails the test unless err says that the server (rank 0)
// closed its stream: ErrPeerClosed, never a lost server's error.
func wantPeerClosed(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, roles.ErrPeerClosed) || errors.Is(err, roles.ErrLost) || !strings.Contains(err.Error(), "rank 0") {
		t.Errorf("%s after the server closed: %v, want an error matching ErrPeerClosed naming rank 0", what, err)
	}
}

// TestClientsOfAClosedServerSayItClosed: a client that never reached its
// server before the server closed (a reader made but never fetching over TCP,
// or a client made after the Close) fails with ErrPeerClosed, as one that was
// connected does, not with the error of a lost server or of a refused
// connection: the server closed on purpose, and the client's rank can end
// cleanly.
func TestClientsOfAClosedServerSayItClosed(t *testing.T) {
	layouts(t, func(t *testing.T, layout string, _ roles.Transport) {
		w := rolestest.World(t, 2, layout)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		pub, err := roles.NewPublisher(ctx, w.Bootstrap(0), "theta", 4)
		if err != nil {
			t.Fatal(err)
		}
		r, err := roles.NewReader(ctx, w.Bootstrap(1), "theta", 1)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := pub.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = r.Latest(ctx)
		wantPeerClosed(t, "Latest of a reader that never fetched", err)
		_, err = r.Latest(ctx)
		wantPeerClosed(t, "Latest again", err)
		if r2, err := roles.NewReader(ctx, w.Bootstrap(1), "theta", 1); err == nil {
			_, err = r2.Latest(ctx)
			r2.Close()
			wantPeerClosed(t, "Latest of a reader made after the Close", err)
		} else {
			wantPeerClosed(t, "NewReader after the Close", err)
		}

		recv, err := roles.NewSampleReceiver(ctx, w.Bootstrap(0), "traj", roles.SampleConfig{MaxRecordBytes: 64, QueueBytes: 256})
		if err != nil {
			t.Fatal(err)
		}
		if err := recv.Close(); err != nil {
			t.Fatal(err)
		}
		if s, err := roles.DialSamples(ctx, w.Bootstrap(1), "traj", 0); err == nil {
			err = s.Push(ctx, roles.Record{Data: make([]byte, 8)})
			s.Close()
			wantPeerClosed(t, "Push of a sender dialled after the Close", err)
		} else {
			wantPeerClosed(t, "DialSamples after the Close", err)
		}

		srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", roles.InferenceConfig{ObsBytes: 16, ActBytes: 16})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if c, err := roles.DialInference(ctx, w.Bootstrap(1), "pi", 0); err == nil {
			_, err = c.Infer(ctx, make([]byte, 16), make([]byte, 16))
			c.Close()
			wantPeerClosed(t, "Infer of a client dialled after the Close", err)
		} else {
			wantPeerClosed(t, "DialInference after the Close", err)
		}
	})
}
