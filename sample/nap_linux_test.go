package sample

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// After close, a wake, and an arming, do nothing: in particular they do not
// touch the timerfd that took the closed one's descriptor number.
func TestNapCloseThenWake(t *testing.T) {
	old := newNap()
	if old.clock == nil {
		t.Fatal("no timerfd on Linux: naps fall back to Go's timer")
	}
	oldFd := fdOf(t, old)
	old.close()
	n := newNap()
	defer n.close()
	if fd := fdOf(t, n); fd != oldFd {
		t.Fatalf("the new timerfd has descriptor %d, not the closed one's %d: the check below would not look at the closed one's number", fd, oldFd)
	}
	old.wake()
	old.clock.(*timerfd).set(time.Hour)
	var cur unix.ItimerSpec
	if err := n.clock.(*timerfd).rc.Control(func(fd uintptr) {
		if err := unix.TimerfdGettime(int(fd), &cur); err != nil {
			t.Error(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if cur.Value != (unix.Timespec{}) {
		t.Errorf("the new timerfd is armed (%v to go) by the closed nap's wake or arming", cur.Value)
	}
}

// fdOf is the descriptor of n's timerfd.
func fdOf(t *testing.T, n *nap) (fd int) {
	t.Helper()
	if err := n.clock.(*timerfd).rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// A shard table's nap is closed with it: tables made and closed leave the
// process's descriptors as they were.
func TestShardTableClosesItsNap(t *testing.T) {
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
