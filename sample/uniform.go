package sample

import "math/rand/v2"

// Uniform selects every present item with the same probability. Insert, Update,
// Delete and a single pick are O(1) (a dense array with swap-remove).
type Uniform struct {
	idx slotIndex
}

var _ Selector = (*Uniform)(nil)

// NewUniform returns an empty uniform selector.
func NewUniform() *Uniform { return &Uniform{} }

// Kind reports KindUniform.
func (u *Uniform) Kind() Kind { return KindUniform }

// Check refuses only NaN.
func (u *Uniform) Check(priority float64) error { return checkNotNaN(KindUniform, priority) }

// Insert adds slot; the priority is checked but otherwise ignored.
func (u *Uniform) Insert(slot int, priority float64) error {
	if err := u.Check(priority); err != nil {
		return err
	}
	if slot < 0 || u.idx.has(slot) {
		return errSlot(KindUniform, slot, u.idx.has(slot))
	}
	u.idx.add(slot)
	return nil
}

// Update checks the priority; the selection does not depend on it.
func (u *Uniform) Update(slot int, priority float64) error {
	if err := u.Check(priority); err != nil {
		return err
	}
	if !u.idx.has(slot) {
		return errSlot(KindUniform, slot, false)
	}
	return nil
}

// Delete removes slot.
func (u *Uniform) Delete(slot int) {
	if u.idx.has(slot) {
		u.idx.remove(slot)
	}
}

// Sample draws len(dst) slots uniformly with replacement.
func (u *Uniform) Sample(r *rand.Rand, dst []Pick) {
	n := len(u.idx.slots)
	if n == 0 {
		panic("sample: uniform selector: Sample on an empty selector")
	}
	p := 1 / float64(n)
	for i := range dst {
		dst[i] = Pick{Slot: int(u.idx.slots[r.IntN(n)]), Probability: p}
	}
}

// Len is the number of present slots.
func (u *Uniform) Len() int { return len(u.idx.slots) }

// Clear removes every slot.
func (u *Uniform) Clear() { u.idx.clear() }

// Slots appends the present slots to dst, in the selector's internal order.
func (u *Uniform) Slots(dst []int) []int {
	for _, s := range u.idx.slots {
		dst = append(dst, int(s))
	}
	return dst
}
