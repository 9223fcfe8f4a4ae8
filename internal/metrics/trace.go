package metrics

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// Trace tracks (Chrome's thread IDs) within a rank's process track.
const (
	TrackRank        = 0 // generations and restarts
	TrackCollectives = 1
	TrackInserts     = 2 // table inserts
	TrackInsertWaits = 3 // inserts blocked by the rate limiter
	TrackSamples     = 4 // table samples
	TrackSampleWaits = 5 // samples blocked by the rate limiter
)

var trackNames = [...]string{"generations", "collectives", "inserts", "rate limiter: inserts", "samples", "rate limiter: samples"}

// TraceEvent is one event of a Chrome trace-event file ("X" spans and "M"
// metadata), as WriteTrace writes it.
type TraceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`            // microseconds since the job's first rank started
	Dur  float64        `json:"dur,omitempty"` // microseconds
	PID  int            `json:"pid"`           // the rank
	TID  int            `json:"tid"`           // a Track
	Args map[string]any `json:"args,omitempty"`
}

// TraceFile is a Chrome trace-event file (the JSON object form).
type TraceFile struct {
	TraceEvents     []TraceEvent `json:"traceEvents"`
	DisplayTimeUnit string       `json:"displayTimeUnit"`
}

// span is an event read from a ring, in unix nanoseconds.
type span struct {
	rank, gen  int
	kind       uint16
	name, comm string
	start, dur int64
	a, b       uint64
}

// WriteTrace merges the trace rings of every segment of job in dir ("":
// ShmDir), every generation's, into one Chrome trace-event file written to
// w: one process track per rank, its collective calls, table inserts,
// samples and rate-limiter waits as spans, each generation as a span and the
// time between generations as a "restart" span. A collective span's args
// name its communicator, sequence number and bytes, and how long the rank
// waited for the last rank to arrive (wait_us, waited_for). It returns the
// number of spans written.
func WriteTrace(w io.Writer, dir, job string) (int, error) {
	segs, err := Segments(dir, job)
	if err != nil {
		return 0, err
	}
	type gen struct {
		rank, gen  int
		start, end int64
		role       string
	}
	var gens []gen
	var spans []span
	for _, sg := range segs {
		v, err := mapView(sg.Path)
		if err != nil {
			continue
		}
		g := gen{rank: int(v.h.rank), gen: int(v.h.gen), start: v.h.unixStart, end: v.h.ended.Load(), role: str(v.h.role[:], v.h.roleLen)}
		ss := v.spans()
		for _, s := range ss {
			g.end = max(g.end, s.start+s.dur)
		}
		if g.end == 0 {
			g.end = g.start
		}
		gens = append(gens, g)
		spans = append(spans, ss...)
		_ = unix.Munmap(v.mem)
	}
	if len(gens) == 0 {
		return 0, fmt.Errorf("metrics: trace of job %s: no metrics segments", job)
	}
	t0 := int64(math.MaxInt64)
	for _, g := range gens {
		t0 = min(t0, g.start)
	}
	us := func(ns int64) float64 { return math.Round(float64(ns-t0)/1e3*1000) / 1000 }
	var out []TraceEvent
	named := map[int]bool{}
	slices.SortFunc(gens, func(a, b gen) int { return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.gen, b.gen)) })
	for i, g := range gens {
		if !named[g.rank] {
			named[g.rank] = true
			label := "rank " + strconv.Itoa(g.rank)
			if g.role != "" {
				label += " (" + g.role + ")"
			}
			out = append(out,
				TraceEvent{Name: "process_name", Ph: "M", PID: g.rank, Args: map[string]any{"name": label}},
				TraceEvent{Name: "process_sort_index", Ph: "M", PID: g.rank, Args: map[string]any{"sort_index": g.rank}})
			for tid, name := range trackNames {
				out = append(out, TraceEvent{Name: "thread_name", Ph: "M", PID: g.rank, TID: tid, Args: map[string]any{"name": name}})
			}
		}
		out = append(out, TraceEvent{Name: "generation " + strconv.Itoa(g.gen), Cat: "rank", Ph: "X",
			TS: us(g.start), Dur: us(g.end) - us(g.start), PID: g.rank, TID: TrackRank})
		if i > 0 && gens[i-1].rank == g.rank && g.start > gens[i-1].end {
			p := gens[i-1]
			out = append(out, TraceEvent{Name: "restart", Cat: "rank", Ph: "X", TS: us(p.end), Dur: us(g.start) - us(p.end),
				PID: g.rank, TID: TrackRank, Args: map[string]any{"from_generation": p.gen, "to_generation": g.gen}})
		}
	}
	// Arrivals: for each call of a communicator, when its last rank came.
	type callKey struct {
		gen  int
		comm string
		seq  uint64
	}
	type arrival struct {
		start int64
		rank  int
	}
	last := map[callKey]arrival{}
	for _, s := range spans {
		if s.kind < uint16(NumOps) && !isP2P(Op(s.kind)) {
			k := callKey{s.gen, s.comm, s.b}
			if a, ok := last[k]; !ok || s.start > a.start {
				last[k] = arrival{s.start, s.rank}
			}
		}
	}
	slices.SortFunc(spans, func(a, b span) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.start, b.start), -cmp.Compare(a.dur, b.dur))
	})
	for _, s := range spans {
		e := TraceEvent{Name: s.name, Ph: "X", TS: us(s.start), Dur: math.Max(math.Round((us(s.start+s.dur)-us(s.start))*1000)/1000, 0), PID: s.rank}
		switch {
		case s.kind < uint16(NumOps):
			e.Cat, e.TID = "collective", TrackCollectives
			e.Args = map[string]any{"comm": s.comm, "seq": s.b, "bytes": s.a}
			if a, ok := last[callKey{s.gen, s.comm, s.b}]; ok && !isP2P(Op(s.kind)) {
				e.Args["wait_us"] = us(a.start) - us(s.start)
				e.Args["waited_for"] = a.rank
			}
		default:
			e.Cat = "table"
			e.Args = map[string]any{"table": s.comm}
			switch s.kind {
			case evInsert:
				e.TID, e.Args["size"] = TrackInserts, s.b
			case evSample:
				e.TID, e.Args["items"], e.Args["size"] = TrackSamples, s.a, s.b
			case evInsertWait:
				e.TID = TrackInsertWaits
			case evSampleWait:
				e.TID = TrackSampleWaits
			}
		}
		out = append(out, e)
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(TraceFile{TraceEvents: out, DisplayTimeUnit: "ms"}); err != nil {
		return 0, fmt.Errorf("metrics: trace of job %s: %w", job, err)
	}
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("metrics: trace of job %s: %w", job, err)
	}
	return len(out), nil
}

func isP2P(o Op) bool { return o == OpSend || o == OpRecv || o == OpSendRecv }

// spans reads the ring's events, oldest first.
func (v *view) spans() []span {
	head := v.h.traceHead.Load()
	if v.cap == 0 || head == 0 {
		return nil
	}
	from := uint64(0)
	if head > v.cap {
		from = head - v.cap
	}
	rank, gen := int(v.h.rank), int(v.h.gen)
	out := make([]span, 0, head-from)
	for i := from; i < head; i++ {
		e := v.event(i)
		if e.stamp.Load() != i+1 {
			continue // being written, or overwritten
		}
		s := span{rank: rank, gen: gen, kind: e.kind, start: v.unix(e.start), dur: e.dur, a: e.a, b: e.b}
		switch {
		case e.kind < uint16(NumOps):
			s.name = Op(e.kind).String()
			if int(e.obj) < maxComms {
				c := &v.comms[e.obj]
				s.comm = str(c.name[:], c.nameLen)
			}
		default:
			s.name = map[uint16]string{evInsert: "insert", evSample: "sample",
				evInsertWait: "rate limiter: insert waits", evSampleWait: "rate limiter: sample waits"}[e.kind]
			if int(e.obj) < maxTables {
				t := &v.tables[e.obj]
				s.comm = str(t.name[:], t.nameLen)
			}
		}
		if s.name == "" {
			continue
		}
		out = append(out, s)
	}
	return out
}
