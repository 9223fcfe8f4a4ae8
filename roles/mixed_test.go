package roles_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/roles"

	"golang.org/x/sync/errgroup"
)

// TestMixedTransports: one policy worker and one trainer (rank 0) serve four
// actors on their host (shared memory) and four on other hosts (TCP) at once:
// replies reach the right actor, and the trainer gets every actor's records in
// order.
func TestMixedTransports(t *testing.T) {
	const steps = 200
	hosts := []string{"h0", "h0", "h0", "h0", "h0", "h1", "h2", "h3", "h4"}
	w := collectivetest.NewWorld(len(hosts), hosts...)
	t.Cleanup(func() { collectivetest.CheckNoSegments(t, w.JobID()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := roles.NewInferenceServer(ctx, w.Bootstrap(0), "pi", roles.InferenceConfig{ObsBytes: 32, ActBytes: 16, MaxBatch: 8, MaxDelay: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	recv, err := roles.NewSampleReceiver(ctx, w.Bootstrap(0), "traj", roles.SampleConfig{MaxRecordBytes: 64, QueueBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	stop := startPolicy(t, ctx, srv)
	defer stop()

	g, gctx := errgroup.WithContext(ctx)
	for a := 1; a < len(hosts); a++ {
		g.Go(func() error {
			c, err := roles.DialInference(gctx, w.Bootstrap(a), "pi", 0)
			if err != nil {
				return err
			}
			defer c.Close()
			s, err := roles.DialSamples(gctx, w.Bootstrap(a), "traj", 0)
			if err != nil {
				return err
			}
			defer s.Close()
			want := roles.TransportTCP
			if hosts[a] == hosts[0] {
				want = roles.TransportShm
			}
			if c.Transport() != want || s.Transport() != want {
				return fmt.Errorf("actor %d: transports %s and %s, want %s", a, c.Transport(), s.Transport(), want)
			}
			obs, act, wantAct := make([]byte, 32), make([]byte, 16), make([]byte, 16)
			for step := range steps {
				binary.LittleEndian.PutUint32(obs, uint32(a))
				binary.LittleEndian.PutUint64(obs[4:], uint64(step))
				if _, err := c.Infer(gctx, obs, act); err != nil {
					return err
				}
				tagged(a, obs, wantAct)
				if string(act) != string(wantAct) {
					return fmt.Errorf("actor %d step %d: another actor's reply", a, step)
				}
				if err := s.Push(gctx, roles.Record{Version: uint64(step), Data: obs[:12]}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		next := map[int]uint64{}
		for range (len(hosts) - 1) * steps {
			rec, err := recv.Recv(gctx)
			if err != nil {
				return err
			}
			a := int(binary.LittleEndian.Uint32(rec.Data))
			if a != rec.Actor || rec.Version != next[a] || binary.LittleEndian.Uint64(rec.Data[4:]) != next[a] {
				return fmt.Errorf("record %x from actor %d version %d, want actor %d's step %d", rec.Data, rec.Actor, rec.Version, a, next[a])
			}
			next[a]++
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}
