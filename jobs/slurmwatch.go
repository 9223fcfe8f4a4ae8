package jobs

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// stepWatch ends an srun step that outlives the world: once the coordinator
// has lost a rank (or the rendezvous failed), the ranks fail and srun ends the
// step; but when a node died with its slurmd, srun waits for its tasks until
// slurmctld gives the node up (SlurmdTimeout, minutes). The watch gives srun
// [launch].grace after the first loss, then kills it, so that the batch script
// ends and SLURM ends the job's processes on the nodes still there.
type stepWatch struct {
	lost     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	what     string
	done     chan struct{}
	finished chan struct{}
	killed   atomic.Bool
}

func newStepWatch() *stepWatch {
	return &stepWatch{lost: make(chan struct{}), done: make(chan struct{}), finished: make(chan struct{})}
}

// note records the first loss.
func (w *stepWatch) note(what string) {
	w.once.Do(func() {
		w.mu.Lock()
		w.what = what
		w.mu.Unlock()
		close(w.lost)
	})
}

func (w *stepWatch) first() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.what
}

// watch starts watching srun; the function it returns reports whether the
// watch killed it. stop must be called once srun has been waited for.
func (w *stepWatch) watch(srun *os.Process, grace time.Duration, stderr io.Writer) func() bool {
	go func() {
		defer close(w.finished)
		select {
		case <-w.lost:
		case <-w.done:
			return
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-w.done:
		case <-t.C:
			fmt.Fprintf(stderr, "gearrun: srun has not ended %s after the %s; stopping it (a node gone with its slurmd?)\n", grace, w.first())
			w.killed.Store(true)
			srun.Kill()
		}
	}()
	return w.killed.Load
}

// stop ends the watch and waits for it.
func (w *stepWatch) stop() {
	close(w.done)
	<-w.finished
}

// stuckStepError is srun's end when the watch killed it.
type stuckStepError struct {
	lost string
	err  error
}

func (e *stuckStepError) Error() string { return e.lost + ": srun: " + e.err.Error() }

func (e *stuckStepError) Unwrap() error { return e.err }
