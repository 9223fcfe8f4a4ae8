package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/rank"
)

// envHostsMetricsRank makes this test binary a rank of
// TestRunOnHostsMetricsAndTrace; its value is the file whose existence lets
// the ranks end.
const envHostsMetricsRank = "GEAR_LAUNCH_TEST_HOSTS_METRICS_RANK"

// TestRunOnHostsMetricsAndTrace runs a job of 2 ranks on 2 hosts (the
// stand-in for ssh of fakeRemote) whose ranks make AllReduce calls: while it
// runs, the launcher's file of figures (LiveMetricsPath, what gearrun top
// reads for a job on hosts) holds both ranks and their calls; at the end the
// trace, merged from the segments that the agents sent, holds both ranks'
// generation and AllReduce spans, the same calls on both; the file and the
// job's segments are gone.
func TestRunOnHostsMetricsAndTrace(t *testing.T) {
	if release := os.Getenv(envHostsMetricsRank); release != "" {
		ctx := context.Background()
		w, err := rank.Init(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		c, err := w.CommContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		buf := []float32{1, 2}
		for {
			for range 10 {
				if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
					t.Fatal(err)
				}
			}
			// Both ranks end after the same call.
			stop := []int32{0}
			if _, err := os.Stat(release); err == nil {
				stop[0] = 1
			}
			if err := collective.AllReduce(ctx, c, stop, collective.Max); err != nil {
				t.Fatal(err)
			}
			if stop[0] == 1 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var b [6]byte
	rand.Read(b[:])
	job := "hostsmet-" + hex.EncodeToString(b[:])
	release := filepath.Join(t.TempDir(), "release")
	rt, trace := t.TempDir(), filepath.Join(t.TempDir(), "trace.json")
	p := placedPlan(t, "h1:1,h2:1", Request{JobID: job, RdzvAddr: "127.0.0.1:0", NoTorchEnv: true, IsGoPackage: noGo,
		Env:    []string{envHostsMetricsRank + "=" + release},
		Groups: []Group{{NP: 2, Argv: []string{os.Args[0], "-test.run=^TestRunOnHostsMetricsAndTrace$", "-test.count=1"}}}})
	var out, errw geartest.Buffer
	type result struct {
		res *Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := RunOnHosts(context.Background(), p, Options{Stdout: &out, Stderr: &errw, TagOutput: true, Grace: 2 * time.Second,
			Timeout: 2 * time.Minute, RuntimeDir: rt, Trace: trace}, fakeRemote(t))
		done <- result{res, err}
	}()
	// The figures of both ranks, with calls, while the job runs.
	var live *LiveMetrics
	for {
		lm, err := ReadLiveMetrics(rt, job)
		if err == nil && len(lm.Ranks) == 2 && lm.Ranks[0].Running && lm.Ranks[1].Running &&
			len(lm.Ranks[0].Ops) > 0 && len(lm.Ranks[1].Ops) > 0 && lm.Ranks[1].Ops[0].Calls > 0 {
			live = lm
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the job ended (%v) before its figures showed both ranks' calls: %+v\n%s%s", r.err, lm, out.String(), errw.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if live.Job != job || live.PID != os.Getpid() || live.Ranks[0].Rank != 0 || live.Ranks[1].Rank != 1 || live.Ranks[0].Ops[0].Op != "allreduce" {
		t.Errorf("figures %+v", live)
	}
	if jobs := LiveJobs(rt); len(jobs) != 1 || jobs[0] != job {
		t.Errorf("LiveJobs = %v, want [%s]", jobs, job)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("%v\n%s%s", r.err, out.String(), errw.String())
	}
	if _, err := os.Stat(LiveMetricsPath(rt, job)); !os.IsNotExist(err) {
		t.Errorf("the figures' file outlives the job: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join("/dev/shm", rank.SegmentName(job, "*"))); len(left) != 0 {
		t.Errorf("segments of the job left: %v", left)
	}
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatalf("no trace: %v\n%s", err, errw.String())
	}
	var tf metrics.TraceFile
	if err := json.Unmarshal(data, &tf); err != nil {
		t.Fatal(err)
	}
	gens := map[int]int{}
	seqs := map[int]map[float64]bool{0: {}, 1: {}}
	for _, e := range tf.TraceEvents {
		switch {
		case e.Ph == "X" && e.Name == "generation 0":
			gens[e.PID]++
		case e.Ph == "X" && e.Name == "allreduce":
			seqs[e.PID][e.Args["seq"].(float64)] = true
		}
	}
	if gens[0] != 1 || gens[1] != 1 {
		t.Errorf("generation spans by rank %v: want one of each rank", gens)
	}
	if len(seqs[0]) < 11 || len(seqs[0]) != len(seqs[1]) {
		t.Errorf("allreduce spans: rank 0 %d, rank 1 %d: want the same calls, 11 or more", len(seqs[0]), len(seqs[1]))
	}
	for s := range seqs[0] {
		if !seqs[1][s] {
			t.Errorf("call %v in rank 0's trace only", s)
			break
		}
	}
}
