package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/internal/shmname"
	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/store"
)

// topCommand is `gearrun top [JOB]`: the live figures of a running job's
// ranks, tables and shards, read from their metrics segments on this machine.
func topCommand(args []string, s stdio) int {
	fs := newFlagSet("top", "top [flags] [JOB]\n\n"+
		"Show the ranks, tables and shards of a running job, refreshed each second;\n"+
		"q or Ctrl-C quits. With no JOB, the one job running on this machine (or\n"+
		"submitted from it to SLURM). JOB: gear's job ID, a prefix of it, or a SLURM job's ID.\n\nFlags:", s)
	jsonOut := fs.Bool("json", false, "print the figures as JSON lines instead of the screen")
	once := fs.Bool("once", false, "print one refresh and exit (the rates are over one interval)")
	interval := fs.Duration("interval", time.Second, "time between refreshes")
	shmDir := fs.String("shm-dir", metrics.ShmDir, "directory of shared-memory segments")
	addr := fs.String("metrics-addr", "", "also serve the figures in Prometheus's text format at `ADDR` (host:port; a bare :port listens on loopback)")
	stateDir := stateDirFlag(fs)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 1 {
		fmt.Fprintf(s.err, "gearrun top: one JOB at most, got %q\n", fs.Args())
		return 2
	}
	if *interval <= 0 {
		fmt.Fprintf(s.err, "gearrun top: --interval %v: want more than 0\n", *interval)
		return 2
	}
	job, err := topJob(*shmDir, *stateDir, fs.Arg(0))
	if err != nil {
		fmt.Fprintf(s.err, "gearrun top: %v\n", err)
		return 1
	}
	ctx, stop := signalContext()
	defer stop()
	if *addr != "" {
		srv, err := serveMetrics(*addr, job)
		if err != nil {
			fmt.Fprintf(s.err, "gearrun top: %v\n", err)
			return 1
		}
		defer srv.Close()
	}
	var restore func()
	if !*jsonOut {
		if f, ok := s.in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			if st, err := term.MakeRaw(int(f.Fd())); err == nil {
				restore = func() { _ = term.Restore(int(f.Fd()), st) }
				defer restore()
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			go readQuit(f, cancel)
		}
	}
	prev, err := readJob(job)
	if err != nil {
		fmt.Fprintf(s.err, "gearrun top: %v\n", err)
		return 1
	}
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	enc := json.NewEncoder(s.out)
	if !*once && !*jsonOut {
		// The first screen at once, with rates to come.
		drawTop(s.out, topFrameOf(job.id, prev, prev))
	}
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
		cur, err := readJob(job)
		if err != nil {
			fmt.Fprintf(s.err, "gearrun top: %v\n", err)
			return 1
		}
		f := topFrameOf(job.id, prev, cur)
		prev = cur
		if *jsonOut {
			if err := enc.Encode(f); err != nil {
				return fail(s, err)
			}
		} else {
			drawTop(s.out, f)
		}
		if *once {
			return 0
		}
		if !f.Running() {
			if !*jsonOut {
				fmt.Fprint(s.out, "job ended\r\n")
			}
			return 0
		}
	}
}

