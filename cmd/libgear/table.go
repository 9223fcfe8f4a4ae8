package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/gear-rl/gear/internal/errmark"
	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/store"
)

// shardHandle is an open shard: a table's owner (st set) or a writer.
type shardHandle struct {
	// mu is held shared by every call that touches the mapping and
	// exclusively by close, which unmaps it.
	mu     sync.RWMutex
	closed bool
	shard  *store.Shard
	st     *sample.ShardTable // nil for a writer
	names  []string
	bytes  []int // block bytes per column

	pendMu sync.Mutex
	pend   map[int]store.Pending

	// stage is the staging row (gear_shard_stage): C memory, so that the
	// caller may keep its address, freed by close; stageOff[c] is column c's
	// offset in it.
	stage    unsafe.Pointer
	stageOff []int
	stageLen int

	// sampleMu serializes the calls that use batch and dst.
	sampleMu sync.Mutex
	batch    sample.Batch
	dst      [][]byte

	// planMu guards the collection plan of the columns last collected.
	planMu   sync.Mutex
	planned  *sample.CollectPlan
	planCols []int32
}

func newShardHandle(s *store.Shard, st *sample.ShardTable) *shardHandle {
	h := &shardHandle{shard: s, st: st, pend: map[int]store.Pending{}}
	for c, col := range s.Spec().Columns {
		h.names = append(h.names, col.Name)
		h.bytes = append(h.bytes, s.BlockBytes(c))
		h.stageOff = append(h.stageOff, h.stageLen)
		h.stageLen += (s.BlockBytes(c) + 7) &^ 7 // each column 8-byte aligned
	}
	// The priority of gear_shard_put_staged follows the columns.
	h.stage = C.calloc(C.size_t(h.stageLen+8), 1)
	return h
}

func (h *shardHandle) close() error {
	var err error
	if h.st != nil {
		err = h.st.Close() // wakes the waiting samples first
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return err
	}
	h.closed = true
	C.free(h.stage)
	h.stage = nil
	return errors.Join(err, h.shard.Close())
}

// expiredCtx is a context that has already ended: Allocate under it takes a
// free row if there is one and returns at once otherwise, with no timer or
// allocation spent on a context.
type expiredCtx struct{}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (expiredCtx) Deadline() (time.Time, bool) { return time.Unix(0, 0), true }
func (expiredCtx) Done() <-chan struct{}       { return closedChan }
func (expiredCtx) Err() error                  { return context.DeadlineExceeded }
func (expiredCtx) Value(any) any               { return nil }

// allocate takes a free row: at once if one is free (no context made), else
// waiting up to ms milliseconds (forever for ms < 0).
func (h *shardHandle) allocate(ms C.int64_t) (store.Pending, error) {
	p, err := h.shard.Allocate(expiredCtx{})
	if err == nil || ms == 0 || !errors.Is(err, context.DeadlineExceeded) {
		return p, err
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	return h.shard.Allocate(ctx)
}

// use returns the open handle h with its lock held shared; the caller lets go
// of it with s.mu.RUnlock (a method value returned instead would cost an
// allocation per call).
func use(h C.uint64_t) (*shardHandle, error) {
	s, err := lookup[*shardHandle](h)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, errHandle
	}
	return s, nil
}

func (h *shardHandle) table() (*sample.ShardTable, error) {
	if h.st == nil {
		return nil, invalidf("shard %q: a writer's handle has no table (only the owner samples)", h.shard.Name())
	}
	return h.st, nil
}

// The default extra rows (extra -1): the table's capacity or as many rows
// as extraBytes hold, whichever is fewer, and from minExtraRows to
// maxExtraRows. A full table's writers take its extra rows while the owner's
// next look at the commit log, which frees their rows' victims, is due;
// the owner looks at most every few milliseconds while commits come, and
// fewer looks leave more of a busy machine's cores to the writers (two
// Python row writers of 400 B rows: about 1.75x one with 16384 extra rows,
// 1.65x with 4096 and 1.5x with 1024; docs/benchmarks.md, "Fewer looks
// while commits come").
const (
	extraBytes   = 8 << 20
	minExtraRows = 1024
	maxExtraRows = 16384
)

