package main

import (
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/metrics"
)

// TestTopMostTime: the MOST TIME column (top_collective) names the operation
// that took most of a rank's time in the last refresh; in a refresh without
// timed calls, the one that took most so far, not the first listed; with no
// time measured at all, the one called most.
func TestTopMostTime(t *testing.T) {
	at := time.Unix(1000, 0)
	read := func(at time.Time, ops ...metrics.OpStats) jobRead {
		return jobRead{at: at, ranks: []metrics.Snapshot{{Rank: 0, PID: 7, Running: true, Ops: ops}}}
	}
	ar := func(calls uint64, sec float64) metrics.OpStats {
		return metrics.OpStats{Op: "allreduce", Calls: calls, Seconds: sec}
	}
	bar := func(calls uint64, sec float64) metrics.OpStats {
		return metrics.OpStats{Op: "barrier", Calls: calls, Seconds: sec}
	}
	for _, c := range []struct {
		name      string
		prev, cur jobRead
		want      string
	}{
		{"this refresh", read(at, ar(10, 0.5), bar(5, 0.1)), read(at.Add(time.Second), ar(10, 0.5), bar(9, 0.4)), "barrier"},
		{"idle refresh", read(at, ar(10, 0.02), bar(5, 0.71)), read(at.Add(time.Second), ar(10, 0.02), bar(5, 0.71)), "barrier"},
		{"untimed calls", read(at, ar(3, 0), bar(8, 0)), read(at.Add(time.Second), ar(3, 0), bar(8, 0)), "barrier"},
		{"no calls", read(at), read(at.Add(time.Second)), ""},
	} {
		f := topFrameOf("job", c.prev, c.cur)
		if len(f.Ranks) != 1 || f.Ranks[0].Top != c.want {
			t.Errorf("%s: ranks %+v, want one whose most time is %q", c.name, f.Ranks, c.want)
		}
	}
}
