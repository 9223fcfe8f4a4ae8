package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/rank"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func shPlan(t *testing.T, np int, script string) *Plan {
	t.Helper()
	p, err := NewPlan(Request{Groups: []Group{{NP: np, Argv: []string{"sh", "-c", script}}}, IsGoPackage: noGo})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testOptions(t *testing.T, out, errw *geartest.Buffer) Options {
	return Options{Stdout: out, Stderr: errw, TagOutput: true, RuntimeDir: t.TempDir(), Grace: 2 * time.Second}
}

func TestRunOutputDirAndCleanup(t *testing.T) {
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	opts.OutputDir = t.TempDir()
	p := shPlan(t, 2, `echo "out $GEAR_RANK"; echo "err $GEAR_RANK" >&2; touch /dev/shm/gear.$GEAR_JOB_ID.r$GEAR_RANK`)
	res, err := Run(context.Background(), p, opts)
	if err != nil {
		t.Fatalf("%v\n%s", err, errw.String())
	}
	if res.ExitCode != 0 || res.FailedRank != -1 || len(res.Ranks) != 2 || res.Ranks[1].Status != "exited with status 0" {
		t.Fatalf("result %+v", res)
	}
	for r := range 2 {
		for stream, want := range map[string]string{"stdout": "out ", "stderr": "err "} {
			b, err := os.ReadFile(filepath.Join(opts.OutputDir, "rank."+strconv.Itoa(r)+"."+stream))
			if err != nil || string(b) != want+strconv.Itoa(r)+"\n" {
				t.Fatalf("rank %d %s: %q %v", r, stream, b, err)
			}
		}
	}
	if out.String() != "" {
		t.Fatalf("terminal got output although --output-dir was given: %q", out.String())
	}
	if m, _ := filepath.Glob("/dev/shm/" + rank.SegmentName(p.JobID, "*")); len(m) != 0 {
		t.Fatalf("segments left: %v", m)
	}
	if e, _ := os.ReadDir(opts.RuntimeDir); len(e) != 0 {
		t.Fatalf("runtime dir not empty: %v", e)
	}
	if c, err := net.DialTimeout("tcp", res.RdzvAddr, time.Second); err == nil {
		c.Close()
		t.Fatalf("coordinator %s still listening after Run", res.RdzvAddr)
	}
}

func TestRunDoesNotWaitForAGrandchildHoldingThePipe(t *testing.T) {
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	// The grandchild leaves the rank's process group (setsid), so only the drain
	// limit can end the wait for its end of the stdout pipe.
	p := shPlan(t, 1, `setsid sleep 30 & echo $!`)
	start := time.Now()
	_, err := Run(context.Background(), p, opts)
	took := time.Since(start)
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(out.String(), "[0] ")))
	if pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatal(err)
	}
	if pid == 0 {
		t.Fatalf("no grandchild pid in %q", out.String())
	}
	if took > 5*time.Second {
		t.Fatalf("Run took %v with a grandchild holding stdout", took)
	}
}

func TestRunStdinReaderGoesToRankZero(t *testing.T) {
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	opts.Stdin = strings.NewReader("to rank zero\n")
	if _, err := Run(context.Background(), shPlan(t, 2, `cat`), opts); err != nil {
		t.Fatal(err)
	}
	if out.String() != "[0] to rank zero\n" {
		t.Fatalf("%q", out.String())
	}
}

func TestRunCancelStopsTheJob(t *testing.T) {
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	ctx, cancel := context.WithCancel(context.Background())
	opts.OnStart = func(r, pid int) {
		if r == 1 {
			time.AfterFunc(100*time.Millisecond, cancel)
		}
	}
	res, err := Run(ctx, shPlan(t, 2, `exec sleep 30`), opts)
	var je *JobError
	if !errors.As(err, &je) || je.Code != ExitLaunchFailed || !strings.Contains(je.Cause, "canceled") {
		t.Fatalf("err %v", err)
	}
	for _, r := range res.Ranks {
		if r.Signal != "SIGTERM" {
			t.Fatalf("rank %d: %s, want killed by SIGTERM", r.Rank, r.Status)
		}
	}
}

