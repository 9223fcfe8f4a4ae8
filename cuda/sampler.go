package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
)

// Sampler selects on the GPU: weighted sampling with replacement and top-k by
// priority, over weights already in device memory. It owns scratch buffers that
// grow to the largest call, and serves one call at a time. Results match the CPU
// twins (WeightedSampleCPU, TopKCPU) exactly.
type Sampler struct {
	dev *Device

	mu      sync.Mutex
	misc    DevicePtr // status int32 at 0; top-k state at 64 (8 uint64); histogram at 128 (256 uint32)
	scan    DevicePtr // tile sums, then the prefix
	scanCap int       // tiles the scan buffer holds
	io      DevicePtr // draws then out, or keys then indices
	ioCap   int       // elements the io buffer holds (16 bytes each)
	stage   []byte    // pinned: 128-byte header, then 16 bytes per element
	done    Event
	pending bool // done was recorded and may not have passed
	closed  bool

	lastTiles int // tiles of the last WeightedSample: its total is prefix[lastTiles]
}

const (
	miscStatus = 0
	miscState  = 64
	miscHist   = 128
	miscBytes  = miscHist + 256*4
	stageHead  = 128
)

// NewSampler creates a Sampler on dev. Close releases it.
func (dev *Device) NewSampler() (*Sampler, error) {
	done, err := dev.NewEvent()
	if err != nil {
		return nil, err
	}
	misc, err := dev.Alloc(miscBytes)
	if err != nil {
		_ = dev.DestroyEvent(done)
		return nil, err
	}
	return &Sampler{dev: dev, misc: misc, done: done}, nil
}

// begin waits for a previous call that was abandoned by its context, and sizes
// the buffers. The caller holds s.mu.
func (s *Sampler) begin(ctx context.Context, tiles, elems int) error {
	if s.closed {
		return fmt.Errorf("%w: sampler", ErrClosed)
	}
	if s.pending {
		if err := s.dev.EventSynchronize(ctx, s.done); err != nil {
			return err
		}
		s.pending = false
	}
	if tiles > s.scanCap {
		n := max(tiles, 2*s.scanCap, 64)
		p, err := s.dev.Alloc((2*n + 1) * 8)
		if err != nil {
			return err
		}
		if err := s.dev.Free(s.scan); err != nil {
			_ = s.dev.Free(p)
			return err
		}
		s.scan, s.scanCap = p, n
	}
	if elems > s.ioCap || s.stage == nil {
		n := max(elems, 2*s.ioCap, 256)
		p, err := s.dev.Alloc(n * 16)
		if err != nil {
			return err
		}
		st, err := s.dev.AllocHost(stageHead + n*16)
		if err != nil {
			_ = s.dev.Free(p)
			return err
		}
		err = s.dev.Free(s.io)
		if s.stage != nil {
			if e := s.dev.FreeHost(s.stage); err == nil {
				err = e
			}
		}
		s.io, s.ioCap, s.stage = p, n, st
		if err != nil {
			return err
		}
	}
	return nil
}

// finish records the end of the enqueued work and waits for it under ctx.
func (s *Sampler) finish(ctx context.Context, st Stream) error {
	if err := s.dev.Record(s.done, st); err != nil {
		return err
	}
	s.pending = true
	if err := s.dev.EventSynchronize(ctx, s.done); err != nil {
		return err
	}
	s.pending = false
	return nil
}

// WeightedSample draws len(draws) indices with replacement from the n weights
// (Float32 or Float64) at weights in device memory, with probability
// proportional to weight: draw i picks the index whose interval of the
// cumulative weights holds draws[i] times their total. The draws, in [0, 1),
// come from the caller (UniformDraws gives seeded ones), so a run is
// reproducible. It runs on stream st and returns when out holds the indices, or
// with ctx's error (the kernels then finish in the background and the next call
// waits for them). Errors: ErrBadWeight, ErrZeroTotal, ErrBadTotal, ErrBadDraw.
func (s *Sampler) WeightedSample(ctx context.Context, st Stream, weights DevicePtr, n int, dt DType, draws []float64, out []int64) error {
	fi, err := floatIndex(dt)
	if err != nil {
		return err
	}
	if len(out) != len(draws) {
		return fmt.Errorf("cuda: weighted sample: %d outputs for %d draws", len(out), len(draws))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if n <= 0 {
		return ErrZeroTotal
	}
	k, err := s.dev.gear()
	if err != nil {
		return err
	}
	nt := (n + wsTile - 1) / wsTile
	nd := len(draws)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, nt, nd); err != nil {
		return err
	}
	dev := s.dev
	tileSums, prefix := s.scan, s.scan.Add(s.scanCap*8)
	dDraws, dOut := s.io, s.io.Add(s.ioCap*8)
	status := s.misc.Add(miscStatus)
	body := s.stage[stageHead:]
	for i, u := range draws {
		binary.LittleEndian.PutUint64(body[i*8:], math.Float64bits(u))
	}
	steps := []func() error{
		func() error { return dev.MemsetAsync(status, 0, 4, st) },
		func() error { return dev.CopyHtoDAsync(dDraws, body[:nd*8], st) },
		func() error {
			return dev.Launch(k.wsTiles[fi], LaunchConfig{Grid: Dim3{X: nt}, Block: Dim3{X: wsThreads}, Stream: st},
				weights, uint64(n), tileSums, status)
		},
		func() error {
			return dev.Launch(k.wsScan, LaunchConfig{Grid: Dim3{X: 1}, Block: Dim3{X: wsScanThreads}, Stream: st},
				tileSums, uint64(nt), prefix, status)
		},
		func() error {
			if nd == 0 {
				return nil
			}
			return dev.Launch(k.wsDraws[fi], LaunchConfig{Grid: Dim3{X: (nd + 7) / 8}, Block: Dim3{X: 256}, Stream: st},
				weights, uint64(n), prefix, uint64(nt), dDraws, uint64(nd), dOut, status)
		},
		func() error { return dev.CopyDtoHAsync(s.stage[:4], status, st) },
		func() error { return dev.CopyDtoHAsync(body[:nd*8], dOut, st) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	if err := s.finish(ctx, st); err != nil {
		return err
	}
	s.lastTiles = nt
	if err := statusError(int32(binary.LittleEndian.Uint32(s.stage))); err != nil {
		return err
	}
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(body[i*8:]))
	}
	return nil
}

