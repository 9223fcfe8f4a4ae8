package metrics

import (
	"bytes"
	"encoding/json"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
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
	world := Comm{Name: "world"}
	for i := range 40 {
		c := world.Start(OpAllReduce, 8)
		c.End(uint64(i+1), 8)
	}
	world.Start(OpBarrier, 0).End(41, 0)
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

// Communicators count apart, each by its one writer, and the rank's figures
// are their sums: goroutines calling on their own communicators at once lose
// no count (run with -race), nor do the communicators past the first
// maxComms, which share the rank's counters.
func TestCommsCountApart(t *testing.T) {
	r := openTest(t, 0)
	Publish(r)
	const comms, calls = maxComms + 8, 500
	var wg sync.WaitGroup
	for g := range comms {
		wg.Go(func() {
			c := Comm{Name: "c" + strconv.Itoa(g)}
			for i := range calls {
				c.Start(OpAllReduce, 8).End(uint64(i+1), 8)
				c.Start(OpBroadcast, 4).End(uint64(i+1), 4)
			}
			c.Flush()
		})
	}
	wg.Wait()
	s, err := Read(r.Path())
	if err != nil {
		t.Fatal(err)
	}
	want := []OpStats{{Op: "allreduce", Calls: comms * calls, Bytes: comms * calls * 8},
		{Op: "broadcast", Calls: comms * calls, Bytes: comms * calls * 4}}
	if len(s.Ops) != 2 {
		t.Fatalf("collectives %+v, want %+v", s.Ops, want)
	}
	for i, o := range s.Ops {
		if o.Op != want[i].Op || o.Calls != want[i].Calls || o.Bytes != want[i].Bytes || o.Seconds <= 0 {
			t.Errorf("collectives[%d] = %+v, want %+v and some time", i, o, want[i])
		}
	}
	taken := 0
	for i := range r.comms {
		if r.comms[i].state.Load() == 1 {
			taken++
		}
	}
	if shared := r.ops[OpAllReduce].calls; taken != maxComms || shared != 8*calls {
		t.Errorf("%d communicator slots taken, %d calls on the shared counters; want %d and %d", taken, shared, maxComms, 8*calls)
	}
}

// The ring keeps the last events only.
func TestTraceRingKeepsTheLast(t *testing.T) {
	r := openTest(t, 8)
	Publish(r)
	world := Comm{Name: "world"}
	for i := range 20 {
		world.Start(OpBroadcast, 4).End(uint64(i+1), 4)
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
		world := Comm{Name: "world"}
		n := testing.AllocsPerRun(1000, func() {
			c := world.Start(OpAllReduce, 8)
			c.End(1, 8)
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

// BenchmarkCallHooks: what Start and End add to a collective call, with no
// segment published (off), with one (on: a communicator's own counters, plain
// stores), on a rank's shared counters (shared: atomic adds, what a
// communicator past the first maxComms gets), and with a trace.
func BenchmarkCallHooks(b *testing.B) {
	for _, mode := range []string{"off", "on", "shared", "trace"} {
		world := Comm{Name: "world"}
		switch mode {
		case "on":
			Publish(openTest(b, 0))
		case "shared":
			r := openTest(b, 0)
			Publish(r)
			for i := range maxComms {
				c := Comm{Name: "c" + strconv.Itoa(i)}
				c.Start(OpBarrier, 0).End(0, 0)
			}
		case "trace":
			Publish(openTest(b, 1<<10))
		}
		b.Run(mode, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				world.Start(OpAllReduce, 8).End(uint64(i), 8)
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

// A communicator's counts reach the segment at least every sampleEvery
// calls of an operation, at every call of an operation whose calls come
// slowly, and all of them at Flush.
func TestCountsReachSegment(t *testing.T) {
	r := openTest(t, 0)
	Publish(r)
	defer Publish(nil)
	read := func(op Op) (calls, bytes uint64) {
		t.Helper()
		s, err := Read(r.Path())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range s.Ops {
			if c.Op == op.String() {
				return c.Calls, c.Bytes
			}
		}
		return 0, 0
	}
	fast := Comm{Name: "fast"}
	const n = 3*sampleEvery + 10
	for i := range n {
		fast.Start(OpAllReduce, 8).End(uint64(i+1), 8)
	}
	if calls, bytes := read(OpAllReduce); calls > n || n-calls >= sampleEvery || bytes != 8*calls {
		t.Errorf("fast calls: segment has %d calls, %d bytes after %d calls: want fewer than %d behind, 8 bytes each", calls, bytes, n, sampleEvery)
	}
	fast.Flush()
	if calls, bytes := read(OpAllReduce); calls != n || bytes != 8*n {
		t.Errorf("after Flush: %d calls, %d bytes; want %d, %d", calls, bytes, n, 8*n)
	}
	// Timed: the calls whose count before them is a multiple of
	// sampleEvery, 0, 256, 512 and 768, whatever path Start took.
	if got, want := fast.s.ops[OpAllReduce].timedCalls, uint64((n+sampleEvery-1)/sampleEvery); got != want {
		t.Errorf("fast calls: %d timed, want %d", got, want)
	}
	// An operation past NumOps counts nowhere, also after the real ones.
	fast.Start(Op(OpAllReduce+opMask+1), 8).End(0, 8)
	fast.Flush()
	if calls, _ := read(OpAllReduce); calls != n {
		t.Errorf("an unknown operation counted as allreduce: %d calls, want %d", calls, n)
	}

	slow := Comm{Name: "slow"}
	for i := range 2*sampleEvery + 5 {
		start := time.Now()
		for time.Since(start) < 3*eagerGap*time.Nanosecond {
		}
		slow.Start(OpBroadcast, 4).End(uint64(i+1), 4)
		if calls, _ := read(OpBroadcast); calls != uint64(i+1) {
			t.Fatalf("slow call %d: segment has %d calls", i+1, calls)
		}
	}
}
