package cpuline_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/cpuline"
)

func twoCPUs(t *testing.T) unix.CPUSet {
	t.Helper()
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		t.Fatal(err)
	}
	if mask.Count() < 2 {
		t.Skipf("this process may run on %d CPU: the probe needs two", mask.Count())
	}
	return mask
}

func TestMeasure(t *testing.T) {
	mask := twoCPUs(t)
	r, err := cpuline.Measure(context.Background(), 20001)
	if err != nil {
		t.Fatal(err)
	}
	// 20001 rounds: thread 0 moves the counter last from 20000, and times
	// from 2 on.
	if r.Rounds != 19998 {
		t.Errorf("Rounds = %d, want 19998", r.Rounds)
	}
	if r.NsPerLine() <= 0 {
		t.Errorf("NsPerLine() = %v, want > 0", r.NsPerLine())
	}
	if r.CPUs[0] == r.CPUs[1] || !mask.IsSet(r.CPUs[0]) || !mask.IsSet(r.CPUs[1]) {
		t.Errorf("CPUs = %v: want two distinct CPUs of the mask", r.CPUs)
	}
	// The pinned threads ended with the call: this goroutine's thread still
	// has the whole mask.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var now unix.CPUSet
	if err := unix.SchedGetaffinity(0, &now); err != nil {
		t.Fatal(err)
	}
	if now != mask {
		t.Errorf("the calling thread's mask changed: %v, was %v", now, mask)
	}
}

func TestMeasureRefusals(t *testing.T) {
	if _, err := cpuline.Measure(context.Background(), 7); err == nil {
		t.Error("7 rounds: no error")
	}
	mask := twoCPUs(t)
	// A thread that may run on one CPU only finds no second one.
	got := make(chan error)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread ends with this goroutine
		var one unix.CPUSet
		for c := 0; ; c++ {
			if mask.IsSet(c) {
				one.Set(c)
				break
			}
		}
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			got <- err
			return
		}
		_, err := cpuline.Measure(context.Background(), 100)
		got <- err
	}()
	if err := <-got; !errors.Is(err, cpuline.ErrOneCPU) {
		t.Errorf("one CPU: err = %v, want ErrOneCPU", err)
	}
	// Go code on one thread at a time (GOMAXPROCS=1): the two threads
	// could not spin at once, and the probe says so at once rather than
	// wait for the scheduler at every hand-over.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	if _, err := cpuline.Measure(context.Background(), 100); !errors.Is(err, cpuline.ErrOneCPU) || !strings.Contains(err.Error(), "GOMAXPROCS is 1") {
		t.Errorf("GOMAXPROCS 1: err = %v, want ErrOneCPU naming GOMAXPROCS", err)
	}
}

func TestMeasureGivesUpAtDeadline(t *testing.T) {
	twoCPUs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := cpuline.Measure(ctx, 1<<50)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the deadline's", err)
	}
}

func TestNsPerLine(t *testing.T) {
	r := cpuline.Result{Rounds: 4, Took: 90 * time.Nanosecond}
	if got := r.NsPerLine(); got != 22.5 {
		t.Errorf("NsPerLine = %v, want 22.5", got)
	}
}
