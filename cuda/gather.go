package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"unsafe"
)

// GatherSpec describes a column table and the window read from each selected
// block. A table holds Capacity blocks of BlockBytes; a block is a chain of frames
// of FrameBytes. Output row r is (HeadPad + Length + TailPad) frames: HeadPad
// frames of zeros, Length frames read from block indices[r] starting at frame
// Offset (or offsets[r]), and TailPad frames of zeros.
type GatherSpec struct {
	BlockBytes int // bytes of one block: the table's stride
	Capacity   int // blocks in the table; every index must be below it
	FrameBytes int // bytes of one frame; 0 means the block is one frame
	Offset     int // first frame read, when no per-row offsets are given
	Length     int // frames read; 0 means from Offset to the end of the block (per-row offsets need it given)
	HeadPad    int // frames of zeros before the data
	TailPad    int // frames of zeros after the data
}

// layout is a GatherSpec resolved to bytes.
type layout struct {
	block, frame, off, copy, head, row int64
}

func (s GatherSpec) resolve(perRowOffsets bool) (layout, error) {
	if s.BlockBytes <= 0 {
		return layout{}, fmt.Errorf("cuda: gather: block bytes %d must be positive", s.BlockBytes)
	}
	if s.Capacity <= 0 {
		return layout{}, fmt.Errorf("cuda: gather: capacity %d must be positive", s.Capacity)
	}
	frame := s.FrameBytes
	if frame == 0 {
		frame = s.BlockBytes
	}
	if frame < 0 || s.BlockBytes%frame != 0 {
		return layout{}, fmt.Errorf("cuda: gather: frame bytes %d must divide block bytes %d", s.FrameBytes, s.BlockBytes)
	}
	frames := s.BlockBytes / frame
	if s.Offset < 0 || s.HeadPad < 0 || s.TailPad < 0 || s.Length < 0 {
		return layout{}, fmt.Errorf("cuda: gather: window offset %d, length %d, padding %d+%d must not be negative", s.Offset, s.Length, s.HeadPad, s.TailPad)
	}
	length := s.Length
	if length == 0 {
		if perRowOffsets {
			return layout{}, fmt.Errorf("cuda: gather: per-row offsets need an explicit window length")
		}
		length = frames - s.Offset
	}
	if !perRowOffsets && s.Offset+length > frames {
		return layout{}, fmt.Errorf("cuda: gather: window [%d, %d) exceeds the block's %d frames", s.Offset, s.Offset+length, frames)
	}
	if length > frames {
		return layout{}, fmt.Errorf("cuda: gather: window length %d exceeds the block's %d frames", length, frames)
	}
	f := int64(frame)
	return layout{
		block: int64(s.BlockBytes), frame: f, off: int64(s.Offset) * f, copy: int64(length) * f,
		head: int64(s.HeadPad) * f, row: int64(s.HeadPad+length+s.TailPad) * f,
	}, nil
}

// RowBytes is the size of one output row: (HeadPad + Length + TailPad) frames.
func (s GatherSpec) RowBytes() (int, error) {
	l, err := s.resolve(false)
	return int(l.row), err
}

// check validates the indices and offsets against the layout.
func (l layout) check(s GatherSpec, indices []int64, offsets []int) error {
	if offsets != nil && len(offsets) != len(indices) {
		return fmt.Errorf("cuda: gather: %d offsets for %d indices", len(offsets), len(indices))
	}
	frames := l.block / l.frame
	for r, ix := range indices {
		if ix < 0 || ix >= int64(s.Capacity) {
			return fmt.Errorf("cuda: gather: index %d (row %d) outside the table's %d blocks", ix, r, s.Capacity)
		}
		if offsets != nil {
			o := int64(offsets[r])
			if o < 0 || o*l.frame+l.copy > l.block {
				return fmt.Errorf("cuda: gather: row %d: window [%d, %d) outside the block's %d frames", r, o, o+l.copy/l.frame, frames)
			}
		}
	}
	return nil
}

