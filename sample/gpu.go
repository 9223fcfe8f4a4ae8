package sample

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/store"
)

// This file holds collection into device memory: a shard table's column tables
// registered with a device, and the zero-copy gather of sampled rows, through a
// window, straight from the shard's shared memory into device buffers.

// OpenDevice opens the CUDA driver (cuda.OpenDriver with opts) and retains device
// ordinal, for RegisterDevice and NewDeviceSelection. Close the device after the
// tables and selections that use it. Without a driver the error wraps
// cuda.ErrNoDriver and reads "sample: ...: cuda: no CUDA driver: ..."; the host
// paths (Collect, the selectors) need none.
func OpenDevice(ordinal int, opts ...cuda.Option) (*cuda.Device, error) {
	drv, err := cuda.OpenDriver(opts...)
	if err != nil {
		return nil, fmt.Errorf("sample: opening GPU %d: %w", ordinal, err)
	}
	dev, err := drv.Device(ordinal)
	if err != nil {
		return nil, fmt.Errorf("sample: opening GPU %d: %w", ordinal, err)
	}
	return dev, nil
}

// deviceTables is a shard table's registration with a device: its column tables
// pinned and mapped for the device, and the buffers of device collection, which
// grow to the largest collection and are freed on unregistration.
type deviceTables struct {
	dev    *cuda.Device
	host   [][]byte         // the registered column tables, by column
	tables []cuda.DevicePtr // their device pointers

	mu      sync.Mutex // one device collection at a time
	rows    cuda.DevicePtr
	rowsCap int          // bytes: rows staged by a distributed collection
	done    cuda.Event   // recorded after a collection's last work
	pending bool         // done was recorded and may not have passed
	pins    []store.View // the rows read by the work before done, pinned here
	closed  bool
	copies  bool            // CollectDevice gathers through the copy engines (GatherByCopies)
	batch   *cuda.CopyBatch // their copies, one run at a time
}

// DeviceOption configures RegisterDevice.
type DeviceOption func(*deviceConfig)

type deviceConfig struct {
	copies bool
}

// GatherByCopies makes CollectDevice move the rows with the device's copy
// engines, one batched copy (cuda.Device.CopyBatchAsync) for each run of rows,
// instead of the gather kernel: no index upload and no kernel, the rows still
// read straight from the shard's registered memory. It needs a driver of CUDA
// 12.8 or later (RegisterDevice fails with cuda.ErrNotSupported otherwise); a
// collection on the legacy default stream (0), which the driver refuses for
// batches, uses the kernel.
func GatherByCopies() DeviceOption { return func(c *deviceConfig) { c.copies = true } }

