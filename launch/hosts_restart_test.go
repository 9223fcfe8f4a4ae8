package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
)

// hostsRestartScript is a rank of a job on hosts with restarts: it says its
// generation and world, writes its pid and its agent's (after its segments),
// and in generation 0
// holds (rank 1 fails with status 3 when $FAIL is set); later generations
// end 0. Rank 0 makes a store segment and a collective one in generation 0,
// and checks in the next that the first is there and the second gone.
const hostsRestartScript = `g=$GEAR_RESTART_COUNT
echo "gen $g size $GEAR_WORLD_SIZE rank $GEAR_RANK on $GEAR_NODE_NAME $GEAR_LOCAL_RANK/$GEAR_LOCAL_SIZE nodes $GEAR_NUM_NODES"
if [ "$GEAR_RANK" = 0 ] && [ -n "$SHM" ]; then
	if [ "$g" = 0 ]; then : > "$SHM/gear.$GEAR_JOB_ID.store.0"; : > "$SHM/gear.$GEAR_JOB_ID.coll.world.r0.abcd"
	else [ -e "$SHM/gear.$GEAR_JOB_ID.store.0" ] || { echo "store segment lost" >&2; exit 4; }
		[ -e "$SHM/gear.$GEAR_JOB_ID.coll.world.r0.abcd" ] && { echo "collective segment kept" >&2; exit 5; }
	fi
fi
echo $$ > "$D/pid.$g.$GEAR_RANK"; echo $PPID > "$D/agent.$g.$GEAR_RANK"
if [ "$g" = 0 ]; then
	[ -n "$FAIL" ] && [ "$GEAR_RANK" = 1 ] && { while [ ! -e "$D/go" ]; do sleep 0.01; done; exit 3; }
	exec sleep 60
fi
exit 0`

type hostsRestartRun struct {
	res  *Result
	err  error
	out  string
	errw string
}

// runHostsRestarts runs hostsRestartScript with -np np (MIN:MAX when
// minNP > 0) on hosts, and act once every rank of generation 0 has written
// its pids (n of them).
func runHostsRestarts(t *testing.T, hosts string, minNP, np, maxRestarts int, shm string, act func(dir string, pids map[string]int), env ...string) hostsRestartRun {
	t.Helper()
	dir := t.TempDir()
	p := placedPlan(t, hosts, Request{Groups: []Group{{NP: np, MinNP: minNP, Argv: []string{"/bin/sh", "-c", hostsRestartScript}}},
		RdzvAddr: "127.0.0.1:0", Env: append([]string{"D=" + dir, "SHM=" + shm}, env...), NoTorchEnv: true, MaxRestarts: maxRestarts})
	rem := fakeRemote(t)
	if shm != "" {
		rem.Gearrun = envAgentShm + "=" + shm + " " + rem.Gearrun
	}
	var out, errw geartest.Buffer
	done := make(chan hostsRestartRun, 1)
	go func() {
		res, err := RunOnHosts(context.Background(), p, Options{Stdout: &out, Stderr: &errw, TagOutput: true, Grace: 2 * time.Second, Timeout: time.Minute}, rem)
		done <- hostsRestartRun{res: res, err: err}
	}()
	pids := waitPIDFiles(t, dir, 2*len(p.Ranks))
	act(dir, pids)
	run := <-done
	run.out, run.errw = out.String(), errw.String()
	all := map[string]int{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		var pid int
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(e.Name(), "pid.") {
			fmt.Sscan(string(b), &pid)
			all[e.Name()] = pid
		}
	}
	waitGone(t, all, 5*time.Second)
	return run
}

// A rank's failure on a job on hosts with a restart: every host stops, new
// agents start the next generation on the same hosts, and it ends 0. The
// agents keep the store's segment across the restart, drop the dead world's
// collective one, and remove the rest at the end.
func TestRunOnHostsRestarts(t *testing.T) {
	shm := t.TempDir()
	pid1 := 0
	run := runHostsRestarts(t, "h1:1,h2:1", 0, 2, 1, shm, func(dir string, pids map[string]int) {
		pid1 = pids["pid.0.1"]
		os.WriteFile(filepath.Join(dir, "go"), nil, 0o644)
	}, "FAIL=1")
	if run.err != nil || run.res.Restarts != 1 {
		t.Fatalf("RunOnHosts: %v, result %+v\nstderr:\n%s\nstdout:\n%s", run.err, run.res, run.errw, run.out)
	}
	if !regexp.MustCompile(`(?m)^gearrun: restart 1 of 1: rank 1 \(pid \d+ on h2\) exited with status 3$`).MatchString(run.errw) {
		t.Errorf("no restart line naming rank 1 on h2:\n%s", run.errw)
	}
	// The line is the one every launch path prints.
	if want := RestartLine("gearrun", 1, 1, fmt.Sprintf("rank 1 (pid %d on h2) exited with status 3", pid1), ""); !strings.Contains(run.errw, want+"\n") {
		t.Errorf("stderr lacks RestartLine's %q:\n%s", want, run.errw)
	}
	for _, want := range []string{"[0] gen 1 size 2 rank 0 on h1 0/1 nodes 2", "[1] gen 1 size 2 rank 1 on h2 0/1 nodes 2"} {
		if !strings.Contains(run.out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, run.out)
		}
	}
	if e, _ := os.ReadDir(shm); len(e) != 0 {
		t.Errorf("segments left after the job: %v", e)
	}
}

