package rank

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testInfo(c *Coordinator, rank, size int, token string) Info {
	return Info{Rank: rank, Size: size, LocalRank: rank, LocalSize: size, NumNodes: 1,
		RoleRank: rank, RdzvAddr: c.Addr(), RdzvTimeout: 5 * time.Second,
		JobID: "job-1", Token: token, Source: SourceGear}
}

// joinAll starts size ranks in goroutines and returns their worlds and errors.
func joinAll(t *testing.T, c *Coordinator, size int, mod func(*Info)) ([]*World, []error) {
	t.Helper()
	worlds := make([]*World, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info := testInfo(c, r, size, "secret")
			if mod != nil {
				mod(&info)
			}
			worlds[r], errs[r] = Init(context.Background(), WithInfo(info), WithHostID("h"))
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, w := range worlds {
			if w != nil {
				w.Close()
			}
		}
	})
	return worlds, errs
}

func newCoord(t *testing.T, size int, mod func(*CoordinatorConfig)) *Coordinator {
	t.Helper()
	cfg := CoordinatorConfig{JobID: "job-1", Token: "secret", Size: size, Timeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	c, err := NewCoordinator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestWorldOfOne(t *testing.T) {
	ctx := context.Background()
	w, err := Init(ctx, WithInfo(Single()))
	if err != nil {
		t.Fatal(err)
	}
	if w.Rank() != 0 || w.Size() != 1 || w.RoleSize() != 1 || len(w.Peers()) != 1 {
		t.Fatalf("world of one: rank %d size %d peers %d", w.Rank(), w.Size(), len(w.Peers()))
	}
	if !strings.HasPrefix(w.JobID(), "local-") {
		t.Errorf("job ID %q: want local-<pid>", w.JobID())
	}
	if err := w.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte)
	go func() {
		v, _ := w.Wait(ctx, "k")
		got <- v
	}()
	if err := w.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "v" {
		t.Fatalf("Wait = %q", v)
	}
	if err := w.Set(ctx, "k", nil); !errors.Is(err, ErrKeyExists) {
		t.Fatalf("second Set: %v, want ErrKeyExists", err)
	}
	if v, ok, err := w.Get(ctx, "k"); err != nil || !ok || string(v) != "v" {
		t.Fatalf("Get = %q %v %v", v, ok, err)
	}
	w.Close()
	w.Close()
	if err := w.Set(ctx, "x", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after Close: %v", err)
	}
}

func TestFromEnvWithoutVariablesIsWorldOfOne(t *testing.T) {
	info, err := FromLookup(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != 1 || info.Rank != 0 || info.Source != SourceSingle || info.RdzvAddr != "" {
		t.Fatalf("got %v", info)
	}
}

func TestRendezvousKeyValueAndBarrier(t *testing.T) {
	const n = 4
	c := newCoord(t, n, nil)
	worlds, errs := joinAll(t, c, n, func(i *Info) {
		if i.Rank == 3 {
			i.Role, i.RoleRank = "trainer", 0
		} else {
			i.Role = "actor"
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	ctx := context.Background()
	for r, w := range worlds {
		if w.Rank() != r || w.Size() != n {
			t.Fatalf("rank %d: got rank %d size %d", r, w.Rank(), w.Size())
		}
		peers := w.Peers()
		for i, p := range peers {
			if p.Rank != i || p.Host != "h" || p.PID == 0 {
				t.Fatalf("rank %d: peer %d = %+v", r, i, p)
			}
		}
		roles := w.Roles()
		if len(roles) != 2 || roles[0].Name != "actor" || roles[0].Size() != 3 || roles[1].Name != "trainer" || roles[1].Ranks[0] != 3 {
			t.Fatalf("rank %d: roles %+v", r, roles)
		}
	}
	if worlds[0].RoleSize() != 3 || worlds[3].RoleSize() != 1 {
		t.Fatalf("role sizes %d %d", worlds[0].RoleSize(), worlds[3].RoleSize())
	}
	// Everyone waits for a key rank 2 sets, then a barrier, twice.
	var wg sync.WaitGroup
	errc := make(chan error, 2*n)
	for r, w := range worlds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 2 {
				key := fmt.Sprintf("id/%d", round)
				if r == 2 {
					if err := w.Set(ctx, key, []byte{byte(round)}); err != nil {
						errc <- err
						return
					}
				}
				v, err := w.Wait(ctx, key)
				if err != nil || len(v) != 1 || v[0] != byte(round) {
					errc <- fmt.Errorf("rank %d: wait %s = %v, %v", r, key, v, err)
					return
				}
				if err := w.Barrier(ctx); err != nil {
					errc <- fmt.Errorf("rank %d: barrier: %w", r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if err := worlds[1].Set(ctx, "id/0", []byte("again")); !errors.Is(err, ErrKeyExists) {
		t.Fatalf("second Set: %v, want ErrKeyExists", err)
	}
	if _, ok, err := worlds[1].Get(ctx, "missing"); ok || err != nil {
		t.Fatalf("Get(missing) = %v, %v", ok, err)
	}
	// Leaving on purpose is not a loss.
	var lost []int
	var mu sync.Mutex
	worlds[0].OnLost(func(r int, _ string) { mu.Lock(); lost = append(lost, r); mu.Unlock() })
	for _, w := range worlds[1:] {
		w.Close()
	}
	worlds[0].Close()
	mu.Lock()
	defer mu.Unlock()
	if len(lost) != 0 {
		t.Fatalf("ranks that closed were reported lost: %v", lost)
	}
}

func TestWrongTokenRefusedAndLogged(t *testing.T) {
	var logs geartest.Buffer
	c := newCoord(t, 2, func(cfg *CoordinatorConfig) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	info := testInfo(c, 0, 2, "not-the-secret")
	_, err := Init(context.Background(), WithInfo(info), WithHostID("h"))
	if !errors.Is(err, ErrTokenRefused) {
		t.Fatalf("Init with a wrong token: %v, want ErrTokenRefused", err)
	}
	if !strings.Contains(logs.String(), "refused connection") {
		t.Fatalf("coordinator did not log the refusal; log:\n%s", logs.String())
	}
	// A refused connection does not count as a join: the right ranks still assemble.
	worlds, errs := joinAll(t, c, 2, nil)
	if errs[0] != nil || errs[1] != nil || worlds[0].Size() != 2 {
		t.Fatalf("after a refused connection: %v %v", errs[0], errs[1])
	}
}

func TestTokenNeverSentInClear(t *testing.T) {
	// A fake coordinator records what a rank sends: the token must not be in it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer nc.Close()
		n := newNonce()
		nc.Write(frame(msgHello, func(e *enc) { e.raw([]byte(wireMagic)); e.raw(n[:]) }))
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		k, _ := nc.Read(buf)
		got <- buf[:k]
	}()
	const token = "the-job-token-value"
	info := Info{Rank: 0, Size: 2, LocalSize: 2, NumNodes: 1, RdzvAddr: ln.Addr().String(),
		RdzvTimeout: time.Second, JobID: "job-1", Token: token, Source: SourceGear}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := Init(ctx, WithInfo(info), WithHostID("h")); err == nil {
		t.Fatal("Init against a silent coordinator succeeded")
	}
	sent := <-got
	if len(sent) == 0 {
		t.Fatal("rank sent nothing")
	}
	if bytes.Contains(sent, []byte(token)) {
		t.Fatal("the join message contains the token in clear")
	}
}

func TestMissingRankNamedInTimeoutError(t *testing.T) {
	failed := make(chan error, 1)
	c := newCoord(t, 4, func(cfg *CoordinatorConfig) {
		cfg.Timeout = 300 * time.Millisecond
		cfg.OnFail = func(err error) { failed <- err }
	})
	start := time.Now()
	worlds := make([]*World, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, r := range []int{0, 2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worlds[i], errs[i] = Init(context.Background(), WithInfo(testInfo(c, r, 4, "secret")), WithHostID("h"))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		var re *RendezvousError
		if !errors.As(err, &re) || !errors.Is(err, ErrRendezvous) {
			t.Fatalf("joiner %d: %v, want a *RendezvousError", i, err)
		}
		if fmt.Sprint(re.Missing) != "[1 3]" || !strings.Contains(err.Error(), "ranks 1,3 never joined") {
			t.Fatalf("joiner %d: %v: want ranks 1 and 3 named", i, err)
		}
	}
	select {
	case err := <-failed:
		if !strings.Contains(err.Error(), "1,3") {
			t.Fatalf("OnFail: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnFail was not called")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("failing took %v for a 300ms timeout", d)
	}
}

func TestRankExitedBeforeJoiningFailsAtOnce(t *testing.T) {
	c := newCoord(t, 2, nil)
	c.RankExited(1, true, "exited with status 0")
	start := time.Now()
	_, err := Init(context.Background(), WithInfo(testInfo(c, 0, 2, "secret")), WithHostID("h"))
	var re *RendezvousError
	if !errors.As(err, &re) || len(re.Missing) != 1 || re.Missing[0] != 1 {
		t.Fatalf("Init: %v, want rank 1 named", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("waited for the timeout although rank 1 had ended")
	}
}

func TestLostRankFailsPeersAtOnce(t *testing.T) {
	lostc := make(chan int, 4)
	c := newCoord(t, 3, func(cfg *CoordinatorConfig) {
		cfg.OnLost = func(r int, _ string) { lostc <- r }
	})
	worlds, errs := joinAll(t, c, 3, nil)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	notified := make(chan string, 1)
	worlds[0].OnLost(func(r int, reason string) { notified <- fmt.Sprintf("%d: %s", r, reason) })
	ctx := context.Background()
	barrier := make(chan error, 1)
	go func() { barrier <- worlds[1].Barrier(ctx) }()
	// Rank 2 dies without saying goodbye: its connection just breaks.
	worlds[2].conn.Close()
	select {
	case err := <-barrier:
		var le *LostError
		if !errors.As(err, &le) || le.Rank != 2 || !errors.Is(err, ErrRankLost) {
			t.Fatalf("barrier: %v, want rank 2 lost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("barrier did not fail after rank 2 died")
	}
	select {
	case n := <-notified:
		if !strings.HasPrefix(n, "2: ") {
			t.Fatalf("OnLost: %s", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnLost not called")
	}
	if r := <-lostc; r != 2 {
		t.Fatalf("coordinator OnLost rank %d", r)
	}
	if _, err := worlds[0].Wait(ctx, "never"); !errors.Is(err, ErrRankLost) {
		t.Fatalf("Wait after a loss: %v", err)
	}
	if err := worlds[0].Set(ctx, "still", []byte("ok")); err != nil {
		t.Fatalf("Set after a loss: %v", err)
	}
	// Registering after the loss still hears of it.
	late := make(chan int, 1)
	worlds[1].OnLost(func(r int, _ string) { late <- r })
	select {
	case r := <-late:
		if r != 2 {
			t.Fatalf("late OnLost: %d", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("late OnLost not called")
	}
}

func TestLauncherReportedExitIsLoss(t *testing.T) {
	c := newCoord(t, 2, nil)
	worlds, errs := joinAll(t, c, 2, nil)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	c.RankExited(1, false, "exited with status 3")
	err := worlds[0].Barrier(context.Background())
	var le *LostError
	if !errors.As(err, &le) || le.Rank != 1 || !strings.Contains(err.Error(), "status 3") {
		t.Fatalf("barrier: %v", err)
	}
}

// A rank that exited with status 0 is reported by the launcher, which can reap
// it before the coordinator reads its goodbye: the goodbye that follows within
// ExitReportWait keeps it from being lost. A clean exit without a goodbye is
// still a loss, naming the exit.
func TestCleanExitBeforeGoodbyeIsNoLoss(t *testing.T) {
	lostc := make(chan string, 4)
	c := newCoord(t, 3, func(cfg *CoordinatorConfig) {
		cfg.ExitReports = true
		cfg.OnLost = func(r int, reason string) { lostc <- fmt.Sprintf("%d: %s", r, reason) }
	})
	worlds, errs := joinAll(t, c, 3, nil)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	c.RankExited(1, true, "exited with status 0")
	if err := worlds[1].Close(); err != nil {
		t.Fatal(err)
	}
	c.RankExited(2, true, "exited with status 0")
	select {
	case got := <-lostc:
		if got != "2: exited with status 0" {
			t.Fatalf("lost %q, want rank 2 alone (rank 1 said goodbye)", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("rank 2 exited without a goodbye and was never lost")
	}
	select {
	case got := <-lostc:
		t.Fatalf("lost %q as well", got)
	case <-time.After(3 * ExitReportWait):
	}
}

func TestCoordinatorGone(t *testing.T) {
	c := newCoord(t, 2, nil)
	worlds, errs := joinAll(t, c, 2, nil)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	c.Close()
	_, err := worlds[0].Wait(context.Background(), "k")
	if !errors.Is(err, ErrCoordinatorGone) {
		t.Fatalf("Wait after the coordinator closed: %v", err)
	}
}

func TestRefusesDuplicateAndOutOfRange(t *testing.T) {
	c := newCoord(t, 2, func(cfg *CoordinatorConfig) { cfg.Timeout = 2 * time.Second })
	info := testInfo(c, 5, 2, "secret")
	if _, err := Init(context.Background(), WithInfo(info), WithHostID("h")); err == nil || !strings.Contains(err.Error(), "outside the world") {
		t.Fatalf("rank 5 of 2: %v", err)
	}
	info = testInfo(c, 0, 3, "secret")
	if _, err := Init(context.Background(), WithInfo(info), WithHostID("h")); err == nil || !strings.Contains(err.Error(), "3 ranks") {
		t.Fatalf("wrong size: %v", err)
	}
}

// A straggler of an older generation (a rank the launcher meant to stop
// before it restarted the world) is refused by name, the refusal is logged at
// Warn, and the world of the current generation still assembles.
func TestRefusesRankOfOlderGeneration(t *testing.T) {
	var logs geartest.Buffer
	c := newCoord(t, 2, func(cfg *CoordinatorConfig) {
		cfg.Generation = 1
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	info := testInfo(c, 1, 2, "secret")
	info.Restart = 0
	_, err := Init(context.Background(), WithInfo(info), WithHostID("h"))
	const want = "rank 1 of generation 0 refused: the job is at generation 1"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("rank of generation 0 at a coordinator of generation 1: %v, want %q", err, want)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), want) {
		t.Fatalf("the refusal is not logged at Warn; log:\n%s", logs.String())
	}
	worlds, errs := joinAll(t, c, 2, func(i *Info) { i.Restart = 1 })
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("generation 1 after a refused straggler: %v %v", errs[0], errs[1])
	}
	if worlds[1].RestartCount() != 1 || worlds[0].Size() != 2 {
		t.Fatalf("world: restart count %d size %d, want 1 and 2", worlds[1].RestartCount(), worlds[0].Size())
	}
}

func TestFormatRanks(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{{nil, ""}, {[]int{3}, "3"}, {[]int{0, 1, 2, 3, 7, 9, 10}, "0-3,7,9-10"}} {
		if got := FormatRanks(c.in); got != c.want {
			t.Errorf("FormatRanks(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestSlurmRankZeroServesTheRendezvous(t *testing.T) {
	rt := t.TempDir()
	t.Setenv(EnvRuntimeDir, rt)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	worlds := make([]*World, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r == 0 {
				// Rank 1 dials before rank 0 listens, and must retry.
				time.Sleep(100 * time.Millisecond)
			}
			info := Info{Rank: r, Size: 2, LocalRank: r, LocalSize: 2, NumNodes: 1, RoleRank: r,
				RdzvAddr: addr, RdzvTimeout: 5 * time.Second, JobID: "slurm-42", Source: SourceSlurm,
				ServeRdzv: r == 0}
			worlds[r], errs[r] = Init(context.Background(), WithInfo(info), WithHostID("h"))
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// The ranks hold the job's lock shared, so gearrun clean keeps its segments.
	if !JobAlive(rt, "slurm-42") {
		t.Fatal("SLURM job not alive while its ranks run")
	}
	var bwg sync.WaitGroup
	for _, w := range worlds {
		bwg.Add(1)
		go func() {
			defer bwg.Done()
			if err := w.Barrier(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	bwg.Wait()
	worlds[1].Close()
	worlds[0].Close()
	if JobAlive(rt, "slurm-42") {
		t.Fatal("SLURM job alive after its ranks closed")
	}
}

func TestExitReportBeatsBrokenConnection(t *testing.T) {
	c := newCoord(t, 2, func(cfg *CoordinatorConfig) { cfg.ExitReports = true })
	worlds, errs := joinAll(t, c, 2, nil)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	// The rank's connection breaks first (its process died); the launcher reaps
	// it a moment later.
	worlds[1].conn.Close()
	time.Sleep(10 * time.Millisecond)
	c.RankExited(1, false, "killed by SIGSEGV")
	err := worlds[0].Barrier(context.Background())
	if !strings.Contains(err.Error(), "rank 1 lost: killed by SIGSEGV") {
		t.Fatalf("barrier: %v", err)
	}
}
