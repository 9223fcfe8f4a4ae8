package store

import (
	"sync/atomic"
	"unsafe"
)

// The pin journal lets the pins of a process that dies be given back.
//
// A View is a pin: a count in its row's status word, which says nothing of who
// holds it. So each handle also writes the rows it holds Views of into its
// slot's journal in the segment (pinEntries words for each of the first
// pinSlots slots, 256 KiB in all, beside the writer slots): an entry is the row's index + 1 in its low 32 bits and a tag of the
// handle's process identity in its high 32 bits. Reclaim, finding a slot's
// process dead, takes each of its entries (a compare-and-swap to zero, so that
// two reclaiming processes never both give one back) and unpins the row.
//
// The order makes a crash leak rather than double-free: Read pins, then writes
// the entry; Done clears the entry, then unpins; Reclaim clears, then unpins.
// A process that dies between the two steps leaves one pin that nobody gives
// back (the row stays until the shard is closed), never a pin given back
// twice. A handle holding more than pinEntries Views at once keeps the rest
// out of the journal, with the old behaviour: they are not given back if the
// process dies; so are all the Views of a handle whose slot is beyond
// pinSlots (more than 63 handles attached at once).
type pinJournal struct {
	base unsafe.Pointer // maxSlots x pinEntries words
	tag  uint64         // this handle's tag, in the high 32 bits
	next atomic.Uint32  // where record looks for a free entry first
	held atomic.Int32   // entries this handle has recorded and not forgotten
}

func (j *pinJournal) word(slot, e int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Add(j.base, (slot*pinEntries+e)*8))
}

// pinTag is the journal tag of a process identity (never zero).
func pinTag(ident uint64) uint64 {
	return uint64(uint32(ident)^uint32(ident>>32)|1) << 32
}

// start readies the journal for a handle of the process ident.
func (j *pinJournal) start(ident uint64) { j.tag = pinTag(ident) }

// record writes row i (pinned by this handle) into a free entry of slot's
// journal and returns the entry + 1, or 0 when every entry is taken. Only
// this handle writes its slot's entries (and a reclaimer, once the process
// is dead), so a free entry is found by compare-and-swap from a rotating
// start, without a lock. A full journal returns at once: a handle holding
// more Views than entries (a batch of 1024 rows collected onto a GPU) would
// otherwise scan every entry for each View past the first pinEntries.
func (j *pinJournal) record(slot int, i uint32) int32 {
	if slot >= pinSlots || j.held.Load() >= pinEntries {
		return 0
	}
	v := j.tag | uint64(i) + 1
	first := int(j.next.Add(1))
	for k := range pinEntries {
		e := (first + k) & (pinEntries - 1)
		if w := j.word(slot, e); w.Load() == 0 && w.CompareAndSwap(0, v) {
			j.held.Add(1)
			return int32(e) + 1
		}
	}
	return 0
}

// forget clears the entry record returned (0: none), before the unpin.
func (j *pinJournal) forget(slot int, entry int32) {
	if entry != 0 {
		j.word(slot, int(entry-1)).Store(0)
		j.held.Add(-1)
	}
}

// takeDead clears every entry of slot written by the dead process of
// identity id and returns their rows, for the caller to unpin.
func (j *pinJournal) takeDead(slot int, id uint64, rows []uint32) []uint32 {
	if slot >= pinSlots {
		return rows
	}
	tag := pinTag(id)
	for e := range pinEntries {
		w := j.word(slot, e)
		x := w.Load()
		if x == 0 || x&^0xffffffff != tag {
			continue
		}
		if w.CompareAndSwap(x, 0) {
			rows = append(rows, uint32(x)-1)
		}
	}
	return rows
}
