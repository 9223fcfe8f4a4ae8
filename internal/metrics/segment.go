package metrics

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/shmname"
)

// nanotime is the runtime's monotonic clock: one vDSO read, without the wall
// clock that time.Now reads beside it.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// The segment's layout, in order, each part at a fixed offset:
//
//	0      header (512 bytes)
//	512    NumOps shared collective counters, one cache line each
//	1280   maxTables table slots (256 bytes each)
//	5376   maxComms communicator slots (512 bytes each): a name and
//	       NumOps counters
//	21760  the trace ring: traceCap events of 48 bytes
const (
	segMagic   = "GEARMET2"
	maxTables  = 16
	maxComms   = 32
	nameBytes  = 48
	shardBytes = 112
	headerSize = 512
	opsOff     = headerSize
	tablesOff  = opsOff + int(NumOps)*64
	commsOff   = tablesOff + maxTables*256
	commSize   = 512
	eventsOff  = commsOff + maxComms*commSize
	eventSize  = 48
	// MaxTraceEvents bounds a rank's trace ring (about 48 MiB).
	MaxTraceEvents = 1 << 20
	// sampleEvery: one collective call in sampleEvery of each operation on
	// each communicator is timed when no trace is kept (a power of two).
	sampleEvery = 256
)

type header struct {
	magic     [8]byte
	version   uint32
	traceCap  uint32
	pid       int64
	rank      int64
	size      int64
	gen       int64
	unixStart int64 // wall clock at Open, unix ns
	monoStart int64 // nanotime at Open
	ended     atomic.Int64
	traceHead atomic.Uint64
	jobLen    uint32
	roleLen   uint32
	job       [64]byte
	role      [32]byte
}

// counters are one collective operation's: calls, bytes, and the calls
// timed and their time. A communicator's are written with plain loads and
// stores by its one writer (Comm); the shared ones with atomic adds. Readers
// load them atomically.
type counters struct {
	calls      uint64
	bytes      uint64
	timedCalls uint64
	timedNs    uint64
}

// opCounters are a rank's shared counters of one operation, a cache line
// each.
type opCounters struct {
	counters
	_ [4]uint64
}

// tableSlot: the counters are written with plain stores by the table's owner,
// under the table's lock, and read with atomic loads.
type tableSlot struct {
	state    atomic.Uint32 // 0 free, 1 open
	nameLen  uint32
	name     [nameBytes]byte
	shardLen uint32
	_        uint32
	shard    [shardBytes]byte
	maxSize  int64
	size     int64
	inserts  int64
	samples  int64
	insWait  int64 // ns inserts spent blocked by the rate limiter
	smpWait  int64 // ns samples spent blocked
	_        [4]int64
}

// commSlot is one communicator's: its name and counters.
type commSlot struct {
	state   atomic.Uint32 // 0 free, 1 taken
	nameLen uint32
	name    [nameBytes]byte
	ops     [NumOps]counters
	_       [commSize - 8 - nameBytes - int(NumOps)*32]byte
}

type event struct {
	stamp atomic.Uint64 // the event's index + 1, written last
	start int64         // nanotime
	dur   int64
	kind  uint16
	obj   uint16 // communicator slot or table slot
	_     uint32
	a, b  uint64
}

var (
	_ [headerSize - unsafe.Sizeof(header{})]byte
	_ [64 - unsafe.Sizeof(opCounters{})]byte
	_ [unsafe.Sizeof(opCounters{}) - 64]byte
	_ [256 - unsafe.Sizeof(tableSlot{})]byte
	_ [unsafe.Sizeof(tableSlot{}) - 256]byte
	_ [commSize - unsafe.Sizeof(commSlot{})]byte
	_ [unsafe.Sizeof(commSlot{}) - commSize]byte
	_ [eventSize - unsafe.Sizeof(event{})]byte
	_ [unsafe.Sizeof(event{}) - eventSize]byte
)

// segmentSize is the size of a segment with a trace ring of n events.
func segmentSize(n int) int {
	size := eventsOff + n*eventSize
	page := os.Getpagesize()
	return (size + page - 1) / page * page
}

// view is a mapped segment.
type view struct {
	mem    []byte
	h      *header
	ops    *[NumOps]opCounters
	tables *[maxTables]tableSlot
	comms  *[maxComms]commSlot
	events unsafe.Pointer
	cap    uint64
}

func newView(mem []byte) (*view, error) {
	if len(mem) < eventsOff {
		return nil, errors.New("segment too small")
	}
	base := unsafe.Pointer(&mem[0])
	v := &view{
		mem:    mem,
		h:      (*header)(base),
		ops:    (*[NumOps]opCounters)(unsafe.Add(base, opsOff)),
		tables: (*[maxTables]tableSlot)(unsafe.Add(base, tablesOff)),
		comms:  (*[maxComms]commSlot)(unsafe.Add(base, commsOff)),
		events: unsafe.Add(base, eventsOff),
	}
	if string(v.h.magic[:]) != segMagic {
		return nil, errors.New("not a metrics segment of this version")
	}
	v.cap = uint64(v.h.traceCap)
	if eventsOff+int(v.cap)*eventSize > len(mem) {
		return nil, fmt.Errorf("trace ring of %d events past the segment's end", v.cap)
	}
	return v, nil
}