// GatherCPU is the CPU twin of the gather kernel: it writes len(indices) rows of
// spec.RowBytes() into dst from the column table (Capacity*BlockBytes bytes).
// offsets, if not nil, gives each row's first frame.
func GatherCPU(dst, table []byte, indices []int64, offsets []int, spec GatherSpec) error {
	l, err := spec.resolve(offsets != nil)
	if err != nil {
		return err
	}
	if err := l.check(spec, indices, offsets); err != nil {
		return err
	}
	if int64(len(table)) < int64(spec.Capacity)*l.block {
		return fmt.Errorf("cuda: gather: table of %d bytes, want %d blocks of %d", len(table), spec.Capacity, l.block)
	}
	if int64(len(dst)) < int64(len(indices))*l.row {
		return fmt.Errorf("cuda: gather: destination of %d bytes, want %d rows of %d", len(dst), len(indices), l.row)
	}
	for r, ix := range indices {
		off := l.off
		if offsets != nil {
			off = int64(offsets[r]) * l.frame
		}
		row := dst[int64(r)*l.row : int64(r+1)*l.row]
		clear(row[:l.head])
		src := ix*l.block + off
		copy(row[l.head:l.head+l.copy], table[src:src+l.copy])
		clear(row[l.head+l.copy:])
	}
	return nil
}

// gatherUnroll is GEAR_GATHER_UNROLL in gather.cuh.
const gatherUnroll = 4

// gatherShape picks the element width (16, 4 or 1 bytes) and the launch shape.
func gatherShape(dst, table DevicePtr, l layout, perRowOffsets bool, rows int) (width int, grid, block Dim3) {
	all := uint64(dst) | uint64(table) | uint64(l.block) | uint64(l.off) | uint64(l.copy) | uint64(l.head) | uint64(l.row)
	if perRowOffsets {
		all |= uint64(l.frame)
	}
	switch {
	case all%16 == 0:
		width = 16
	case all%4 == 0:
		width = 4
	default:
		width = 1
	}
	units := l.row / int64(width)
	threads := 256
	if perThread := (units + gatherUnroll - 1) / gatherUnroll; perThread < 256 {
		threads = max(32, 1<<bits.Len64(uint64(perThread-1)))
	}
	gx := (units + int64(threads*gatherUnroll) - 1) / int64(threads*gatherUnroll)
	gx = min(max(gx, 1), 1<<20)
	gy := min(rows, 65535)
	return width, Dim3{X: int(gx), Y: gy, Z: 1}, Dim3{X: threads, Y: 1, Z: 1}
}

// LaunchGather enqueues the gather kernel on stream s: rows output rows into dst
// from the column table at table (a device pointer, usually of registered host
// memory), with the rows' block indices read from the int64 device array indices
// and, when offsetBytes is not 0, each row's window start in bytes from the int64
// device array offsetBytes. It trusts its caller: Gatherer.Gather validates the
// indices and moves them to the device first.
func (dev *Device) LaunchGather(s Stream, dst, table, indices, offsetBytes DevicePtr, rows int, spec GatherSpec) error {
	l, err := spec.resolve(offsetBytes != 0)
	if err != nil {
		return err
	}
	return dev.launchGather(s, dst, table, indices, offsetBytes, rows, l)
}

func (dev *Device) launchGather(s Stream, dst, table, indices, offsetBytes DevicePtr, rows int, l layout) error {
	if rows == 0 || l.row == 0 {
		return nil
	}
	k, err := dev.gear()
	if err != nil {
		return err
	}
	width, grid, block := gatherShape(dst, table, l, offsetBytes != 0, rows)
	fn := k.gatherV1
	switch width {
	case 16:
		fn = k.gatherV16
	case 4:
		fn = k.gatherV4
	}
	return dev.Launch(fn, LaunchConfig{Grid: grid, Block: block, Stream: s},
		dst, table, indices, offsetBytes, uint64(rows), uint64(l.block), uint64(l.off),
		uint64(l.head), uint64(l.copy), uint64(l.row))
}

// GatherParamRows is the most rows one launch of LaunchGatherHost carries in
// its parameters (GEAR_GATHER_PARAM_ROWS in gather.cuh); it launches more rows
// as several launches.
const GatherParamRows = 960

// LaunchGatherHost is LaunchGather with the rows' block indices from the host:
// they go in the launch's parameters (4 bytes each, GatherParamRows a launch),
// so that no copy of them to the device comes before the kernel (on an H100 that
// copy and the kernel's wait for it took 3 to 15 us, about 3% of a 16 MiB
// gather). The indices are checked against spec (which takes no per-row
// offsets) and read during the call only; spec.Capacity must be at most 2^32.
func (dev *Device) LaunchGatherHost(s Stream, dst, table DevicePtr, indices []int64, spec GatherSpec) error {
	l, err := spec.resolve(false)
	if err != nil {
		return err
	}
	if err := l.check(spec, indices, nil); err != nil {
		return err
	}
	if spec.Capacity > 1<<32 {
		return fmt.Errorf("cuda: gather: capacity %d exceeds the 2^32 blocks that host indices address (use LaunchGather)", spec.Capacity)
	}
	return dev.launchGatherHost(s, dst, table, indices, l)
}

