package metrics

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/shmname"
)

// Snapshot is one rank's figures, read from its segment.
type Snapshot struct {
	Job        string       `json:"job"`
	Rank       int          `json:"rank"`
	Size       int          `json:"size"`
	Generation int          `json:"generation"`
	Role       string       `json:"role,omitempty"`
	PID        int          `json:"pid"`
	Running    bool         `json:"running"` // not closed, and its process lives
	Start      time.Time    `json:"start"`
	End        time.Time    `json:"end,omitzero"`
	Taken      time.Time    `json:"taken"` // when it was read
	Ops        []OpStats    `json:"collectives"`
	Tables     []TableStats `json:"tables"`
	// TraceEvents is how many events the rank recorded (its ring keeps the
	// last TraceCap of them).
	TraceEvents uint64 `json:"trace_events,omitempty"`
	TraceCap    int    `json:"trace_cap,omitempty"`
	Segment     string `json:"segment"`
}

// OpStats are one collective operation's counts on one rank.
type OpStats struct {
	Op    string `json:"op"`
	Calls uint64 `json:"calls"`
	Bytes uint64 `json:"bytes"`
	// Seconds is the time in the calls: measured for every call with a
	// trace, else for one call in 64 of each communicator and scaled to all
	// of them.
	Seconds float64 `json:"seconds"`
}

// TableStats are one table's counts on one rank.
type TableStats struct {
	Name    string `json:"name"`
	Shard   string `json:"shard,omitempty"` // the store shard under it
	Size    int64  `json:"size"`
	MaxSize int64  `json:"max_size"`
	Inserts int64  `json:"inserts"`
	Samples int64  `json:"samples"`
	// InsertWait and SampleWait are the seconds inserts and samples spent
	// blocked by the rate limiter.
	InsertWait float64 `json:"insert_wait_seconds"`
	SampleWait float64 `json:"sample_wait_seconds"`
}

// Read maps the segment at path read-only and returns its figures.
func Read(path string) (Snapshot, error) {
	v, err := mapView(path)
	if err != nil {
		return Snapshot{}, err
	}
	defer unix.Munmap(v.mem)
	return v.snapshot(path), nil
}

func mapView(path string) (*view, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("metrics: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("metrics: stat %s: %w", path, err)
	}
	if st.Size < int64(eventsOff) {
		return nil, fmt.Errorf("metrics: %s: %d bytes, not a metrics segment", path, st.Size)
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("metrics: map %s: %w", path, err)
	}
	v, err := newView(mem)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("metrics: %s: %w", path, err)
	}
	return v, nil
}

func load64(p *int64) int64 { return (*atomic.Int64)(unsafe.Pointer(p)).Load() }

func (v *view) snapshot(path string) Snapshot {
	h := v.h
	s := Snapshot{
		Job: str(h.job[:], h.jobLen), Rank: int(h.rank), Size: int(h.size), Generation: int(h.gen),
		Role: str(h.role[:], h.roleLen), PID: int(h.pid), Start: time.Unix(0, h.unixStart),
		Taken: time.Now(), TraceEvents: h.traceHead.Load(), TraceCap: int(h.traceCap), Segment: path,
		Ops: []OpStats{}, Tables: []TableStats{},
	}
	if end := h.ended.Load(); end != 0 {
		s.End = time.Unix(0, end)
	} else {
		s.Running = pidAlive(s.PID)
	}
	for i := range v.ops {
		var sum counters
		add := func(o *counters) {
			sum.calls += atomic.LoadUint64(&o.calls)
			sum.bytes += atomic.LoadUint64(&o.bytes)
			sum.timedCalls += atomic.LoadUint64(&o.timedCalls)
			sum.timedNs += atomic.LoadUint64(&o.timedNs)
		}
		add(&v.ops[i].counters)
		for j := range v.comms {
			if c := &v.comms[j]; c.state.Load() == 1 {
				add(&c.ops[i])
			}
		}
		if sum.calls == 0 {
			continue
		}
		st := OpStats{Op: Op(i).String(), Calls: sum.calls, Bytes: sum.bytes}
		if sum.timedCalls > 0 {
			st.Seconds = float64(sum.timedNs) / 1e9 * float64(sum.calls) / float64(sum.timedCalls)
		}
		s.Ops = append(s.Ops, st)
	}
	for i := range v.tables {
		t := &v.tables[i]
		if t.state.Load() != 1 {
			continue
		}
		s.Tables = append(s.Tables, TableStats{
			Name: str(t.name[:], t.nameLen), Shard: str(t.shard[:], atomic.LoadUint32(&t.shardLen)),
			Size: load64(&t.size), MaxSize: load64(&t.maxSize), Inserts: load64(&t.inserts), Samples: load64(&t.samples),
			InsertWait: float64(load64(&t.insWait)) / 1e9, SampleWait: float64(load64(&t.smpWait)) / 1e9,
		})
	}
	return s
}

func str(b []byte, n uint32) string { return string(b[:min(int(n), len(b))]) }

func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// Segment is a metrics segment found in a directory.
type Segment struct {
	Path           string
	Job            string
	Rank, Gen, PID int
}

// Segments lists the metrics segments in dir ("": ShmDir), of job only when
// job is not "", by job, rank, generation and process.
func Segments(dir, job string) ([]Segment, error) {
	if dir == "" {
		dir = ShmDir
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var out []Segment
	for _, e := range entries {
		p, ok := shmname.Parse(e.Name())
		if !ok || p.Kind != shmname.Metrics || (job != "" && p.Job != job) {
			continue
		}
		var s Segment
		if _, err := fmt.Sscanf(p.Rest, "r%d.g%d.p%d", &s.Rank, &s.Gen, &s.PID); err != nil {
			continue
		}
		s.Path, s.Job = dir+"/"+e.Name(), p.Job
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Segment) int {
		return cmp.Or(cmp.Compare(a.Job, b.Job), cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.Gen, b.Gen), cmp.Compare(a.PID, b.PID))
	})
	return out, nil
}

// Job reads the segments of job in dir ("": ShmDir) and returns, for each
// rank, the snapshot of its latest generation, ordered by rank.
func Job(dir, job string) ([]Snapshot, error) {
	segs, err := Segments(dir, job)
	if err != nil {
		return nil, err
	}
	latest := map[int]Snapshot{}
	for _, sg := range segs {
		s, err := Read(sg.Path)
		if err != nil {
			continue // being made, or removed meanwhile
		}
		if old, ok := latest[s.Rank]; !ok || s.Generation > old.Generation ||
			(s.Generation == old.Generation && (s.Running || !old.Running)) {
			latest[s.Rank] = s
		}
	}
	out := make([]Snapshot, 0, len(latest))
	for _, s := range latest {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Snapshot) int { return cmp.Compare(a.Rank, b.Rank) })
	return out, nil
}

// RunningJobs lists the jobs in dir ("": ShmDir) that have a segment of a
// running rank.
func RunningJobs(dir string) ([]string, error) {
	segs, err := Segments(dir, "")
	if err != nil {
		return nil, err
	}
	var jobs []string
	for _, sg := range segs {
		if slices.Contains(jobs, sg.Job) || !pidAlive(sg.PID) {
			continue
		}
		if s, err := Read(sg.Path); err == nil && s.Running {
			jobs = append(jobs, sg.Job)
		}
	}
	return jobs, nil
}