// registerTables pins and maps every column table of st's shard for dev,
// checking ctx before each table (pinning a large one takes a while).
func registerTables(ctx context.Context, st *ShardTable, dev *cuda.Device) (*deviceTables, error) {
	g := &deviceTables{dev: dev}
	ev, err := dev.NewEvent()
	if err != nil {
		return nil, fmt.Errorf("sample: table %q: register with GPU %d: %w", st.t.name, dev.Ordinal(), err)
	}
	g.done = ev
	for col := range st.shard.Spec().Columns {
		if err := ctx.Err(); err != nil {
			_ = g.release(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("sample: table %q: register with GPU %d: %w", st.t.name, dev.Ordinal(), err)
		}
		tb := st.shard.ColumnTable(col)
		p, err := dev.RegisterHost(tb)
		if err != nil {
			_ = g.release(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("sample: table %q: registering column %q of shard %q (%d bytes) with GPU %d: %w",
				st.t.name, st.shard.Spec().Columns[col].Name, st.shard.Name(), len(tb), dev.Ordinal(), err)
		}
		g.host = append(g.host, tb)
		g.tables = append(g.tables, p)
	}
	return g, nil
}

// RegisterDevice pins every column table of the shard in this process and maps it
// for dev (cuMemHostRegister, portable and mapped), once, so that CollectDevice
// reads sampled rows with the zero-copy gather kernel (or, with GatherByCopies,
// the copy engines). Pinning takes time in proportion to the tables' size: ctx
// is checked before each table, and when it ends the tables pinned so far are
// unpinned again. Registering again with the same device only takes the new
// options; another device is refused. UnregisterDevice, or Close, undoes it:
// close the table before the device and the shard.
//
// Errors: ErrClosed; the context's; the driver's (a table the driver cannot
// pin, a closed device); cuda.ErrNotSupported (GatherByCopies on a driver
// without batched copies).
func (st *ShardTable) RegisterDevice(ctx context.Context, dev *cuda.Device, opts ...DeviceOption) error {
	if dev == nil {
		return fmt.Errorf("sample: table %q: register device: no device (sample.OpenDevice opens one)", st.t.name)
	}
	var cfg deviceConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.copies {
		if err := dev.CheckCopyBatch(); err != nil {
			return fmt.Errorf("sample: table %q: register device: gathering by copies: %w", st.t.name, err)
		}
	}
	st.devMu.Lock()
	defer st.devMu.Unlock()
	st.mu.Lock()
	g, closed := st.gpu, st.closed
	st.mu.Unlock()
	switch {
	case closed:
		return st.t.errClosed("register device")
	case g != nil && g.dev == dev:
		g.mu.Lock()
		g.copies = cfg.copies
		g.mu.Unlock()
		return nil
	case g != nil:
		return fmt.Errorf("sample: table %q: registered with GPU %d already; UnregisterDevice first", st.t.name, g.dev.Ordinal())
	}
	g, err := registerTables(ctx, st, dev)
	if err != nil {
		return err
	}
	g.copies, g.batch = cfg.copies, new(cuda.CopyBatch)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		_ = g.release(context.WithoutCancel(ctx))
		return st.t.errClosed("register device")
	}
	st.gpu = g
	return nil
}

// UnregisterDevice waits, under ctx, for the device work of the last collection
// into device memory, unpins the rows it read, frees the collection buffers and
// unregisters the column tables. It does nothing when no device is registered.
//
// Errors: the context's (the registration then stays); the driver's.
func (st *ShardTable) UnregisterDevice(ctx context.Context) error {
	st.devMu.Lock()
	defer st.devMu.Unlock()
	st.mu.Lock()
	g := st.gpu
	st.mu.Unlock()
	if g == nil {
		return nil
	}
	g.mu.Lock()
	err := g.wait(ctx)
	g.mu.Unlock()
	if err != nil {
		return fmt.Errorf("sample: table %q: unregister device: %w", st.t.name, err)
	}
	st.mu.Lock()
	st.gpu = nil
	st.mu.Unlock()
	if err := g.release(ctx); err != nil {
		return fmt.Errorf("sample: table %q: unregister device: %w", st.t.name, err)
	}
	return nil
}

// device returns the registration, or an error naming op.
func (st *ShardTable) device(op string) (*deviceTables, error) {
	st.mu.Lock()
	g, closed := st.gpu, st.closed
	st.mu.Unlock()
	switch {
	case closed:
		return nil, st.t.errClosed(op)
	case g == nil:
		return nil, fmt.Errorf("sample: table %q: %s: no device registered (RegisterDevice)", st.t.name, op)
	}
	return g, nil
}

// wait waits for the last collection's work and unpins its rows (g.mu held).
func (g *deviceTables) wait(ctx context.Context) error {
	if g.closed {
		return fmt.Errorf("%w: device registration", ErrClosed)
	}
	if g.pending {
		if err := g.dev.EventSynchronize(ctx, g.done); err != nil {
			return fmt.Errorf("waiting for the previous collection's device work: %w", err)
		}
		g.pending = false
	}
	g.unpin()
	return nil
}

// finish records the end of a collection's work on s and waits for it under
// ctx; the rows it read are unpinned once it has passed, now or, if ctx ends
// first, at the next collection or unregistration (g.mu held).
func (g *deviceTables) finish(ctx context.Context, s cuda.Stream) error {
	if err := g.dev.Record(g.done, s); err != nil {
		// Nothing marks the work's end: wait for the stream itself.
		if werr := g.dev.StreamSynchronize(ctx, s); werr != nil {
			err = errors.Join(err, werr)
		}
		g.unpin()
		return err
	}
	g.pending = true
	return g.wait(ctx)
}

// abandon ends a collection that failed with cause: the rows stay pinned until
// the work enqueued so far has passed, which it waits for unless ctx has ended
// (g.mu held).
func (g *deviceTables) abandon(ctx context.Context, s cuda.Stream, cause error) error {
	if err := g.dev.Record(g.done, s); err != nil {
		_ = g.dev.StreamSynchronize(ctx, s)
		g.unpin()
		return cause
	}
	g.pending = true
	if ctx.Err() == nil {
		if err := g.wait(ctx); err != nil {
			return errors.Join(cause, err)
		}
	}
	return cause
}

// pin keeps v, from pinRow, until unpin (own: pinRow pinned it).
func (g *deviceTables) pin(v store.View, own bool) {
	if own {
		g.pins = append(g.pins, v)
	}
}

func (g *deviceTables) unpin() {
	for _, v := range g.pins {
		v.Done()
	}
	clear(g.pins)
	g.pins = g.pins[:0]
}

// release frees everything and unregisters the tables. No work may be pending.
func (g *deviceTables) release(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	var errs []error
	if err := g.wait(ctx); err != nil {
		// Unregistering under running kernels is worse than a late return.
		errs = append(errs, err, g.wait(context.WithoutCancel(ctx)))
	}
	g.closed = true
	errs = append(errs, g.dev.Free(g.rows))
	for _, tb := range g.host {
		errs = append(errs, g.dev.UnregisterHost(tb))
	}
	if g.done != 0 {
		errs = append(errs, g.dev.DestroyEvent(g.done))
	}
	g.rows, g.host, g.tables, g.rowsCap = 0, nil, nil, 0
	return errors.Join(errs...)
}

// reserve makes room for rowBytes staged row bytes. No work may be pending
// (g.mu held).
func (g *deviceTables) reserve(rowBytes int) error {
	if rowBytes <= g.rowsCap {
		return nil
	}
	rowBytes = max(rowBytes, g.rowsCap+g.rowsCap/2)
	rows, err := g.dev.Alloc(rowBytes)
	if err != nil {
		return err
	}
	err = g.dev.Free(g.rows)
	g.rows, g.rowsCap = rows, rowBytes
	return err
}

// readBytes is the bytes a column's window reads from a block.
func (p colPlan) readBytes() int { return p.avail * p.frameBytes }

// gatherFromShard enqueues, on s, the gather of rows (local row indices) of
// column plan p from the registered table into dst: with the window's padding
// (padded: item layout, p.itemBytes() per row) or without it (packed:
// p.readBytes() per row). The indices go in the launches' parameters: no copy
// of them to the device comes first. The kernel gathers every row: unlike
// cuda.Gatherer.Gather, a collection does not share rows of 64 KiB with the
// copy engines, whose batch would cost the host about a microsecond a row
// while it pins the next run (on an H100, 256 rows of 64 KiB went at 0.833 to
// 0.842 of the pinned copy with the split and 0.838 to 0.849 without it, in
// BenchmarkCollectDeviceRuns).
func (st *ShardTable) gatherFromShard(g *deviceTables, s cuda.Stream, dst cuda.DevicePtr, p colPlan, rows []int64, padded bool) error {
	spec, ok, err := st.gatherSpec(g, s, dst, p, len(rows), padded)
	if !ok || err != nil {
		return err
	}
	return g.dev.LaunchGatherHost(s, dst, g.tables[p.col], rows, spec)
}

// copiesFromShard is gatherFromShard through the copy engines: it adds the
// copies of rows (local row indices, from the host) to g.batch, after zeroing
// dst's rows on s where the item layout pads them. The caller enqueues the
// batch.
func (st *ShardTable) copiesFromShard(g *deviceTables, s cuda.Stream, dst cuda.DevicePtr, p colPlan, rows []int64) error {
	spec, ok, err := st.gatherSpec(g, s, dst, p, len(rows), true)
	if !ok || err != nil {
		return err
	}
	return g.dev.AddGatherZeroed(s, g.batch, dst, g.tables[p.col], rows, nil, spec)
}

// gatherSpec is the gather of column plan p's window from the shard's table
// (padded: with the item layout's padding). When the window reads nothing it
// zeroes the padded items on s itself and reports !ok: nothing to gather.
func (st *ShardTable) gatherSpec(g *deviceTables, s cuda.Stream, dst cuda.DevicePtr, p colPlan, rows int, padded bool) (cuda.GatherSpec, bool, error) {
	n, ib := p.readBytes(), p.itemBytes()
	if rows == 0 {
		return cuda.GatherSpec{}, false, nil
	}
	if n == 0 {
		if padded {
			return cuda.GatherSpec{}, false, g.dev.MemsetAsync(dst, 0, rows*ib, s)
		}
		return cuda.GatherSpec{}, false, nil
	}
	spec := cuda.GatherSpec{BlockBytes: st.shard.BlockStride(p.col), Capacity: st.shard.Capacity(), FrameBytes: 1,
		Offset: p.first * p.frameBytes, Length: n}
	if padded {
		spec.HeadPad, spec.TailPad = p.readAt, ib-n-p.readAt
	}
	return spec, true, nil
}

// ItemBytes returns, for each column, the bytes one item takes in a collection
// through w: buffer i of a collection of n items holds n*ItemBytes[i] bytes.
//
// Errors: an unknown column; a bad window.
func (st *ShardTable) ItemBytes(columns []string, w Window) ([]int, error) {
	plans, err := planColumns(st.shard, columns, w)
	if err != nil {
		return nil, err
	}
	out := make([]int, len(plans))
	for i, p := range plans {
		out[i] = p.itemBytes()
	}
	return out, nil
}

// CollectDevice is Collect into device memory: dst[i], device memory of at least
// len(indices)*ItemBytes(columns, w)[i] bytes, receives column i's items in the
// order of indices, laid out as Collect lays them out, padding included. The
// gather kernel (or the copy engines: GatherByCopies) reads the rows over the
// bus straight from the shard's shared memory, registered by RegisterDevice;
// each row is pinned until the device has read it. The work runs on stream s,
// after the work already enqueued there, and CollectDevice returns once dst
// holds the items (or with an error).
//
// Ownership: dst is the caller's; CollectDevice writes it only from s, and not
// after it returns. If ctx ends while the device works, CollectDevice returns
// ctx's error and the kernel goes on: dst is then written until s passes it, and
// the rows stay pinned until the next device collection or UnregisterDevice.
//
// The rows go to the device in runs, each gathered while the host pins the
// next: an index that holds no item fails the call after the runs before it
// were gathered, so dst may then hold some of the items.
//
// Errors: ErrClosed; no device registered; an unknown column; a bad window; a
// wrong number of buffers; an index that holds no item; the driver's; the
// context's.
func (st *ShardTable) CollectDevice(ctx context.Context, s cuda.Stream, dst []cuda.DevicePtr, indices []int, columns []string, w Window) error {
	plans, err := planColumns(st.shard, columns, w)
	if err != nil {
		return err
	}
	if len(dst) != len(plans) {
		return fmt.Errorf("sample: table %q: collect on device: %d buffers for %d columns", st.t.name, len(dst), len(plans))
	}
	g, err := st.device("collect on device")
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.wait(ctx); err != nil {
		return fmt.Errorf("sample: table %q: collect on device: %w", st.t.name, err)
	}
	if len(indices) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sample: table %q: collect on device: %w", st.t.name, err)
	}
	fail := func(err error) error {
		return g.abandon(ctx, s, fmt.Errorf("sample: table %q: collect on device: %w", st.t.name, err))
	}
	// The rows go in runs (collectRuns): the device gathers a run while the
	// host pins the next, so that only the first run's pins come before the
	// bus is busy. A run's kernel carries its rows' indices in its
	// parameters.
	rows := make([]int64, len(indices))
	for k, idx := range indices {
		rows[k] = int64(idx)
	}
	copies := g.copies && s != 0 // the driver refuses batches on the legacy stream
	rowBytes := 0
	for _, p := range plans {
		rowBytes += p.itemBytes()
	}
	for start, n := range collectRuns(len(indices), rowBytes) {
		for _, idx := range indices[start : start+n] {
			v, own, err := st.pinRow(idx)
			if err != nil {
				return g.abandon(ctx, s, fmt.Errorf("%w (collect on device)", err))
			}
			g.pin(v, own)
		}
		if copies {
			g.batch.Reset()
			for i, p := range plans {
				if err := st.copiesFromShard(g, s, dst[i].Add(start*p.itemBytes()), p, rows[start:start+n]); err != nil {
					return fail(err)
				}
			}
			if err := g.dev.CopyBatchAsync(s, g.batch); err != nil {
				return fail(err)
			}
			continue
		}
		for i, p := range plans {
			if err := st.gatherFromShard(g, s, dst[i].Add(start*p.itemBytes()), p, rows[start:start+n], true); err != nil {
				return fail(err)
			}
		}
	}
	if err := g.finish(ctx, s); err != nil {
		return fmt.Errorf("sample: table %q: collect on device: %w", st.t.name, err)
	}
	return nil
}

// collectRun is the bytes of the first run of rows a device collection
// gathers (at least collectRunRows rows); the second run takes every row left,
// whose pins (about 40 ns a row) the host makes while the device reads the
// first run's megabyte (20 us of a PCIe 5 bus). On an H100, 256 rows of 64 KiB
// went at 0.845 of the pinned copy so and at 0.830 in runs that doubled
// (BenchmarkCollectDeviceRuns).
const collectRunRows = 32

// collectRun and collectRunGrowth are variables for
// BenchmarkCollectDeviceRuns, which compares other runs: a growth above 0
// makes each run that many times the last.
var (
	collectRun       = 1 << 20
	collectRunGrowth = 0
)

// collectRuns yields the runs (first row, rows) of a collection of n rows of
// rowBytes each.
func collectRuns(n, rowBytes int) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		run := max(collectRunRows, collectRun/max(rowBytes, 1))
		for start := 0; start < n; {
			k := min(run, n-start)
			if !yield(start, k) {
				return
			}
			start, run = start+k, collectRunGrowth*run
			if run == 0 {
				run = n
			}
		}
	}
}
