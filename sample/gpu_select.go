package sample

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"unsafe"

	"github.com/gear-rl/gear/cuda"
)

// DeviceSelection runs a table's selection with GEAR's selection kernels: the
// weighted draws of a prioritized sampler and, in a distributed table, the top-k
// of a heap sampler (Top and decentralized samples). It runs them on a GPU
// (NewDeviceSelection) or with the kernels' CPU twins (NewTwinSelection); the
// two pick the same slots, bit for bit, for the same state and seed, so a run
// on a machine without a GPU reproduces one with.
//
// Each selector's array by slot (a prioritized sampler's weights p^c, a heap's
// priorities) is mirrored: in pinned host memory and device memory on a GPU, in
// Go memory for the twins. The selectors mark the 512-slot pages they change,
// and a draw first copies the changed pages to the mirror and uploads them (one
// copy per run of pages, or one copy of their whole span when there are many
// runs), so the device holds the array between draws and only changes cross the
// bus.
//
// What coincides with the host selectors, given the same table and seed:
//
//   - Prioritized: every pick consumes one r.Float64() = u, as the sum tree's
//     does, and picks the slot whose interval of the cumulative weights, in slot
//     order, holds u times their total; so does the sum tree. The two sum in
//     different orders, so they agree on every pick except when u·total falls
//     within rounding of an interval's end; when every partial sum is exact
//     (weights that are small integers, or multiples of one power of two) they
//     agree on every pick. When every weight is zero both fall back to the same
//     uniform pick. A pick's Probability is its weight over the sum tree's total.
//   - Heaps: the k highest (MaxHeap) or lowest (MinHeap) priorities, best first,
//     as Best lists them, except for ties: the kernel puts the lower slot first,
//     the heap the item least recently inserted or updated.
//
// A DeviceSelection may serve several tables and serves one draw at a time. Its
// mirrors are the selection's to change; close the tables that use it before
// Close.
type DeviceSelection struct {
	dev     *cuda.Device // nil: the CPU twins
	stream  cuda.Stream
	sampler *cuda.Sampler
	done    cuda.Event // recorded after a draw that its context abandoned

	mu      sync.Mutex
	arrays  map[mirrored]*mirror
	spare   *mirror // a forgotten mirror kept for the next selector
	pending bool    // done was recorded and may not have passed
	closed  bool
	draws   []float64
	out     []int64
}

// mirror is one selector's array as the selection holds it.
type mirror struct {
	host   []float64 // the values: pinned on a GPU, Go memory for the twins
	pinned []byte    // host's memory on a GPU
	dev    cuda.DevicePtr
	n      int // slots mirrored so far
}

func (m *mirror) capacity() int { return len(m.host) }

// NewDeviceSelection creates a selection on dev, with a stream of its own and a
// cuda.Sampler. Close releases them.
//
// Errors: dev is nil; the driver's.
func NewDeviceSelection(dev *cuda.Device) (*DeviceSelection, error) {
	if dev == nil {
		return nil, errors.New("sample: device selection: no device (sample.OpenDevice opens one; NewTwinSelection needs none)")
	}
	s := &DeviceSelection{dev: dev, arrays: map[mirrored]*mirror{}}
	var err error
	if s.stream, err = dev.NewStream(); err != nil {
		return nil, fmt.Errorf("sample: device selection: %w", err)
	}
	if s.done, err = dev.NewEvent(); err != nil {
		_ = dev.DestroyStream(s.stream)
		return nil, fmt.Errorf("sample: device selection: %w", err)
	}
	if s.sampler, err = dev.NewSampler(); err != nil {
		_ = dev.DestroyEvent(s.done)
		_ = dev.DestroyStream(s.stream)
		return nil, fmt.Errorf("sample: device selection: %w", err)
	}
	return s, nil
}

// NewTwinSelection returns a selection that runs the kernels' CPU twins
// (cuda.WeightedSampleCPU, cuda.TopKCPU): the picks of a DeviceSelection on a
// GPU, without one. The twins recompute the prefix sums for every draw (O(slots)),
// so they are a reference, not a fast path: the host selectors are.
func NewTwinSelection() *DeviceSelection {
	return &DeviceSelection{arrays: map[mirrored]*mirror{}}
}

// OnDevice reports whether the selection runs on a GPU.
func (s *DeviceSelection) OnDevice() bool { return s.dev != nil }

// Close waits for a draw its context abandoned and releases the mirrors, the
// stream and the sampler. Tables that use the selection fail their draws with
// ErrClosed afterwards. It is idempotent.
func (s *DeviceSelection) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.dev == nil {
		s.arrays, s.spare = nil, nil
		return nil
	}
	var errs []error
	if s.pending {
		errs = append(errs, s.dev.EventSynchronize(context.Background(), s.done))
	}
	errs = append(errs, s.sampler.Close())
	for _, m := range s.arrays {
		errs = append(errs, s.freeMirror(m))
	}
	if s.spare != nil {
		errs = append(errs, s.freeMirror(s.spare))
	}
	s.arrays, s.spare = nil, nil
	errs = append(errs, s.dev.DestroyEvent(s.done), s.dev.DestroyStream(s.stream))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sample: device selection: close: %w", err)
	}
	return nil
}

