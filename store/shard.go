package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/clock"
	"github.com/gear-rl/gear/internal/prefetch"
)

// Errors returned by the shard's methods (wrapped, so test with errors.Is).
var (
	// ErrClosed: the shard was closed, by this process or by its owner.
	ErrClosed = errors.New("store: shard closed")
	// ErrStale: the Ref no longer names a committed row (released or evicted).
	ErrStale = errors.New("store: row no longer committed")
	// ErrNotPending: Commit or Abort of a row that is not this Pending's any more
	// (already committed or aborted, or reclaimed because its writer looked dead).
	ErrNotPending = errors.New("store: row is not being written by this pending insert")
	// ErrMissed: ReadCommits was asked for commits the commit log no longer holds.
	ErrMissed = errors.New("store: commits fell out of the commit log")
	// ErrLayout: Attach or Restore found another layout than the one asked for.
	ErrLayout = errors.New("store: layout differs")
	// ErrCorrupt: a checkpoint failed a check.
	ErrCorrupt = errors.New("store: checkpoint corrupt")
	// ErrName: a segment name that cannot name a shared-memory segment (empty,
	// with '/' or NUL, longer than 255 bytes).
	ErrName = errors.New("store: bad segment name")
)

// opError prefixes an operation to an error without repeating "store: ".
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "store: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "store: ")
}

func (e *opError) Unwrap() error { return e.err }

func wrapOp(op string, err error) error { return &opError{op: op, err: err} }

// Shard is one process's handle on a shard segment. Its methods are safe for
// concurrent use by several goroutines, except that Close must come after every
// other call has returned, and every Pending and View obtained from it must be
// finished before Close.
type Shard struct {
	name  string
	owner bool
	l     *layout

	reattached bool // the owner took the shard over (Open)
	mem        []byte
	state      *atomic.Uint32 // header state
	slots      unsafe.Pointer
	pins       pinJournal
	status     unsafe.Pointer
	removed    *atomic.Uint64
	claim      *atomic.Uint64 // FIFO eviction claim (see evictFIFO)
	free       freeQueue
	log        commitLog
	tables     [][]byte
	cap        uint32
	slot       int
	ident      uint64
	remover    Remover
	clock      clock.Clock // stamps commits and paces eviction scans
	committing func()      // test hook (export_test.go): runs inside Commit

	closed   atomic.Bool
	closeMu  sync.Mutex
	closeErr error

	ev   evictor
	dead deadSet

	// The rows reserved for this handle (reserved with its slot in the status
	// table), taken from the end; see Allocate.
	chunkMu   sync.Mutex
	chunk     []uint32
	chunkHead int // chunk[:chunkHead] are used
	chunkRows int
	popped    []uint32 // refill's indices from the free queue, before it reserves them
}

// Compile-time check that a status row is exactly one stride.
var _ [statusStride - unsafe.Sizeof(statusRow{})]byte
var _ [unsafe.Sizeof(statusRow{}) - statusStride]byte

// Option tunes Create, Attach, Restore and Checkpoint; each ignores the options
// that do not concern it.
type Option func(*options)

type options struct {
	spec      *Spec
	remover   Remover
	clock     clock.Clock
	progress  func(done, total int64)
	frameSize int
	level     int
	chunk     int
	label     uint64
	uncreated bool // Attach waits while the segment does not exist
}

// WithSpec makes Attach and Restore fail (with an error wrapping ErrLayout that
// names the column and both shapes or types) unless the shard has exactly this
// layout.
func WithSpec(spec Spec) Option { return func(o *options) { s := spec.normalized(); o.spec = &s } }

// WithRemover supplies the eviction policy. For a custom policy, Spec.Remover must
// be empty or equal r.Name(), and every process attaching must pass a Remover of
// the same name. Built-in policies need no option.
func WithRemover(r Remover) Option { return func(o *options) { o.remover = r } }