// launchGatherHost is LaunchGatherHost with spec resolved and the indices
// checked.
func (dev *Device) launchGatherHost(s Stream, dst, table DevicePtr, indices []int64, l layout) error {
	if len(indices) == 0 || l.row == 0 {
		return nil
	}
	k, err := dev.gear()
	if err != nil {
		return err
	}
	size := 4 * GatherParamRows
	if len(indices) <= gatherSmallRows {
		size = 4 * 256 // one launch, of the 1 KiB form
	}
	buf := make([]byte, size)
	for start := 0; start < len(indices); start += GatherParamRows {
		part := indices[start:min(start+GatherParamRows, len(indices))]
		// The 256-row form where the rows fit: a small launch carries
		// no more than it needs.
		fns, rows := &k.gatherRows, buf
		if len(part) <= gatherSmallRows {
			fns, rows = &k.gatherRows256, buf[:4*256]
		}
		for i, ix := range part {
			binary.LittleEndian.PutUint32(rows[4*i:], uint32(ix))
		}
		at := dst.Add(int(int64(start) * l.row))
		width, grid, block := gatherShape(at, table, l, false, len(part))
		fn := fns[2]
		switch width {
		case 16:
			fn = fns[0]
		case 4:
			fn = fns[1]
		}
		if err := dev.Launch(fn, LaunchConfig{Grid: grid, Block: block, Stream: s},
			at, table, uint64(len(part)), uint64(l.block), uint64(l.off),
			uint64(l.head), uint64(l.copy), uint64(l.row), rows); err != nil {
			return err
		}
	}
	return nil
}

// gatherSmallRows is the most rows launchGatherHost gives the 256-row form of
// the kernel (gear_gather_rows256_v*); a variable for BenchmarkGatherWays,
// which sets it to 0 to time the 960-row form alone.
var gatherSmallRows = 256

// Gatherer runs the gather kernel for host-side index lists: it validates them
// and launches on the caller's stream. Indices alone go in the launches'
// parameters (LaunchGatherHost); with per-row offsets, or a table of more than
// 2^32 blocks, they are staged in pinned memory and copied to the device first.
// Rows of 64 KiB and more it shares with the copy engines, on a stream of its
// own that the caller's stream waits for (Gather). A Gatherer serves one call
// at a time.
type Gatherer struct {
	dev *Device

	mu      sync.Mutex
	stage   []byte    // pinned: indices, then offsets in bytes
	devBuf  DevicePtr // the same on the device
	rows    int       // rows the buffers hold
	staged  Event     // recorded after the last copy out of stage
	done    Event     // recorded after the last kernel, which reads devBuf
	last    Stream    // the stream of the last call
	pending bool      // the events have been recorded and may not have passed
	closed  bool
	copies  *CopyBatch  // GatherCopies' list
	side    *gatherSide // the copy engines' share of a split gather, once made
}

// gatherSide is what a Gatherer needs to share a gather between the kernel and
// the copy engines: a stream of its own for the copies, the event it waits for
// before them (the work already on the caller's stream), the event the
// caller's stream waits for after them, and their list.
type gatherSide struct {
	stream     Stream
	fork, join Event
	batch      CopyBatch
}

// splitMinCopy is the least bytes each row of a gather must read for Gather
// to split it (splitGather). On an H100 the copies of a batch went at 0.57 to
// 0.74 of the pinned copy with rows of 64 KiB, but at 0.08 with rows of 16
// KiB and 0.05 with 4 KiB: each copy costs the engine a fixed time.
const splitMinCopy = 64 << 10

// NewGatherer creates a Gatherer on dev. Close releases its buffers.
func (dev *Device) NewGatherer() (*Gatherer, error) {
	staged, err := dev.NewEvent()
	if err != nil {
		return nil, err
	}
	done, err := dev.NewEvent()
	if err != nil {
		_ = dev.DestroyEvent(staged)
		return nil, err
	}
	return &Gatherer{dev: dev, staged: staged, done: done}, nil
}

