package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/rank"
)

// restartScript is a rank of a job with restarts. Rank 0 makes a segment in
// the first generation and checks in every later one that it is still there;
// rank 1 waits for it and kills itself with SIGKILL while GEAR_RESTART_COUNT
// is below $KILLS, once rank 0 has printed. Each rank prints its
// generation's contract.
const restartScript = `seg="$SHM/gear.$GEAR_JOB_ID.store.keep"
echo "gen $GEAR_RESTART_COUNT size $GEAR_WORLD_SIZE torch $TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS ckpt $GEAR_CHECKPOINT_DIR"
up="$GEAR_CHECKPOINT_DIR/up.$GEAR_RESTART_COUNT"
if [ "$GEAR_RANK" = 0 ]; then
	if [ "$GEAR_RESTART_COUNT" = 0 ]; then echo shard > "$seg"; else [ -e "$seg" ] || { echo "segment lost" >&2; exit 3; }; fi
	: > "$up"
	[ "$GEAR_RESTART_COUNT" -lt "$KILLS" ] && exec sleep 30
	exit 0
fi
while [ ! -e "$seg" ] || [ ! -e "$up" ]; do sleep 0.01; done
[ "$GEAR_RESTART_COUNT" -lt "$KILLS" ] && kill -KILL $$
exit 0`

type restartRun struct {
	res   *Result
	err   error
	out   string
	errw  string
	pids  [][2]int // each generation's pids of ranks 0 and 1
	shm   string
	ckpt  string
	start time.Time
}