func (v *view) event(i uint64) *event {
	return (*event)(unsafe.Add(v.events, uintptr(i%v.cap)*eventSize))
}

// Rank is a rank's own metrics segment, which its hooks write.
type Rank struct {
	view
	name    string
	tracing bool
	closed  atomic.Bool
}

// current is the segment the hooks write; nil: none.
var current atomic.Pointer[Rank]

// Publish makes r the segment that the hooks of this process write (nil: none).
func Publish(r *Rank) { current.Store(r) }

// Current returns the published segment, or nil.
func Current() *Rank { return current.Load() }

// Place is what Open records of the rank that makes a segment.
type Place struct {
	Job         string // the job's ID
	Rank, Size  int
	Generation  int // the world's restart count
	Role        string
	TraceEvents int    // the trace ring's length; 0: no trace
	Dir         string // "" means ShmDir
}

// ShmDir is where segments live.
const ShmDir = "/dev/shm"

// Open makes the metrics segment of the calling process for place p, in
// /dev/shm, named by shmname (kind Metrics), mode 0600. The caller Publishes
// it for the hooks, and Closes it when the rank ends (the launcher removes it
// with the job's other segments), or Removes it when no launcher will.
func Open(p Place) (*Rank, error) {
	if p.TraceEvents < 0 || p.TraceEvents > MaxTraceEvents {
		return nil, fmt.Errorf("metrics: trace of %d events: want 0 to %d", p.TraceEvents, MaxTraceEvents)
	}
	if p.Job == "" {
		return nil, errors.New("metrics: no job ID")
	}
	dir := p.Dir
	if dir == "" {
		dir = ShmDir
	}
	name := SegmentName(p.Job, p.Rank, p.Generation, os.Getpid())
	size := segmentSize(p.TraceEvents)
	path := dir + "/" + name
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("metrics: create %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Unlink(path)
		return nil, fmt.Errorf("metrics: size %s: %w", path, err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Unlink(path)
		return nil, fmt.Errorf("metrics: map %s: %w", path, err)
	}
	h := (*header)(unsafe.Pointer(&mem[0]))
	h.version = 2
	h.traceCap = uint32(p.TraceEvents)
	h.pid = int64(os.Getpid())
	h.rank, h.size, h.gen = int64(p.Rank), int64(p.Size), int64(p.Generation)
	h.jobLen = uint32(copy(h.job[:], p.Job))
	h.roleLen = uint32(copy(h.role[:], p.Role))
	h.monoStart = nanotime()
	h.unixStart = time.Now().UnixNano()
	copy(h.magic[:], segMagic) // last: readers refuse the segment until then
	v, err := newView(mem)
	if err != nil {
		_ = unix.Munmap(mem)
		_ = unix.Unlink(path)
		return nil, fmt.Errorf("metrics: %s: %w", path, err)
	}
	return &Rank{view: *v, name: path, tracing: p.TraceEvents > 0}, nil
}

// SegmentName is the name of the metrics segment of a job's rank in one
// generation, made by process pid.
func SegmentName(job string, rank, gen, pid int) string {
	return shmname.Make(job, shmname.Metrics, "r"+strconv.Itoa(rank)+".g"+strconv.Itoa(gen)+".p"+strconv.Itoa(pid))
}

// Path is the segment's file.
func (r *Rank) Path() string { return r.name }

// Tracing reports whether r keeps a trace.
func (r *Rank) Tracing() bool { return r != nil && r.tracing }

// Close stamps the segment's end and, if it is the published one, stops the
// hooks of later calls from finding it. It keeps the mapping until the
// process exits, so that tables and calls that outlive the world count
// harmlessly into it. Close is idempotent.
func (r *Rank) Close() error {
	if r == nil || !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	current.CompareAndSwap(r, nil)
	r.h.ended.Store(time.Now().UnixNano())
	return nil
}

// Remove closes the segment and unlinks it (a process alone, whose segment
// no launcher removes).
func (r *Rank) Remove() error {
	if r == nil {
		return nil
	}
	err := r.Close()
	if e := unix.Unlink(r.name); e != nil && !errors.Is(e, unix.ENOENT) {
		err = errors.Join(err, fmt.Errorf("metrics: remove %s: %w", r.name, e))
	}
	return err
}

// unix converts a nanotime of the segment's process to unix nanoseconds.
func (v *view) unix(mono int64) int64 { return v.h.unixStart + (mono - v.h.monoStart) }
