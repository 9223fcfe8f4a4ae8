package metrics

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

func openTest(t testing.TB, events int) *Rank {
	t.Helper()
	r, err := Open(Place{Job: "mtest", Rank: 1, Size: 2, Generation: 3, Role: "learner", TraceEvents: events, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Publish(nil); _ = r.Remove() })
	return r
}

// The hooks count what happened, a reader in the same process sees it
// through the segment's file, and the trace holds the spans.
func TestCountsAndTrace(t *testing.T) {
	r := openTest(t, 64)
	Publish(r)
	for i := range 40 {
		c := StartCall(OpAllReduce)
		c.End("world", uint64(i+1), 8)
	}
	StartCall(OpBarrier).End("world", 41, 0)
	tb := r.Table("replay", 100)
	tb.SetShard("gear.mtest.replay.1")
	for i := range 10 {
		s := tb.Begin()
		tb.Inserted(i + 1)
		tb.EndInsert(s)
	}
	w := tb.BeginWait()
	tb.Waited(false, w)
	tb.Sampled(4, 10)
	s, err := Read(r.Path())
	if err != nil {
		t.Fatal(err)
	}
	if s.Job != "mtest" || s.Rank != 1 || s.Size != 2 || s.Generation != 3 || s.Role != "learner" || !s.Running || s.PID != os.Getpid() {
		t.Errorf("snapshot %+v", s)
	}
	if len(s.Ops) != 2 || s.Ops[0].Op != "allreduce" || s.Ops[0].Calls != 40 || s.Ops[0].Bytes != 320 || s.Ops[0].Seconds <= 0 || s.Ops[1].Op != "barrier" {
		t.Errorf("collectives %+v", s.Ops)
	}
	if len(s.Tables) != 1 || s.Tables[0] != (TableStats{Name: "replay", Shard: "gear.mtest.replay.1", Size: 10, MaxSize: 100,
		Inserts: 10, Samples: 4, SampleWait: s.Tables[0].SampleWait}) || s.Tables[0].SampleWait < 0 {
		t.Errorf("tables %+v", s.Tables)
	}
	if s.TraceEvents != 41+10+1 {
		t.Errorf("%d trace events, want 52", s.TraceEvents)
	}
	var buf bytes.Buffer
	if _, err := WriteTrace(&buf, r.Path()[:len(r.Path())-len("/"+SegmentName("mtest", 1, 3, os.Getpid()))], "mtest"); err != nil {
		t.Fatal(err)
	}
	var tf TraceFile
	if err := json.Unmarshal(buf.Bytes(), &tf); err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, e := range tf.TraceEvents {
		if e.Ph == "X" {
			n[e.Name]++
		}
	}
	// The ring keeps the last 64 of 52 events: all of them.
	if n["allreduce"] != 40 || n["barrier"] != 1 || n["insert"] != 10 || n["rate limiter: sample waits"] != 1 || n["generation 3"] != 1 {
		t.Errorf("spans %v", n)
	}
	tb.Close()
	if s, _ := Read(r.Path()); len(s.Tables) != 0 {
		t.Errorf("a closed table's slot still shows: %+v", s.Tables)
	}
	r.Close()
	if Current() != nil {
		t.Error("Close left the segment published")
	}
	if s, _ := Read(r.Path()); s.Running || s.End.IsZero() {
		t.Errorf("closed segment: running %v, end %v", s.Running, s.End)
	}
}

// The ring keeps the last events only.
func TestTraceRingKeepsTheLast(t *testing.T) {
	r := openTest(t, 8)
	Publish(r)
	for i := range 20 {
		StartCall(OpBroadcast).End("world", uint64(i+1), 4)
	}
	v := r.view
	ss := v.spans()
	if len(ss) != 8 || ss[0].b != 13 || ss[7].b != 20 {
		t.Fatalf("spans %+v: want seq 13 to 20", ss)
	}
}

// The hooks allocate nothing, with metrics off, on, and tracing.
func TestHooksDoNotAllocate(t *testing.T) {
	for _, events := range []int{-1, 0, 16} {
		var r *Rank
		if events >= 0 {
			r = openTest(t, events)
		}
		Publish(r)
		tb := r.Table("t", 10)
		n := testing.AllocsPerRun(1000, func() {
			c := StartCall(OpAllReduce)
			c.End("world", 1, 8)
			s := tb.Begin()
			tb.Inserted(3)
			tb.EndInsert(s)
			tb.Sampled(1, 3)
			tb.Waited(true, tb.BeginWait())
		})
		if n != 0 {
			t.Errorf("trace %d: %v allocations per call", events, n)
		}
		Publish(nil)
	}
}

// BenchmarkCallHooks: what StartCall and End add to a collective call, with
// no segment published (off) and with one (on).
func BenchmarkCallHooks(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
			Publish(openTest(b, 0))
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				StartCall(OpAllReduce).End("world", uint64(i), 8)
			}
		})
		Publish(nil)
	}
}

// BenchmarkTableHooks: what an insert's hooks add (span, count, size).
func BenchmarkTableHooks(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		var tb *Table
		if on {
			name = "on"
			tb = openTest(b, 0).Table("t", 10)
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				s := tb.Begin()
				tb.Inserted(i)
				tb.EndInsert(s)
			}
		})
	}
}
