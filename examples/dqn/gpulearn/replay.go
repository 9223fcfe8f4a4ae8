package gpulearn

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"syscall"
	"unsafe"

	"github.com/gear-rl/gear/cuda"
	"github.com/gear-rl/gear/examples/dqn/agent"
	"github.com/gear-rl/gear/examples/dqn/replay"
)

// Replay is a prioritized replay that feeds a Learner the GEAR way: its
// transitions live in a host shard (memory mapped outside the Go heap and
// registered with the driver), their sampling weights (priority^α, float32)
// in device memory. A step samples on the GPU (cuda.Sampler), gathers the
// chosen rows zero-copy from the shard into device memory (cuda.Gatherer, no
// host staging copy), computes the importance weights from the sampler's
// total on the device, runs the learner, and writes the new priorities back
// into the sampling weights on the device.
//
// Insert writes a row into the shard (FIFO once full) and its weight; it must
// not run during Learn. A Replay is not safe for concurrent use.
type Replay struct {
	l        *Learner
	dev      *cuda.Device
	layout   Layout
	capacity int
	alpha    float64
	rng      *rand.Rand

	shard    []byte // mmap'd, registered
	shardDev cuda.DevicePtr
	weights  cuda.DevicePtr // capacity float32
	rows     cuda.DevicePtr // batch rows, gathered
	idxDev   cuda.DevicePtr // batch int64
	isw      cuda.DevicePtr // batch float64
	sampler  *cuda.Sampler
	gatherer *cuda.Gatherer
	pinned   []byte // the batch's indices, then one weight for Insert
	idx      []int64
	one      []float32
	draws    []float64

	next, size int
	closed     bool
}

var _ agent.DeviceReplay = (*Replay)(nil)

// NewReplay returns an empty replay of capacity transitions for learner l,
// with priority exponent alpha; rng draws the samples.
func NewReplay(l *Learner, capacity int, alpha float64, rng *rand.Rand) (*Replay, error) {
	if capacity < 1 || !(alpha >= 0) {
		return nil, fmt.Errorf("gpulearn: replay of capacity %d, priority exponent %g", capacity, alpha)
	}
	r := &Replay{l: l, dev: l.dev, layout: l.layout, capacity: capacity, alpha: alpha, rng: rng,
		draws: make([]float64, l.batch)}
	if err := r.open(); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	return r, nil
}

func (r *Replay) open() error {
	var err error
	size := r.capacity * r.layout.Bytes()
	if r.shard, err = syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE); err != nil {
		return fmt.Errorf("gpulearn: shard: %w", err)
	}
	if r.shardDev, err = r.dev.RegisterHost(r.shard); err != nil {
		return err
	}
	b := r.l.batch
	if r.weights, err = r.dev.Alloc(4 * r.capacity); err != nil {
		return err
	}
	if err = r.dev.MemsetAsync(r.weights, 0, 4*r.capacity, 0); err != nil {
		return err
	}
	if r.rows, err = r.dev.Alloc(b * r.layout.Bytes()); err != nil {
		return err
	}
	if r.idxDev, err = r.dev.Alloc(8 * b); err != nil {
		return err
	}
	if r.isw, err = r.dev.Alloc(8 * b); err != nil {
		return err
	}
	if r.pinned, err = r.dev.AllocHost(8*b + 8); err != nil {
		return err
	}
	r.idx = unsafe.Slice((*int64)(unsafe.Pointer(unsafe.SliceData(r.pinned))), b)
	r.one = unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(r.pinned)), 8*b)), 1)
	if r.sampler, err = r.dev.NewSampler(); err != nil {
		return err
	}
	r.gatherer, err = r.dev.NewGatherer()
	return err
}

// Close releases the replay's device memory, shard and helpers. The learner
// must still be open (it owns the stream the replay's work ran on).
func (r *Replay) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	if r.l != nil && !r.l.closed {
		errs = append(errs, r.dev.StreamSynchronize(context.Background(), r.l.st))
	}
	if r.gatherer != nil {
		errs = append(errs, r.gatherer.Close())
	}
	if r.sampler != nil {
		errs = append(errs, r.sampler.Close())
	}
	for _, p := range []cuda.DevicePtr{r.weights, r.rows, r.idxDev, r.isw} {
		errs = append(errs, r.dev.Free(p))
	}
	if r.pinned != nil {
		errs = append(errs, r.dev.FreeHost(r.pinned))
	}
	if r.shardDev != 0 {
		errs = append(errs, r.dev.UnregisterHost(r.shard))
	}
	if r.shard != nil {
		errs = append(errs, syscall.Munmap(r.shard))
	}
	return errors.Join(errs...)
}

