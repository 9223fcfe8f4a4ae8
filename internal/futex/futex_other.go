//go:build !linux

package futex

import "time"

// Wait without futexes: a short sleep, after which the caller rechecks.
func Wait(addr *uint32, val uint32, d time.Duration) { time.Sleep(min(d, 50*time.Microsecond)) }

// Wake without futexes does nothing: waiters poll.
func Wake(addr *uint32, n int) {}
