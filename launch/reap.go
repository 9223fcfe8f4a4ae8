package launch

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reaper waits for the ranks with one goroutine woken by SIGCHLD, instead of
// one blocked wait per rank: a blocking wait holds an OS thread, and a
// launch of N ranks would create N threads (measured on 2 cores: the
// threads' start-up cost about a millisecond per four ranks).
//
// On each SIGCHLD it polls every rank not yet reaped with wait4(WNOHANG) on
// the rank's pid only, so that other children of the process (the guard, a
// `go build`, other jobs of a program that runs several) are left to their
// own waiters. Signals that arrive together wake it once; a poll covers them
// all.
type reaper struct {
	sigc  chan os.Signal
	exits chan<- exitEvent
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	pending map[int]pendingRank // by pid
}

type pendingRank struct {
	rank int
	proc *os.Process
}

func newReaper(exits chan<- exitEvent) *reaper {
	r := &reaper{
		sigc:    make(chan os.Signal, 1),
		exits:   exits,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		pending: map[int]pendingRank{},
	}
	signal.Notify(r.sigc, syscall.SIGCHLD)
	go r.run()
	return r
}

// add makes the reaper wait for proc, rank's process (started after
// newReaper, so that its SIGCHLD cannot be missed).
func (r *reaper) add(rank int, proc *os.Process) {
	r.mu.Lock()
	r.pending[proc.Pid] = pendingRank{rank, proc}
	r.mu.Unlock()
	// It may have ended before it was added: look now.
	select {
	case r.sigc <- syscall.SIGCHLD:
	default:
	}
}

func (r *reaper) run() {
	defer close(r.done)
	for {
		select {
		case <-r.sigc:
			r.poll()
		case <-r.stop:
			return
		}
	}
}

// poll reaps every pending rank that has ended.
func (r *reaper) poll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for pid, p := range r.pending {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		if err == nil && got == 0 {
			continue // still running
		}
		delete(r.pending, pid)
		p.proc.Release() // its pidfd; the process is reaped
		ev := exitEvent{rank: p.rank, status: ws}
		if err != nil {
			ev.err = os.NewSyscallError("wait4", err)
		}
		r.exits <- ev // buffered for every rank
	}
}

// close stops the reaper; ranks still pending are not waited for.
func (r *reaper) close() {
	signal.Stop(r.sigc)
	close(r.stop)
	<-r.done
}
