package launch

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/internal/shmname"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"
)

// A job on hosts (RunOnHosts) has its ranks' metrics segments on the hosts,
// where `gearrun top` on the launcher's machine cannot map them. Each agent
// reads its ranks' segments once a second and sends their figures to the
// launcher (frameMetrics); the launcher keeps the latest of every host in a
// file of its runtime directory (LiveMetricsPath), which top and
// --metrics-addr read for a job with no segment on their machine. When a
// generation's ranks have ended and the job keeps a trace, each agent sends
// copies of its ranks' segments of that generation (frameSegment), which the
// launcher merges into the job's trace when it ends.

// agentMetricsEvery is how often an agent sends its ranks' figures.
const agentMetricsEvery = time.Second

// LiveMetrics are the figures of a job on hosts, as its launcher last heard
// them from its agents.
type LiveMetrics struct {
	Job string `json:"job"`
	// PID is the launcher's process: the figures are live while it runs.
	PID    int                     `json:"pid"`
	Time   time.Time               `json:"time"`
	Ranks  []metrics.Snapshot      `json:"ranks"`
	Shards map[string]store.Census `json:"shards,omitempty"`
	// ShardErrors says why a shard could not be read.
	ShardErrors map[string]string `json:"shard_errors,omitempty"`
}

// hostFigures is an agent's frameMetrics payload.
type hostFigures struct {
	Ranks       []metrics.Snapshot      `json:"ranks"`
	Shards      map[string]store.Census `json:"shards,omitempty"`
	ShardErrors map[string]string       `json:"shard_errors,omitempty"`
}

// LiveMetricsPath is the file in which the launcher of job jobID on hosts
// keeps its ranks' figures, in runtimeDir ("": rank.RuntimeDir()).
func LiveMetricsPath(runtimeDir, jobID string) string {
	if runtimeDir == "" {
		runtimeDir = rank.RuntimeDir()
	}
	return filepath.Join(runtimeDir, jobID+".metrics.json")
}

// ReadLiveMetrics reads the figures of job jobID on hosts that its launcher
// keeps in runtimeDir ("": rank.RuntimeDir()).
func ReadLiveMetrics(runtimeDir, jobID string) (*LiveMetrics, error) {
	b, err := os.ReadFile(LiveMetricsPath(runtimeDir, jobID))
	if err != nil {
		return nil, fmt.Errorf("launch: figures of job %s: %w", jobID, err)
	}
	var lm LiveMetrics
	if err := json.Unmarshal(b, &lm); err != nil {
		return nil, fmt.Errorf("launch: figures of job %s: %w", jobID, err)
	}
	return &lm, nil
}

// LiveJobs lists the jobs on hosts whose launchers run and keep figures in
// runtimeDir ("": rank.RuntimeDir()).
func LiveJobs(runtimeDir string) []string {
	files, _ := filepath.Glob(LiveMetricsPath(runtimeDir, "*"))
	var jobs []string
	for _, f := range files {
		job := strings.TrimSuffix(filepath.Base(f), ".metrics.json")
		if lm, err := ReadLiveMetrics(runtimeDir, job); err == nil && processAlive(lm.PID) {
			jobs = append(jobs, job)
		}
	}
	return jobs
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// figures reads the metrics of the agent's ranks on its host.
func (a *agent) figures() hostFigures {
	lm := Figures(a.opts.ShmDir, a.job.Plan.JobID, a.ranks)
	return hostFigures{Ranks: lm.Ranks, Shards: lm.Shards, ShardErrors: lm.ShardErrors}
}

// Figures reads the figures of job jobID's ranks that keep their metrics
// segments in shmDir ("": metrics.ShmDir) on this machine, of the ranks in
// ranks only when ranks is not nil: each rank's latest segment, and the
// rows of the store shards under its tables (read from the shards
// themselves, which only the default directory has). Its PID is this
// process and its Time now.
func Figures(shmDir, jobID string, ranks []int) LiveMetrics {
	lm := LiveMetrics{Job: jobID, PID: os.Getpid(), Time: time.Now(), Ranks: []metrics.Snapshot{}}
	snaps, err := metrics.Job(shmDir, jobID)
	if err != nil {
		return lm
	}
	for _, s := range snaps {
		if ranks != nil && !slices.Contains(ranks, s.Rank) {
			continue
		}
		lm.Ranks = append(lm.Ranks, s)
		for _, t := range s.Tables {
			if t.Shard == "" || (shmDir != "" && shmDir != metrics.ShmDir) {
				continue
			}
			if lm.Shards == nil {
				lm.Shards, lm.ShardErrors = map[string]store.Census{}, map[string]string{}
			}
			if c, err := store.CountRows(t.Shard); err == nil {
				lm.Shards[t.Shard] = c
			} else {
				lm.ShardErrors[t.Shard] = err.Error()
			}
		}
	}
	return lm
}

// sendFigures sends the agent's ranks' figures to the launcher.
func (a *agent) sendFigures() {
	if b, err := json.Marshal(a.figures()); err == nil {
		a.out.send(frameMetrics, -1, b)
	}
}

// segmentChunk bounds a frameSegment's bytes of a segment.
const segmentChunk = 4 << 20

// sendTrace sends copies of the metrics segments of the agent's ranks in
// this generation, for the job's trace, if it keeps one.
func (a *agent) sendTrace() {
	p := a.job.Plan
	if n, _ := strconv.Atoi(rank.EnvValue(p.Env, rank.EnvTraceEvents)); n <= 0 {
		return
	}
	segs, err := metrics.Segments(a.opts.ShmDir, p.JobID)
	if err != nil {
		return
	}
	for _, sg := range segs {
		if sg.Gen != p.Restart || !slices.Contains(a.ranks, sg.Rank) {
			continue
		}
		data, err := os.ReadFile(sg.Path)
		if err != nil {
			continue
		}
		name := filepath.Base(sg.Path)
		for off := 0; off < len(data); off += segmentChunk {
			end := min(off+segmentChunk, len(data))
			b := make([]byte, 0, len(name)+9+end-off)
			b = append(b, name...)
			b = append(b, '\n')
			b = binary.BigEndian.AppendUint64(b, uint64(off))
			if a.out.send(frameSegment, -1, append(b, data[off:end]...)) != nil {
				return
			}
		}
	}
}

// hostMetrics is what the launcher of a job on hosts keeps of its agents'
// figures and trace segments.
type hostMetrics struct {
	mu       sync.Mutex
	path     string // LiveMetricsPath
	job      string
	byHost   map[int]hostFigures
	traceDir string // the segments' copies; "" without a trace
}

func newHostMetrics(runtimeDir, jobID string, trace bool) (*hostMetrics, error) {
	hm := &hostMetrics{path: LiveMetricsPath(runtimeDir, jobID), job: jobID, byHost: map[int]hostFigures{}}
	if err := os.MkdirAll(filepath.Dir(hm.path), 0o700); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	if trace {
		d, err := os.MkdirTemp("", "gear-trace-")
		if err != nil {
			return nil, fmt.Errorf("launch: trace: %w", err)
		}
		hm.traceDir = d
	}
	return hm, nil
}

// figures takes a host's figures and rewrites the job's file.
func (hm *hostMetrics) figures(host int, data []byte) error {
	var f hostFigures
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("its agent's figures: %w", err)
	}
	hm.mu.Lock()
	defer hm.mu.Unlock()
	hm.byHost[host] = f
	return hm.write()
}