// WithWaitForCreation makes Attach also wait (until ctx is done) while no
// segment of the name exists yet: a writer started beside its owner may look
// for the shard before the owner has created it. Once ctx is done, the error
// wraps both ctx's error and fs.ErrNotExist.
func WithWaitForCreation() Option { return func(o *options) { o.uncreated = true } }

// WithClock sets the clock that stamps commits and paces the eviction scans of
// a waiting Allocate (default, or nil: the wall clock).
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

// WithProgress makes Checkpoint and Restore report progress: bytes of shard data
// done so far and in all. It is called from the calling goroutine.
func WithProgress(f func(done, total int64)) Option { return func(o *options) { o.progress = f } }

// WithFrameSize sets the uncompressed size of a checkpoint frame (default 4 MiB;
// rounded to whole blocks).
func WithFrameSize(n int) Option { return func(o *options) { o.frameSize = n } }

// WithCompressionLevel sets the checkpoint's zstd level: 1 fastest (the default)
// to 4 best.
func WithCompressionLevel(level int) Option { return func(o *options) { o.level = level } }

// WithChunk sets how many rows Create's or Attach's handle reserves at a time
// for its inserts (1 to maxChunk): one pass over the shared free queue or the
// eviction order reserves a chunk, and the handle's Allocate calls take the
// chunk's rows without touching memory other writers use. The default is
// Capacity/512, from 1 to 32. 1 reserves one row at a time.
func WithChunk(rows int) Option { return func(o *options) { o.chunk = rows } }

// maxChunk is the largest chunk a handle reserves.
const maxChunk = 256

// defaultChunk is the chunk size for a shard of capacity rows: small enough
// that the chunks of many writers leave most of the shard to the others.
func defaultChunk(capacity int) int { return min(max(capacity/512, 1), 32) }

