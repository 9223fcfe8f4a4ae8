package sample

import (
	"encoding/binary"
	"errors"
)

// ErrClosed is returned by every call on a closed table, and wakes every call that
// was waiting when the table closed.
var ErrClosed = errors.New("sample: table closed")

// le is the byte order of every message the distributed table sends.
var le = binary.LittleEndian
