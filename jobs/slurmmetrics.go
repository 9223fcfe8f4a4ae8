package jobs

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"
)

// A SLURM job's ranks keep their metrics segments on their nodes, where
// `gearrun top` on the submitting machine cannot map them, and no launcher
// runs on the nodes to gather them. Each task reads its rank's segment once
// a second and writes its figures into the job's directory (MetricsDir, one
// file a rank), which the state directory shares with the submitting
// machine as it does the ranks' exit records; top and --metrics-addr read
// them there (ReadSlurmFigures). When the job keeps a trace, each task
// copies its rank's segment into the job's directory when the rank ends
// (TraceDir), and the batch script's gearrun merges the copies into the
// trace file when the job ends.

const (
	// MetricsDir is where the tasks of a SLURM job keep their ranks'
	// figures in the job's directory: <rank>.json, a launch.LiveMetrics.
	MetricsDir = "metrics"
	// TraceDir is where the tasks of a SLURM job with a trace leave copies
	// of their ranks' metrics segments for the merge.
	TraceDir = "trace"
)

// taskFiguresEvery is how often a task writes its rank's figures.
const taskFiguresEvery = time.Second

// slurmFiguresStale: a rank's figures older than this are of a rank that no
// longer runs (its task or node is gone).
const slurmFiguresStale = 5 * taskFiguresEvery

// figuresWriter writes a task's rank's figures into the job's directory.
type figuresWriter struct {
	path   string // <job dir>/metrics/<rank>.json
	shmDir string // the rank's metrics directory ("": the default)
	info   rank.Info
}

// newFiguresWriter is the writer of the rank of info's figures, or nil
// when the task keeps no records (no job directory).
func newFiguresWriter(jobDir string, env []string, info rank.Info) *figuresWriter {
	if jobDir == "" {
		return nil
	}
	return &figuresWriter{path: filepath.Join(jobDir, MetricsDir, strconv.Itoa(info.Rank)+".json"),
		shmDir: rank.EnvValue(env, rank.EnvMetricsDir), info: info}
}

// run writes the figures every taskFiguresEvery until done is closed.
func (w *figuresWriter) run(done <-chan struct{}) {
	if w == nil {
		return
	}
	t := time.NewTicker(taskFiguresEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			w.write()
		}
	}
}

// write writes the rank's figures of this generation, once its segment
// exists.
func (w *figuresWriter) write() {
	if w == nil {
		return
	}
	lm := launch.Figures(w.shmDir, w.info.JobID, []int{w.info.Rank})
	lm.Ranks = slices.DeleteFunc(lm.Ranks, func(s metrics.Snapshot) bool { return s.Generation != w.info.Restart })
	if len(lm.Ranks) == 0 {
		return
	}
	b, err := json.Marshal(lm)
	if err != nil {
		return
	}
	_ = os.MkdirAll(filepath.Dir(w.path), 0o700)
	_ = writeFileAtomic(w.path, b, 0o600)
}

// keepTrace copies the rank's metrics segments of this generation into the
// job's TraceDir for the merge at the job's end.
func keepTrace(jobDir string, env []string, info rank.Info) {
	if jobDir == "" || rank.EnvValue(env, rank.EnvTraceEvents) == "" {
		return
	}
	segs, _ := metrics.Segments(rank.EnvValue(env, rank.EnvMetricsDir), info.JobID)
	for _, sg := range segs {
		if sg.Rank != info.Rank || sg.Gen != info.Restart {
			continue
		}
		data, err := os.ReadFile(sg.Path)
		if err != nil {
			continue
		}
		dir := filepath.Join(jobDir, TraceDir)
		_ = os.MkdirAll(dir, 0o700)
		_ = writeFileAtomic(filepath.Join(dir, filepath.Base(sg.Path)), data, 0o600)
	}
}

// writeSlurmTrace merges the segments the tasks of job jobID left in
// jobDir's TraceDir into file, says so on stderr, and removes the copies.
func writeSlurmTrace(file, jobDir, jobID string, stderr io.Writer) {
	if file == "" || jobDir == "" {
		return
	}
	dir := filepath.Join(jobDir, TraceDir)
	defer os.RemoveAll(dir)
	if _, err := os.Stat(dir); err != nil {
		fmt.Fprintf(stderr, "gearrun: trace %s: no rank left its events in %s\n", file, dir)
		return
	}
	n, err := launch.WriteTrace(file, dir, jobID)
	if err != nil {
		fmt.Fprintf(stderr, "gearrun: %s\n", strings.TrimPrefix(err.Error(), "launch: "))
		return
	}
	fmt.Fprintf(stderr, "gearrun: trace of %d events in %s (open it in Perfetto or chrome://tracing)\n", n, file)
}

// ReadSlurmFigures reads the figures that the tasks of the SLURM job whose
// directory is jobDir keep there, merged: every rank's latest, the shards
// of every node. A rank whose figures are older than slurmFiguresStale is
// shown as not running. It returns an error wrapping os.ErrNotExist when
// no task has written any.
func ReadSlurmFigures(jobDir string) (*launch.LiveMetrics, error) {
	files, err := filepath.Glob(filepath.Join(jobDir, MetricsDir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("jobs: figures in %s: %w", filepath.Join(jobDir, MetricsDir), os.ErrNotExist)
	}
	out := &launch.LiveMetrics{Ranks: []metrics.Snapshot{}, Shards: map[string]store.Census{}, ShardErrors: map[string]string{}}
	now := time.Now()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var lm launch.LiveMetrics
		if json.Unmarshal(b, &lm) != nil {
			continue
		}
		out.Job = lm.Job
		if lm.Time.After(out.Time) {
			out.Time = lm.Time
		}
		for _, s := range lm.Ranks {
			if now.Sub(lm.Time) > slurmFiguresStale {
				s.Running = false
			}
			out.Ranks = append(out.Ranks, s)
		}
		for k, v := range lm.Shards {
			out.Shards[k] = v
		}
		for k, v := range lm.ShardErrors {
			out.ShardErrors[k] = v
		}
	}
	slices.SortFunc(out.Ranks, func(a, b metrics.Snapshot) int { return cmp.Compare(a.Rank, b.Rank) })
	return out, nil
}

// SlurmFiguresLive reports whether any rank of the job whose directory is
// jobDir wrote its figures lately (the job runs).
func SlurmFiguresLive(jobDir string) bool {
	lm, err := ReadSlurmFigures(jobDir)
	if err != nil {
		return false
	}
	for _, s := range lm.Ranks {
		if s.Running {
			return true
		}
	}
	return false
}