// Gather enqueues, on stream s, the gather of the rows named by indices (local
// block indices of the table) into dst, which must hold len(indices) rows of
// spec.RowBytes(). table is the device pointer of the column table (RegisterHost
// or HostDevicePointer for host memory, or device memory). offsets, if not nil,
// gives each row's first frame. Gather returns once the work is enqueued; dst is
// complete when s has passed it (StreamSynchronize). Only a call with offsets
// may block: to wait, under ctx, for the previous such call's copy of its
// indices.
//
// Two or more rows that read 64 KiB or more each, without padding or offsets,
// on a driver with batched copies (CanCopyBatch), go half by the kernel on s
// and half by one batch of copies on the Gatherer's own stream, which starts
// after the work enqueued on s before the call and which s waits for before
// the work enqueued after it; the kernel takes the first ceil(n/2) rows.
func (g *Gatherer) Gather(ctx context.Context, s Stream, dst, table DevicePtr, indices []int64, offsets []int, spec GatherSpec) error {
	l, err := spec.resolve(offsets != nil)
	if err != nil {
		return err
	}
	if err := l.check(spec, indices, offsets); err != nil {
		return err
	}
	if len(indices) == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("%w: gatherer", ErrClosed)
	}
	if offsets == nil && spec.Capacity <= 1<<32 {
		if l.copy >= splitMinCopy && l.copy == l.row && len(indices) >= 2 && g.dev.CanCopyBatch() {
			return g.splitGather(s, dst, table, indices, l)
		}
		return g.dev.launchGatherHost(s, dst, table, indices, l)
	}
	if g.pending {
		// On the same stream the previous kernel reads the device copy of its
		// indices before this call's copy lands; only the staging memory must
		// be free. On another stream, wait for the previous kernel too.
		wait := g.staged
		if s != g.last {
			wait = g.done
		}
		if err := g.dev.EventSynchronize(ctx, wait); err != nil {
			return err
		}
		g.pending = false
	}
	rows := len(indices)
	if rows > g.rows {
		if err := g.waitDone(ctx); err != nil {
			return err
		}
		if err := g.grow(rows); err != nil {
			return err
		}
	}
	idx := unsafe.Slice((*int64)(unsafe.Pointer(&g.stage[0])), 2*g.rows)
	copy(idx, indices)
	n := rows * 8
	var offDev DevicePtr
	if offsets != nil {
		for r, o := range offsets {
			idx[g.rows+r] = int64(o) * l.frame
		}
		offDev = g.devBuf.Add(g.rows * 8)
	}
	if err := g.dev.CopyHtoDAsync(g.devBuf, g.stage[:n], s); err != nil {
		return err
	}
	if offsets != nil {
		if err := g.dev.CopyHtoDAsync(offDev, g.stage[g.rows*8:g.rows*8+n], s); err != nil {
			return err
		}
	}
	if err := g.dev.Record(g.staged, s); err != nil {
		return err
	}
	if err := g.dev.launchGather(s, dst, table, g.devBuf, offDev, rows, l); err != nil {
		return err
	}
	if err := g.dev.Record(g.done, s); err != nil {
		return err
	}
	g.pending, g.last = true, s
	return nil
}

// splitGather is Gather of rows of at least splitMinCopy bytes, with no
// padding, on a driver with batched copies: the kernel gathers the first half
// of the rows on s while the copy engines copy the second half, one batch on
// the Gatherer's own stream, which starts after the work before it on s; s
// waits for the batch after the kernel. The engines read host memory in larger
// requests than the kernel's 128-byte lines, and with both at work the bus
// carries more. On an H100 (gearbench gpu, the kernel alone beside it in the
// same runs): 1024 rows of 64 KiB 0.928 and 0.981 of the pinned copy against
// 0.911 and 0.949 in two runs, 256 rows of 128 KiB 0.936 and 0.930 against
// 0.918 and 0.910, 256 rows of 64 KiB 0.903 against 0.900 (medians of six
// runs). g.mu held.
func (g *Gatherer) splitGather(s Stream, dst, table DevicePtr, indices []int64, l layout) error {
	if g.side == nil {
		side, err := g.dev.newGatherSide()
		if err != nil {
			return err
		}
		g.side = side
	}
	sd := g.side
	k := (len(indices) + 1) / 2 // the kernel's rows
	sd.batch.Reset()
	sd.batch.addGather(dst.Add(int(int64(k)*l.row)), table, indices[k:], nil, l)
	// The kernel is launched first: the batch's call takes the host about a
	// microsecond a copy, which the kernel would otherwise wait out (a split
	// gather that enqueued the batch first went at 0.70 of the pinned copy).
	// The fork, recorded before it, keeps the copies from waiting for it.
	if err := g.dev.Record(sd.fork, s); err != nil {
		return err
	}
	if err := g.dev.launchGatherHost(s, dst, table, indices[:k], l); err != nil {
		return err
	}
	if err := g.dev.StreamWaitEvent(sd.stream, sd.fork); err != nil {
		return err
	}
	if err := g.dev.CopyBatchAsync(sd.stream, &sd.batch); err != nil {
		return err
	}
	if err := g.dev.Record(sd.join, sd.stream); err != nil {
		// The copies are enqueued: s must not pass them unwaited.
		return errors.Join(err, g.dev.StreamSynchronize(context.Background(), sd.stream))
	}
	return g.dev.StreamWaitEvent(s, sd.join)
}