// hostGone marks a host's ranks as not running.
func (hm *hostMetrics) hostGone(host int) {
	hm.mu.Lock()
	defer hm.mu.Unlock()
	f, ok := hm.byHost[host]
	if !ok {
		return
	}
	for i := range f.Ranks {
		f.Ranks[i].Running = false
	}
	_ = hm.write()
}

func (hm *hostMetrics) write() error {
	lm := LiveMetrics{Job: hm.job, PID: os.Getpid(), Time: time.Now(), Ranks: []metrics.Snapshot{}}
	latest := map[int]metrics.Snapshot{}
	for _, f := range hm.byHost {
		for _, s := range f.Ranks {
			if old, ok := latest[s.Rank]; !ok || s.Generation > old.Generation || (s.Generation == old.Generation && s.Running) {
				latest[s.Rank] = s
			}
		}
		for k, v := range f.Shards {
			if lm.Shards == nil {
				lm.Shards = map[string]store.Census{}
			}
			lm.Shards[k] = v
		}
		for k, v := range f.ShardErrors {
			if lm.ShardErrors == nil {
				lm.ShardErrors = map[string]string{}
			}
			lm.ShardErrors[k] = v
		}
	}
	for _, s := range latest {
		lm.Ranks = append(lm.Ranks, s)
	}
	slices.SortFunc(lm.Ranks, func(a, b metrics.Snapshot) int { return cmp.Compare(a.Rank, b.Rank) })
	b, err := json.Marshal(lm)
	if err != nil {
		return err
	}
	tmp := hm.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, hm.path)
}

// segment writes a chunk of a segment's copy.
func (hm *hostMetrics) segment(data []byte) error {
	if hm.traceDir == "" {
		return nil
	}
	name, rest, ok := strings.Cut(string(data), "\n")
	if p, okName := metricsName(name); !ok || !okName || p != hm.job || len(rest) < 8 {
		return errors.New("a malformed trace segment")
	}
	off := binary.BigEndian.Uint64([]byte(rest[:8]))
	f, err := os.OpenFile(filepath.Join(hm.traceDir, name), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteAt([]byte(rest[8:]), int64(off))
	return errors.Join(err, f.Close())
}

// metricsName returns the job of a metrics segment's name.
func metricsName(name string) (string, bool) {
	if strings.ContainsAny(name, "/\x00") {
		return "", false
	}
	p, ok := shmname.Parse(name)
	return p.Job, ok && p.Kind == shmname.Metrics
}

// close removes the job's file and the trace's copies.
func (hm *hostMetrics) close() {
	_ = os.Remove(hm.path)
	if hm.traceDir != "" {
		_ = os.RemoveAll(hm.traceDir)
	}
}