func collect(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Create makes the shared-memory segment name (mode 0600) with the layout spec and
// returns the owner's handle. name is the whole segment name, such as
// rank.SegmentName(jobID, "store.0"); Create fails if it exists. The owner's Close
// removes the segment.
func Create(name string, spec Spec, opts ...Option) (*Shard, error) {
	o := collect(opts)
	if err := checkName(name); err != nil {
		return nil, err
	}
	rem, err := pickRemover(spec.Remover, o.remover)
	if err != nil {
		return nil, err
	}
	spec.Remover = removerName(rem)
	l, err := computeLayout(spec, max(os.Getpagesize(), minPageSize))
	if err != nil {
		return nil, err
	}
	return create(name, l, o, rem, func(s *Shard) error {
		s.free.reset()
		for i := range s.cap {
			s.free.push(i)
		}
		return nil
	})
}

// create makes and sets up the segment for l; fill initializes the tables before
// the shard is marked ready.
func create(name string, l *layout, o options, rem Remover, fill func(*Shard) error) (*Shard, error) {
	ident, err := selfIdent()
	if err != nil {
		return nil, err
	}
	mem, err := createSegment(name, l.total)
	if err != nil {
		return nil, wrapOp(fmt.Sprintf("create %q", name), err)
	}
	encodeHeader(mem, l, ident)
	s := newShard(name, l, mem, o, rem)
	s.owner = true
	fail := func(err error) (*Shard, error) {
		_ = unix.Munmap(mem)
		_ = unix.Unlink(segmentPath(name))
		return nil, err
	}
	if err := fill(s); err != nil {
		return fail(err)
	}
	if err := s.register(ident); err != nil {
		return fail(err)
	}
	s.state.Store(stateReady)
	return s, nil
}

func newShard(name string, l *layout, mem []byte, o options, rem Remover) *Shard {
	base := unsafe.Pointer(&mem[0])
	s := &Shard{
		name:    name,
		l:       l,
		mem:     mem,
		state:   (*atomic.Uint32)(unsafe.Add(base, offState)),
		slots:   unsafe.Add(base, l.slotsOff),
		pins:    pinJournal{base: unsafe.Add(base, l.pinsOff)},
		status:  unsafe.Add(base, l.statusOff),
		removed: (*atomic.Uint64)(unsafe.Add(base, offRemovals)),
		claim:   (*atomic.Uint64)(unsafe.Add(base, offFIFOClaim)),
		cap:     uint32(l.spec.Capacity),
		remover: rem,
	}
	s.chunkRows = defaultChunk(l.spec.Capacity)
	if o.chunk > 0 {
		s.chunkRows = min(o.chunk, maxChunk, l.spec.Capacity)
	}
	s.chunk = make([]uint32, 0, s.chunkRows)
	s.popped = make([]uint32, 0, s.chunkRows)
	s.free = newFreeQueue((*atomic.Uint64)(unsafe.Add(base, offFreeHead)), (*atomic.Uint64)(unsafe.Add(base, offFreeTail)),
		unsafe.Add(base, l.freeOff), l.freeCells)
	s.free.bell = newBell(base, offFreeBell)
	s.log = newCommitLog((*atomic.Uint64)(unsafe.Add(base, offLogTail)), unsafe.Add(base, l.logOff), l.logCells)
	for _, c := range l.cols {
		s.tables = append(s.tables, mem[c.tableOff:c.tableOff+c.tableLen:c.tableOff+c.tableLen])
	}
	s.clock = o.clock
	s.ev.init(s.l.spec.Capacity)
	return s
}

// Attach maps an existing shard by name for reading and writing. It waits (until
// ctx is done) while the owner is still setting the shard up, and fails at once if
// there is no such segment (the error wraps fs.ErrNotExist) unless
// WithWaitForCreation. With WithSpec it checks the layout.
func Attach(ctx context.Context, name string, opts ...Option) (*Shard, error) {
	o := collect(opts)
	if err := checkName(name); err != nil {
		return nil, err
	}
	ident, err := selfIdent()
	if err != nil {
		return nil, err
	}
	wait := 100 * time.Microsecond
	for {
		s, err := tryAttach(name, o, ident)
		if err == nil {
			return s, nil
		}
		missing := o.uncreated && errors.Is(err, fs.ErrNotExist)
		if !errors.Is(err, errNotReady) && !missing {
			return nil, wrapOp(fmt.Sprintf("attach %q", name), err)
		}
		if err := sleepCtx(ctx, wait); err != nil {
			if missing {
				return nil, wrapOp(fmt.Sprintf("attach %q: waited for its owner to create it", name), fmt.Errorf("%w (%w)", err, fs.ErrNotExist))
			}
			return nil, wrapOp(fmt.Sprintf("attach %q: still being set up", name), err)
		}
		wait = min(2*wait, 10*time.Millisecond)
	}
}

func tryAttach(name string, o options, ident uint64) (*Shard, error) {
	mem, err := openSegment(name)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Shard, error) {
		_ = unix.Munmap(mem)
		return nil, err
	}
	st := (*atomic.Uint32)(unsafe.Pointer(&mem[offState])).Load()
	switch st {
	case stateReady:
	case stateClosed:
		return fail(ErrClosed)
	default:
		owner := (*atomic.Uint64)(unsafe.Pointer(&mem[offOwner])).Load()
		if owner != 0 && !identAlive(owner) {
			return fail(fmt.Errorf("its creator (pid %d) died while setting it up", owner>>32))
		}
		return fail(errNotReady)
	}
	l, err := parseHeader(mem, int64(len(mem)))
	if err != nil {
		return fail(err)
	}
	if o.spec != nil {
		if err := diffSpec(l.spec, *o.spec); err != nil {
			return fail(fmt.Errorf("%w: %w", ErrLayout, err))
		}
	}
	rem, err := pickRemover(l.spec.Remover, o.remover)
	if err != nil {
		return fail(err)
	}
	// Fault the page tables in now, so that inserts do not take page faults.
	_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	s := newShard(name, l, mem, o, rem)
	if err := s.register(ident); err != nil {
		return fail(err)
	}
	return s, nil
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (s *Shard) slotWord(i int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Add(s.slots, i*8))
}

func (s *Shard) row(i uint32) *statusRow {
	return (*statusRow)(unsafe.Add(s.status, uintptr(i)*statusStride))
}