// readQuit cancels when q, Q or Ctrl-C is typed on the raw terminal f.
func readQuit(f *os.File, cancel context.CancelFunc) {
	buf := make([]byte, 16)
	for {
		n, err := f.Read(buf)
		for _, b := range buf[:n] {
			if b == 'q' || b == 'Q' || b == 3 {
				cancel()
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// jobRef is the job top shows, and where its figures are: the metrics
// segments in shmDir on this machine, the figures that the launcher of a
// job on hosts keeps on this machine, or, for a SLURM job, the figures its
// tasks keep in its directory in the state directory (slurmDir).
type jobRef struct {
	id       string
	shmDir   string
	slurmDir string
}

// topJob picks the job: the one named, or the one running on this machine
// (a SLURM job submitted from it included).
func topJob(shmDir, stateDir, job string) (jobRef, error) {
	if shmDir == "" {
		shmDir = metrics.ShmDir
	}
	state := jobs.StateDir(stateDir)
	if stateDir == "" {
		state, _ = jobs.DefaultStateDir()
	}
	if job != "" {
		segs, err := metrics.Segments(shmDir, job)
		if err != nil {
			return jobRef{}, err
		}
		if len(segs) > 0 {
			return jobRef{id: job, shmDir: shmDir}, nil
		}
		if _, err := launch.ReadLiveMetrics(rank.RuntimeDir(), job); err == nil {
			return jobRef{id: job, shmDir: shmDir}, nil
		}
		// A prefix of a job running here, as status takes one.
		local, err := localJobs(shmDir)
		if err != nil {
			return jobRef{}, err
		}
		if i, err := jobs.MatchJobID(job, local); err == nil {
			return jobRef{id: local[i], shmDir: shmDir}, nil
		} else if !errors.Is(err, jobs.ErrNotFound) {
			return jobRef{}, errors.New(strings.TrimPrefix(err.Error(), "jobs: "))
		}
		if state != "" {
			if rec, err := state.Find(job); err == nil {
				if _, err := jobs.ReadSlurmFigures(rec.Dir); err == nil {
					return jobRef{id: rec.ID, shmDir: shmDir, slurmDir: rec.Dir}, nil
				}
				return jobRef{}, fmt.Errorf("SLURM job %s has no figures yet in %s (its ranks write them there once a second while they run)", rec.ID, filepath.Join(rec.Dir, jobs.MetricsDir))
			}
		}
		return jobRef{}, fmt.Errorf("job %s has no metrics on this machine (gearrun top reads %s, the figures that the launcher of a job on hosts keeps in %s, and those of the SLURM jobs recorded in %s; run it on the launcher's machine)", job, shmDir, rank.RuntimeDir(), state)
	}
	local, err := localJobs(shmDir)
	if err != nil {
		return jobRef{}, err
	}
	var refs []jobRef
	for _, j := range local {
		refs = append(refs, jobRef{id: j, shmDir: shmDir})
	}
	if state != "" {
		recs, _ := state.List()
		for _, rec := range recs {
			if jobs.SlurmFiguresLive(rec.Dir) {
				refs = append(refs, jobRef{id: rec.ID, shmDir: shmDir, slurmDir: rec.Dir})
			}
		}
	}
	switch len(refs) {
	case 0:
		return jobRef{}, errors.New("no job is running on this machine")
	case 1:
		return refs[0], nil
	}
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.id
	}
	return jobRef{}, fmt.Errorf("%d jobs are running on this machine: name one (%s)", len(refs), strings.Join(ids, ", "))
}

// localJobs lists the jobs whose figures are on this machine: those with
// metrics segments in shmDir, then the jobs on hosts whose launcher runs here.
func localJobs(shmDir string) ([]string, error) {
	running, err := metrics.RunningJobs(shmDir)
	if err != nil {
		return nil, err
	}
	for _, j := range launch.LiveJobs(rank.RuntimeDir()) {
		if !slices.Contains(running, j) {
			running = append(running, j)
		}
	}
	return running, nil
}

// jobRead is one reading of a job's segments and shards.
type jobRead struct {
	at     time.Time
	ranks  []metrics.Snapshot
	shards map[string]store.Census
	errs   map[string]string
}

func readJob(job jobRef) (jobRead, error) {
	shmDir := job.shmDir
	if shmDir == "" {
		shmDir = metrics.ShmDir
	}
	if job.slurmDir != "" {
		lm, err := jobs.ReadSlurmFigures(job.slurmDir)
		if err != nil {
			return jobRead{}, err
		}
		return liveRead(lm), nil
	}
	if _, err := os.Stat(shmDir); err != nil {
		return jobRead{}, fmt.Errorf("metrics: %w", err)
	}
	lm := launch.Figures(shmDir, job.id, nil)
	if len(lm.Ranks) == 0 {
		// A job on hosts: the figures its launcher keeps on this machine.
		if live, err := launch.ReadLiveMetrics(rank.RuntimeDir(), job.id); err == nil {
			return liveRead(live), nil
		}
	}
	return liveRead(&lm), nil
}

// liveRead is a reading of the figures gathered from elsewhere (a job on
// hosts, a SLURM job).
func liveRead(lm *launch.LiveMetrics) jobRead {
	r := jobRead{at: time.Now(), ranks: lm.Ranks, shards: lm.Shards, errs: lm.ShardErrors}
	if r.shards == nil {
		r.shards = map[string]store.Census{}
	}
	if r.errs == nil {
		r.errs = map[string]string{}
	}
	return r
}

// topFrame is one refresh of gearrun top: what the screen shows, and each
// JSON line of --json.
type topFrame struct {
	Job      string     `json:"job"`
	Time     time.Time  `json:"time"`
	Interval float64    `json:"interval_seconds"`
	Ranks    []topRank  `json:"ranks"`
	Tables   []topTable `json:"tables"`
	Shards   []topShard `json:"shards"`
}

// Running reports whether some rank of the frame still runs.
func (f topFrame) Running() bool {
	return slices.ContainsFunc(f.Ranks, func(r topRank) bool { return r.Running })
}

type topRank struct {
	Rank        int     `json:"rank"`
	Role        string  `json:"role,omitempty"`
	PID         int     `json:"pid"`
	Generation  int     `json:"generation"`
	Running     bool    `json:"running"`
	Calls       uint64  `json:"collective_calls"`
	Bytes       uint64  `json:"collective_bytes"`
	Seconds     float64 `json:"collective_seconds"`
	CallsPerSec float64 `json:"collective_calls_per_second"`
	BytesPerSec float64 `json:"collective_bytes_per_second"`
	// Busy is the share of the interval spent in collective calls; Wait the
	// share spent waiting for peers, estimated per operation as the time
	// beyond the fastest rank's mean call (which arrived last).
	Busy float64             `json:"collective_busy"`
	Wait float64             `json:"collective_wait"`
	Top  string              `json:"top_collective,omitempty"`
	Ops  []metrics.OpStats   `json:"collectives"`
	op   map[string]opDeltas // this interval's, by op
}

type opDeltas struct {
	calls   uint64
	seconds float64
}

type topTable struct {
	Name          string  `json:"name"`
	Rank          int     `json:"rank"`
	Shard         string  `json:"shard,omitempty"`
	Size          int64   `json:"size"`
	MaxSize       int64   `json:"max_size"`
	Inserts       int64   `json:"inserts"`
	Samples       int64   `json:"samples"`
	InsertsPerSec float64 `json:"inserts_per_second"`
	SamplesPerSec float64 `json:"samples_per_second"`
	// SamplesPerInsert is samples over inserts since the table began.
	SamplesPerInsert float64 `json:"samples_per_insert"`
	// InsertBlocked and SampleBlocked are the seconds per second that
	// inserts and samples spent blocked by the rate limiter (above 1 when
	// several callers wait at once).
	InsertBlocked     float64 `json:"insert_blocked"`
	SampleBlocked     float64 `json:"sample_blocked"`
	InsertWaitSeconds float64 `json:"insert_wait_seconds"`
	SampleWaitSeconds float64 `json:"sample_wait_seconds"`
}

type topShard struct {
	Name  string `json:"name"`
	Rank  int    `json:"rank"`
	Error string `json:"error,omitempty"`
	store.Census
}

// topFrameOf computes a frame from two readings of job (the same reading
// twice gives totals and no rates).
func topFrameOf(job string, prev, cur jobRead) topFrame {
	f := topFrame{Job: job, Time: cur.at, Interval: cur.at.Sub(prev.at).Seconds(),
		Ranks: []topRank{}, Tables: []topTable{}, Shards: []topShard{}}
	dt := f.Interval
	rate := func(d float64) float64 {
		if dt <= 0 {
			return 0
		}
		return d / dt
	}
	before := map[int]metrics.Snapshot{}
	for _, s := range prev.ranks {
		before[s.Rank] = s
	}
	minMean := map[string]float64{} // op: the least mean call time of a rank this interval
	for _, s := range cur.ranks {
		p, ok := before[s.Rank]
		if !ok || p.Generation != s.Generation || p.PID != s.PID {
			p = metrics.Snapshot{}
		}
		r := topRank{Rank: s.Rank, Role: s.Role, PID: s.PID, Generation: s.Generation, Running: s.Running,
			Ops: s.Ops, op: map[string]opDeltas{}}
		var dcalls, dbytes uint64
		// The operation of most time in the last refresh; else of most time
		// so far; else of most calls (calls too short to be timed).
		var dsec, top, mostTotal float64
		var mostOp, mostCalled string
		var mostCalls uint64
		for _, o := range s.Ops {
			r.Calls += o.Calls
			r.Bytes += o.Bytes
			r.Seconds += o.Seconds
			var po metrics.OpStats
			for _, x := range p.Ops {
				if x.Op == o.Op {
					po = x
				}
			}
			d := opDeltas{calls: o.Calls - po.Calls, seconds: o.Seconds - po.Seconds}
			dcalls += d.calls
			dbytes += o.Bytes - po.Bytes
			dsec += d.seconds
			r.op[o.Op] = d
			if d.seconds > top {
				top, r.Top = d.seconds, o.Op
			}
			if o.Seconds > mostTotal {
				mostTotal, mostOp = o.Seconds, o.Op
			}
			if o.Calls > mostCalls {
				mostCalls, mostCalled = o.Calls, o.Op
			}
			if d.calls > 0 && d.seconds > 0 {
				mean := d.seconds / float64(d.calls)
				if m, ok := minMean[o.Op]; !ok || mean < m {
					minMean[o.Op] = mean
				}
			}
		}
		if r.Top == "" {
			r.Top = cmp.Or(mostOp, mostCalled)
		}
		r.CallsPerSec, r.BytesPerSec, r.Busy = rate(float64(dcalls)), rate(float64(dbytes)), min(rate(dsec), 1)
		f.Ranks = append(f.Ranks, r)
		beforeT := map[string]metrics.TableStats{}
		for _, t := range p.Tables {
			beforeT[t.Name] = t
		}
		for _, t := range s.Tables {
			pt := beforeT[t.Name]
			tt := topTable{Name: t.Name, Rank: s.Rank, Shard: t.Shard, Size: t.Size, MaxSize: t.MaxSize,
				Inserts: t.Inserts, Samples: t.Samples,
				InsertsPerSec: rate(float64(t.Inserts - pt.Inserts)), SamplesPerSec: rate(float64(t.Samples - pt.Samples)),
				InsertBlocked: rate(t.InsertWait - pt.InsertWait), SampleBlocked: rate(t.SampleWait - pt.SampleWait),
				InsertWaitSeconds: t.InsertWait, SampleWaitSeconds: t.SampleWait}
			if t.Inserts > 0 {
				tt.SamplesPerInsert = float64(t.Samples) / float64(t.Inserts)
			}
			f.Tables = append(f.Tables, tt)
			if t.Shard != "" {
				sh := topShard{Name: t.Shard, Rank: s.Rank, Error: cur.errs[t.Shard], Census: cur.shards[t.Shard]}
				f.Shards = append(f.Shards, sh)
			}
		}
	}
	for i := range f.Ranks {
		r := &f.Ranks[i]
		var wait float64
		for op, d := range r.op {
			if m, ok := minMean[op]; ok && op != "send" && op != "recv" && op != "sendrecv" {
				wait += max(d.seconds-m*float64(d.calls), 0)
			}
		}
		r.Wait = min(rate(wait), r.Busy)
	}
	slices.SortFunc(f.Tables, func(a, b topTable) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Rank, b.Rank)) })
	return f
}

