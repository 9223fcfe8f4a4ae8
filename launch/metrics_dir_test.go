package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/rank"
)

// envMetricsRank makes this test binary a rank of TestShmDirHoldsMetricsSegments.
const envMetricsRank = "GEAR_LAUNCH_TEST_METRICS_RANK"

// TestShmDirHoldsMetricsSegments runs ranks that make their metrics segments
// (rank.Init) under a launcher whose ShmDir is not /dev/shm: the segments are
// made there, the launcher merges the trace from them and removes them at the
// end, and the job leaves no entry in /dev/shm nor in ShmDir.
func TestShmDirHoldsMetricsSegments(t *testing.T) {
	if os.Getenv(envMetricsRank) != "" {
		w, err := rank.Init(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := w.Barrier(context.Background()); err != nil {
			t.Fatal(err)
		}
		return
	}
	var b [6]byte
	rand.Read(b[:])
	job := "shmdir-" + hex.EncodeToString(b[:])
	inShm := func() []string {
		m, _ := filepath.Glob(filepath.Join("/dev/shm", rank.SegmentName(job, "*")))
		return m
	}
	before := len(inShm())
	p, err := NewPlan(Request{JobID: job, IsGoPackage: noGo, Env: []string{envMetricsRank + "=1"},
		Groups: []Group{{NP: 2, Argv: []string{os.Args[0], "-test.run=^TestShmDirHoldsMetricsSegments$", "-test.count=1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	var out, errw geartest.Buffer
	opts := testOptions(t, &out, &errw)
	opts.ShmDir = t.TempDir()
	opts.Trace = filepath.Join(t.TempDir(), "trace.json")
	if _, err := Run(context.Background(), p, opts); err != nil {
		t.Fatalf("%v\n%s%s", err, out.String(), errw.String())
	}
	if left := inShm(); len(left) != before {
		for _, p := range left {
			os.Remove(p) // no litter from this test's failure
		}
		t.Errorf("/dev/shm held %d entries of the job before, %d after: %v", before, len(left), left)
	}
	if left, _ := filepath.Glob(filepath.Join(opts.ShmDir, rank.SegmentName(job, "*"))); len(left) != 0 {
		t.Errorf("segments of the job left in ShmDir: %v", left)
	}
	data, err := os.ReadFile(opts.Trace)
	if err != nil {
		t.Fatalf("no trace: %v; stderr:\n%s", err, errw.String())
	}
	var tf metrics.TraceFile
	if err := json.Unmarshal(data, &tf); err != nil {
		t.Fatal(err)
	}
	gens := map[int]int{}
	for _, e := range tf.TraceEvents {
		if e.Ph == "X" && e.Name == "generation 0" {
			gens[e.PID]++
		}
	}
	if len(gens) != 2 {
		t.Errorf("generation spans by rank %v: want both ranks' (their segments were made in ShmDir)", gens)
	}
}