// newGatherSide makes a gatherSide's stream and events.
func (dev *Device) newGatherSide() (*gatherSide, error) {
	sd := &gatherSide{}
	var err error
	if sd.stream, err = dev.NewStream(); err != nil {
		return nil, err
	}
	if sd.fork, err = dev.NewEvent(); err == nil {
		if sd.join, err = dev.NewEvent(); err != nil {
			_ = dev.DestroyEvent(sd.fork)
		}
	}
	if err != nil {
		_ = dev.DestroyStream(sd.stream)
		return nil, err
	}
	return sd, nil
}

// GatherCopies is Gather through the copy engines instead of the kernel: one
// batched copy (CopyBatchAsync) of the rows' windows, after a fill of dst with
// zeros when spec pads the rows. It needs a driver of CUDA 12.8 or later
// (Device.CanCopyBatch) and a created stream; table is registered host memory
// (its device pointer) or device memory. The host reads indices and offsets
// during the call and keeps nothing of them, so GatherCopies never waits.
//
// Errors: Gather's; ErrNotSupported; the legacy default stream.
func (g *Gatherer) GatherCopies(s Stream, dst, table DevicePtr, indices []int64, offsets []int, spec GatherSpec) error {
	l, err := spec.resolve(offsets != nil)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("%w: gatherer", ErrClosed)
	}
	if g.copies == nil {
		g.copies = new(CopyBatch)
	}
	b := g.copies
	b.Reset()
	if err := g.dev.addGatherZeroed(s, b, dst, table, indices, offsets, spec, l); err != nil {
		return err
	}
	return g.dev.CopyBatchAsync(s, b)
}

// waitDone waits for the last kernel, before its buffers are replaced.
func (g *Gatherer) waitDone(ctx context.Context) error {
	if g.rows == 0 {
		return nil
	}
	return g.dev.EventSynchronize(ctx, g.done)
}

// grow replaces the buffers with ones for at least rows rows. The previous
// copies have passed (Gather waited for them).
func (g *Gatherer) grow(rows int) error {
	rows = max(rows, 2*g.rows, 256)
	if err := g.free(); err != nil {
		return err
	}
	stage, err := g.dev.AllocHost(rows * 16)
	if err != nil {
		return err
	}
	buf, err := g.dev.Alloc(rows * 16)
	if err != nil {
		_ = g.dev.FreeHost(stage)
		return err
	}
	g.stage, g.devBuf, g.rows = stage, buf, rows
	return nil
}

func (g *Gatherer) free() error {
	var err error
	if g.devBuf != 0 {
		err = g.dev.Free(g.devBuf)
	}
	if g.stage != nil {
		if e := g.dev.FreeHost(g.stage); err == nil {
			err = e
		}
	}
	g.stage, g.devBuf, g.rows = nil, 0, 0
	return err
}

// Close waits for the last kernel and frees the Gatherer's buffers, stream and
// events. A second Close does nothing; calls after Close fail with ErrClosed.
func (g *Gatherer) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	err := g.waitDone(context.Background())
	if e := g.free(); err == nil {
		err = e
	}
	events := []Event{g.staged, g.done}
	if sd := g.side; sd != nil {
		// Work still on the side stream ends on its own: the driver
		// releases a stream and its events once their work has passed.
		events = append(events, sd.fork, sd.join)
		if e := g.dev.DestroyStream(sd.stream); err == nil {
			err = e
		}
		g.side = nil
	}
	for _, ev := range events {
		if e := g.dev.DestroyEvent(ev); err == nil {
			err = e
		}
	}
	return err
}
