// Package cpuline measures how long one cache line takes to pass from one CPU
// to another: two threads, each pinned to one of the first two CPUs this
// process may run on, hand a counter back and forth, and every hand-over moves
// the counter's line once.
//
// gear's writer processes and a table's owner meet on a few shared lines per
// row (the commit log's cells, the row's status word, the free queue), so what
// two writers reach against one follows this figure. On a virtual machine it
// is a property of where the host placed the virtual CPUs, and it can change
// while a program runs: python/bench.py probes it between its windows and
// reports the writers' ratio for each speed it saw (docs/benchmarks.md).
package cpuline

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Result is one measurement.
type Result struct {
	CPUs   [2]int        // the two CPUs the threads ran on
	Rounds int           // hand-overs timed
	Took   time.Duration // their time
}

// NsPerLine is the mean time of one hand-over in nanoseconds, unrounded.
func (r Result) NsPerLine() float64 {
	return float64(r.Took) / float64(time.Nanosecond) / float64(r.Rounds)
}

// ErrOneCPU is returned where this process may run on fewer than two CPUs,
// or its Go code on fewer than two threads at once (GOMAXPROCS).
var ErrOneCPU = errors.New("no second CPU to pass a line to")

// line is the counter, alone on its cache line.
type line struct {
	_ [64]byte
	n atomic.Int64
	_ [56]byte
}

// Measure times about rounds hand-overs (at least 8) between the first two
// CPUs of this process's affinity mask. It gives up with ctx's error when ctx
// ends first, as when one of the two threads is never scheduled. The threads
// it pins end with the call, so no other goroutine runs on them afterwards.
func Measure(ctx context.Context, rounds int) (Result, error) {
	if rounds < 8 {
		return Result{}, fmt.Errorf("cpuline: %d rounds: want at least 8", rounds)
	}
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		return Result{}, fmt.Errorf("cpuline: the process's CPUs: %w", err)
	}
	cpus := make([]int, 0, 2)
	for c := 0; c < len(mask)*64 && len(cpus) < 2; c++ {
		if mask.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		return Result{}, fmt.Errorf("cpuline: this process may run on one CPU only: %w", ErrOneCPU)
	}
	if n := runtime.GOMAXPROCS(0); n < 2 {
		// The two threads spin for each other's turn: one at a time, each
		// hand-over would wait for the scheduler to preempt the other.
		return Result{}, fmt.Errorf("cpuline: GOMAXPROCS is %d, and the probe's two threads must run at once: %w", n, ErrOneCPU)
	}
	var (
		l           line
		stop        atomic.Bool
		pinned, all sync.WaitGroup
		start       = make(chan struct{})
		errs        [2]error
		took        time.Duration
	)
	// Thread 0 moves the counter from even values, thread 1 from odd ones.
	// Thread 0 times from its second turn on, once both threads spin, to its
	// last: last-2 hand-overs.
	last := int64(rounds-1) &^ 1
	for p := range 2 {
		pinned.Add(1)
		all.Add(1)
		go func() {
			defer all.Done()
			// Pinned, the thread must not run other goroutines afterwards: it
			// stays locked, and the runtime ends it when this goroutine returns.
			runtime.LockOSThread()
			var set unix.CPUSet
			set.Set(cpus[p])
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errs[p] = fmt.Errorf("cpuline: pin a thread to CPU %d: %w", cpus[p], err)
				stop.Store(true)
			}
			pinned.Done()
			<-start
			var t0 time.Time
			for v := int64(p); v <= last+1 && !stop.Load(); v += 2 {
				for spins := 0; l.n.Load() != v; spins++ {
					if spins&0xfff == 0xfff && stop.Load() {
						return
					}
				}
				if v == 2 {
					t0 = time.Now()
				}
				l.n.Store(v + 1)
			}
			if p == 0 && !t0.IsZero() {
				took = time.Since(t0)
			}
		}()
	}
	pinned.Wait()
	close(start)
	done := make(chan struct{})
	go func() { all.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		stop.Store(true)
		<-done
		return Result{}, fmt.Errorf("cpuline: %d hand-overs between CPUs %d and %d: %w", rounds, cpus[0], cpus[1], ctx.Err())
	}
	if err := errors.Join(errs[:]...); err != nil {
		return Result{}, err
	}
	if n := l.n.Load(); n < last+1 {
		return Result{}, fmt.Errorf("cpuline: %d hand-overs between CPUs %d and %d: stopped at %d", rounds, cpus[0], cpus[1], n)
	}
	timed := int(last - 2)
	return Result{CPUs: [2]int{cpus[0], cpus[1]}, Rounds: timed, Took: took}, nil
}