// register takes a writer slot for this process.
func (s *Shard) register(ident uint64) error {
	s.ident = ident
	for pass := 0; pass < 2; pass++ {
		for i := 1; i < maxSlots; i++ {
			if s.slotWord(i).CompareAndSwap(0, ident) {
				s.slot = i
				s.pins.start(ident)
				return nil
			}
		}
		// Every slot is taken: free those of dead processes and try once more.
		s.reclaim()
	}
	return fmt.Errorf("store: shard %q: all %d writer slots are taken by live processes", s.name, maxSlots-1)
}

// Name returns the segment name.
func (s *Shard) Name() string { return s.name }

// Owner reports whether this handle created the shard (and removes it on Close).
func (s *Shard) Owner() bool { return s.owner }

// Spec returns the shard's layout (normalized: defaults filled in).
func (s *Shard) Spec() Spec { return s.l.spec.normalized() }

// Capacity returns the number of rows.
func (s *Shard) Capacity() int { return int(s.cap) }

// Remover returns the shard's eviction policy (nil for RemoverNone).
func (s *Shard) Remover() Remover { return s.remover }

// Column returns the index of the column called name.
func (s *Shard) Column(name string) (int, error) {
	for i, c := range s.l.spec.Columns {
		if c.Name == name {
			return i, nil
		}
	}
	return -1, fmt.Errorf("store: shard %q has no column %q", s.name, name)
}

// ColumnSpec returns column col's description.
func (s *Shard) ColumnSpec(col int) Column {
	c := s.l.spec.Columns[col]
	c.Shape = append([]int(nil), c.Shape...)
	return c
}

// Close releases this handle: it aborts this process's uncommitted rows, gives back
// its writer slot and unmaps the segment; the owner's Close also marks the shard
// closed and removes the segment. Close is idempotent; every Pending and View must
// be finished before it.
func (s *Shard) Close() error { return s.close(true) }

// Detach releases this handle as Close does, but an owner leaves the shard
// ready and its segment in place, as if its process had died: it clears the
// shard's owner, and the next Open, from any process (this one too, while it
// lives), takes the shard over with every committed row. A
// rank stopped for a restart detaches its shard, so that the next
// generation re-attaches it rather than restoring an older checkpoint.
// Whoever ends the job removes the segment (the launcher, gearrun's sweep
// under SLURM).
func (s *Shard) Detach() error { return s.close(false) }

func (s *Shard) close(remove bool) error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed.Load() {
		return s.closeErr
	}
	s.closed.Store(true)
	if s.owner && remove {
		s.state.Store(stateClosed)
	}
	for i := range s.cap {
		r := s.row(i)
		x := r.state.Load()
		if p := phaseOf(x); (p == phaseWriting || p == phaseCommitting || isReserved(x)) && slotOf(x) == s.slot {
			if r.state.CompareAndSwap(x, freeWord(genOf(x))) {
				s.free.push(i)
			}
		}
	}
	s.slotWord(s.slot).CompareAndSwap(s.ident, 0)
	if s.owner && !remove {
		// Detach: the shard is nobody's now, as if this process had died,
		// so that Open takes it over while this process still lives (this
		// process's own Open too).
		(*atomic.Uint64)(unsafe.Pointer(&s.mem[offOwner])).CompareAndSwap(s.ident, 0)
	}
	var errs []error
	if s.owner && remove {
		if err := unix.Unlink(segmentPath(s.name)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, &fs.PathError{Op: "remove", Path: segmentPath(s.name), Err: err})
		}
	}
	if err := unix.Munmap(s.mem); err != nil {
		errs = append(errs, fmt.Errorf("store: unmap %q: %w", s.name, err))
	}
	s.mem, s.tables = nil, nil
	s.closeErr = errors.Join(errs...)
	return s.closeErr
}

// Mapping returns the whole segment as mapped in this process (page-aligned), for
// registering it with a device in one call.
func (s *Shard) Mapping() []byte { return s.mem }

