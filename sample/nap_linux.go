package sample

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// timerfd is a napClock on a Linux timerfd, read through Go's poller.
type timerfd struct {
	f   *os.File
	rc  syscall.RawConn // f's, for set
	buf [8]byte
}

// newNapClock returns a timerfd, or nil where none can be made (nap then
// uses Go's timer).
func newNapClock() napClock {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), "gear-ingest-nap")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	return &timerfd{f: f, rc: rc}
}

// set arms the timer to fire once, after d (at least 1 ns: zero disarms).
// Through the file's own descriptor, so that a set after close does
// nothing, rather than arm whatever reuses the number.
func (t *timerfd) set(d time.Duration) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(max(d, 1)))}
	_ = t.rc.Control(func(fd uintptr) { _ = unix.TimerfdSettime(int(fd), 0, &spec, nil) })
}

func (t *timerfd) wait(d time.Duration, woke func() bool) {
	_ = t.f.SetReadDeadline(time.Time{}) // clear the last interrupt
	t.set(d)
	if woke() {
		return
	}
	// The expirations since the last read; an error (the interrupt's
	// deadline, or closed) ends the nap too.
	_, _ = t.f.Read(t.buf[:])
}

// interrupt sets a read deadline in the past, which ends a read under way
// at once; after close it does nothing.
func (t *timerfd) interrupt() { _ = t.f.SetReadDeadline(time.Unix(1, 0)) }

func (t *timerfd) close() { _ = t.f.Close() }
