package jobs

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/rank"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// fakeSlurm answers SLURM's client commands from a table of jobs, the way a
// cluster without accounting does: squeue knows queued and running jobs,
// scontrol also knows finished ones until it forgets them, sacct knows nothing.
type fakeSlurm struct {
	mu      sync.Mutex
	next    int
	queued  map[string]string // id -> squeue state
	done    map[string]string // id -> scontrol line
	calls   []string
	envSeen []string
	scripts []string
}

func newFakeSlurm() *fakeSlurm {
	return &fakeSlurm{next: 100, queued: map[string]string{}, done: map[string]string{}}
}

func (f *fakeSlurm) exec(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	switch name {
	case "sbatch":
		f.envSeen = append(f.envSeen, env...)
		script, err := os.ReadFile(args[len(args)-1])
		if err != nil {
			return nil, err
		}
		f.scripts = append(f.scripts, string(script))
		f.next++
		id := fmt.Sprint(f.next)
		f.queued[id] = "PENDING"
		return []byte(id + "\n"), nil
	case "squeue":
		id := args[2]
		if st, ok := f.queued[id]; ok {
			return []byte(st + "|None|vm\n"), nil
		}
		return nil, nil
	case "scontrol":
		id := args[len(args)-1]
		if line, ok := f.done[id]; ok {
			return []byte(line + "\n"), nil
		}
		if st, ok := f.queued[id]; ok {
			return []byte("JobId=" + id + " JobState=" + st + " Reason=None ExitCode=0:0 NodeList=vm\n"), nil
		}
		return nil, errors.New("slurm_load_jobs error: Invalid job id specified")
	case "sacct":
		return nil, errors.New("Slurm accounting storage is disabled")
	case "scancel":
		id := args[0]
		if _, ok := f.queued[id]; !ok {
			return nil, errors.New("scancel: error: Kill job error on job id " + id + ": Job/step already completing or completed")
		}
		delete(f.queued, id)
		f.done[id] = "JobId=" + id + " JobState=CANCELLED Reason=None ExitCode=0:15 NodeList=vm"
		return nil, nil
	}
	return nil, fmt.Errorf("fake slurm: no command %s", name)
}

func (f *fakeSlurm) finish(id, state, exit string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.queued, id)
	f.done[id] = "JobId=" + id + " JobName=x JobState=" + state + " Reason=NonZeroExitCode ExitCode=" + exit + " NodeList=vm"
}

func (f *fakeSlurm) forget(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.queued, id)
	delete(f.done, id)
}

func newTestCluster(t *testing.T) (*Cluster, *fakeSlurm) {
	f := newFakeSlurm()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return &Cluster{
		State:   StateDir(t.TempDir()),
		Sched:   Scheduler{Exec: f.exec},
		Gearrun: "/opt/gear/bin/gearrun",
		Clock:   func() time.Time { now = now.Add(time.Second); return now },
	}, f
}

