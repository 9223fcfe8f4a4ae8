package cuda

import (
	"fmt"
	"runtime"
	"unsafe"
)

// CopyBatch is a list of copies that Device.CopyBatchAsync enqueues in one
// driver call (cuMemcpyBatchAsync, CUDA 12.8 and later): the copy engines move
// many separate pieces, such as rows of a registered host table gathered into
// a device buffer, with neither a kernel nor a call per piece. Add merges a
// copy that continues the previous one at both ends. A CopyBatch is reused
// (Reset) and serves one goroutine at a time.
type CopyBatch struct {
	dsts, srcs []DevicePtr
	sizes      []uint64
	bytes      int64
	// What the driver reads besides the lists, kept in the batch (pinned
	// for the call) rather than on a goroutine stack, which may move.
	attr    memcpyAttributes
	attrIdx uint64
	failIdx uint64
}

// memcpyAttributes is CUmemcpyAttributes_v1: the order in which a batch's
// copies read their sources, two location hints (ignored for memory that is
// not managed) and flags.
type memcpyAttributes struct {
	srcAccessOrder uint32
	srcLocType     uint32
	srcLocID       int32
	dstLocType     uint32
	dstLocID       int32
	flags          uint32
}

// memcpySrcAccessStream is CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: a copy reads its
// source after the work enqueued before it on the stream, as any stream
// operation does.
const memcpySrcAccessStream = 1

// Reset empties the batch, keeping its memory.
func (b *CopyBatch) Reset() {
	b.dsts, b.srcs, b.sizes, b.bytes = b.dsts[:0], b.srcs[:0], b.sizes[:0], 0
}

// Len is the number of copies in the batch, after merging.
func (b *CopyBatch) Len() int { return len(b.dsts) }

// Bytes is the bytes the batch copies.
func (b *CopyBatch) Bytes() int64 { return b.bytes }

// Add appends a copy of n bytes from src to dst (n <= 0 adds nothing). A copy
// that starts where the last one ended, at both ends, extends it.
func (b *CopyBatch) Add(dst, src DevicePtr, n int) {
	if n <= 0 {
		return
	}
	if k := len(b.dsts) - 1; k >= 0 && b.dsts[k].Add(int(b.sizes[k])) == dst && b.srcs[k].Add(int(b.sizes[k])) == src {
		b.sizes[k] += uint64(n)
	} else {
		b.dsts, b.srcs, b.sizes = append(b.dsts, dst), append(b.srcs, src), append(b.sizes, uint64(n))
	}
	b.bytes += int64(n)
}

// CanCopyBatch reports whether the driver offers cuMemcpyBatchAsync, which
// CopyBatchAsync needs (CUDA 12.8 and later).
func (dev *Device) CanCopyBatch() bool { return dev.drv.fn.cuMemcpyBatchAsync != 0 }

// CheckCopyBatch is CanCopyBatch as an error: nil, or one wrapping
// ErrNotSupported that names the driver's CUDA version.
func (dev *Device) CheckCopyBatch() error {
	if dev.CanCopyBatch() {
		return nil
	}
	return fmt.Errorf("%w: cuMemcpyBatchAsync (the driver is CUDA %d; batches need 12.8)", ErrNotSupported, dev.drv.version)
}

// CopyBatchAsync enqueues b's copies on stream s in one driver call. Each copy
// reads its source in stream order, after the work enqueued on s before it;
// within the batch the copies run in any order, so no copy may read what
// another writes. Sources and destinations are device memory, or host memory
// that CUDA allocated or registered (RegisterHost), alive until s has passed
// the copies. b may be reset and reused once the call returns.
//
// Errors: ErrNotSupported (a driver before CUDA 12.8); the legacy default
// stream (0), which the driver refuses for batches; the driver's, naming the
// copy it refused.
func (dev *Device) CopyBatchAsync(s Stream, b *CopyBatch) error {
	n := len(b.dsts)
	if n == 0 {
		return nil
	}
	if err := dev.CheckCopyBatch(); err != nil {
		return err
	}
	if s == 0 {
		return fmt.Errorf("cuda: a batch of %d copies on the legacy default stream, which the driver refuses for batches: use a created stream", n)
	}
	b.attr = memcpyAttributes{srcAccessOrder: memcpySrcAccessStream}
	b.attrIdx, b.failIdx = 0, ^uint64(0)
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(b)
	pin.Pin(&b.dsts[0])
	pin.Pin(&b.srcs[0])
	pin.Pin(&b.sizes[0])
	err := dev.call("cuMemcpyBatchAsync", dev.drv.fn.cuMemcpyBatchAsync,
		uintptr(unsafe.Pointer(&b.dsts[0])), uintptr(unsafe.Pointer(&b.srcs[0])), uintptr(unsafe.Pointer(&b.sizes[0])),
		uintptr(n), uintptr(unsafe.Pointer(&b.attr)), uintptr(unsafe.Pointer(&b.attrIdx)), 1,
		uintptr(unsafe.Pointer(&b.failIdx)), uintptr(s))
	if err != nil && b.failIdx < uint64(n) {
		i := b.failIdx
		return fmt.Errorf("%w (copy %d of %d: %d bytes from %#x to %#x)", err, i, n, b.sizes[i], uintptr(b.srcs[i]), uintptr(b.dsts[i]))
	}
	return err
}

// AddGather appends the copies of a gather (GatherCPU's, from the column table
// at table into dst) to b, without the rows' padding, which the caller zeroes
// (Gatherer.GatherCopies does). Rows whose blocks follow one another in the
// table, as in dst, become one copy.
func (b *CopyBatch) AddGather(dst, table DevicePtr, indices []int64, offsets []int, spec GatherSpec) error {
	l, err := spec.resolve(offsets != nil)
	if err != nil {
		return err
	}
	if err := l.check(spec, indices, offsets); err != nil {
		return err
	}
	b.addGather(dst, table, indices, offsets, l)
	return nil
}

// AddGatherZeroed is AddGather for a gather whose rows spec pads: it first
// zeroes dst's rows (the padding the copies leave) on stream s, then appends
// the copies to b, which the caller enqueues on s after it.
func (dev *Device) AddGatherZeroed(s Stream, b *CopyBatch, dst, table DevicePtr, indices []int64, offsets []int, spec GatherSpec) error {
	l, err := spec.resolve(offsets != nil)
	if err != nil {
		return err
	}
	return dev.addGatherZeroed(s, b, dst, table, indices, offsets, spec, l)
}

// addGatherZeroed is AddGatherZeroed with spec resolved to l.
func (dev *Device) addGatherZeroed(s Stream, b *CopyBatch, dst, table DevicePtr, indices []int64, offsets []int, spec GatherSpec, l layout) error {
	if err := l.check(spec, indices, offsets); err != nil {
		return err
	}
	if len(indices) > 0 && l.copy != l.row {
		if err := dev.MemsetAsync(dst, 0, int(int64(len(indices))*l.row), s); err != nil {
			return err
		}
	}
	b.addGather(dst, table, indices, offsets, l)
	return nil
}

// addGather is AddGather with spec resolved to l and the indices checked.
func (b *CopyBatch) addGather(dst, table DevicePtr, indices []int64, offsets []int, l layout) {
	for r, ix := range indices {
		off := l.off
		if offsets != nil {
			off = int64(offsets[r]) * l.frame
		}
		b.Add(dst.Add(int(int64(r)*l.row+l.head)), table.Add(int(ix*l.block+off)), int(l.copy))
	}
}
