package launch

import (
	"context"
	"fmt"
	"io"
)

// RestartLine is the line a launcher prints when it starts a job's world
// again after a failure: "<name>: restart <n> of <max>: <cause>", and
// "; <next>" after it when next, what the next world is ("next world: 2
// ranks on h1"), is not empty. It has no newline. RestartLoop prints it for
// every launch path: Run, RunOnHosts and the SLURM batch side (package jobs).
func RestartLine(name string, n, max int, cause, next string) string {
	line := fmt.Sprintf("%s: restart %d of %d: %s", name, n, max, cause)
	if next != "" {
		line += "; " + next
	}
	return line
}

// Ending is how the world of one generation of a job ended, as its launch
// path tells RestartLoop.
type Ending struct {
	// Cause is the world's failure, in one line ("" if it did not fail).
	Cause string
	// Restartable says that a restart answers the failure: a rank's
	// failure, a host or node lost while its ranks ran. The launcher's own
	// failures (a program not found, a world that did not assemble, a
	// signal, the timeout) are not.
	Restartable bool
}

// Generations is a launch path's side of RestartLoop: it runs the world of
// each generation of a job and keeps the job's account (its result, its
// cause, its exit code). RestartLoop calls its methods from one goroutine,
// one generation after the other.
type Generations interface {
	// RunGeneration runs the world of generation gen (0 first). Once the
	// world has stopped, or once every rank's end is known where the hosts
	// wait for word of the next generation (RunOnHosts), it calls decide,
	// once, with how the world ended; decide reports whether a next
	// generation follows, and has printed the restart line if so.
	// RunGeneration returns whether one does: decide's answer, unless what
	// came after it (a signal) ended the job all the same. Returning
	// without calling decide ends the job.
	RunGeneration(ctx context.Context, gen int, decide func(Ending) bool) bool
	// Stopped reports whether the job was stopped since its world failed
	// (a signal to the launcher, the job's timeout, the end of ctx), which
	// ends it instead of a restart. Stopped records that cause in the
	// job's account as its own.
	Stopped(ctx context.Context) bool
	// Next makes ready the world of the next generation once a restart is
	// decided, and returns what the restart line adds about it: "" for the
	// same world, "next world: 2 ranks on h1" for another. ok is false
	// when no world is left (too few hosts or nodes); Next has then
	// recorded why in the job's account, and the job ends.
	Next(ctx context.Context) (next string, ok bool)
}

// RestartLoop is the restart loop of a job, one for every launch path: it
// owns the generation count, the restart budget, the decision to start the
// world again or end the job, and the restart line. It is synchronous and
// starts no goroutine: the worlds' own live in the Generations it runs.
//
// A world is started again when its failure is restartable
// (Ending.Restartable), restarts remain (fewer than Max so far), no signal,
// timeout or cancellation came since (Generations.Stopped), and a next world
// is left (Generations.Next), in that order: a check is not made once an
// earlier one ended the job. The restart line (RestartLine) is printed then,
// once per restart, before the next generation starts.
type RestartLoop struct {
	// Name prefixes the restart line: Options.Name, "gearrun" under SLURM.
	Name string
	// Max is how many times the world may be started again
	// (Plan.MaxRestarts, [launch].restarts); 0 allows none.
	Max int
	// Out receives each restart line, whole, with its newline.
	Out io.Writer

	restarts int  // restarts so far
	decided  bool // the current generation's fate is known
	again    bool // ... and it is a next generation
}

// Run runs g's generations, from 0, until one is not followed by another.
// Restarts says how many restarts there were.
func (l *RestartLoop) Run(ctx context.Context, g Generations) {
	for gen := 0; ; gen++ {
		l.decided, l.again = false, false
		decide := func(e Ending) bool { return l.decide(ctx, g, e) }
		if !g.RunGeneration(ctx, gen, decide) || !l.again {
			return
		}
		l.restarts++
	}
}

// Restarts is how many times the world was started again so far.
func (l *RestartLoop) Restarts() int { return l.restarts }

// left is how many restarts remain.
func (l *RestartLoop) left() int { return max(l.Max-l.restarts, 0) }

// decide settles the current generation's fate, once: a later call returns
// the first answer and prints nothing.
func (l *RestartLoop) decide(ctx context.Context, g Generations, e Ending) bool {
	if l.decided {
		return l.again
	}
	l.decided = true
	if !e.Restartable || l.left() == 0 || g.Stopped(ctx) {
		return false
	}
	next, ok := g.Next(ctx)
	if !ok {
		return false
	}
	l.again = true
	if l.Out != nil {
		io.WriteString(l.Out, RestartLine(l.Name, l.restarts+1, l.Max, e.Cause, next)+"\n")
	}
	return true
}
