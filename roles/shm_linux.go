//go:build linux

package roles

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

const shmDir = "/dev/shm/"

// shmSupported: shared memory and futexes are available.
const shmSupported = true

// createSegment makes, sizes, locks and maps a new segment; it fails if the name
// exists. The caller writes the header and then the magic.
func createSegment(name string, size int) (*segment, error) {
	path := shmDir + name
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("roles: create shared memory %s: %w", name, err)
	}
	fail := func(what string, err error) (*segment, error) {
		unix.Close(fd)
		unix.Unlink(path)
		return nil, fmt.Errorf("roles: %s shared memory %s: %w", what, name, err)
	}
	// The exclusive lock is the owner's heartbeat: the kernel drops it when the
	// process ends, however it ends.
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fail("lock", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Sprintf("size to %d bytes", size), err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("map", err)
	}
	return &segment{name: name, owner: true, fd: fd, mem: mem}, nil
}

// openSegment maps an existing segment of exactly size bytes.
func openSegment(name string, size int) (*segment, error) {
	fd, err := unix.Open(shmDir+name, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("roles: open shared memory %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("roles: stat shared memory %s: %w", name, err)
	}
	if st.Size != int64(size) {
		unix.Close(fd)
		return nil, fmt.Errorf("roles: shared memory %s has %d bytes, want %d", name, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("roles: map shared memory %s: %w", name, err)
	}
	return &segment{name: name, fd: fd, mem: mem}, nil
}

// anonSegment maps private anonymous memory with a segment's layout, for a
// server that shares nothing (TransportTCP). Its accesses are, like those of a
// shared segment, outside the Go heap.
func anonSegment(size int) (*segment, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("roles: map %d bytes: %w", size, err)
	}
	return &segment{owner: true, fd: -1, mem: mem}, nil
}

// probeOwner reports whether the owner still holds its exclusive lock on fd's
// file.
func probeOwner(fd int) bool {
	err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB)
	if err == nil {
		unix.Flock(fd, unix.LOCK_UN)
		return false
	}
	return true // EWOULDBLOCK: held; any other error: no evidence of death
}

func unmapMem(mem []byte) { unix.Munmap(mem) }
func closeFD(fd int)      { unix.Close(fd) }

func unlinkSegment(name string) error {
	if err := unix.Unlink(shmDir + name); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("roles: remove shared memory %s: %w", name, err)
	}
	return nil
}