// topWidth is the width gearrun top fits: an 80-column terminal.
const topWidth = 80

// drawTop clears the terminal and draws f, every line at most topWidth
// columns (lines end in \r\n: the terminal is raw).
func drawTop(w io.Writer, f topFrame) {
	var b strings.Builder
	line := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		if len(s) > topWidth {
			s = s[:topWidth]
		}
		b.WriteString(s + "\x1b[K\r\n")
	}
	b.WriteString("\x1b[H\x1b[2J")
	running := 0
	for _, r := range f.Ranks {
		if r.Running {
			running++
		}
	}
	line("gear top  job %s  %d/%d ranks running  %s", f.Job, running, len(f.Ranks), f.Time.Format("15:04:05"))
	line("rates per second over the last %.1fs; q or Ctrl-C quits", f.Interval)
	line("%4s %-9s %8s %3s %9s %9s %6s %6s  %-12s", "RANK", "ROLE", "PID", "GEN", "COLL/s", "MB/s", "COLL%", "WAIT%", "MOST TIME")
	for _, r := range f.Ranks {
		state := ""
		if !r.Running {
			state = " ended"
		}
		line("%4d %-9s %8d %3d %9.0f %9.2f %6.1f %6.1f  %-12s%s", r.Rank, clip(r.Role, 9), r.PID, r.Generation,
			r.CallsPerSec, r.BytesPerSec/1e6, 100*r.Busy, 100*r.Wait, clip(r.Top, 12), state)
	}
	line("")
	line("%-12s %4s %9s %9s %8s %8s %7s %6s %6s", "TABLE", "RANK", "SIZE", "MAX", "INS/s", "SMP/s", "SMP/INS", "INSBLK", "SMPBLK")
	for _, t := range f.Tables {
		line("%-12s %4d %9d %9d %8.0f %8.0f %7.1f %5.0f%% %5.0f%%", clip(t.Name, 12), t.Rank, t.Size, t.MaxSize,
			t.InsertsPerSec, t.SamplesPerSec, t.SamplesPerInsert, 100*t.InsertBlocked, 100*t.SampleBlocked)
	}
	if len(f.Shards) > 0 {
		line("")
		line("%-24s %4s %9s %8s %9s %7s %7s", "SHARD", "RANK", "FREE", "WRITING", "COMMITTED", "PINNED", "WRITERS")
		for _, s := range f.Shards {
			name := s.Name
			if p, ok := shmname.Parse(name); ok {
				name = p.Rest
				if p.Kind != shmname.Data {
					name = p.Kind.String() + "." + p.Rest
				}
			}
			if s.Error != "" {
				line("%-24s %4d  %s", clip(name, 24), s.Rank, s.Error)
				continue
			}
			line("%-24s %4d %9d %8d %9d %7d %7d", clip(name, 24), s.Rank, s.Free, s.Writing, s.Committed, s.Pinned, s.Writers)
		}
	}
	io.WriteString(w, b.String())
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n-1] + "~"
	}
	return s
}
