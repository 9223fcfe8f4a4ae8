package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/errmark"
)

// shmDir is where POSIX shared memory lives on Linux (shm_open is open(2) there).
const shmDir = "/dev/shm"

// checkName checks a segment name: one path element, no slash, at most 255 bytes.
func checkName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return errmark.Errorf(ErrName, "store: segment name %q: want a name such as gear.<job>.store", name)
	case strings.ContainsRune(name, '/') || strings.ContainsRune(name, 0):
		return errmark.Errorf(ErrName, "store: segment name %q contains '/' or NUL", name)
	case len(name) > 255:
		return errmark.Errorf(ErrName, "store: segment name of %d bytes: at most 255", len(name))
	}
	return nil
}

func segmentPath(name string) string { return shmDir + "/" + name }

// createSegment makes /dev/shm/name (mode 0600, failing if it exists), sizes it,
// reserves its pages and maps it.
func createSegment(name string, size int) ([]byte, error) {
	path := segmentPath(name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &fs.PathError{Op: "create", Path: path, Err: err}
	}
	defer unix.Close(fd)
	fail := func(op string, err error) ([]byte, error) {
		_ = unix.Unlink(path)
		return nil, fmt.Errorf("%s %s: %w", op, path, err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fail("chmod", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("size", err)
	}
	// Reserve the pages now, so that a full /dev/shm is an error here rather than a
	// SIGBUS on some later write.
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return fail(fmt.Sprintf("reserve %d bytes for", size), err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fail("map", err)
	}
	return mem, nil
}

// openSegment maps an existing /dev/shm/name whole.
func openSegment(name string) ([]byte, error) {
	path := segmentPath(name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Size < offEnc {
		return nil, errNotReady
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, &fs.PathError{Op: "map", Path: path, Err: err}
	}
	return mem, nil
}

// Remove unlinks the shared-memory segment name (as `gearrun clean` does for the
// segments of dead jobs). Processes that have it mapped keep their mapping. It
// returns an error wrapping fs.ErrNotExist if there is no such segment.
func Remove(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := unix.Unlink(segmentPath(name)); err != nil {
		return &fs.PathError{Op: "remove", Path: segmentPath(name), Err: err}
	}
	return nil
}

// Info describes a shard segment as Inspect finds it.
type Info struct {
	Name       string
	Size       int64
	Spec       Spec
	OwnerPID   int
	OwnerAlive bool // the creating process still runs
	Ready      bool // set up and not closed
	Closed     bool // its owner closed it (and should have removed it)
}

// Inspect reads a segment's header without attaching to it, for tools that list or
// clean segments.
func Inspect(name string) (Info, error) {
	if err := checkName(name); err != nil {
		return Info{}, err
	}
	mem, err := openSegment(name)
	if err != nil {
		return Info{Name: name}, wrapOp(fmt.Sprintf("inspect %q", name), err)
	}
	defer unix.Munmap(mem)
	info := Info{Name: name, Size: int64(len(mem))}
	owner := binary.LittleEndian.Uint64(mem[offOwner:])
	info.OwnerPID = int(owner >> 32)
	info.OwnerAlive = owner != 0 && identAlive(owner)
	st := (*atomic.Uint32)(unsafe.Pointer(&mem[offState])).Load()
	info.Ready = st == stateReady
	info.Closed = st == stateClosed
	l, err := parseHeader(mem, int64(len(mem)))
	if err != nil {
		return info, wrapOp(fmt.Sprintf("inspect %q", name), err)
	}
	info.Spec = l.spec.normalized()
	return info, nil
}

// selfIdent is this process's identity (procIdent of its own pid).
func selfIdent() (uint64, error) {
	ident, ok := procIdent(os.Getpid())
	if !ok {
		return 0, errors.New("store: cannot read this process's start time from /proc")
	}
	return ident, nil
}

// procIdent returns the identity of a live process: pid<<32 | the low 32 bits of its
// start time (clock ticks since boot), which tells a process apart from a later one
// that reuses its pid. It returns false for a process that is gone or a zombie.
func procIdent(pid int) (uint64, bool) {
	if pid <= 0 || pid > 1<<31-1 {
		return 0, false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name is in parentheses and may contain anything: the fields we
	// need come after the last ')'. Then: state (field 3) ... starttime (field 22).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false
	}
	if f[0] == "Z" || f[0] == "X" || f[0] == "x" {
		return 0, false
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, false
	}
	return uint64(pid)<<32 | uint64(uint32(start)), true
}

// identAlive reports whether the process with identity id (from procIdent) still runs.
func identAlive(id uint64) bool {
	cur, ok := procIdent(int(id >> 32))
	return ok && cur == id
}

// Census is a shard's rows by state and its writers attached, as CountRows
// finds them.
type Census struct {
	Stats
	Writers int // processes with a writer slot (the owner included)
}

// CountRows counts the rows of the shard segment name in each state and the
// writers attached to it, without attaching (for tools such as gearrun top,
// which read a running job's shards). It scans the status table: O(capacity).
func CountRows(name string) (Census, error) {
	if err := checkName(name); err != nil {
		return Census{}, err
	}
	mem, err := openSegment(name)
	if err != nil {
		return Census{}, wrapOp(fmt.Sprintf("count rows of %q", name), err)
	}
	defer unix.Munmap(mem)
	if (*atomic.Uint32)(unsafe.Pointer(&mem[offState])).Load() != stateReady {
		return Census{}, wrapOp(fmt.Sprintf("count rows of %q", name), errNotReady)
	}
	l, err := parseHeader(mem, int64(len(mem)))
	if err != nil {
		return Census{}, wrapOp(fmt.Sprintf("count rows of %q", name), err)
	}
	base := unsafe.Pointer(&mem[0])
	s := &Shard{
		status:  unsafe.Add(base, l.statusOff),
		slots:   unsafe.Add(base, l.slotsOff),
		removed: (*atomic.Uint64)(unsafe.Add(base, offRemovals)),
		cap:     uint32(l.spec.Capacity),
		log:     newCommitLog((*atomic.Uint64)(unsafe.Add(base, offLogTail)), unsafe.Add(base, l.logOff), l.logCells),
	}
	c := Census{Stats: s.Stats()}
	for i := 1; i < maxSlots; i++ {
		if s.slotWord(i).Load() != 0 {
			c.Writers++
		}
	}
	return c, nil
}