// ColumnTable returns column col's table: Capacity blocks of BlockStride(col)
// bytes, page-aligned at both ends, for registering with cuMemHostRegister.
func (s *Shard) ColumnTable(col int) []byte { return s.tables[col] }

// BlockOffset returns the offset of row index's block within ColumnTable(col).
func (s *Shard) BlockOffset(col, index int) int { return index * s.l.cols[col].stride }

// BlockStride returns the distance between consecutive blocks of column col (the
// block size rounded up to the block alignment).
func (s *Shard) BlockStride(col int) int { return s.l.cols[col].stride }

// BlockBytes returns the size of one block of column col.
func (s *Shard) BlockBytes(col int) int { return s.l.cols[col].blockBytes }

// Touch reads the status of each row in indices and, for each column in
// cols, one byte of each cache line of the rows' blocks, a column at a time,
// so that a reader about to pin and copy many rows can first bring them all
// into the cache together: the loads of different rows overlap, where a
// pin's locked instruction would wait for each row's misses in turn. It
// returns what it read, for the caller to keep (a load whose value is unused
// may be left out by the compiler). It changes nothing and pins nothing; an
// index out of range is skipped.
func (s *Shard) Touch(indices []int, cols []int) uint64 {
	if s.closed.Load() {
		return 0
	}
	var x uint64
	for _, i := range indices {
		if i >= 0 && i < int(s.cap) {
			x += s.row(uint32(i)).state.Load()
		}
	}
	for _, col := range cols {
		for _, i := range indices {
			if i < 0 || i >= int(s.cap) {
				continue
			}
			b := s.block(col, uint32(i))
			for off := 0; off < len(b); off += 64 {
				x += uint64(b[off])
			}
		}
	}
	return x
}

// PrefetchStatus asks, without waiting, for the status lines of the rows in
// indices, for writing: a table about to release those rows calls it ahead,
// so that each release's compare-and-swap finds its line in the cache, and
// nothing waits for the lines meanwhile (as Touch's loads do). An index out
// of range is skipped.
func (s *Shard) PrefetchStatus(indices []int) {
	if s.closed.Load() {
		return
	}
	for _, i := range indices {
		if i >= 0 && i < int(s.cap) {
			prefetch.Write(unsafe.Pointer(s.row(uint32(i))))
		}
	}
}

func (s *Shard) block(col int, i uint32) []byte {
	c := &s.l.cols[col]
	off := int(i) * c.stride
	return s.tables[col][off : off+c.blockBytes : off+c.blockBytes]
}

// Removals returns how many rows were released or evicted since the shard was
// created (or restored): one atomic load, for readers that keep their own index of
// the rows and want to know cheaply whether some of their Refs went stale.
func (s *Shard) Removals() uint64 {
	if s.closed.Load() {
		return 0
	}
	return s.removed.Load()
}

// Stats counts the rows in each state (by a scan of the status table).
type Stats struct {
	Free      int    // free rows (Reserved included)
	Reserved  int    // free rows in writers' chunks
	Writing   int    // allocated, not yet committed
	Committed int    // selectable
	Pinned    int    // committed rows with at least one View
	Doomed    int    // released while pinned, freed when unpinned
	Commits   uint64 // commits since creation (the next insertion sequence)
	Removals  uint64 // rows released or evicted since creation
}

// Stats scans the status table.
func (s *Shard) Stats() Stats {
	var st Stats
	for i := range s.cap {
		x := s.row(i).state.Load()
		switch phaseOf(x) {
		case phaseFree:
			st.Free++
			if isReserved(x) {
				st.Reserved++
			}
		case phaseWriting, phaseCommitting:
			st.Writing++
		case phaseCommitted:
			if x&doomedBit != 0 {
				st.Doomed++
			} else {
				st.Committed++
			}
			if pinsOf(x) > 0 {
				st.Pinned++
			}
		}
	}
	st.Commits = s.log.end()
	st.Removals = s.removed.Load()
	return st
}
