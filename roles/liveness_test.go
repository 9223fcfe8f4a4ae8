package roles_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective/collectivetest"
	"github.com/gear-rl/gear/roles"
	"github.com/gear-rl/gear/roles/rolestest"
)

// Set in a child policy worker process: "dir,transport,job,mode", mode "hold"
// (answer 20 requests, then none) or "serve" (answer until killed).
const childEnv = "GEAR_ROLES_TEST_POLICY_CHILD"

// TestHelperPolicyProcess is not a test: it is the body of the child processes
// that TestLivenessWithoutCoordinator and the process benchmarks start, and it
// does nothing unless childEnv is set.
func TestHelperPolicyProcess(t *testing.T) {
	if spec := os.Getenv(childEnv); spec != "" {
		runChildPolicy(t, spec)
	}
}

// startChildPolicy starts a policy worker (rank 0 of a two-rank world whose
// key-value exchange is dir) in a child process; stop kills it and waits.
func startChildPolicy(t testing.TB, dir, job string, tr roles.Transport, mode string) (cmd *exec.Cmd, stop func()) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^TestHelperPolicyProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%s,%s", childEnv, dir, tr, job, mode))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return cmd, func() {
		once.Do(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
}

// TestLivenessWithoutCoordinator: a policy worker in a child process is killed
// with SIGKILL while nobody reports losses (the bootstrap is a shared
// directory); its actor still fails with an error naming it: over shared memory
// because the segment's owner lock is gone, over TCP because the connection
// broke.
func TestLivenessWithoutCoordinator(t *testing.T) {
	for _, tc := range []struct {
		name string
		tr   roles.Transport
		want string
	}{
		{"shm", roles.TransportShm, "its process ended (shared memory gear."},
		{"tcp", roles.TransportTCP, "connection to 127.0.0.1:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			job := fmt.Sprintf("test-live-%d-%s", os.Getpid(), tc.name)
			t.Cleanup(func() { collectivetest.CheckNoSegments(t, job) })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, kill := startChildPolicy(t, dir, job, tc.tr, "hold")
			defer kill()
			boot := &rolestest.DirBootstrap{Dir: dir, RankID: 1, WorldLen: 2, HostID: "host0", Job: job}
			c, err := roles.DialInference(ctx, boot, "pi", 0, roles.WithTransport(tc.tr))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			obs, act := make([]byte, 16), make([]byte, 16)
			for i := range 20 {
				if _, err := c.Infer(ctx, obs, act); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			// The child answers 20 requests, then none: kill it while the next
			// request waits.
			done := make(chan error, 1)
			go func() {
				_, err := c.Infer(ctx, obs, act)
				done <- err
			}()
			time.Sleep(50 * time.Millisecond)
			kill()
			err = <-done
			var lost *roles.LostError
			if !errors.As(err, &lost) || lost.Rank != 0 || !strings.Contains(err.Error(), "roles: policy worker rank 0 lost: "+tc.want) {
				t.Fatalf("Infer when the policy worker died: %v", err)
			}
			t.Log(err)
			if _, err := c.Infer(ctx, obs, act); !errors.As(err, &lost) {
				t.Fatalf("Infer after: %v", err)
			}
			// The dead owner could not remove its segment; the launcher does
			// that for a real job, the test here.
			for _, name := range collectivetest.Segments(job) {
				os.Remove("/dev/shm/" + name)
			}
		})
	}
}

// runChildPolicy is the child's side: a policy worker that serves until killed.
func runChildPolicy(t *testing.T, spec string) {
	parts := strings.Split(spec, ",")
	dir, tr, job, mode := parts[0], roles.Transport(parts[1]), parts[2], parts[3]
	boot := &rolestest.DirBootstrap{Dir: dir, RankID: 0, WorldLen: 2, HostID: "host0", Job: job}
	ctx := context.Background()
	srv, err := roles.NewInferenceServer(ctx, boot, "pi", roles.InferenceConfig{ObsBytes: 16, ActBytes: 16}, roles.WithTransport(tr))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if mode == "serve" {
		rolestest.ServePolicy(ctx, srv, func() uint64 { return 1 }, tagged)
		return
	}
	for served := 0; served < 20; {
		b, err := srv.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		served += b.Len()
		if err := b.Reply(make([]byte, 16*b.Len()), 1); err != nil {
			t.Fatal(err)
		}
	}
	select {} // hold the next request until killed
}
