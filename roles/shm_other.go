//go:build !linux

package roles

import "errors"

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
