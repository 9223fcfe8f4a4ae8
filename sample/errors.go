package sample

import (
	"encoding/binary"
	"errors"
)

// ErrClosed is returned by every call on a closed table, and wakes every call that
// was waiting when the table closed.
var ErrClosed = errors.New("sample: table closed")

// ErrEvicted is wrapped by the error of a collection (Collect,
// CollectBatch, a distributed table's, on the host or the device) when an
// item of the batch was evicted between the sample and the collection (the
// remover may take an item that the batch does not hold): sample again.
var ErrEvicted = errors.New("item evicted since it was sampled")

// ErrPriority is matched (errors.Is) by the error of a priority that the
// table's sampler or remover refuses: NaN for every selector; for the
// prioritized one also a negative or infinite priority, or one whose weight
// overflows.
var ErrPriority = errors.New("sample: priority refused")

// le is the byte order of every message the distributed table sends.
var le = binary.LittleEndian
