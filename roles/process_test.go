package roles_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/launch/launchtest"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/roles"
)

// TestPolicyWorkerKilled runs a real SRL job, each rank a process: a trainer
// publishes parameters and receives samples, a policy worker reads the
// parameters and serves two actors, which push samples tagged with the version
// they were served with. After a while the policy worker kills itself with
// SIGKILL; both actors must fail with an error naming it, instead of hanging,
// over shared memory and over TCP.
func TestPolicyWorkerKilled(t *testing.T) {
	for _, tc := range []struct {
		name string
		tr   roles.Transport
	}{{"shm", roles.TransportShm}, {"tcp", roles.TransportTCP}} {
		t.Run(tc.name, func(t *testing.T) {
			const served = 200 // requests before the policy worker dies
			launchtest.RunRanks(t, 4, func(t *testing.T, w *rank.World) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				plan, err := roles.Plan(roles.TableOf(w.Roles()), roles.DefaultNames)
				if err != nil {
					t.Fatal(err)
				}
				switch w.Role() {
				case "trainer":
					pub, err := roles.NewPublisher(ctx, w, "theta", 4, roles.WithTransport(tc.tr))
					if err != nil {
						t.Fatal(err)
					}
					defer pub.Close()
					if err := pub.Publish(ctx, 1, []float32{1, 2, 3, 4}); err != nil {
						t.Fatal(err)
					}
					recv, err := roles.NewSampleReceiver(ctx, w, "traj", roles.SampleConfig{MaxRecordBytes: 1024}, roles.WithTransport(tc.tr))
					if err != nil {
						t.Fatal(err)
					}
					defer recv.Close()
					// Receive until the launcher stops the job.
					for {
						rec, err := recv.Recv(ctx)
						if err != nil {
							t.Fatal(err)
						}
						if rec.Version != 1 || len(rec.Data) != 64 {
							t.Fatalf("record of version %d, %d bytes", rec.Version, len(rec.Data))
						}
					}
				case "policy":
					params, err := roles.NewReader(ctx, w, "theta", 10, roles.WithTransport(tc.tr))
					if err != nil {
						t.Fatal(err)
					}
					defer params.Close()
					if _, err := params.Wait(ctx, 1); err != nil {
						t.Fatal(err)
					}
					srv, err := roles.NewInferenceServer(ctx, w, "pi", roles.InferenceConfig{ObsBytes: 64, ActBytes: 8}, roles.WithTransport(tc.tr))
					if err != nil {
						t.Fatal(err)
					}
					defer srv.Close()
					n := 0
					for {
						b, err := srv.Next(ctx)
						if err != nil {
							t.Fatal(err)
						}
						n += b.Len()
						if n >= served {
							fmt.Printf("policy worker rank %d: served %d requests, killing itself\n", w.Rank(), n)
							syscall.Kill(os.Getpid(), syscall.SIGKILL)
							select {}
						}
						if _, err := params.MaybeRefresh(ctx, int64(n)); err != nil {
							t.Fatal(err)
						}
						if err := b.Reply(make([]byte, 8*b.Len()), params.Version()); err != nil {
							t.Fatal(err)
						}
					}
				}
				// An actor: outlive the launcher's SIGTERM long enough to report.
				signal.Ignore(syscall.SIGTERM)
				policy, _ := plan.PolicyOf(w.Rank())
				c, err := roles.DialInference(ctx, w, "pi", policy, roles.WithTransport(tc.tr))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if c.Transport() != tc.tr {
					t.Fatalf("transport %s, want %s", c.Transport(), tc.tr)
				}
				samples, err := roles.DialSamples(ctx, w, "traj", plan.ActorTrainer[w.RoleRank()], roles.WithTransport(tc.tr))
				if err != nil {
					t.Fatal(err)
				}
				defer samples.Close()
				var steps atomic.Int64
				obs, act := make([]byte, 64), make([]byte, 8)
				for {
					v, err := c.Infer(ctx, obs, act)
					if err == nil {
						if steps.Add(1)%10 == 0 {
							if err := samples.Push(ctx, roles.Record{Version: v, Data: obs}); err != nil {
								t.Fatal(err)
							}
						}
						continue
					}
					fmt.Printf("actor rank %d: after %d steps: %v\n", w.Rank(), steps.Load(), err)
					var lost *roles.LostError
					if !errors.As(err, &lost) || lost.Rank != policy || lost.Role != "policy worker" {
						t.Fatalf("Infer: %v, want a *LostError naming policy worker rank %d", err, policy)
					}
					return
				}
			}, launchtest.Roles("policy", 1, "actor", 2, "trainer", 1), launchtest.Timeout(time.Minute),
				launchtest.ExpectFailure(func(res *launch.Result, output string) error {
					if res.FailedRank != 0 || res.Ranks[0].Signal != "SIGKILL" {
						return fmt.Errorf("job ended by rank %d (%+v), want rank 0 killed by SIGKILL", res.FailedRank, res.Ranks[0])
					}
					for _, a := range []int{1, 2} {
						want := fmt.Sprintf("[%d] actor rank %d: after ", a, a)
						i := strings.Index(output, want)
						if i < 0 {
							return fmt.Errorf("actor rank %d did not report its error", a)
						}
						line, _, _ := strings.Cut(output[i:], "\n")
						t.Log(line)
						if !strings.Contains(line, "roles: policy worker rank 0 lost: ") {
							return fmt.Errorf("actor rank %d: %q does not name the policy worker", a, line)
						}
						if res.Ranks[a].Code != 0 {
							return fmt.Errorf("actor rank %d %s", a, res.Ranks[a].Status)
						}
					}
					if left := collectivetest.Segments(res.JobID); len(left) > 0 {
						return fmt.Errorf("shared memory left behind: %v", left)
					}
					return nil
				}))
		})
	}
}
