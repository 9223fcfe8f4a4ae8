package metrics

import "sync/atomic"

// Op is a collective operation, as the hooks count it.
type Op uint8

// The operations: collective's public calls.
const (
	OpAllReduce Op = iota
	OpReduce
	OpBroadcast
	OpAllGather
	OpGather
	OpScatter
	OpReduceScatter
	OpAllToAll
	OpBarrier
	OpSend
	OpRecv
	OpSendRecv
	NumOps
)

var opNames = [NumOps]string{"allreduce", "reduce", "broadcast", "allgather", "gather", "scatter",
	"reduce_scatter", "alltoall", "barrier", "send", "recv", "sendrecv"}

// String is the operation's name in top, Prometheus labels and traces.
func (o Op) String() string {
	if o < NumOps {
		return opNames[o]
	}
	return "op?"
}

// The kinds of trace event beyond the collective operations (0 to NumOps-1).
const (
	evInsert     = 32 + iota // a table insert
	evSample                 // a table sample
	evInsertWait             // an insert blocked by the rate limiter
	evSampleWait             // a sample blocked by the rate limiter
)

// Comm is one communicator's counters in its rank's segment. The
// communicator keeps it (its zero value is ready) and passes it to Start
// from each of its calls, one call at a time (its calls hold the
// communicator's lock): its counters have that one writer, which updates them
// with plain loads and stores, no locked instruction; readers load them
// atomically from their own mapping. A rank's first maxComms communicators
// get a slot each; the later ones share the rank's counters, which they
// update with atomic adds.
type Comm struct {
	r    *Rank     // the segment that s is in; nil: none yet
	s    *commSlot // nil: no slot free: r.ops, shared
	slot uint16    // s's index, maxComms for none
}

// Call is a collective call in progress, from Comm.Start to End. The zero
// Call (no segment published) does nothing.
type Call struct {
	o      *counters // nil: not counted
	r      *Rank
	start  int64 // nanotime; 0: not timed
	slot   uint16
	op     Op
	shared bool // o is the rank's shared counters: atomic adds
}

// Start counts a call of op on the communicator called name; the caller
// ends it with End. It allocates nothing and makes no locked instruction
// (but on the shared counters of a rank's communicators past its first
// maxComms); one call in sampleEvery of each operation, and every call with
// a trace, also reads the clock.
func (m *Comm) Start(name string, op Op) Call {
	r := current.Load()
	if r == nil || op >= NumOps {
		return Call{}
	}
	if m.r != r || m.s == nil {
		return m.startSlow(r, name, op)
	}
	o := &m.s.ops[op]
	n := o.calls + 1
	o.calls = n
	c := Call{o: o, r: r, slot: m.slot, op: op}
	if n%sampleEvery == 1 || r.tracing {
		c.start = nanotime()
	}
	return c
}

// startSlow is Start for a communicator's first call on r, and for one
// without a slot of its own (the rank's shared counters).
func (m *Comm) startSlow(r *Rank, name string, op Op) Call {
	if m.r != r {
		m.attach(r, name)
	}
	if m.s != nil {
		return m.Start(name, op)
	}
	c := Call{o: &r.ops[op].counters, r: r, slot: m.slot, op: op, shared: true}
	if n := atomic.AddUint64(&c.o.calls, 1); n%sampleEvery == 1 || r.tracing {
		c.start = nanotime()
	}
	return c
}

// attach takes a free communicator slot of r for the communicator called
// name, or none (the shared counters) when they are all taken.
func (m *Comm) attach(r *Rank, name string) {
	m.r, m.s, m.slot = r, nil, maxComms
	for i := range r.comms {
		s := &r.comms[i]
		if s.state.Load() != 0 || !s.state.CompareAndSwap(0, 2) { // 2: being filled
			continue
		}
		s.nameLen = uint32(copy(s.name[:], name))
		s.state.Store(1)
		m.s, m.slot = s, uint16(i)
		return
	}
}

// End adds the call's bytes (its buffer's size on this rank) and, for a
// timed call, its time; with a trace it leaves the call's event, naming the
// call's sequence number seq (the tag for send and receive).
func (c Call) End(seq uint64, bytes int) {
	o := c.o
	if o == nil {
		return
	}
	if c.shared || c.start != 0 {
		c.endSlow(seq, bytes)
		return
	}
	o.bytes += uint64(bytes)
}

