package sample

import (
	"runtime"
	"testing"
	"time"
)

// ends fails unless sleep returns within 30 s (its naps ask for an hour).
func ends(t *testing.T, what string, sleep func()) {
	t.Helper()
	ended := make(chan struct{})
	go func() {
		sleep()
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: an hour's nap still sleeps after 30 s", what)
	}
}

// A wake ends the nap under way, and a wake that comes between the look
// for work (mark) and the nap ends that nap: none is lost, on Go's timer
// (long naps) or on the timerfd (short ones). A nap that is not woken
// lasts what it asks for.
func TestNapWakes(t *testing.T) {
	n := newNap()
	defer n.close()
	if n.clock == nil && runtime.GOOS == "linux" {
		t.Fatal("no timerfd on Linux: naps fall back to Go's timer")
	}

	seen := n.mark()
	n.wake()
	ends(t, "woken after the look, before the nap", func() { n.sleep(seen, time.Hour) })

	seen = n.mark()
	go func() {
		time.Sleep(20 * time.Millisecond)
		n.wake()
	}()
	ends(t, "woken during the nap", func() { n.sleep(seen, time.Hour) })

	if n.clock != nil {
		// The timerfd's own protocol, with an hour's nap: a wake seen by
		// the look after the arming ends it before the read, and an
		// interrupt during the read ends the read.
		ends(t, "timerfd: a wake seen after arming", func() { n.clock.wait(time.Hour, func() bool { return true }) })
		go func() {
			time.Sleep(20 * time.Millisecond)
			n.clock.interrupt()
		}()
		ends(t, "timerfd: interrupted during the read", func() { n.clock.wait(time.Hour, func() bool { return false }) })
	}

	// Unwoken short naps, on the timerfd, end by themselves.
	ends(t, "100 naps of 50 µs", func() {
		for range 100 {
			n.sleep(n.mark(), 50*time.Microsecond)
		}
	})
}
