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

// Comm is one communicator's counters. The communicator keeps it (its zero
// value is ready, with Name set) and passes it to Start from each of its
// calls, one call at a time (its calls hold the communicator's lock): its
// counters have that one writer.
//
// A call counts itself in the Comm, in the communicator's own memory, and
// the Comm copies an operation's counts into its slot of the rank's segment,
// where readers load them atomically, at every timed call of the operation
// (one in sampleEvery) and at every call of an operation whose calls come
// slower than eagerGap apart: the segment lags by less than sampleEvery
// calls that came faster than that. Flush copies them all. (A store into the
// segment at every call cost a 2-rank 8-byte AllReduce about 2.5%: another
// page touched per call.) A rank's first maxComms communicators get a slot
// each; the later ones share the rank's counters, which they update with
// atomic adds at every call.
type Comm struct {
	// own and the first operations' counts, what Start's fast path reads,
	// come first: one cache line.
	own *Rank                   // r when s is the communicator's own slot, else nil
	ops [opMask + 1]localCounts // NumOps used; a power of two, so that Start indexes it with a mask

	// Name is the communicator's, shown by readers; its owner sets it
	// before the first call.
	Name  string
	r     *Rank     // the segment that s is in; nil: none yet
	s     *commSlot // nil: no slot free: r.ops, shared
	mask  uint64    // a call is timed when the count before it &mask is 0: sampleEvery-1, or 0 with a trace
	start int64     // nanotime at the start of the timed call in progress
	slot  uint16    // s's index, maxComms for none
}

// opMask masks an Op into Comm.ops (an Op past NumOps is refused by count).
const opMask = 15

// localCounts are a Comm's counts of one operation, copied into its slot.
type localCounts struct {
	calls, bytes uint64
	next         uint64 // Start's fast path counts calls below this: the next timed call's count, 0 when eager
	last         int64  // nanotime of the last timed call
	eager        bool   // copy at every call: the calls come slower than eagerGap
}

// eagerGap: an operation whose last sampleEvery calls took longer than
// sampleEvery*eagerGap has its counts copied into the segment at every call
// (a copy costs a few nanoseconds, nothing beside calls that far apart).
const eagerGap = 20000 // ns

// Call is a collective call in progress, from Comm.Start to End. It is two
// words, returned in registers; a timed call's start is in its Comm (one
// call at a time). The zero Call (no segment, or a call not timed) needs no
// End.
type Call struct {
	m     *Comm // nil: not timed
	op    Op
	trace bool // m.r keeps a trace
}

// Start counts a call of op on the communicator, with bytes (its buffer's
// size on this rank); the caller ends it with End. It allocates nothing and
// makes no locked instruction (but on the shared counters of a rank's
// communicators past its first maxComms); one call in sampleEvery of each
// operation, and every call with a trace, also reads the clock.
//
// An untimed call on the communicator's own slot is a load, three compares
// and two adds here, in the communicator's memory (ops[op].next says where
// the next timed call is); everything else is in count. (The 2-rank 8-byte
// AllReduce pays under 1% for it, gearbench metrics.)
func (m *Comm) Start(op Op, bytes int) Call {
	r := current.Load()
	if r == nil {
		return Call{}
	}
	o := &m.ops[op&opMask]
	if r != m.own || o.calls >= o.next || op >= NumOps {
		return m.count(r, op, bytes)
	}
	o.calls++
	o.bytes += uint64(bytes)
	return Call{}
}

// count is Start with a published segment r, for every call but an untimed
// one on the communicator's own slot of r with no eager copy.
func (m *Comm) count(r *Rank, op Op, bytes int) Call {
	if m.r != r || m.s == nil || op >= NumOps {
		return m.countSlow(r, op, bytes)
	}
	o := &m.ops[op]
	n := o.calls
	o.calls, o.bytes = n+1, o.bytes+uint64(bytes)
	if n&m.mask == 0 {
		return m.timed(op)
	}
	if o.eager {
		m.copyOut(op)
	}
	o.setNext(m.mask)
	return Call{}
}

// setNext sets where Start's fast path stops counting: at the next timed
// call (a count that is 0 under mask), or at once when eager.
func (o *localCounts) setNext(mask uint64) {
	if o.eager {
		o.next = 0
	} else {
		o.next = (o.calls + mask) &^ mask
	}
}

// timed starts a timed call of op, copies op's counts into the segment, and
// decides from the time since op's last timed call whether to copy them at
// every call until the next.
func (m *Comm) timed(op Op) Call {
	now := nanotime()
	o := &m.ops[op]
	o.eager = o.last == 0 || now-o.last > int64(m.mask+1)*eagerGap
	o.last, m.start = now, now
	o.setNext(m.mask)
	m.copyOut(op)
	return Call{m: m, op: op, trace: m.r.tracing}
}

// copyOut copies op's counts into the communicator's slot.
func (m *Comm) copyOut(op Op) {
	o, so := &m.ops[op], &m.s.ops[op]
	so.calls, so.bytes = o.calls, o.bytes
}

// Flush copies every operation's counts into the segment. The communicator
// calls it when it closes.
func (m *Comm) Flush() {
	if m.s == nil || m.r != current.Load() {
		return
	}
	for op := range NumOps {
		m.copyOut(op)
	}
}

// countSlow is count for a communicator's first call on r, and for one
// without a slot of its own (the rank's shared counters).
func (m *Comm) countSlow(r *Rank, op Op, bytes int) Call {
	if op >= NumOps {
		return Call{}
	}
	if m.r != r {
		m.attach(r)
	}
	if m.s != nil {
		return m.count(r, op, bytes)
	}
	o := &r.ops[op].counters
	atomic.AddUint64(&o.bytes, uint64(bytes))
	if n := atomic.AddUint64(&o.calls, 1) - 1; n&m.mask == 0 {
		m.start = nanotime()
		return Call{m: m, op: op, trace: r.tracing}
	}
	return Call{}
}

// attach takes a free communicator slot of r for the communicator, or none
// (the shared counters) when they are all taken.
func (m *Comm) attach(r *Rank) {
	m.r, m.own, m.s, m.slot, m.mask = r, nil, nil, maxComms, sampleEvery-1
	for op := range m.ops { // the counts of this segment only
		m.ops[op].calls, m.ops[op].bytes, m.ops[op].next = 0, 0, 0
	}
	if r.tracing {
		m.mask = 0
	}
	for i := range r.comms {
		s := &r.comms[i]
		if s.state.Load() != 0 || !s.state.CompareAndSwap(0, 2) { // 2: being filled
			continue
		}
		s.nameLen = uint32(copy(s.name[:], m.Name))
		s.state.Store(1)
		m.s, m.slot, m.own = s, uint16(i), r
		return
	}
}

// End adds a timed call's time; with a trace it leaves the call's event,
// naming the call's sequence number seq (the tag for send and receive) and
// its bytes. An untimed call's End is one comparison.
func (c Call) End(seq uint64, bytes int) {
	if c.m != nil {
		c.end(seq, bytes)
	}
}

// end is End for a timed call.
func (c Call) end(seq uint64, bytes int) {
	m := c.m
	d := nanotime() - m.start
	if m.s == nil {
		o := &m.r.ops[c.op].counters
		atomic.AddUint64(&o.timedCalls, 1)
		atomic.AddUint64(&o.timedNs, uint64(d))
	} else {
		o := &m.s.ops[c.op]
		o.timedCalls++
		o.timedNs += uint64(d)
	}
	if c.trace {
		m.r.record(uint16(c.op), m.slot, m.start, d, uint64(bytes), seq)
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
