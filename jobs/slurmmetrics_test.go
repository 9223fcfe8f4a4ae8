package jobs

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// A task writes its rank's figures into the job's directory, top reads
// every rank's there, and a rank whose figures stopped coming is shown as
// not running.
func TestSlurmFiguresRoundTrip(t *testing.T) {
	shm, jobDir := t.TempDir(), t.TempDir()
	const job = "0b7f2a5e-1111-4222-8333-944455556666"
	if _, err := ReadSlurmFigures(jobDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no figures yet: %v, want os.ErrNotExist", err)
	}
	env := []string{rank.EnvMetricsDir + "=" + shm}
	for r := range 3 {
		seg, err := metrics.Open(metrics.Place{Job: job, Rank: r, Size: 3, Dir: shm})
		if err != nil {
			t.Fatal(err)
		}
		defer seg.Close()
		tb := seg.Table("replay", 100)
		for i := range r + 1 {
			tb.Inserted(i + 1)
		}
		newFiguresWriter(jobDir, env, rank.Info{JobID: job, Rank: r, Size: 3}).write()
	}
	lm, err := ReadSlurmFigures(jobDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(lm.Ranks) != 3 || lm.Job != job {
		t.Fatalf("figures %+v: want 3 ranks of job %s", lm, job)
	}
	for r, s := range lm.Ranks {
		if s.Rank != r || !s.Running || len(s.Tables) != 1 || s.Tables[0].Inserts != int64(r+1) {
			t.Errorf("rank %d: %+v, want running with %d inserts", r, s, r+1)
		}
	}
	if !SlurmFiguresLive(jobDir) {
		t.Error("SlurmFiguresLive: false while every rank's figures are fresh")
	}

	// Rank 1's task stopped writing a while ago (its node went away).
	path := filepath.Join(jobDir, MetricsDir, "1.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var old launch.LiveMetrics
	if err := json.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	old.Time = time.Now().Add(-2 * slurmFiguresStale)
	b, _ = json.Marshal(old)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	lm, err = ReadSlurmFigures(jobDir)
	if err != nil {
		t.Fatal(err)
	}
	if lm.Ranks[1].Running || !lm.Ranks[0].Running || !lm.Ranks[2].Running {
		t.Errorf("running %v %v %v, want only rank 1 stale", lm.Ranks[0].Running, lm.Ranks[1].Running, lm.Ranks[2].Running)
	}
}

// A task of a job with a trace keeps its rank's segment for the merge, and
// the merge writes one trace of every rank and removes the copies.
func TestSlurmTraceMerge(t *testing.T) {
	shm, jobDir := t.TempDir(), t.TempDir()
	const job = "0b7f2a5e-2222-4222-8333-944455556666"
	env := []string{rank.EnvMetricsDir + "=" + shm, rank.EnvTraceEvents + "=64"}
	for r := range 2 {
		seg, err := metrics.Open(metrics.Place{Job: job, Rank: r, Size: 2, Dir: shm, TraceEvents: 64})
		if err != nil {
			t.Fatal(err)
		}
		metrics.Publish(seg)
		c := metrics.Comm{Name: "world"}
		for i := range 5 {
			c.Start(metrics.OpAllReduce, 8).End(uint64(i+1), 8)
		}
		metrics.Publish(nil)
		seg.Close()
		keepTrace(jobDir, env, rank.Info{JobID: job, Rank: r, Size: 2})
	}
	file := filepath.Join(t.TempDir(), "trace.json")
	var msg bytesWriter
	writeSlurmTrace(file, jobDir, job, &msg)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v; gearrun said %q", err, msg)
	}
	var tf metrics.TraceFile
	if err := json.Unmarshal(b, &tf); err != nil {
		t.Fatal(err)
	}
	spans := map[int]int{}
	for _, e := range tf.TraceEvents {
		if e.Ph == "X" && e.Name == "allreduce" {
			spans[e.PID]++
		}
	}
	if len(spans) != 2 {
		t.Errorf("allreduce spans by track %v, want 2 ranks with 5 each; gearrun said %q", spans, msg)
	}
	for pid, n := range spans {
		if n != 5 {
			t.Errorf("track %d: %d allreduce spans, want 5", pid, n)
		}
	}
	if _, err := os.Stat(filepath.Join(jobDir, TraceDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the segment copies stay after the merge: %v", err)
	}
}

type bytesWriter []byte

func (w *bytesWriter) Write(p []byte) (int, error) { *w = append(*w, p...); return len(p), nil }