func loadExample(t *testing.T, name string) *Spec {
	t.Helper()
	s, err := Load(filepath.Join("..", "examples", "jobs", name))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSubmitRecordsBothIDs(t *testing.T) {
	c, f := newTestCluster(t)
	spec := loadExample(t, "hello.toml")
	r, err := c.Submit(context.Background(), spec, "examples/jobs/hello.toml", "/home/u/run")
	if err != nil {
		t.Fatal(err)
	}
	if r.SlurmID != "101" || r.Name != "hello" {
		t.Fatalf("record %+v", r)
	}
	for _, id := range []string{r.ID, r.SlurmID, r.ID[:8]} {
		got, err := c.State.Find(id)
		if err != nil || got.ID != r.ID {
			t.Errorf("Find(%q) = %v, %v", id, got, err)
		}
	}
	// The token travels in sbatch's environment, not in the script.
	var token string
	for _, kv := range f.envSeen {
		if v, ok := strings.CutPrefix(kv, rank.EnvJobToken+"="); ok {
			token = v
		}
	}
	if token == "" {
		t.Fatalf("sbatch got no %s in its environment: %q", rank.EnvJobToken, f.envSeen)
	}
	if strings.Contains(f.scripts[0], token) {
		t.Error("the batch script holds the job token")
	}
	for _, file := range []string{RecordFile, SpecFile, ScriptFile} {
		fi, err := os.Stat(filepath.Join(r.Dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is readable by others: %v", file, fi.Mode())
		}
	}
	// The copy of the spec in the job directory is the resolved spec.
	copied, err := Load(filepath.Join(r.Dir, SpecFile))
	if err != nil {
		t.Fatal(err)
	}
	if copied.Name != "hello" || copied.Launch.NP != 4 {
		t.Errorf("copied spec %+v", copied)
	}
}

func TestSubmitFailureLeavesNoRecord(t *testing.T) {
	c, _ := newTestCluster(t)
	c.Sched.Exec = func(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
		return nil, errors.New("sbatch: error: Batch job submission failed: Invalid account")
	}
	_, err := c.Submit(context.Background(), loadExample(t, "hello.toml"), "hello.toml", "/w")
	if err == nil || !strings.Contains(err.Error(), "jobs: submit: sbatch: error: Batch job submission failed: Invalid account") {
		t.Fatalf("Submit: %v", err)
	}
	if all, _ := c.State.List(); len(all) != 0 {
		t.Errorf("records left behind: %v", all)
	}
}

func TestStatusLifecycle(t *testing.T) {
	ctx := context.Background()
	c, f := newTestCluster(t)
	spec := loadExample(t, "hello.toml")

	ok, err := c.Submit(ctx, spec, "a.toml", "/w")
	if err != nil {
		t.Fatal(err)
	}
	check := func(id, state string, exit int, source string) {
		t.Helper()
		st, err := c.Status(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != state || st.ExitCode != exit || st.Source != source {
			t.Errorf("status of %s: %s exit %d from %s, want %s exit %d from %s", id, st.State, st.ExitCode, st.Source, state, exit, source)
		}
	}
	check(ok.ID, "PENDING", -1, "squeue")
	f.queued[ok.SlurmID] = "RUNNING"
	check(ok.SlurmID, "RUNNING", -1, "squeue")
	f.finish(ok.SlurmID, "COMPLETED", "0:0")
	check(ok.ID, "COMPLETED", 0, "scontrol")
	// SLURM forgets it (MinJobAge passed, no accounting): the exit file decides.
	f.forget(ok.SlurmID)
	check(ok.ID, StateUnknown, -1, "record")
	writeExit(t, ok.Dir, 0)
	check(ok.ID, "COMPLETED", 0, "exit file")

	bad, err := c.Submit(ctx, spec, "b.toml", "/w")
	if err != nil {
		t.Fatal(err)
	}
	f.finish(bad.SlurmID, "FAILED", "3:0")
	check(bad.ID, "FAILED", 3, "scontrol")
	f.forget(bad.SlurmID)
	writeExit(t, bad.Dir, 3)
	check(bad.SlurmID, "FAILED", 3, "exit file")

	gone, err := c.Submit(ctx, spec, "c.toml", "/w")
	if err != nil {
		t.Fatal(err)
	}
	f.queued[gone.SlurmID] = "RUNNING"
	if _, err := c.Cancel(ctx, gone.SlurmID); err != nil {
		t.Fatal(err)
	}
	check(gone.ID, "CANCELLED", 0, "scontrol")
	f.forget(gone.SlurmID)
	check(gone.ID, "CANCELLED", -1, "record")
	writeExit(t, gone.Dir, 143)
	check(gone.ID, "CANCELLED", 143, "exit file")

	all, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].Record.ID != gone.ID || all[2].Record.ID != ok.ID {
		t.Errorf("List is not newest first: %v", all)
	}
}

func writeExit(t *testing.T, dir string, code int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, ExitFile), []byte(fmt.Sprintf("%d\n", code)), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestFindErrors(t *testing.T) {
	c, _ := newTestCluster(t)
	spec := loadExample(t, "hello.toml")
	if _, err := c.State.Find("12345"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Find in an empty state dir: %v", err)
	}
	// Two records whose IDs share a prefix.
	for _, id := range []string{"abcd0000-0000-4000-8000-000000000001", "abcd0000-0000-4000-8000-000000000002"} {
		if err := c.State.Create(&Record{ID: id, Name: spec.Name, SubmittedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.State.Find("abcd"); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("ambiguous prefix: %v", err)
	}
	if _, err := c.State.Find("abc"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a 3-character prefix matched: %v", err)
	}
	r, err := c.State.Find("ABCD0000-0000-4000-8000-000000000002")
	if err != nil || r.ID != "abcd0000-0000-4000-8000-000000000002" {
		t.Errorf("upper-case UUID: %v %v", r, err)
	}
	if err := c.State.Create(&Record{ID: "../escape"}); err == nil {
		t.Error("Create accepted a job ID that is not a UUID")
	}
}

func TestCancelErrors(t *testing.T) {
	ctx := context.Background()
	c, _ := newTestCluster(t)
	r, err := c.Submit(ctx, loadExample(t, "hello.toml"), "a.toml", "/w")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err = c.Cancel(ctx, r.ID); err != nil {
		t.Errorf("cancel of a job that has ended: %v", err)
	}
	// scancel fails for a job SLURM still runs: the error names the job.
	r2, err := c.Submit(ctx, loadExample(t, "hello.toml"), "b.toml", "/w")
	if err != nil {
		t.Fatal(err)
	}
	exec := c.Sched.Exec
	c.Sched.Exec = func(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
		if name == "scancel" {
			return nil, errors.New("scancel: error: Access/permission denied")
		}
		return exec(ctx, env, name, args...)
	}
	_, err = c.Cancel(ctx, r2.ID)
	if err == nil || !strings.HasPrefix(err.Error(), "jobs: cancel "+r2.SlurmID+": ") {
		t.Errorf("cancel refused by SLURM: %v", err)
	}
	if got, _ := c.State.Load(r2.ID); got.CancelledAt != nil {
		t.Error("a refused cancel was recorded")
	}
	if _, err := c.Cancel(ctx, "999"); !errors.Is(err, ErrNotFound) {
		t.Errorf("cancel of an unknown job: %v", err)
	}
}

func TestLogs(t *testing.T) {
	ctx := context.Background()
	c, f := newTestCluster(t)
	r, err := c.Submit(ctx, loadExample(t, "hello.toml"), "a.toml", "/w")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := c.Logs(ctx, r, &buf, false, time.Millisecond); err == nil {
		t.Error("Logs of a job without output gave no error")
	}
	if err := os.WriteFile(r.Output(), []byte("line 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.queued[r.SlurmID] = "RUNNING"
	done := make(chan error, 1)
	var followed geartest.Buffer
	go func() { done <- c.Logs(ctx, r, &followed, true, 5*time.Millisecond) }()
	for !strings.Contains(followed.String(), "line 1") {
		time.Sleep(5 * time.Millisecond)
	}
	out, err := os.OpenFile(r.Output(), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(out, "line 2")
	out.Close()
	f.finish(r.SlurmID, "COMPLETED", "0:0")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := followed.String(); got != "line 1\nline 2\n" {
		t.Errorf("followed output %q", got)
	}
}

func TestQueryParsing(t *testing.T) {
	out := func(s string) Exec {
		return func(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
			if name == "sacct" {
				return []byte(s), nil
			}
			return nil, errors.New("no")
		}
	}
	sched := Scheduler{Exec: out("CANCELLED by 0|0:15|vm\n")}
	st, err := sched.Query(context.Background(), "5")
	if err != nil || st.State != "CANCELLED" || st.Signal != 15 || st.Source != "sacct" {
		t.Errorf("sacct: %+v %v", st, err)
	}
	sched = Scheduler{Exec: out("")}
	if _, err := sched.Query(context.Background(), "5"); !errors.Is(err, ErrUnknownJob) {
		t.Errorf("nobody knows the job: %v", err)
	}
	st, ok := parseScontrolJob([]byte("JobId=9 JobName=a b JobState=TIMEOUT Reason=TimeLimit Dependency=(null) ExitCode=0:15 NodeList=gpu[1-2]\n"))
	if !ok || st.State != "TIMEOUT" || st.Reason != "TimeLimit" || st.ExitCode != 0 || st.Signal != 15 || st.NodeList != "gpu[1-2]" {
		t.Errorf("scontrol: %+v", st)
	}
	if _, ok := parseScontrolJob([]byte("slurm_load_jobs error: Invalid job id specified")); ok {
		t.Error("parsed an error as a job")
	}
	sched = Scheduler{Exec: func(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
		return []byte("Submitted batch job 12\n"), nil
	}}
	if _, err := sched.Submit(context.Background(), "x.sh", nil); err == nil {
		t.Error("Submit accepted sbatch output that is not --parsable")
	}
	sched.Exec = func(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
		return []byte("12;cluster2\n"), nil
	}
	if id, err := sched.Submit(context.Background(), "x.sh", nil); err != nil || id != "12" {
		t.Errorf("Submit with a cluster name: %q %v", id, err)
	}
}

func TestBatchScriptGolden(t *testing.T) {
	for _, name := range []string{"hello", "replay"} {
		t.Run(name, func(t *testing.T) {
			spec := loadExample(t, name+".toml")
			id := "0f0e0d0c-0b0a-4908-8706-050403020100"
			got, err := BatchScript(spec, Batch{
				JobID: id, Dir: "/home/u/.local/state/gear/jobs/" + id, StateDir: "/home/u/.local/state/gear",
				WorkDir: "/home/u/my project", Gearrun: "/home/u/go/bin/gearrun",
			})
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", name+".sh.golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("batch script differs from %s (go test -run TestBatchScriptGolden -update):\n%s", golden, got)
			}
		})
	}
	spec := loadExample(t, "hello.toml")
	if _, err := BatchScript(spec, Batch{JobID: "x", Dir: "/d\n#SBATCH --evil", WorkDir: "/w", Gearrun: "g"}); err == nil {
		t.Error("BatchScript accepted a path with a newline")
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"plain/path-1.2": "plain/path-1.2",
		"":               "''",
		"a b":            "'a b'",
		"it's":           `'it'\''s'`,
		"$HOME":          "'$HOME'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestDefaultStateDir(t *testing.T) {
	t.Setenv(rank.EnvStateDir, "/s")
	if d, _ := DefaultStateDir(); d != "/s" {
		t.Errorf("with %s: %s", rank.EnvStateDir, d)
	}
	t.Setenv(rank.EnvStateDir, "")
	t.Setenv("XDG_STATE_HOME", "/x")
	if d, _ := DefaultStateDir(); d != "/x/gear" {
		t.Errorf("with XDG_STATE_HOME: %s", d)
	}
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/h")
	if d, _ := DefaultStateDir(); d != "/h/.local/state/gear" {
		t.Errorf("with HOME: %s", d)
	}
}