func (s *DeviceSelection) freeMirror(m *mirror) error {
	if s.dev == nil {
		return nil
	}
	return errors.Join(s.dev.Free(m.dev), s.dev.FreeHost(m.pinned))
}

// forget drops a selector's mirror (its table closed); the selection keeps the
// largest forgotten one for the next selector.
func (s *DeviceSelection) forget(sel Selector) {
	ms, ok := sel.(mirrored)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.arrays[ms]
	if m == nil || s.closed {
		return
	}
	delete(s.arrays, ms)
	ms.dirtyPages().detach()
	keep, drop := m, s.spare
	if drop != nil && drop.capacity() > keep.capacity() {
		keep, drop = drop, keep
	}
	s.spare = keep
	if drop != nil {
		_ = s.freeMirror(drop)
	}
}

// dirtyPages records which pages of 512 slots a selector changed since its
// mirror was last brought up to date. It records nothing until a selection
// mirrors the selector.
type dirtyPages struct {
	on   bool
	all  bool
	bits []uint64
}

const pageShift = 9 // 512 slots (4 KiB of float64) per page

func (d *dirtyPages) mark(slot int) {
	if !d.on {
		return
	}
	p := slot >> pageShift
	w := p >> 6
	if w >= len(d.bits) {
		d.bits = append(d.bits, make([]uint64, w+1-len(d.bits))...)
	}
	d.bits[w] |= 1 << (p & 63)
}

func (d *dirtyPages) markAll() {
	if d.on {
		d.all = true
	}
}

func (d *dirtyPages) detach() { *d = dirtyPages{} }

// mirrored is a selector whose array by slot a selection can mirror.
type mirrored interface {
	// mirrorLen is the number of slots of the array.
	mirrorLen() int
	// fillMirror writes the values of slots [lo, lo+len(dst)).
	fillMirror(lo int, dst []float64)
	dirtyPages() *dirtyPages
}

func (p *Prioritized) mirrorLen() int { return len(p.tree.w) }

func (p *Prioritized) fillMirror(lo int, dst []float64) { copy(dst, p.tree.w[lo:]) }

func (p *Prioritized) dirtyPages() *dirtyPages { return &p.dirty }

func (h *Heap) mirrorLen() int { return len(h.pos) }

// absentKey stands for an absent slot in a heap's mirror: a NaN whose bits are all
// ones, which the top-k kernel orders below every priority (NaN is refused).
var absentKey = math.Float64frombits(^uint64(0))

// fillMirror writes the heap's order keys: the priority for a MaxHeap, its
// negation for a MinHeap (so that the k largest keys are the heap's first k), +0
// for either zero, and absentKey for absent slots.
func (h *Heap) fillMirror(lo int, dst []float64) {
	for i := range dst {
		slot := lo + i
		if h.pos[slot] < 0 {
			dst[i] = absentKey
			continue
		}
		k := h.prio[slot]
		if h.min {
			k = -k
		}
		if k == 0 {
			k = 0 // -0 and +0 are one priority
		}
		dst[i] = k
	}
}

func (h *Heap) dirtyPages() *dirtyPages { return &h.dirty }

// maxRuns is the number of runs of changed pages above which a sync uploads the
// span from the first to the last in one copy.
const maxRuns = 16

// sync brings sel's mirror up to date and returns it (s.mu held).
func (s *DeviceSelection) sync(ctx context.Context, sel mirrored) (*mirror, error) {
	if s.closed {
		return nil, fmt.Errorf("%w: device selection", ErrClosed)
	}
	if s.pending {
		if err := s.dev.EventSynchronize(ctx, s.done); err != nil {
			return nil, err
		}
		s.pending = false
	}
	dp := sel.dirtyPages()
	m := s.arrays[sel]
	if m == nil {
		m, s.spare = s.spare, nil
		if m == nil {
			m = &mirror{}
		}
		m.n = 0
		s.arrays[sel] = m
		dp.on, dp.all = true, true
	}
	n := sel.mirrorLen()
	if n > m.capacity() {
		if err := s.grow(m, max(n, 2*m.capacity())); err != nil {
			return nil, err
		}
		dp.all = true
	}
	if dp.all || m.n == 0 {
		sel.fillMirror(0, m.host[:n])
		m.n = n
		dp.all = false
		clear(dp.bits)
		return m, s.upload(m, 0, n)
	}
	type run struct{ lo, hi int }
	var runs []run
	if n > m.n { // slots the selector added: never written since
		sel.fillMirror(m.n, m.host[m.n:n])
		runs = append(runs, run{m.n, n})
	}
	for w, word := range dp.bits {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &= word - 1
			lo := (w<<6 + b) << pageShift
			hi := min(lo+1<<pageShift, m.n)
			if lo >= hi {
				continue
			}
			sel.fillMirror(lo, m.host[lo:hi])
			if k := len(runs) - 1; k >= 0 && runs[k].hi == lo {
				runs[k].hi = hi
			} else {
				runs = append(runs, run{lo, hi})
			}
		}
	}
	clear(dp.bits)
	m.n = n
	if len(runs) > maxRuns {
		lo, hi := runs[0].lo, runs[0].hi
		for _, r := range runs {
			lo, hi = min(lo, r.lo), max(hi, r.hi)
		}
		return m, s.upload(m, lo, hi)
	}
	for _, r := range runs {
		if err := s.upload(m, r.lo, r.hi); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// grow replaces m's buffers with ones of capacity slots (s.mu held, no work
// pending).
func (s *DeviceSelection) grow(m *mirror, slots int) error {
	if s.dev == nil {
		m.host = make([]float64, slots)
		return nil
	}
	pinned, err := s.dev.AllocHost(8 * slots)
	if err != nil {
		return err
	}
	dev, err := s.dev.Alloc(8 * slots)
	if err != nil {
		_ = s.dev.FreeHost(pinned)
		return err
	}
	err = s.freeMirror(m)
	m.pinned, m.dev = pinned, dev
	m.host = unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(pinned))), slots)
	m.n = 0
	return err
}