// defaultExtraRows is the default extra rows of a table of capacity rows
// whose shard spec is ss (before the extra rows).
func defaultExtraRows(ss store.Spec, capacity int) int {
	row := 0
	for _, c := range ss.Columns {
		row += c.BlockBytes()
	}
	return min(max(min(capacity, extraBytes/max(row, 1)), minExtraRows), maxExtraRows)
}

// buildTable decodes a job spec's [table] (a whole job spec, or a document
// with only its [table]) with package jobs and builds it for one shard, with
// extra rows beyond the table's capacity for writers in flight (the default,
// defaultExtraRows, for -1). It returns the extra rows it added.
func buildTable(spec string, extra int) (store.Spec, sample.Config, int, error) {
	s, err := jobs.DecodeDefaults([]byte(spec), "")
	if err != nil {
		return store.Spec{}, sample.Config{}, 0, errmark.Mark(err, errInvalid) // the caller's spec
	}
	if s.Table == nil {
		return store.Spec{}, sample.Config{}, 0, invalidf("the spec has no [table]")
	}
	ss, rt, err := s.Table.Build(1)
	if err != nil {
		return store.Spec{}, sample.Config{}, 0, err
	}
	switch {
	case extra == -1:
		extra = defaultExtraRows(ss, rt.MaxSize)
	case extra < 0:
		return store.Spec{}, sample.Config{}, 0, invalidf("extra rows %d: want >= 0 (or -1: the default)", extra)
	}
	ss.Capacity += extra
	cfg, err := sample.NewConfig(rt)
	return ss, cfg, extra, err
}

// gear_table_create creates the shard segment (a whole shared-memory segment
// name, such as gear_segment_name gives) with the table spec describes (a job
// spec's TOML, or its [table] alone) and the table over it, whose random
// choices seed fixes; extra is the number of rows beyond the table's capacity
// for writers in flight (-1: the default, see defaultExtraRows). It stores
// the table's handle in out.
//
//export gear_table_create
func gear_table_create(spec *C.char, specLen C.int64_t, seg *C.char, segLen C.int64_t, seed C.uint64_t, extra C.int64_t, out *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	if out == nil {
		return nullArg("gear_table_create: out")
	}
	ss, cfg, _, err := buildTable(gostring(spec, specLen), int(extra))
	if err != nil {
		return fail(err)
	}
	name := gostring(seg, segLen)
	s, err := store.Create(name, ss)
	if err != nil {
		return fail(err)
	}
	cfg.Seed = uint64(seed)
	t, err := sample.NewShardTable(s, cfg)
	if err != nil {
		s.Close()
		return fail(err)
	}
	*out = register(newShardHandle(s, t))
	return statusOK
}

// gear_table_restore starts making the shard seg from the checkpoint at path
// and the table over it (spec, seed and extra as for gear_table_create); the
// operation's result is the table's handle.
//
//export gear_table_restore
func gear_table_restore(spec *C.char, specLen C.int64_t, path *C.char, pathLen C.int64_t, seg *C.char, segLen C.int64_t, seed C.uint64_t, extra C.int64_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	ss, cfg, rows, err := buildTable(gostring(spec, specLen), int(extra))
	if err != nil {
		return fail(err)
	}
	p, name := gostring(path, pathLen), gostring(seg, segLen)
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		s, err := store.Restore(ctx, p, name, store.WithSpec(ss))
		if errors.Is(err, store.ErrLayout) {
			return 0, fmt.Errorf("%w (this spec's table of capacity %d with extra_rows %d has a shard of %d rows: restore with the capacity and extra_rows of the table checkpointed)",
				err, cfg.MaxSize, rows, ss.Capacity)
		}
		if err != nil {
			return 0, err
		}
		cfg.Seed = uint64(seed)
		t, err := sample.NewShardTable(s, cfg)
		if err != nil {
			s.Close()
			return 0, err
		}
		return register(newShardHandle(s, t)), nil
	})
}