// Size is the number of transitions held.
func (r *Replay) Size() int { return r.size }

// Insert writes t into the shard with the given priority.
func (r *Replay) Insert(ctx context.Context, t replay.Transition, priority float64) error {
	d := r.layout.ObsSize
	if len(t.Obs) != d || len(t.NextObs) != d {
		return fmt.Errorf("gpulearn: transition of %d and %d values, want %d", len(t.Obs), len(t.NextObs), d)
	}
	// The previous step's gather may still read the shard, and its write-back
	// the weights.
	if err := r.dev.StreamSynchronize(ctx, r.l.st); err != nil {
		return err
	}
	slot := r.next
	words := r.layout.Words()
	row := unsafe.Slice((*uint32)(unsafe.Pointer(&r.shard[slot*r.layout.Bytes()])), words)
	for k := 0; k < d; k++ {
		row[k] = math.Float32bits(t.Obs[k])
		row[r.layout.Next()+k] = math.Float32bits(t.NextObs[k])
	}
	row[r.layout.Action()] = uint32(t.Action)
	row[r.layout.Reward()] = math.Float32bits(t.Reward)
	row[r.layout.Discount()] = math.Float32bits(t.Discount)
	r.one[0] = float32(math.Pow(priority, r.alpha))
	if err := r.dev.CopyHtoD(r.weights.Add(4*slot), unsafe.Slice((*byte)(unsafe.Pointer(&r.one[0])), 4)); err != nil {
		return err
	}
	r.next = (r.next + 1) % r.capacity
	r.size = min(r.size+1, r.capacity)
	return nil
}

// Learn runs one batch through the learner's ComputeGradients the GEAR way
// (see Replay) and writes the batch's priorities back to the sampling
// weights. The caller then calls the learner's ApplyGradients. It returns
// replay.ErrEmpty while the replay is empty.
func (r *Replay) Learn(ctx context.Context, beta float64) (agent.Stats, error) {
	if r.size == 0 {
		return agent.Stats{}, replay.ErrEmpty
	}
	l, st, b := r.l, r.l.st, r.l.batch
	for i := range r.draws {
		r.draws[i] = r.rng.Float64()
	}
	// The sampler runs on the learner's stream and returns with the indices.
	if err := r.sampler.WeightedSample(ctx, st, r.weights, r.size, cuda.Float32, r.draws, r.idx); err != nil {
		return agent.Stats{}, err
	}
	if err := r.dev.CopyHtoDAsync(r.idxDev, unsafe.Slice((*byte)(unsafe.Pointer(&r.idx[0])), 8*b), st); err != nil {
		return agent.Stats{}, err
	}
	if err := r.dev.LaunchISWeights(st, r.isw, r.weights, r.idxDev, b, r.size, r.sampler.Total(), beta); err != nil {
		return agent.Stats{}, err
	}
	spec := cuda.GatherSpec{BlockBytes: r.layout.Bytes(), Capacity: r.capacity}
	if err := r.gatherer.Gather(ctx, st, r.rows, r.shardDev, r.idx, nil, spec); err != nil {
		return agent.Stats{}, err
	}
	stats, err := l.ComputeGradientsDevice(ctx, r.rows, r.isw)
	if err != nil {
		return stats, err
	}
	return stats, r.dev.LaunchPrioScatter(st, r.weights, r.idxDev, l.Item(), b, r.alpha)
}

// Weights copies the sampling weights of the first Size items to the host
// (for tests and inspection).
func (r *Replay) Weights() ([]float32, error) {
	out := make([]float32, r.size)
	if err := r.dev.StreamSynchronize(context.Background(), r.l.st); err != nil {
		return nil, err
	}
	return out, r.dev.CopyDtoH(f32Bytes(out), r.weights)
}

// Indices are the last batch's sampled indices (shard slots), in batch order;
// valid until the next Learn.
func (r *Replay) Indices() []int64 { return r.idx }