// -np 2:4 on h1:2,h2:2 runs 4 ranks; h2's agent killed (the host lost) with a
// restart left: the next generation runs 2 ranks on h1 and ends 0.
func TestRunOnHostsElasticLostHost(t *testing.T) {
	run := runHostsRestarts(t, "h1:2,h2:2", 2, 4, 1, "", func(_ string, pids map[string]int) {
		syscall.Kill(pids["agent.0.2"], syscall.SIGKILL)
	})
	if run.err != nil || run.res.Restarts != 1 || len(run.res.Ranks) != 2 {
		t.Fatalf("RunOnHosts: %v, result %+v\nstderr:\n%s\nstdout:\n%s", run.err, run.res, run.errw, run.out)
	}
	if !regexp.MustCompile(`(?m)^gearrun: restart 1 of 1: host h2 \(ranks 2-3\) lost: .*; next world: 2 ranks on h1$`).MatchString(run.errw) {
		t.Errorf("no restart line naming h2 and the next world:\n%s", run.errw)
	}
	for _, want := range []string{"[1] gen 0 size 4 rank 1 on h1 1/2 nodes 2", "[0] gen 1 size 2 rank 0 on h1 0/2 nodes 1", "[1] gen 1 size 2 rank 1 on h1 1/2 nodes 1"} {
		if !strings.Contains(run.out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, run.out)
		}
	}
	if strings.Contains(run.out, "gen 1 size 2 rank 2") {
		t.Errorf("a rank 2 in generation 1:\n%s", run.out)
	}
}

// A spare host (h3, without a rank in generation 0) takes the place of the
// lost h2, and the world keeps its 4 ranks.
func TestRunOnHostsElasticSpareHost(t *testing.T) {
	run := runHostsRestarts(t, "h1:2,h2:2,h3:2", 2, 4, 1, "", func(_ string, pids map[string]int) {
		syscall.Kill(pids["agent.0.2"], syscall.SIGKILL)
	})
	if run.err != nil || run.res.Restarts != 1 || len(run.res.Ranks) != 4 {
		t.Fatalf("RunOnHosts: %v, result %+v\nstderr:\n%s\nstdout:\n%s", run.err, run.res, run.errw, run.out)
	}
	if !regexp.MustCompile(`(?m)^gearrun: restart 1 of 1: host h2 \(ranks 2-3\) lost: .*; next world: 4 ranks on h1,h3$`).MatchString(run.errw) {
		t.Errorf("no restart line naming h2 and the next world:\n%s", run.errw)
	}
	for _, want := range []string{"[2] gen 1 size 4 rank 2 on h3 0/2 nodes 2", "[3] gen 1 size 4 rank 3 on h3 1/2 nodes 2"} {
		if !strings.Contains(run.out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, run.out)
		}
	}
}

// Ranks killed with SIGKILL on a host whose agent stays are a rank's
// failure: the next generation runs on the same hosts, at full size.
func TestRunOnHostsKilledRanksSameHosts(t *testing.T) {
	run := runHostsRestarts(t, "h1:2,h2:2", 2, 4, 1, "", func(_ string, pids map[string]int) {
		syscall.Kill(pids["pid.0.2"], syscall.SIGKILL)
		syscall.Kill(pids["pid.0.3"], syscall.SIGKILL)
	})
	if run.err != nil || run.res.Restarts != 1 || len(run.res.Ranks) != 4 {
		t.Fatalf("RunOnHosts: %v, result %+v\nstderr:\n%s\nstdout:\n%s", run.err, run.res, run.errw, run.out)
	}
	if !regexp.MustCompile(`(?m)^gearrun: restart 1 of 1: rank [23] \(pid \d+ on h2\) killed by SIGKILL$`).MatchString(run.errw) {
		t.Errorf("no restart line naming the killed rank:\n%s", run.errw)
	}
	if !strings.Contains(run.out, "[3] gen 1 size 4 rank 3 on h2 1/2 nodes 2") {
		t.Errorf("rank 3 not on h2 in generation 1:\n%s", run.out)
	}
}

