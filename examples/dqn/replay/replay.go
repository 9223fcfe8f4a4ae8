package replay

import (
	"context"
	"errors"
)

// ErrEmpty is returned by Sample when the table holds no item with a positive priority.
var ErrEmpty = errors.New("replay: no item to sample")

// Transition is one (possibly n-step) transition: from Obs, Action was taken,
// Reward is the discounted sum of the rewards collected until NextObs, and
// Discount is the factor that multiplies the bootstrap value of NextObs (γ^n, or
// 0 when the episode terminated in between).
type Transition struct {
	Obs      []float32
	Action   int32
	Reward   float32
	Discount float32
	NextObs  []float32
}

// Batch is a sampled batch in columns, with Reverb's sample information per item.
type Batch struct {
	// Keys identify the sampled items for UpdatePriorities.
	Keys []uint64
	// Probabilities are the probabilities with which each item was drawn.
	Probabilities []float64
	// Priorities are the items' priorities when they were drawn.
	Priorities []float64
	// TableSize is the number of items in the table when the batch was drawn.
	TableSize int

	ObsSize   int
	Obs       []float32 // len(Keys)×ObsSize
	Actions   []int32
	Rewards   []float32
	Discounts []float32
	NextObs   []float32 // len(Keys)×ObsSize
}

// NewBatch returns a batch of size items with observations of obsSize values.
func NewBatch(size, obsSize int) *Batch {
	return &Batch{
		Keys:          make([]uint64, size),
		Probabilities: make([]float64, size),
		Priorities:    make([]float64, size),
		ObsSize:       obsSize,
		Obs:           make([]float32, size*obsSize),
		Actions:       make([]int32, size),
		Rewards:       make([]float32, size),
		Discounts:     make([]float32, size),
		NextObs:       make([]float32, size*obsSize),
	}
}

// Len returns the number of items in the batch.
func (b *Batch) Len() int { return len(b.Keys) }

// Table is the replay a learner needs: Reverb's insert, sample and priority update.
type Table interface {
	// Insert copies t into the table with the given priority and returns its key.
	Insert(ctx context.Context, t Transition, priority float64) (uint64, error)
	// Sample fills b with b.Len() items drawn independently, with replacement.
	// It returns ErrEmpty when there is nothing to draw.
	Sample(ctx context.Context, b *Batch) error
	// UpdatePriorities sets the priority of each key still in the table.
	UpdatePriorities(ctx context.Context, keys []uint64, priorities []float64) error
	// Size returns the number of items in the table.
	Size() int
}