// endSlow is End for a timed call or one on the shared counters.
func (c Call) endSlow(seq uint64, bytes int) {
	o := c.o
	if c.shared {
		atomic.AddUint64(&o.bytes, uint64(bytes))
	} else {
		o.bytes += uint64(bytes)
	}
	if c.start == 0 {
		return
	}
	d := nanotime() - c.start
	if c.shared {
		atomic.AddUint64(&o.timedCalls, 1)
		atomic.AddUint64(&o.timedNs, uint64(d))
	} else {
		o.timedCalls++
		o.timedNs += uint64(d)
	}
	if c.r.tracing {
		c.r.record(uint16(c.op), c.slot, c.start, d, uint64(bytes), seq)
	}
}

// record appends an event to the trace ring.
func (r *Rank) record(kind, obj uint16, start, dur int64, a, b uint64) {
	i := r.h.traceHead.Add(1) - 1
	e := r.event(i)
	e.stamp.Store(0)
	e.start, e.dur, e.kind, e.obj, e.a, e.b = start, dur, kind, obj, a, b
	e.stamp.Store(i + 1)
}

// Table is one replay table's slot in its rank's segment. A nil *Table (no
// segment, or every slot taken) does nothing. Its counting methods are called
// with the table's lock held: one writer at a time.
type Table struct {
	r   *Rank
	s   *tableSlot
	idx uint16
}

// Table takes a slot for the table called name, of at most maxSize items. It
// returns nil when r is nil or its slots are all taken. The table gives the
// slot back with Close.
func (r *Rank) Table(name string, maxSize int) *Table {
	if r == nil || r.closed.Load() {
		return nil
	}
	for i := range r.tables {
		s := &r.tables[i]
		if s.state.Load() != 0 || !s.state.CompareAndSwap(0, 2) { // 2: being filled
			continue
		}
		s.nameLen = uint32(copy(s.name[:], name))
		s.shardLen = 0
		s.maxSize, s.size, s.inserts, s.samples, s.insWait, s.smpWait = int64(maxSize), 0, 0, 0, 0, 0
		s.state.Store(1)
		return &Table{r: r, s: s, idx: uint16(i)}
	}
	return nil
}

// SetShard records the name of the store shard under the table, which
// readers inspect for its rows and writers.
func (t *Table) SetShard(name string) {
	if t == nil {
		return
	}
	t.s.shardLen = uint32(copy(t.s.shard[:], name))
}

// Inserted counts one insert; size is the table's size after it.
func (t *Table) Inserted(size int) {
	if t == nil {
		return
	}
	t.s.inserts++
	t.s.size = int64(size)
}

// Sampled counts n samples; size is the table's size after them.
func (t *Table) Sampled(n, size int) {
	if t == nil {
		return
	}
	t.s.samples += int64(n)
	t.s.size = int64(size)
}

// Resized records the table's size after a delete.
func (t *Table) Resized(size int) {
	if t == nil {
		return
	}
	t.s.size = int64(size)
}

// Begin starts a span for the trace: a nanotime, or 0 without a trace.
func (t *Table) Begin() int64 {
	if t == nil || !t.r.tracing {
		return 0
	}
	return nanotime()
}

// BeginWait starts a rate-limiter wait: always timed (a wait is slow anyway).
func (t *Table) BeginWait() int64 {
	if t == nil {
		return 0
	}
	return nanotime()
}

// EndInsert ends an insert's span started by Begin.
func (t *Table) EndInsert(start int64) { t.span(evInsert, start, 1) }

// EndSample ends a sample's span started by Begin; n items were sampled.
func (t *Table) EndSample(start int64, n int) { t.span(evSample, start, uint64(n)) }

func (t *Table) span(kind uint16, start int64, n uint64) {
	if t == nil || start == 0 {
		return
	}
	t.r.record(kind, t.idx, start, nanotime()-start, n, uint64(t.s.size))
}

// Waited adds the time since start (from BeginWait) to the time that
// inserts (insert) or samples spent blocked by the rate limiter.
func (t *Table) Waited(insert bool, start int64) {
	if t == nil || start == 0 {
		return
	}
	d := nanotime() - start
	kind := uint16(evSampleWait)
	if insert {
		t.s.insWait += d
		kind = evInsertWait
	} else {
		t.s.smpWait += d
	}
	if t.r.tracing {
		t.r.record(kind, t.idx, start, d, 0, 0)
	}
}

// Close gives the slot back.
func (t *Table) Close() {
	if t == nil || t.r.closed.Load() {
		return
	}
	t.s.state.Store(0)
}