// gear_table_checkpoint starts writing the table's shard to path.
//
//export gear_table_checkpoint
func gear_table_checkpoint(h C.uint64_t, path *C.char, pathLen C.int64_t, opOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := lookup[*shardHandle](h)
	if err != nil {
		return fail(err)
	}
	p := gostring(path, pathLen)
	return start(opOut, func(ctx context.Context) (C.uint64_t, error) {
		s.mu.RLock()
		defer s.mu.RUnlock()
		if s.closed {
			return 0, errHandle
		}
		if s.st != nil {
			return 0, s.st.Checkpoint(ctx, p)
		}
		return 0, s.shard.Checkpoint(ctx, p)
	})
}

// gear_shard_attach maps the shard seg as a writer, waiting up to ms
// milliseconds for its owner to create it and set it up (GEAR_TIMEOUT then,
// with the reason in the error text), and stores the writer's handle.
//
//export gear_shard_attach
func gear_shard_attach(seg *C.char, segLen C.int64_t, ms C.int64_t, out *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	if out == nil {
		return nullArg("gear_shard_attach: out")
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	// An actor started beside its learner may look for the table before the
	// learner has made it.
	s, err := store.Attach(ctx, gostring(seg, segLen), store.WithWaitForCreation())
	if err != nil {
		return fail(err)
	}
	*out = register(newShardHandle(s, nil))
	return statusOK
}

type layoutColumn struct {
	Name       string `json:"name"`
	DType      string `json:"dtype"`
	Shape      []int  `json:"shape"`
	Length     int    `json:"length"`
	Offset     int    `json:"offset"`
	Stride     int    `json:"stride"`
	BlockBytes int    `json:"block_bytes"`
	Stage      int    `json:"stage_offset"`
}

// gear_shard_unlink removes the segment name of h's shard if h is its
// owner's handle (a writer's: nothing), leaving the handle and its mapping
// as they are: for a process that exits while views of the rows may still
// be read, so that the segment does not outlive it.
//
//export gear_shard_unlink
func gear_shard_unlink(h C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	if !s.shard.Owner() {
		return statusOK
	}
	if err := store.Remove(s.shard.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(err)
	}
	return statusOK
}

// gear_shard_layout writes the shard's layout as JSON into buf: segment,
// capacity, owner, mapping_addr and mapping_len (the segment's mapping in this
// process), and per column its name, dtype (store's name), shape, length
// (frames per row), offset (of its column table in the mapping), stride
// (bytes from one row's block to the next), block_bytes and stage_offset (in
// the staging row of gear_shard_stage, whose size is stage_bytes), and
// stage_priority, the offset of the float64 priority that
// gear_shard_put_staged reads (just past the columns).
//
//export gear_shard_layout
func gear_shard_layout(h C.uint64_t, buf *C.char, capacity C.int64_t, n *C.int64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	m := s.shard.Mapping()
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	var cols []layoutColumn
	for c, col := range s.shard.Spec().Columns {
		t := s.shard.ColumnTable(c)
		cols = append(cols, layoutColumn{
			Name: col.Name, DType: col.DType.String(), Shape: append([]int{}, col.Shape...), Length: col.Length,
			Offset: int(uintptr(unsafe.Pointer(unsafe.SliceData(t)))-base) + s.shard.BlockOffset(c, 0),
			Stride: s.shard.BlockStride(c), BlockBytes: s.shard.BlockBytes(c), Stage: s.stageOff[c],
		})
	}
	b, err := json.Marshal(map[string]any{
		"segment": s.shard.Name(), "capacity": s.shard.Capacity(), "owner": s.st != nil,
		"mapping_addr": uint64(base), "mapping_len": len(m), "columns": cols, "stage_bytes": s.stageLen,
		"stage_priority": s.stageLen,
	})
	if err != nil {
		return fail(err)
	}
	copyOut(string(b), buf, capacity, n)
	return statusOK
}

// gear_shard_allocate takes a free row for writing in place, waiting up to ms
// milliseconds while the shard is full (GEAR_TIMEOUT then, with nothing
// taken), and stores its index in row. The row's blocks lie at the offsets
// gear_shard_layout gives; the caller fills them, then commits or aborts.
//
//export gear_shard_allocate
func gear_shard_allocate(h C.uint64_t, ms C.int64_t, row *C.int64_t) (st C.int32_t) {
	defer guard(&st)
	if row == nil {
		return nullArg("gear_shard_allocate: row")
	}
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	p, err := s.allocate(ms)
	if err != nil {
		return fail(err)
	}
	s.pendMu.Lock()
	s.pend[p.Index()] = p
	s.pendMu.Unlock()
	*row = C.int64_t(p.Index())
	return statusOK
}

func (s *shardHandle) takePending(row C.int64_t) (store.Pending, error) {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	p, ok := s.pend[int(row)]
	if !ok {
		return p, invalidf("shard %q: row %d is not being written through this handle", s.shard.Name(), int64(row))
	}
	delete(s.pend, int(row))
	return p, nil
}

// gear_shard_commit makes the allocated row selectable with priority, and with
// key when hasKey is not 0 (else its insertion sequence is its key); it stores
// the row's insertion sequence in seq (may be NULL).
//
//export gear_shard_commit
func gear_shard_commit(h C.uint64_t, row C.int64_t, hasKey C.int32_t, key C.uint64_t, priority C.double, seq *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	if err := s.checkPriority(uint64(key), float64(priority)); err != nil {
		return fail(err) // the row stays allocated, to commit with another priority or abort
	}
	p, err := s.takePending(row)
	if err != nil {
		return fail(err)
	}
	ref, err := commitRow(p, hasKey != 0, uint64(key), float64(priority))
	if err != nil {
		return fail(err)
	}
	if seq != nil {
		*seq = C.uint64_t(ref.Seq)
	}
	return statusOK
}

// gear_shard_abort gives an allocated row back without committing it.
//
//export gear_shard_abort
func gear_shard_abort(h C.uint64_t, row C.int64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	p, err := s.takePending(row)
	if err != nil {
		return fail(err)
	}
	return fail(p.Abort())
}

// gear_shard_insert inserts n rows: row i's column c is block_bytes(c) bytes
// at src[c] + i*block_bytes(c) (src has one pointer per column, in the
// layout's order), its priority priorities[i] and its key keys[i] (keys may be
// NULL: insertion sequences). It waits up to ms milliseconds for each free
// row; done counts the rows committed, also when it fails partway (the rows
// from done on were not).
//
//export gear_shard_insert
func gear_shard_insert(h C.uint64_t, n C.int64_t, keys *C.uint64_t, priorities *C.double, ncols C.int32_t, src *unsafe.Pointer, ms C.int64_t, done *C.int64_t) (st C.int32_t) {
	defer guard(&st)
	if done == nil {
		return nullArg("gear_shard_insert: done")
	}
	*done = 0
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	if int(ncols) != len(s.names) || src == nil || priorities == nil || n < 0 {
		return fail(invalidf("shard %q: insert of %d rows with %d column buffers: want %d, and priorities", s.shard.Name(), int64(n), int32(ncols), len(s.names)))
	}
	cols := unsafe.Slice(src, int(ncols))
	for c, p := range cols {
		if p == nil && n > 0 {
			return fail(invalidf("shard %q: insert of %d rows: column %q's buffer is NULL", s.shard.Name(), int64(n), s.names[c]))
		}
	}
	prio := unsafe.Slice((*float64)(unsafe.Pointer(priorities)), int(n))
	var ks []uint64
	if keys != nil {
		ks = unsafe.Slice((*uint64)(unsafe.Pointer(keys)), int(n))
	}
	key := func(i int) uint64 { // row i's key; 0 without keys
		if ks == nil {
			return 0
		}
		return ks[i]
	}
	for i := range prio {
		if err := s.checkPriority(key(i), prio[i]); err != nil {
			return fail(fmt.Errorf("row %d of %d: %w", i, int64(n), err))
		}
	}
	for i := 0; i < int(n); i++ {
		p, err := s.allocate(ms)
		if err != nil {
			return fail(err)
		}
		for c, bb := range s.bytes {
			copy(p.Block(c), unsafe.Slice((*byte)(unsafe.Add(cols[c], i*bb)), bb))
		}
		if _, err := commitRow(p, ks != nil, key(i), prio[i]); err != nil {
			return fail(err)
		}
		*done = C.int64_t(i + 1)
	}
	return statusOK
}

// gear_shard_stage stores in addr the address of the handle's staging row:
// memory of libgear's, valid until gear_close(h), with room for one row
// (column c's block_bytes at its stage_offset in gear_shard_layout), that
// gear_shard_put inserts. The caller writes it and calls gear_shard_put from
// one thread at a time.
//
//export gear_shard_stage
func gear_shard_stage(h C.uint64_t, addr *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	if addr == nil {
		return nullArg("gear_shard_stage: addr")
	}
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	*addr = C.uint64_t(uintptr(s.stage))
	return statusOK
}

// gear_shard_put inserts the staging row (gear_shard_stage) as one row with
// priority, and with key when hasKey is not 0 (else its insertion sequence is
// its key): one call per row, for callers that insert rows one at a time. It
// waits up to ms milliseconds for a free row (0: none; GEAR_TIMEOUT then, with
// nothing inserted) and stores the row's insertion sequence in seq (may be
// NULL).
//
//export gear_shard_put
func gear_shard_put(h C.uint64_t, ms C.int64_t, hasKey C.int32_t, key C.uint64_t, priority C.double, seq *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	ref, err := shardPut(uint64(h), int64(ms), hasKey != 0, uint64(key), float64(priority))
	if err != nil {
		return fail(err)
	}
	if seq != nil {
		*seq = C.uint64_t(ref.Seq)
	}
	return statusOK
}

// gear_shard_put_staged is gear_shard_put of the staging row with no key
// (its insertion sequence is its key), no wait for a free row (GEAR_TIMEOUT
// when there is none, with nothing inserted) and the priority that the
// caller wrote at stage_priority (gear_shard_layout) in the staging row: one
// argument, the cheapest call for a caller that inserts rows one at a time
// and rarely changes their priority.
//
//export gear_shard_put_staged
func gear_shard_put_staged(h C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	if _, err := s.put(0, false, 0, *(*float64)(unsafe.Add(s.stage, s.stageLen))); err != nil {
		return fail(err)
	}
	return statusOK
}

// shardPut is gear_shard_put in Go's types.
func shardPut(h uint64, ms int64, hasKey bool, key uint64, priority float64) (store.Ref, error) {
	s, err := use(C.uint64_t(h))
	if err != nil {
		return store.Ref{}, err
	}
	defer s.mu.RUnlock()
	return s.put(ms, hasKey, key, priority)
}

// put inserts the staging row (the caller holds s.mu for reading).
func (s *shardHandle) put(ms int64, hasKey bool, key uint64, priority float64) (store.Ref, error) {
	if err := s.checkPriority(key, priority); err != nil {
		return store.Ref{}, err
	}
	p, err := s.allocate(C.int64_t(ms))
	if err != nil {
		return store.Ref{}, err
	}
	for c, bb := range s.bytes {
		copy(p.Block(c), unsafe.Slice((*byte)(unsafe.Add(s.stage, s.stageOff[c])), bb))
	}
	return commitRow(p, hasKey, key, priority)
}

// commitRow commits the written row p with priority, and with key when
// hasKey (else its insertion sequence is its key). A commit that fails gives
// the row back to the free rows, not lost to the shard.
func commitRow(p store.Pending, hasKey bool, key uint64, priority float64) (store.Ref, error) {
	var ref store.Ref
	var err error
	if hasKey {
		ref, err = p.CommitKey(key, priority)
	} else {
		ref, err = p.Commit(priority)
	}
	if err != nil {
		_ = p.Abort()
	}
	return ref, err
}

// checkPriority refuses, before a row is taken for it, a priority that the
// commit or the table would refuse: NaN on every handle, and on the owner's
// whatever its sampler or remover refuses (which the table would otherwise
// refuse at admission, after the insert returned, counting it in Info's
// Refused). A writer's handle does not know the owner's selectors.
func (s *shardHandle) checkPriority(key uint64, priority float64) error {
	if math.IsNaN(priority) {
		return invalidf("shard %q: priority is NaN", s.shard.Name())
	}
	if s.st != nil {
		return s.st.CheckPriority(key, priority)
	}
	return nil
}

// batchHandle is a sampled batch the caller holds (gear_table_sample with keep).
type batchHandle struct {
	s *shardHandle
	b *sample.Batch
}

func (b *batchHandle) close() error {
	b.s.mu.RLock()
	defer b.s.mu.RUnlock()
	if !b.s.closed {
		b.b.Release()
	}
	return nil
}

// gear_table_sample samples a batch of 1 to n items, waiting up to ms
// milliseconds for the first (GEAR_TIMEOUT then, with nothing sampled), and
// writes got items' keys, probabilities, priorities, rows (the local indices
// of the shard) and times sampled into the arrays given (each of n elements;
// any may be NULL). With ncols > 0 it also collects columns cols (indices in
// the layout's order) of the items, in order, into dst[k] (room for n
// items of block_bytes each; the first got are written; the column plan is
// made once and reused while cols stay the same). With keep 0 the batch is released before the call returns;
// otherwise its handle is stored in batchOut and its rows stay readable (also
// those the sample deleted, by max_times_sampled) until gear_close(batch).
//
//export gear_table_sample
func gear_table_sample(h C.uint64_t, n C.int64_t, ms C.int64_t, keep C.int32_t,
	keys *C.uint64_t, probs, prios *C.double, rows, times *C.int64_t,
	ncols C.int32_t, cols *C.int32_t, dst *unsafe.Pointer, got *C.int64_t, batchOut *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	if got == nil {
		return nullArg("gear_table_sample: got")
	}
	*got = 0
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	t, err := s.table()
	if err != nil {
		return fail(err)
	}
	if n < 1 {
		return fail(invalidf("table %q: sample of %d items: want at least 1", t.Name(), int64(n)))
	}
	if ncols < 0 || (ncols > 0 && (cols == nil || dst == nil)) {
		return fail(invalidf("table %q: %d columns to collect without their buffers", t.Name(), int32(ncols)))
	}
	var colIdx []C.int32_t
	if ncols > 0 {
		colIdx = unsafe.Slice(cols, int(ncols))
		for _, c := range colIdx {
			if c < 0 || int(c) >= len(s.names) {
				return fail(invalidf("table %q: column index %d of %d", t.Name(), int32(c), len(s.names)))
			}
		}
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()

	var b *sample.Batch
	if keep != 0 {
		if batchOut == nil {
			return fail(invalidf("table %q: keep without a batch pointer", t.Name()))
		}
		b = new(sample.Batch)
	} else {
		s.sampleMu.Lock()
		defer s.sampleMu.Unlock()
		b = &s.batch
		defer b.Release()
	}
	// The remover may evict a sampled item (one the sample did not delete,
	// so its batch does not hold it) between the sample and the collection:
	// the collection then fails with sample.ErrEvicted, and the batch is
	// sampled again (16 times at most: the remover would have to take a
	// sampled item every time); any other error is the call's.
	var plan *sample.CollectPlan
	var out [][]byte
	if ncols > 0 {
		if plan, err = s.plan(t, colIdx); err != nil {
			return fail(err)
		}
		out = make([][]byte, 0, 8)
		if keep == 0 {
			out = s.dst[:0]
		}
		ptrs := unsafe.Slice(dst, len(colIdx))
		for j, c := range colIdx {
			if ptrs[j] == nil {
				return fail(invalidf("table %q: column %q's buffer is NULL", t.Name(), s.names[c]))
			}
			out = append(out, unsafe.Slice((*byte)(ptrs[j]), int(n)*plan.ItemBytes(j)))
		}
		if keep == 0 {
			s.dst = out
		}
	}
	for try := 0; ; try++ {
		if err := t.SampleInto(ctx, b, int(n)); err != nil {
			return fail(err)
		}
		s.fill(b, keys, probs, prios, rows, times)
		if ncols == 0 {
			break
		}
		err := t.CollectBatch(ctx, plan, b, out)
		if err == nil {
			break
		}
		if !errors.Is(err, sample.ErrEvicted) || try >= 16 {
			if keep != 0 {
				b.Release()
			}
			return fail(err)
		}
	}
	k := len(b.Items)
	if keep != 0 {
		*batchOut = register(&batchHandle{s: s, b: b})
	}
	*got = C.int64_t(k)
	return statusOK
}

// plan returns the collection plan of columns colIdx, made once for the last
// columns asked for and reused while they stay the same (the caller holds
// sampleMu or does not share the handle's plan: see planMu).
func (s *shardHandle) plan(t *sample.ShardTable, colIdx []C.int32_t) (*sample.CollectPlan, error) {
	s.planMu.Lock()
	defer s.planMu.Unlock()
	if s.planned != nil && len(s.planCols) == len(colIdx) {
		same := true
		for j, c := range colIdx {
			same = same && s.planCols[j] == int32(c)
		}
		if same {
			return s.planned, nil
		}
	}
	names := make([]string, len(colIdx))
	cols := make([]int32, len(colIdx))
	for j, c := range colIdx {
		names[j], cols[j] = s.names[c], int32(c)
	}
	p, err := t.PlanCollect(names, sample.Window{})
	if err != nil {
		return nil, err
	}
	s.planned, s.planCols = p, cols
	return p, nil
}

// sliceOr is p as a slice of n elements, or nil.
func sliceOr[T any](p *T, n int) []T {
	if p == nil {
		return nil
	}
	return unsafe.Slice(p, n)
}

// gear_table_mutate sets the priorities of nup items (ukeys[i] to uprios[i])
// and deletes ndel items (dkeys), as sample.ShardTable.MutatePriorities.
//
//export gear_table_mutate
func gear_table_mutate(h C.uint64_t, nup C.int64_t, ukeys *C.uint64_t, uprios *C.double, ndel C.int64_t, dkeys *C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	t, err := s.table()
	if err != nil {
		return fail(err)
	}
	if nup < 0 || ndel < 0 || (nup > 0 && (ukeys == nil || uprios == nil)) || (ndel > 0 && dkeys == nil) {
		return fail(invalidf("table %q: %d updates and %d deletes without their arrays", t.Name(), int64(nup), int64(ndel)))
	}
	ups := make([]sample.Update, nup)
	uk, up := sliceOr(ukeys, int(nup)), sliceOr(uprios, int(nup))
	for i := range ups {
		ups[i] = sample.Update{Key: uint64(uk[i]), Priority: float64(up[i])}
	}
	var dels []uint64
	if ndel > 0 {
		dels = unsafe.Slice((*uint64)(unsafe.Pointer(dkeys)), int(ndel))
	}
	return fail(t.MutatePriorities(ups, dels))
}

// gear_table_reset deletes every item of the table.
//
//export gear_table_reset
func gear_table_reset(h C.uint64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	t, err := s.table()
	if err != nil {
		return fail(err)
	}
	return fail(t.Reset())
}

// gear_table_info writes the table's state as JSON into buf: name, size,
// max_size, max_times_sampled, sampler, remover, inserts, samples, deletes,
// unique_samples, blocked_inserts, blocked_samples, admitted, held, refused,
// last_refusal, limiter (its fields as Go names them), and shard (commits,
// capacity).
//
//export gear_table_info
func gear_table_info(h C.uint64_t, buf *C.char, capacity C.int64_t, n *C.int64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	t, err := s.table()
	if err != nil {
		return fail(err)
	}
	i := t.Info()
	refusal := ""
	if i.LastRefusal != nil {
		refusal = i.LastRefusal.Error()
	}
	b, err := json.Marshal(map[string]any{
		"name": i.Name, "size": i.Size, "max_size": i.MaxSize, "max_times_sampled": i.MaxTimesSampled,
		"sampler": i.Sampler.String(), "remover": i.Remover.String(),
		"inserts": i.Inserts, "samples": i.Samples, "deletes": i.Deletes, "unique_samples": i.UniqueSamples,
		"blocked_inserts": i.BlockedInserts, "blocked_samples": i.BlockedSamples,
		"admitted": i.Admitted, "waiting": i.Waiting, "held": i.Held, "refused": i.Refused, "last_refusal": refusal,
		"existing": i.Existing, "limiter": i.Limiter,
		"commits": s.shard.CommitSeq(), "capacity": s.shard.Capacity(),
	})
	if err != nil {
		return fail(fmt.Errorf("libgear: table %q: info: %w", i.Name, err))
	}
	copyOut(string(b), buf, capacity, n)
	return statusOK
}

// gear_table_wait_admitted waits up to ms milliseconds until the table has
// admitted every commit made so far to its shard (GEAR_TIMEOUT otherwise).
//
//export gear_table_wait_admitted
func gear_table_wait_admitted(h C.uint64_t, ms C.int64_t) (st C.int32_t) {
	defer guard(&st)
	s, err := use(h)
	if err != nil {
		return fail(err)
	}
	defer s.mu.RUnlock()
	t, err := s.table()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	return fail(t.WaitAdmitted(ctx, s.shard.CommitSeq()))
}

// fill writes the batch's items into the caller's arrays (any may be NULL).
func (s *shardHandle) fill(b *sample.Batch, keys *C.uint64_t, probs, prios *C.double, rows, times *C.int64_t) {
	k := len(b.Items)
	ks := sliceOr(keys, k)
	ps, pr := sliceOr(probs, k), sliceOr(prios, k)
	rs, ts := sliceOr(rows, k), sliceOr(times, k)
	for i := range b.Items {
		it := &b.Items[i]
		if ks != nil {
			ks[i] = C.uint64_t(it.Key)
		}
		if ps != nil {
			ps[i] = C.double(it.Probability)
		}
		if pr != nil {
			pr[i] = C.double(it.Priority)
		}
		if rs != nil {
			rs[i] = C.int64_t(it.Index)
		}
		if ts != nil {
			ts[i] = C.int64_t(it.TimesSampled)
		}
	}
}

// tableSample is gear_table_sample in Go's types (for the package's tests
// and benchmarks, which cannot name cgo's types): with keep false, the rows
// of the batch are collected into dst (one buffer per column of cols, of n
// items each) and the batch released; it returns the items sampled and the
// call's status.
func tableSample(h uint64, n int, ms int64, keys []uint64, prios []float64, rows []int64, cols []int32, dst []unsafe.Pointer) (int, int32) {
	var got C.int64_t
	var batch C.uint64_t
	var cp *C.int32_t
	var dp *unsafe.Pointer
	if len(cols) > 0 {
		cp, dp = (*C.int32_t)(unsafe.Pointer(&cols[0])), &dst[0]
	}
	st := gear_table_sample(C.uint64_t(h), C.int64_t(n), C.int64_t(ms), 0,
		(*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(keys))), nil, (*C.double)(unsafe.Pointer(unsafe.SliceData(prios))),
		(*C.int64_t)(unsafe.Pointer(unsafe.SliceData(rows))), nil, C.int32_t(len(cols)), cp, dp, &got, &batch)
	return int(got), int32(st)
}