func runRestarts(t *testing.T, maxRestarts, kills int, mod func(*Options)) restartRun {
	t.Helper()
	shm, ckpt := t.TempDir(), filepath.Join(t.TempDir(), "ckpt")
	p, err := NewPlan(Request{
		Groups:      []Group{{NP: 2, Argv: []string{"sh", "-c", restartScript}}},
		Env:         []string{"SHM=" + shm, fmt.Sprintf("KILLS=%d", kills)},
		MaxRestarts: maxRestarts, CheckpointDir: ckpt, IsGoPackage: noGo,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	opts.ShmDir = shm
	var mu sync.Mutex
	var pids [][2]int
	opts.OnStart = func(r, pid int) {
		mu.Lock()
		defer mu.Unlock()
		if r == 0 {
			pids = append(pids, [2]int{})
		}
		pids[len(pids)-1][r] = pid
	}
	if mod != nil {
		mod(&opts)
	}
	run := restartRun{shm: shm, ckpt: ckpt, start: time.Now()}
	run.res, run.err = Run(context.Background(), p, opts)
	run.out, run.errw, run.pids = out.String(), errw.String(), pids
	if e, _ := os.ReadDir(shm); len(e) != 0 {
		t.Errorf("segments left after the job: %v", e)
	}
	if e, _ := os.ReadDir(opts.RuntimeDir); len(e) != 0 {
		t.Errorf("runtime dir not empty: %v", e)
	}
	return run
}

// --max-restarts 2 and rank 1 killed twice: the third generation ends the job
// with 0. Every restart is one line naming its cause; the segment made in the
// first generation survives both restarts and is gone after the job; every
// generation sees its restart count and the same checkpoint directory.
func TestRunRestartsAfterKilledRank(t *testing.T) {
	run := runRestarts(t, 2, 2, nil)
	if run.err != nil {
		t.Fatalf("%v\nstderr:\n%s\nstdout:\n%s", run.err, run.errw, run.out)
	}
	if run.res.ExitCode != 0 || run.res.Restarts != 2 || run.res.FailedRank != -1 || len(run.pids) != 3 {
		t.Fatalf("result %+v, %d generations; want exit 0 after 2 restarts, 3 generations\nstderr:\n%s", run.res, len(run.pids), run.errw)
	}
	var want []string
	for g := range 2 {
		want = append(want, RestartLine("gearrun", g+1, 2, fmt.Sprintf("rank 1 (pid %d) killed by SIGKILL", run.pids[g][1]), ""))
	}
	if got := nonLogLines(run.errw); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("launcher's lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for g := range 3 {
		line := fmt.Sprintf("gen %d size 2 torch %d/2 ckpt %s", g, g, run.ckpt)
		if n := strings.Count(run.out, line); n != 2 {
			t.Errorf("%q printed by %d ranks, want 2\n%s", line, n, run.out)
		}
	}
	if fi, err := os.Stat(run.ckpt); err != nil || !fi.IsDir() {
		t.Errorf("checkpoint directory after the job: %v; want it kept", err)
	}
}

// A third kill with --max-restarts 2 ends the job with the rank's code, 137
// for SIGKILL.
func TestRunRestartBudgetSpent(t *testing.T) {
	run := runRestarts(t, 2, 3, nil)
	var je *JobError
	if !errors.As(run.err, &je) || je.Code != 137 || run.res.ExitCode != 137 || run.res.Restarts != 2 || run.res.FailedRank != 1 {
		t.Fatalf("err %v, result %+v; want code 137 after 2 restarts\nstderr:\n%s", run.err, run.res, run.errw)
	}
	lines := nonLogLines(run.errw)
	want := fmt.Sprintf("gearrun: rank 1 (pid %d) killed by SIGKILL", run.pids[2][1])
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "gearrun: restart 2 of 2: ") || lines[2] != want {
		t.Fatalf("launcher's lines:\n%s\nwant two restarts, then %q", strings.Join(lines, "\n"), want)
	}
}

// The launcher's own failures are not restarted: its timeout ends the job
// at once, whatever restarts remain.
func TestRunTimeoutIsNotRestarted(t *testing.T) {
	p := shPlan(t, 2, `exec sleep 30`)
	p.MaxRestarts = 3
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	opts.Timeout = 300 * time.Millisecond
	res, err := Run(context.Background(), p, opts)
	var je *JobError
	if !errors.As(err, &je) || je.Code != ExitTimeout || res.Restarts != 0 {
		t.Fatalf("err %v, result %+v; want a timeout\nstderr:\n%s", err, res, errw.String())
	}
	if got := nonLogLines(errw.String()); len(got) != 1 || got[0] != "gearrun: job timed out after 300ms" {
		t.Fatalf("stderr:\n%s", errw.String())
	}
}

// A signal to the launcher while a restart is under way ends the job.
func TestRunSignalStopsRestarts(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	run := runRestarts(t, 5, 10, func(o *Options) {
		start := o.OnStart
		o.OnStart = func(r, pid int) {
			start(r, pid)
			if r == 1 {
				select {
				case sigs <- os.Interrupt:
				default:
				}
			}
		}
		o.Signals = sigs
	})
	var je *JobError
	if !errors.As(run.err, &je) || je.Code != 130 || run.res.Restarts > 1 {
		t.Fatalf("err %v, result %+v; want 130 (SIGINT) within a restart\nstderr:\n%s", run.err, run.res, run.errw)
	}
}

// A signal that comes after a rank's failure, while the world stops, ends
// the job: the restart line is printed only once the restart is decided, so
// the failure is said as the job's end, then the signal, and no restart.
func TestRunSignalBeforeRestartDecided(t *testing.T) {
	dir := t.TempDir()
	p, err := NewPlan(Request{
		// Rank 1 fails only once rank 0 holds its trap: a SIGTERM that came
		// before it would end rank 0 at once, the world would stop before the
		// signal below, and the restart would be right.
		Groups: []Group{{NP: 2, Argv: []string{"sh", "-c", `if [ "$GEAR_RANK" = 1 ]; then
	while [ ! -e "$D/ready" ]; do sleep 0.01; done
	exit 3
fi
trap 'echo term > "$D/term"' TERM
: > "$D/ready"
while :; do sleep 0.02; done`}}},
		Env: []string{"D=" + dir}, MaxRestarts: 2, IsGoPackage: noGo,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	sigs := make(chan os.Signal, 1)
	opts.Signals = sigs
	var mu sync.Mutex
	pid1 := 0
	opts.OnStart = func(r, pid int) {
		mu.Lock()
		defer mu.Unlock()
		if r == 1 {
			pid1 = pid
		}
	}
	go func() {
		// Rank 0 got SIGTERM: rank 1's failure is known, and the world
		// stops.
		for {
			if _, err := os.Stat(filepath.Join(dir, "term")); err == nil {
				sigs <- os.Interrupt
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	res, err := Run(context.Background(), p, opts)
	var je *JobError
	if !errors.As(err, &je) || je.Code != 130 || res.Restarts != 0 {
		t.Fatalf("err %v, result %+v; want 130 (SIGINT) and no restart\nstderr:\n%s", err, res, errw.String())
	}
	mu.Lock()
	want := []string{fmt.Sprintf("gearrun: rank 1 (pid %d) exited with status 3", pid1), "gearrun: interrupted by SIGINT"}
	mu.Unlock()
	var got []string // the launcher's own, without the ranks' ("[0] Terminated")
	for _, l := range nonLogLines(errw.String()) {
		if strings.HasPrefix(l, "gearrun: ") {
			got = append(got, l)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("launcher's lines:\n%s\nwant:\n%s", errw.String(), strings.Join(want, "\n"))
	}
}

// A program that does not exist is the launcher's failure: not restarted.
func TestRunMissingProgramIsNotRestarted(t *testing.T) {
	p, err := NewPlan(Request{Groups: []Group{{NP: 2, Argv: []string{"./no-such-program"}}}, MaxRestarts: 3, IsGoPackage: noGo})
	if err != nil {
		t.Fatal(err)
	}
	var out, errw geartest.Buffer
	res, err := Run(context.Background(), p, testOptions(t, &out, &errw))
	var je *JobError
	if !errors.As(err, &je) || je.Code != ExitNotFound || res.Restarts != 0 {
		t.Fatalf("err %v, result %+v", err, res)
	}
}

func TestNewPlanRefusesNegativeRestarts(t *testing.T) {
	_, err := NewPlan(Request{Groups: []Group{{NP: 1, Argv: []string{"true"}}}, MaxRestarts: -1, IsGoPackage: noGo})
	if err == nil || !strings.Contains(err.Error(), "max restarts -1") {
		t.Fatalf("NewPlan with -1 restarts: %v", err)
	}
}

// The contract of a later generation: GEAR_RESTART_COUNT, torchrun's
// TORCHELASTIC_* and the checkpoint directory; a parent's are not inherited.
func TestEnvironOfGeneration(t *testing.T) {
	p, err := NewPlan(Request{Groups: []Group{{NP: 2, Argv: []string{"true"}}}, MaxRestarts: 4, CheckpointDir: "/ckpt/j", IsGoPackage: noGo})
	if err != nil {
		t.Fatal(err)
	}
	p.Restart = 3
	env := rank.MergeEnv([]string{rank.EnvRestartCount + "=9", rank.EnvCheckpointDir + "=/elsewhere"}, p.Environ(1, "127.0.0.1:1"))
	for _, want := range []string{rank.EnvRestartCount + "=3", rank.EnvCheckpointDir + "=/ckpt/j",
		rank.EnvTorchRestartCount + "=3", rank.EnvTorchMaxRestarts + "=4"} {
		n := 0
		for _, kv := range env {
			name, _, _ := strings.Cut(want, "=")
			if strings.HasPrefix(kv, name+"=") {
				n++
				if kv != want {
					t.Errorf("%s, want %s", kv, want)
				}
			}
		}
		if n != 1 {
			t.Errorf("%s appears %d times", want, n)
		}
	}
}

var logLine = regexp.MustCompile(`^time=`)

// nonLogLines are the launcher's own lines on stderr, without its slog lines.
func nonLogLines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l != "" && !logLine.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

func TestRemoveCheckpoints(t *testing.T) {
	root := t.TempDir()
	dir := CheckpointDir(root, "job-7")
	if err := os.MkdirAll(filepath.Join(dir, "shard.0"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, err := RemoveCheckpoints(root, "job-7")
	if err != nil || got != dir {
		t.Fatalf("RemoveCheckpoints = %q, %v; want %q", got, err, dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still there: %v", dir, err)
	}
	for _, id := range []string{"job-7", "no-such-job", "../etc"} {
		if _, err := RemoveCheckpoints(root, id); err == nil || !strings.Contains(err.Error(), id) {
			t.Errorf("RemoveCheckpoints(%q) = %v, want an error naming it", id, err)
		}
	}
	if e, _ := os.ReadDir(root); len(e) != 0 {
		t.Fatalf("root after removal: %v", e)
	}
}

// Between generations the dead world's collective and role-channel segments
// go, and its ranks' metrics segments, and every other segment of the job
// stays: generation 0 makes one of each kind (and a new collective segment
// and metrics segment per generation, as a Comm and a rank do), generation 1
// lists what it finds, and nothing grows per generation.
func TestRunRestartRemovesGenerationSegments(t *testing.T) {
	const script = `cd "$SHM"
g=$GEAR_RESTART_COUNT
if [ "$GEAR_RANK" = 0 ]; then
	echo "gen $g finds: $(ls | sort | tr '\n' ' ')"
	: > "gear.$GEAR_JOB_ID.coll.world.r0.$g$g$g$g"
	: > "gear.$GEAR_JOB_ID.roles.sample.replay.r0.ab$g"
	: > "gear.$GEAR_JOB_ID.roles.param.policy.cd$g"
	: > "gear.$GEAR_JOB_ID.metrics.r0.g$g.p$$"
	[ "$g" = 0 ] && : > "gear.$GEAR_JOB_ID.dqn.replay.0" && : > "gear.$GEAR_JOB_ID.store.0"
	touch ready.$g
else
	while [ ! -e ready.$g ]; do sleep 0.01; done
	rm ready.$g
fi
[ "$g" -lt 2 ] && [ "$GEAR_RANK" = 1 ] && kill -KILL $$
[ "$g" -lt 2 ] && exec sleep 30
exit 0`
	shm := t.TempDir()
	other := filepath.Join(shm, rank.SegmentName("other-job", "coll.world.r0.ffff"))
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(Request{
		Groups:      []Group{{NP: 2, Argv: []string{"sh", "-c", script}}},
		JobID:       "job-gen",
		Env:         []string{"SHM=" + shm},
		MaxRestarts: 2, IsGoPackage: noGo,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	opts.ShmDir = shm
	res, err := Run(context.Background(), p, opts)
	if err != nil || res.Restarts != 2 {
		t.Fatalf("err %v, result %+v\nstderr:\n%s", err, res, errw.String())
	}
	kept := "gear.job-gen.dqn.replay.0 gear.job-gen.store.0 gear.other-job.coll.world.r0.ffff "
	for _, want := range []string{
		"gen 0 finds: gear.other-job.coll.world.r0.ffff \n",
		"gen 1 finds: " + kept + "\n",
		"gen 2 finds: " + kept + "\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, out.String())
		}
	}
	if e, _ := os.ReadDir(shm); len(e) != 1 || e[0].Name() != filepath.Base(other) {
		t.Errorf("after the job: %v; want only the other job's segment", e)
	}
}

func TestRemoveGenerationSegments(t *testing.T) {
	shm := t.TempDir()
	names := []string{"gear.j1.coll.world.r0.0a0b", "gear.j1.coll.sub.r3.ffee", "gear.j1.roles.infer.pi.r2.1234",
		"gear.j1.dqn.replay.0", "gear.j1.store.0", "gear.j1.collector.0", "gear.j10.coll.world.r0.0a0b", "gear.j2.roles.param.x.00"}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(shm, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := RemoveGenerationSegments(shm, "j1")
	want := []string{"gear.j1.coll.sub.r3.ffee", "gear.j1.coll.world.r0.0a0b", "gear.j1.roles.infer.pi.r2.1234"}
	if err != nil || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("RemoveGenerationSegments = %v, %v; want %v", got, err, want)
	}
	var left []string
	e, _ := os.ReadDir(shm)
	for _, x := range e {
		left = append(left, x.Name())
	}
	if w := "gear.j1.collector.0 gear.j1.dqn.replay.0 gear.j1.store.0 gear.j10.coll.world.r0.0a0b gear.j2.roles.param.x.00"; strings.Join(left, " ") != w {
		t.Fatalf("left %v, want %s", left, w)
	}
}