// Total is the device address of the float64 total of the weights that the
// last WeightedSample drew from (the last entry of its prefix sums), for
// kernels that turn weights into probabilities (LaunchISWeights) on the
// device. It is valid until the sampler's next call, and 0 before the first.
func (s *Sampler) Total() DevicePtr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastTiles == 0 {
		return 0
	}
	return s.scan.Add(s.scanCap*8 + s.lastTiles*8)
}

// topkGrid is the grid of the histogram and collect kernels.
func topkGrid(n int) int { return min(max((n+255)/256, 1), 1024) }

// TopK writes to out the indices of the k largest of the n priorities (Float32
// or Float64) at prio in device memory, largest first, ties broken by the smaller
// index; len(out) must be k. It runs a radix select on stream st and returns when
// out is filled, or with ctx's error.
func (s *Sampler) TopK(ctx context.Context, st Stream, prio DevicePtr, n int, dt DType, out []int64) error {
	fi, err := floatIndex(dt)
	if err != nil {
		return err
	}
	k := len(out)
	if err := checkTopK(n, k, k); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if k == 0 {
		return nil
	}
	if n > math.MaxUint32 {
		return fmt.Errorf("cuda: top-k: %d priorities, at most %d", n, uint64(math.MaxUint32))
	}
	kern, err := s.dev.gear()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, 0, k); err != nil {
		return err
	}
	dev := s.dev
	state, hist := s.misc.Add(miscState), s.misc.Add(miscHist)
	keys, idx := s.io, s.io.Add(s.ioCap*8)
	grid := LaunchConfig{Grid: Dim3{X: topkGrid(n)}, Block: Dim3{X: 256}, Stream: st}
	one := LaunchConfig{Grid: Dim3{X: 1}, Block: Dim3{X: 1}, Stream: st}
	if err := dev.Launch(kern.topkInit, LaunchConfig{Grid: Dim3{X: 1}, Block: Dim3{X: 256}, Stream: st}, state, hist, uint64(k)); err != nil {
		return err
	}
	keyBits := 32
	if dt == Float64 {
		keyBits = 64
	}
	type pass struct{ shift, stage int32 }
	var passes []pass
	for sh := keyBits - 8; sh >= 0; sh -= 8 {
		passes = append(passes, pass{int32(sh), 0})
	}
	for sh := 24; sh >= 0; sh -= 8 {
		passes = append(passes, pass{int32(sh), 1})
	}
	for _, p := range passes {
		if err := dev.Launch(kern.topkHist[fi], grid, prio, uint64(n), p.shift, p.stage, state, hist); err != nil {
			return err
		}
		if err := dev.Launch(kern.topkSelect, one, p.shift, p.stage, state, hist); err != nil {
			return err
		}
	}
	if err := dev.Launch(kern.topkCollect[fi], grid, prio, uint64(n), state, uint64(k), keys, idx); err != nil {
		return err
	}
	head, body := s.stage[:64], s.stage[stageHead:stageHead+16*k]
	if err := dev.CopyDtoHAsync(head, state, st); err != nil {
		return err
	}
	if err := dev.CopyDtoHAsync(body[:8*k], keys, st); err != nil {
		return err
	}
	if err := dev.CopyDtoHAsync(body[8*k:], idx, st); err != nil {
		return err
	}
	if err := s.finish(ctx, st); err != nil {
		return err
	}
	le := binary.LittleEndian
	if flag, count := le.Uint64(head[5*8:]), le.Uint64(head[6*8:]); flag != 1 || count != uint64(k) {
		return fmt.Errorf("cuda: top-k: internal error (state %d, selected %d of %d)", flag, count, k)
	}
	r := make([]ranked, k)
	for i := range r {
		r[i] = ranked{key: le.Uint64(body[8*i:]), idx: int64(le.Uint64(body[8*(k+i):]))}
	}
	sortRanked(r)
	for i, c := range r {
		out[i] = c.idx
	}
	return nil
}

// Close waits for work still in flight and frees the Sampler's buffers.
func (s *Sampler) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if s.pending {
		errs = append(errs, s.dev.EventSynchronize(context.Background(), s.done))
	}
	errs = append(errs, s.dev.Free(s.misc), s.dev.Free(s.scan), s.dev.Free(s.io))
	if s.stage != nil {
		errs = append(errs, s.dev.FreeHost(s.stage))
	}
	errs = append(errs, s.dev.DestroyEvent(s.done))
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
