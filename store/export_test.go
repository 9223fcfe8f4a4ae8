package store

import "time"

// SetCommittingHook makes every commit through s call f after reserving its
// insertion sequence and before publishing the row (nil removes the hook). Set
// it before any commit through s; only child processes of the tests do.
func SetCommittingHook(s *Shard, f func()) { s.committing = f }

// ScanPause is how long a waiting Allocate leaves the status table alone after
// a scan that found no row to take.
const ScanPause = scanPause

// Evict runs one eviction round of s for want rows, as a waiting Allocate
// does, and returns the rows it reserved and the time before which the next
// round skips its status-table scan.
func Evict(s *Shard, want int) (rows []uint32, idleUntil time.Time) {
	rows = s.evict(want, nil)
	s.ev.mu.Lock()
	defer s.ev.mu.Unlock()
	return rows, s.ev.idleUntil
}

// PinEntries is how many Views of one handle the pin journal records.
const PinEntries = pinEntries

// Journal returns how many entries of s's slot in the pin journal hold a row,
// and how many s counts as recorded.
func Journal(s *Shard) (entries, held int) {
	for e := range pinEntries {
		if s.pins.word(s.slot, e).Load() != 0 {
			entries++
		}
	}
	return entries, int(s.pins.held.Load())
}

// FreeBell is the free queue's bell word: a push moves it when a writer sleeps
// on it.
func (s *Shard) FreeBell() uint32 { return s.free.bell.word.Load() }

// FreeSleeping reports whether a writer may sleep on the free queue's bell.
func (s *Shard) FreeSleeping() bool { return s.free.bell.sleeping.Load() != 0 }
