package sample

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
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
	ends(t, "woken after the look, before the nap", func() { n.sleep(seen, time.Hour, nil) })

	seen = n.mark()
	go func() {
		time.Sleep(20 * time.Millisecond)
		n.wake()
	}()
	ends(t, "woken during the nap", func() { n.sleep(seen, time.Hour, nil) })

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

	// A nap may end early (a stale expiration), never lose its wake; and
	// an unwoken short nap ends by itself.
	for range 100 {
		seen = n.mark()
		n.sleep(seen, 50*time.Microsecond, nil)
	}
}

// After close, a wake does nothing: in particular it does not fire the
// timer of a nap that took the closed one's descriptor number.
func TestNapCloseThenWake(t *testing.T) {
	old := newNap()
	old.close()
	n := newNap() // likely takes the closed timer's number
	defer n.close()
	if n.clock == nil {
		t.Skip("no timerfd: naps take Go's timer alone")
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		old.wake()
	}()
	start := time.Now()
	n.clock.wait(300*time.Millisecond, func() bool { return false })
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("a 300 ms nap ended after %v: the closed nap's wake reached it", d)
	}
}

// A shard table's nap is closed with it: tables made and closed leave the
// process's descriptors as they were.
func TestShardTableClosesItsNap(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	count := func() int {
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(fds)
	}
	spec := store.Spec{Capacity: 8, Remover: store.RemoverNone, Columns: []store.Column{{Name: "x", DType: store.Uint8, Length: 1}}}
	shards := make([]*store.Shard, 5)
	for i := range shards {
		shards[i] = storetest.Create(t, spec)
	}
	before := count()
	for _, sh := range shards {
		st, err := NewShardTable(sh, Config{Name: "naps", Sampler: NewUniform(), Remover: NewFIFO()})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if after := count(); after != before {
		t.Errorf("5 tables made and closed: %d descriptors open, %d before", after, before)
	}
}
