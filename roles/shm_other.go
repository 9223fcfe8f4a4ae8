//go:build !linux

package roles

import (
	"errors"
	"time"
)

// Without Linux futexes the streams use TCP only; TransportShm is refused.
const shmSupported = false

var errNoShm = errors.New("roles: shared-memory streams need Linux")

func createSegment(name string, size int) (*segment, error) { return nil, errNoShm }
func openSegment(name string, size int) (*segment, error)   { return nil, errNoShm }

// anonSegment gives Go memory the layout of a segment.
func anonSegment(size int) (*segment, error) {
	return &segment{owner: true, fd: -1, mem: make([]byte, size)}, nil
}

func probeOwner(fd int) bool          { return true }
func unmapMem(mem []byte)             {}
func closeFD(fd int)                  {}
func unlinkSegment(name string) error { return nil }

// futexWait without futexes: a short sleep, after which the caller rechecks.
func futexWait(addr *uint32, val uint32, d time.Duration) { time.Sleep(min(d, 50*time.Microsecond)) }
func futexWake(addr *uint32, n int)                       {}
