package replay

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
)

// Prioritized is a fixed-capacity table with a prioritized sampler and a
// first-in-first-out remover, storing transitions in columns.
type Prioritized struct {
	capacity int
	obsSize  int
	exponent float64
	rng      *rand.Rand
	tree     *SumTree

	keys      []uint64 // per slot; 0 = empty
	prios     []float64
	obs       []float32
	next      []float32
	actions   []int32
	rewards   []float32
	discounts []float32
	nextKey   uint64 // keys are 1, 2, 3, ...; slot = (key-1) % capacity
	size      int
	inserts   int64
	samples   int64
}

var _ Table = (*Prioritized)(nil)

// NewPrioritized returns an empty table of the given capacity for observations
// of obsSize values, sampling with priority exponent α (Reverb's
// Prioritized(priority_exponent)) from rng.
func NewPrioritized(capacity, obsSize int, exponent float64, rng *rand.Rand) (*Prioritized, error) {
	if capacity < 1 || obsSize < 1 {
		return nil, fmt.Errorf("replay: capacity %d and observation size %d must be positive", capacity, obsSize)
	}
	if exponent < 0 || math.IsNaN(exponent) || math.IsInf(exponent, 0) {
		return nil, fmt.Errorf("replay: priority exponent %v must be finite and non-negative", exponent)
	}
	return &Prioritized{
		capacity:  capacity,
		obsSize:   obsSize,
		exponent:  exponent,
		rng:       rng,
		tree:      NewSumTree(capacity),
		keys:      make([]uint64, capacity),
		prios:     make([]float64, capacity),
		obs:       make([]float32, capacity*obsSize),
		next:      make([]float32, capacity*obsSize),
		actions:   make([]int32, capacity),
		rewards:   make([]float32, capacity),
		discounts: make([]float32, capacity),
		nextKey:   1,
	}, nil
}

// Size returns the number of items in the table.
func (p *Prioritized) Size() int { return p.size }

// Capacity returns the most items the table holds.
func (p *Prioritized) Capacity() int { return p.capacity }

// Inserts returns the number of items inserted so far.
func (p *Prioritized) Inserts() int64 { return p.inserts }

// Samples returns the number of items sampled so far.
func (p *Prioritized) Samples() int64 { return p.samples }

func (p *Prioritized) weight(priority float64) float64 {
	switch p.exponent {
	case 0:
		return 1
	case 1:
		return priority
	}
	return math.Pow(priority, p.exponent)
}

func checkPriority(priority float64) error {
	if priority < 0 || math.IsNaN(priority) || math.IsInf(priority, 0) {
		return fmt.Errorf("replay: priority %v must be finite and non-negative", priority)
	}
	return nil
}

// Insert copies t into the table with the given priority, removing the oldest
// item when the table is full, and returns the new item's key.
func (p *Prioritized) Insert(ctx context.Context, t Transition, priority float64) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := checkPriority(priority); err != nil {
		return 0, err
	}
	if len(t.Obs) != p.obsSize || len(t.NextObs) != p.obsSize {
		return 0, fmt.Errorf("replay: observations of %d and %d values, want %d", len(t.Obs), len(t.NextObs), p.obsSize)
	}
	key := p.nextKey
	p.nextKey++
	slot := int((key - 1) % uint64(p.capacity))
	if p.keys[slot] == 0 {
		p.size++
	}
	p.keys[slot] = key
	p.prios[slot] = priority
	copy(p.obs[slot*p.obsSize:(slot+1)*p.obsSize], t.Obs)
	copy(p.next[slot*p.obsSize:(slot+1)*p.obsSize], t.NextObs)
	p.actions[slot] = t.Action
	p.rewards[slot] = t.Reward
	p.discounts[slot] = t.Discount
	p.tree.Set(slot, p.weight(priority))
	p.inserts++
	return key, nil
}

// Sample fills b with b.Len() items, each drawn independently with probability
// p^α / Σ p^α, and the sample information (key, probability, priority, table size).
func (p *Prioritized) Sample(ctx context.Context, b *Batch) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.ObsSize != p.obsSize {
		return fmt.Errorf("replay: batch for observations of %d values, table has %d", b.ObsSize, p.obsSize)
	}
	total := p.tree.Total()
	if p.size == 0 || total <= 0 {
		return ErrEmpty
	}
	d := p.obsSize
	for i := range b.Keys {
		slot := p.tree.Find(p.rng.Float64() * total)
		b.Keys[i] = p.keys[slot]
		b.Probabilities[i] = p.tree.Get(slot) / total
		b.Priorities[i] = p.prios[slot]
		copy(b.Obs[i*d:(i+1)*d], p.obs[slot*d:(slot+1)*d])
		copy(b.NextObs[i*d:(i+1)*d], p.next[slot*d:(slot+1)*d])
		b.Actions[i] = p.actions[slot]
		b.Rewards[i] = p.rewards[slot]
		b.Discounts[i] = p.discounts[slot]
	}
	b.TableSize = p.size
	p.samples += int64(len(b.Keys))
	return nil
}

// UpdatePriorities sets the priority of each key still in the table; keys that
// were removed (or never existed) are ignored, as in Reverb.
func (p *Prioritized) UpdatePriorities(ctx context.Context, keys []uint64, priorities []float64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(keys) != len(priorities) {
		return fmt.Errorf("replay: %d keys and %d priorities", len(keys), len(priorities))
	}
	for i, key := range keys {
		if err := checkPriority(priorities[i]); err != nil {
			return err
		}
		if key == 0 {
			continue
		}
		slot := int((key - 1) % uint64(p.capacity))
		if p.keys[slot] != key {
			continue
		}
		p.prios[slot] = priorities[i]
		p.tree.Set(slot, p.weight(priorities[i]))
	}
	return nil
}