// A lost host that leaves fewer ranks than MIN ends the job, naming MIN and
// what is left, even with restarts left.
func TestRunOnHostsElasticTooFewLeft(t *testing.T) {
	run := runHostsRestarts(t, "h1:2,h2:2", 3, 4, 2, "", func(_ string, pids map[string]int) {
		syscall.Kill(pids["agent.0.2"], syscall.SIGKILL)
	})
	var je *JobError
	if !errors.As(run.err, &je) || run.res.Restarts != 0 {
		t.Fatalf("RunOnHosts: %v, result %+v\nstderr:\n%s", run.err, run.res, run.errw)
	}
	if !regexp.MustCompile(`(?m)^gearrun: host h2 \(ranks 2-3\) lost: .*; 2 slots are left \(h1:2\), fewer than the 3 ranks the job needs at least \(-np 3:4\)$`).MatchString(run.errw) {
		t.Errorf("no line naming MIN and what is left:\n%s", run.errw)
	}
	if strings.Contains(run.errw, "restart") {
		t.Errorf("a restart announced:\n%s", run.errw)
	}
}

func TestElasticPlan(t *testing.T) {
	for _, tc := range []struct {
		groups []Group
		want   string
	}{
		{[]Group{{NP: 4, MinNP: 5, Argv: []string{"a"}}}, "-np 5:4: want 1 <= MIN <= MAX"},
		{[]Group{{NP: 4, MinNP: -1, Argv: []string{"a"}}}, "-np -1:4: want 1 <= MIN <= MAX"},
		{[]Group{{NP: 4, MinNP: 2, Argv: []string{"a"}}, {NP: 1, Argv: []string{"b"}}}, "group 0: -np 2:4: an elastic size is for a job of one group"},
	} {
		if _, err := NewPlan(Request{Groups: tc.groups, IsGoPackage: noGo}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewPlan(%+v) = %v, want %q", tc.groups, err, tc.want)
		}
	}
	p, err := NewPlan(Request{Groups: []Group{{NP: 6, MinNP: 3, Role: "w", Argv: []string{"a"}}}, IsGoPackage: noGo})
	if err != nil || p.Size() != 6 || p.MinSize != 3 || p.MaxSize != 6 {
		t.Fatalf("NewPlan: %v, size %d min %d max %d", err, p.Size(), p.MinSize, p.MaxSize)
	}
	// Fewer slots than MAX: as many ranks as they hold.
	if err := p.PlaceOnHosts([]Host{{"a", 2}, {"b", 2}}); err != nil || p.Size() != 4 || len(p.Roles[0].Ranks) != 4 {
		t.Fatalf("PlaceOnHosts on 4 slots: %v, %d ranks", err, p.Size())
	}
	_, err = p.Survivors([]string{"a"})
	if err == nil || err.Error() != "2 slots are left (b:2), fewer than the 3 ranks the job needs at least (-np 3:6)" {
		t.Fatalf("Survivors without a: %v", err)
	}
	if err := p.PlaceOnHosts([]Host{{"a", 2}, {"b", 2}, {"c", 4}}); err != nil || p.Size() != 4 {
		t.Fatalf("PlaceOnHosts again: %v, %d ranks", err, p.Size())
	}
	q, err := p.Survivors([]string{"b"})
	if err != nil {
		t.Fatal(err)
	}
	// Up to MAX again, on a and c; p unchanged.
	if q.Size() != 6 || strings.Join(q.Hosts, ",") != "a,c" || q.NumNodes != 2 || p.Size() != 4 || strings.Join(p.Hosts, ",") != "a,b" {
		t.Fatalf("survivors: %d ranks on %v; p: %d ranks on %v", q.Size(), q.Hosts, p.Size(), p.Hosts)
	}
	for i, r := range q.Ranks {
		wantHost, wantLocal := "a", i
		if i >= 2 {
			wantHost, wantLocal = "c", i-2
		}
		if r.Rank != i || r.RoleRank != i || r.Host != wantHost || r.LocalRank != wantLocal || r.Role != "w" {
			t.Errorf("rank %d: %+v", i, r)
		}
	}
	if _, err := q.Survivors([]string{"a", "c"}); err == nil || !strings.HasPrefix(err.Error(), "no host is left") {
		t.Errorf("Survivors of nothing: %v", err)
	}
	// A fixed size moves to a spare host, or fails naming its size.
	f, _ := NewPlan(Request{Groups: []Group{{NP: 2, Argv: []string{"a"}}}, IsGoPackage: noGo})
	f.PlaceOnHosts([]Host{{"a", 2}, {"b", 2}})
	if g, err := f.Survivors([]string{"a"}); err != nil || strings.Join(g.Hosts, ",") != "b" || g.Size() != 2 {
		t.Errorf("fixed plan without a: %v", err)
	}
	if _, err := f.Survivors([]string{"a", "b"}); err == nil || !strings.Contains(err.Error(), "fewer than the job's 2 ranks") {
		t.Errorf("fixed plan without hosts: %v", err)
	}
}