func TestRunBuildsGoPackage(t *testing.T) {
	p, err := NewPlan(Request{Groups: []Group{{NP: 2, Argv: []string{"../examples/hello"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Ranks[0].GoPackage {
		t.Fatal("../examples/hello not recognised as a Go package")
	}
	var out, errw geartest.Buffer
	if _, err := Run(context.Background(), p, testOptions(t, &out, &errw)); err != nil {
		t.Fatalf("%v\n%s", err, errw.String())
	}
	if !strings.Contains(out.String(), "[1] hello from rank 1 of 2") || !strings.Contains(out.String(), "[0] world of 2 ranks") {
		t.Fatalf("output:\n%s", out.String())
	}
}

func TestRemoveJobSegments(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{rank.SegmentName("j1", "a"), rank.SegmentName("j1", "b"), rank.SegmentName("j2", "a")} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	got, err := RemoveJobSegments(dir, "j1")
	if err != nil || len(got) != 2 {
		t.Fatalf("%v %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, rank.SegmentName("j2", "a"))); err != nil {
		t.Fatal("another job's segment was removed")
	}
}

// Run reaps its ranks only: a child the program started itself, which ends
// while a job runs, is still there for its own Wait, with its status. And
// jobs run at once in one process each get their own ranks' statuses.
func TestRunLeavesOtherChildrenToTheirWaiters(t *testing.T) {
	other := exec.Command("sh", "-c", "sleep 0.2; exit 7")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	codes := make([]int, 3)
	for k := range codes {
		wg.Go(func() {
			var out, errw geartest.Buffer
			// The last rank to end sets the code (an earlier failure would
			// stop the others).
			p := shPlan(t, 3, fmt.Sprintf("sleep 0.$GEAR_RANK; [ $GEAR_RANK = 2 ] && exit %d; exit 0", k))
			res, _ := Run(context.Background(), p, testOptions(t, &out, &errw))
			codes[k] = res.ExitCode
			for r, rr := range res.Ranks {
				if want := map[bool]int{true: k}[r == 2]; rr.Code != want {
					t.Errorf("job %d rank %d: code %d (%s), want %d", k, r, rr.Code, rr.Status, want)
				}
			}
		})
	}
	wg.Wait()
	err := other.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("the program's own child: Wait = %v, want exit status 7", err)
	}
	if codes[0] != 0 || codes[1] == 0 || codes[2] == 0 {
		t.Errorf("job exit codes %v: want 0 for the job whose ranks all exit 0, non-zero for the others", codes)
	}
}

// A script whose #! interpreter does not exist fails as a missing program
// does (127), and the error names the interpreter, not the script, which
// exists; a script in the plan's directory is read there.
func TestRunScriptWithMissingInterpreter(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(script, []byte("#! /no/such/interpreter -e\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, argv0 := range []string{script, "./job.sh"} {
		p, err := NewPlan(Request{Groups: []Group{{NP: 1, Argv: []string{argv0}}}, Dir: dir, IsGoPackage: noGo})
		if err != nil {
			t.Fatal(err)
		}
		var out, errw geartest.Buffer
		_, err = Run(context.Background(), p, testOptions(t, &out, &errw))
		var je *JobError
		if !errors.As(err, &je) || je.Code != ExitNotFound {
			t.Fatalf("%s: %v, want a JobError with code %d\n%s", argv0, err, ExitNotFound, errw.String())
		}
		want := "launch: rank 0: start " + argv0 + ": its #! line names the interpreter /no/such/interpreter, which does not exist"
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q, want %q", argv0, err, want)
		}
	}
	// A missing program is still said so.
	p, err := NewPlan(Request{Groups: []Group{{NP: 1, Argv: []string{filepath.Join(dir, "none.sh")}}}, IsGoPackage: noGo})
	if err != nil {
		t.Fatal(err)
	}
	var out, errw geartest.Buffer
	_, err = Run(context.Background(), p, testOptions(t, &out, &errw))
	if err == nil || !strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "#!") {
		t.Errorf("missing program: %v", err)
	}
}