// upload enqueues the copy of slots [lo, hi) of the mirror to the device.
func (s *DeviceSelection) upload(m *mirror, lo, hi int) error {
	if s.dev == nil || hi <= lo {
		return nil
	}
	return s.dev.CopyHtoDAsync(m.dev.Add(8*lo), m.pinned[8*lo:8*hi], s.stream)
}

// settle marks the selection's stream busy after a call its context abandoned,
// so that the next sync waits before it changes a mirror (s.mu held).
func (s *DeviceSelection) settle(err error) error {
	if err != nil && s.dev != nil && !s.pending {
		if rerr := s.dev.Record(s.done, s.stream); rerr == nil {
			s.pending = true
		}
	}
	return err
}

func (s *DeviceSelection) scratch(k int) ([]float64, []int64) {
	if cap(s.draws) < k {
		s.draws, s.out = make([]float64, k), make([]int64, k)
	}
	return s.draws[:k], s.out[:k]
}

// drawPrioritized is Prioritized.Sample through the kernels: the same draws from
// r, one u = r.Float64() per pick, and the same uniform fallback when every
// weight is zero.
func (s *DeviceSelection) drawPrioritized(ctx context.Context, p *Prioritized, r *rand.Rand, dst []Pick) error {
	total := p.tree.total()
	if len(p.idx.slots) == 0 || !(total > 0) || len(dst) == 0 {
		if len(p.idx.slots) > 0 {
			p.Sample(r, dst) // the uniform fallback, exactly
		}
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	draws, out := s.scratch(len(dst))
	for i := range draws {
		draws[i] = r.Float64()
	}
	m, err := s.sync(ctx, p)
	if err != nil {
		return s.settle(fmt.Errorf("sample: device selection: %w", err))
	}
	if s.dev == nil {
		err = cuda.WeightedSampleCPU(m.host[:m.n], draws, out)
	} else {
		err = s.sampler.WeightedSample(ctx, s.stream, m.dev, m.n, cuda.Float64, draws, out)
	}
	if err != nil {
		return s.settle(fmt.Errorf("sample: device selection: weighted draw over %d slots: %w", m.n, err))
	}
	for i, slot := range out {
		dst[i] = Pick{Slot: int(slot), Probability: p.tree.w[slot] / total}
	}
	return nil
}

// bestHeap is Heap.Best through the top-k kernel: up to k present slots, best
// first, ties to the lower slot.
func (s *DeviceSelection) bestHeap(ctx context.Context, h *Heap, k int, dst []int) ([]int, error) {
	k = min(k, h.Len())
	if k <= 0 {
		return dst, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, out := s.scratch(k)
	m, err := s.sync(ctx, h)
	if err != nil {
		return dst, s.settle(fmt.Errorf("sample: device selection: %w", err))
	}
	if s.dev == nil {
		err = cuda.TopKCPU(m.host[:m.n], k, out)
	} else {
		err = s.sampler.TopK(ctx, s.stream, m.dev, m.n, cuda.Float64, out)
	}
	if err != nil {
		return dst, s.settle(fmt.Errorf("sample: device selection: top %d of %d slots: %w", k, m.n, err))
	}
	for _, slot := range out {
		dst = append(dst, int(slot))
	}
	return dst, nil
}

// drawLocked fills picks from the sampler with r: through the table's device
// selection when it has one and the sampler is prioritized, else with the
// sampler's own Sample (t.mu held).
func (t *Table) drawLocked(ctx context.Context, r *rand.Rand, picks []Pick) error {
	if p, ok := t.sampler.(*Prioritized); ok && t.selection != nil {
		return t.selection.drawPrioritized(ctx, p, r, picks)
	}
	t.sampler.Sample(r, picks)
	return nil
}

// bestLocked appends the first k slots of an ordered sampler: through the
// table's device selection for a heap, else with Best (t.mu held).
func (t *Table) bestLocked(ctx context.Context, k int, dst []int) ([]int, error) {
	if h, ok := t.sampler.(*Heap); ok && t.selection != nil {
		return t.selection.bestHeap(ctx, h, k, dst)
	}
	return t.sampler.(Ordered).Best(k, dst), nil
}
