package sample

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gear-rl/gear/sample/reverb"
)

// Kind names a selection strategy. The distributed table uses it to choose how a
// collective sample is drawn (split draw, centralized, decentralized).
type Kind int

// The selection strategies of Reverb.
const (
	KindUniform Kind = iota + 1
	KindPrioritized
	KindFIFO
	KindLIFO
	KindMaxHeap
	KindMinHeap
)

// String is the kind's name, package reverb's (reverb.Selectors, in the
// order of the kinds).
func (k Kind) String() string {
	if names := reverb.Selectors(); k >= KindUniform && int(k) <= len(names) {
		return names[k-KindUniform]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Pick is one selection: the slot of the chosen item and the probability with which
// it was chosen (1 for the deterministic strategies).
type Pick struct {
	Slot        int
	Probability float64
}

// A Selector keeps its own index of a table's items and chooses among them. A table
// uses two: the sampler, which answers samples, and the remover, which picks the
// victim when the table is over its maximum size. Every selector can play both roles.
//
// Items are addressed by slot, a small non-negative integer the table assigns to
// each live item (in a shard-backed table, the item's row), so selectors keep plain
// arrays and no maps. A slot is present at most once.
//
// Selectors are synchronous and not safe for concurrent use; the table serialises
// calls. Randomness comes only from the *rand.Rand passed to Sample, so a selector
// fed the same operations and the same seeded source makes the same choices.
type Selector interface {
	// Kind reports the strategy.
	Kind() Kind
	// Check reports whether priority is acceptable, without changing anything.
	Check(priority float64) error
	// Insert adds slot with priority. It fails, changing nothing, when Check
	// fails or slot is negative or present.
	Insert(slot int, priority float64) error
	// Update sets the priority of a present slot. It fails, changing nothing,
	// when Check fails or slot is absent.
	Update(slot int, priority float64) error
	// Delete removes slot; an absent slot is ignored.
	Delete(slot int)
	// Sample fills dst with len(dst) picks, each drawn independently from the
	// current state (so a pick may repeat). It panics when Len is 0.
	Sample(r *rand.Rand, dst []Pick)
	// Len is the number of present slots.
	Len() int
	// Clear removes every slot.
	Clear()
}

// checkNotNaN is the priority check shared by every selector.
func checkNotNaN(kind Kind, priority float64) error {
	if math.IsNaN(priority) {
		return fmt.Errorf("sample: %s selector: priority NaN refused", kind)
	}
	return nil
}

// slotIndex maps slots to dense positions and back; it is the bookkeeping the
// swap-remove selectors share.
type slotIndex struct {
	pos   []int32 // slot -> position, -1 when absent
	slots []int32 // position -> slot
}

func (s *slotIndex) has(slot int) bool {
	return slot >= 0 && slot < len(s.pos) && s.pos[slot] >= 0
}

// growPositions returns pos (positions by slot, -1 for an absent slot) grown,
// if need be, to hold slot: at least doubled, the new slots absent.
func growPositions[T int32 | int64](pos []T, slot int) []T {
	if slot < len(pos) {
		return pos
	}
	grown := make([]T, max(2*len(pos), slot+1, 16))
	copy(grown, pos)
	for i := len(pos); i < len(grown); i++ {
		grown[i] = -1
	}
	return grown
}

// add appends slot at position len(slots) and returns the position.
func (s *slotIndex) add(slot int) int {
	s.pos = growPositions(s.pos, slot)
	p := len(s.slots)
	s.pos[slot] = int32(p)
	s.slots = append(s.slots, int32(slot))
	return p
}

// remove deletes slot by moving the last position into its place. It returns the
// freed position and the position that moved into it (equal when slot was last).
func (s *slotIndex) remove(slot int) (hole, last int) {
	hole = int(s.pos[slot])
	last = len(s.slots) - 1
	moved := s.slots[last]
	s.slots[hole] = moved
	s.pos[moved] = int32(hole)
	s.pos[slot] = -1
	s.slots = s.slots[:last]
	return hole, last
}

func (s *slotIndex) clear() {
	for _, sl := range s.slots {
		s.pos[sl] = -1
	}
	s.slots = s.slots[:0]
}

func errSlot(kind Kind, slot int, present bool) error {
	if present {
		return fmt.Errorf("sample: %s selector: slot %d already present", kind, slot)
	}
	if slot < 0 {
		return fmt.Errorf("sample: %s selector: slot %d is negative", kind, slot)
	}
	return fmt.Errorf("sample: %s selector: slot %d not present", kind, slot)
}
