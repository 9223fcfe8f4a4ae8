//go:build linux

package futex

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations without FUTEX_PRIVATE_FLAG: the words live in shared memory and
// the waiters are in other processes.
const (
	waitOp = 0 // FUTEX_WAIT
	wakeOp = 1 // FUTEX_WAKE
)

// Wait sleeps while *addr == val, for at most d. Spurious returns are fine: the
// callers loop.
func Wait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), waitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// Wake wakes up to n waiters sleeping on addr.
func Wake(addr *uint32, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), wakeOp, uintptr(n), 0, 0, 0)
}
