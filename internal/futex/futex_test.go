package futex_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/futex"
)

func TestWaitReturnsWhenWordDiffers(t *testing.T) {
	w := uint32(1)
	start := time.Now()
	futex.Wait(&w, 0, 10*time.Second)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Wait on a word that differs slept %v", d)
	}
}

func TestWaitTimesOut(t *testing.T) {
	var w uint32
	start := time.Now()
	futex.Wait(&w, 0, 20*time.Millisecond)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Wait for 20ms slept %v", d)
	}
}

func TestWakeWakesWaiter(t *testing.T) {
	var w uint32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for atomic.LoadUint32(&w) == 0 {
			futex.Wait(&w, 0, 10*time.Second)
		}
	}()
	time.Sleep(20 * time.Millisecond) // let the waiter sleep
	atomic.StoreUint32(&w, 1)
	futex.Wake(&w, 1)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken")
	}
}
