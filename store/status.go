package store

import (
	"fmt"
	"math"
	"sync/atomic"
)

// A row's status word (one uint64, changed only by compare-and-swap):
//
//	bits 0-1   phase: free, writing, committing, committed
//	bit  2     doomed: released while pinned; freed by the last unpin
//	           (committed); reserved: in the chunk of the writer in bits 3-12 (free)
//	bits 3-12  writer slot (reserved, writing and committing only)
//	bits 13-28 pins (committed only)
//	bits 29-63 generation, incremented by every allocation of the row
const (
	phaseFree       = 0
	phaseWriting    = 1
	phaseCommitting = 2
	phaseCommitted  = 3
	phaseMask       = 3

	doomedBit   = 1 << 2
	reservedBit = doomedBit // in phase free: the row is in a writer's chunk
	slotShift   = 3
	slotMask    = (maxSlots - 1) << slotShift
	pinShift    = 13
	pinOne      = 1 << pinShift
	maxPins     = 1<<16 - 1
	pinMask     = maxPins << pinShift
	genShift    = 29
)

func phaseOf(x uint64) uint64 { return x & phaseMask }
func slotOf(x uint64) int     { return int((x & slotMask) >> slotShift) }
func pinsOf(x uint64) int     { return int((x & pinMask) >> pinShift) }
func genOf(x uint64) uint64   { return x >> genShift }

func freeWord(gen uint64) uint64 { return gen << genShift }
func writingWord(gen uint64, slot int) uint64 {
	return gen<<genShift | uint64(slot)<<slotShift | phaseWriting
}
func reservedWord(gen uint64, slot int) uint64 {
	return gen<<genShift | uint64(slot)<<slotShift | reservedBit
}

// isReserved reports whether x is a free row held in a writer's chunk.
func isReserved(x uint64) bool { return phaseOf(x) == phaseFree && x&reservedBit != 0 }

func committingWord(w uint64) uint64 { return w&^phaseMask | phaseCommitting }
func committedWord(gen uint64) uint64 {
	return gen<<genShift | phaseCommitted
}

// statusRow is one row of the status table in shared memory (64 bytes, one cache
// line, so that writers of neighbouring rows do not share a line).
type statusRow struct {
	state    atomic.Uint64
	seq      atomic.Uint64
	key      atomic.Uint64
	priority atomic.Uint64 // float64 bits
	inserted atomic.Int64  // unix nanoseconds at commit
	sampled  atomic.Uint32
	_        uint32
	_        [2]uint64
}

// Ref names one committed occupant of a row: the row's index and the insertion
// sequence its commit received. A Ref goes stale when that occupant is released or
// evicted, even if the row is reused.
type Ref struct {
	Index int
	Seq   uint64
}

func (r Ref) String() string { return fmt.Sprintf("row %d (seq %d)", r.Index, r.Seq) }

// RowStatus is a snapshot of one committed row's status.
type RowStatus struct {
	Index        int
	Seq          uint64 // insertion sequence: commit order across the shard, from 0
	Key          uint64
	Priority     float64
	TimesSampled uint32
	InsertedAt   int64 // unix nanoseconds, from the shard's clock, at commit
}

// Ref returns the row's reference.
func (r RowStatus) Ref() Ref { return Ref{Index: r.Index, Seq: r.Seq} }

// load fills st from r's fields (the caller validates the state word around it).
func (r *statusRow) load(i int) RowStatus {
	return RowStatus{
		Index:        i,
		Seq:          r.seq.Load(),
		Key:          r.key.Load(),
		Priority:     math.Float64frombits(r.priority.Load()),
		TimesSampled: r.sampled.Load(),
		InsertedAt:   r.inserted.Load(),
	}
}
