package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gear-rl/gear/rank"
)

// Defaults of Options.
const (
	DefaultGrace = 10 * time.Second
	DefaultDrain = 250 * time.Millisecond
)

// Exit codes of a job that did not end with a rank's own failure.
const (
	ExitLaunchFailed = 1   // the launcher could not start the job, or the world did not assemble
	ExitTimeout      = 124 // the job ran past Options.Timeout
	ExitNotFound     = 127 // a program does not exist
	ExitNotRunnable  = 126 // a program exists but cannot be executed
)

// Options says how Run runs a plan. The zero value runs untagged, with output on
// the launcher's stdout and stderr, no stdin, no timeout and a 10s grace period.
type Options struct {
	// Stdout and Stderr receive the ranks' output (nil: os.Stdout, os.Stderr).
	Stdout, Stderr io.Writer
	// Stdin goes to rank 0 only (nil: /dev/null for every rank). A non-terminal
	// *os.File is handed to rank 0 as it is; anything else is copied.
	Stdin io.Reader
	// TagOutput prefixes every line with "[rank] ".
	TagOutput bool
	// OutputDir, if set, receives one file per rank and stream
	// (rank.<N>.stdout, rank.<N>.stderr) instead of Stdout and Stderr.
	OutputDir string
	// Timeout bounds the whole job (0: none).
	Timeout time.Duration
	// Grace is the time between SIGTERM and SIGKILL (0: DefaultGrace).
	Grace time.Duration
	// Drain is how long output is still read after the ranks ended, for
	// grandchildren that hold a pipe open (0: DefaultDrain).
	Drain time.Duration
	// LineHold bounds how long tagged output waits for a line longer than
	// 1 MiB that a rank began and has not ended, before that line is cut
	// (0: DefaultLineHold).
	LineHold time.Duration
	// Signals, if set, delivers the signals to forward (SIGINT, SIGTERM): the first
	// is forwarded to every rank's process group and starts the grace period; a
	// second kills at once. Run installs no signal handler itself.
	Signals <-chan os.Signal
	// Logger receives the launcher's logs (nil: they go to Stderr, whole lines,
	// warnings such as refused rendezvous connections only unless Verbose).
	Logger *slog.Logger
	// Verbose logs the launcher's steps when Logger is nil.
	Verbose bool
	// Name prefixes the lines the launcher itself prints ("gearrun" if empty).
	Name string
	// BaseEnv is the environment ranks inherit (nil: os.Environ()), less the
	// contract variables, which Run sets.
	BaseEnv []string
	// RuntimeDir holds the job's lock file ("": rank.RuntimeDir()).
	RuntimeDir string
	// ShmDir is where the job's shared-memory segments live ("": /dev/shm); Run
	// removes the job's segments there when the job ends.
	ShmDir string
	// OnStart, if set, is called as each rank starts.
	OnStart func(rank, pid int)
	// Limits are the machine's limits that Run checks the plan against before
	// it starts anything (CheckHost); nil reads them (ReadHostLimits on ShmDir).
	Limits *HostLimits
	// Trace, if set, is the file where Run writes the job's Chrome trace when
	// the job ends (see WriteTrace): every rank keeps its last TraceEvents
	// events (0: DefaultTraceEvents).
	Trace       string
	TraceEvents int
}

// RankResult is how one rank ended.
type RankResult struct {
	Rank    int    `json:"rank"`
	PID     int    `json:"pid"`
	Started bool   `json:"started"`
	Code    int    `json:"exit_code"` // the exit code, or 128+signal
	Signal  string `json:"signal,omitempty"`
	Status  string `json:"status"` // "exited with status 3", "killed by SIGKILL"
}

// Result is how a job ended.
type Result struct {
	JobID    string `json:"job_id"`
	RdzvAddr string `json:"rdzv_addr"`
	// MasterAddr is where rank 0 was told to serve torch's TCPStore
	// (MASTER_ADDR:MASTER_PORT), "" without the torch contract.
	MasterAddr string       `json:"master_addr,omitempty"`
	Ranks      []RankResult `json:"ranks"`
	// FailedRank is the rank whose failure ended the job, or -1.
	FailedRank int `json:"failed_rank"`
	// Cause is the one line that says why the job failed ("" on success).
	Cause string `json:"cause,omitempty"`
	// ExitCode is the launcher's exit code: 0, the failed rank's code (128+signal
	// for a signal), or one of the Exit* codes.
	ExitCode int `json:"exit_code"`
	// Restarts is how many times the world was started again after a rank
	// failed (at most Plan.MaxRestarts); Ranks are the last world's.
	Restarts int `json:"restarts,omitempty"`
}

// JobError is Run's error when the job did not succeed. Announced is set when
// Run already printed Cause on Options.Stderr.
type JobError struct {
	Cause     string
	Code      int
	Announced bool
}

func (e *JobError) Error() string { return "launch: " + e.Cause }

// Run runs the plan: it takes the job's lock, builds Go packages named by the
// plan, starts the coordinator, spawns every rank in its own process group with a
// parent-death signal, routes output, and waits. When a rank fails, the job times
// out, the world cannot assemble or a signal arrives, the ranks get SIGTERM (or
// the forwarded signal) and SIGKILL after the grace period. When the job ends,
// whatever is left in the ranks' process groups is killed and the job's
// shared-memory segments and lock file are removed.
//
// Run returns the result and, unless every rank exited 0, a *JobError whose Code
// is the exit code for the launcher. Cancelling ctx stops the job like SIGTERM.
func Run(ctx context.Context, p *Plan, opts Options) (*Result, error) {
	if p != nil && len(p.Hosts) > 0 {
		return nil, errors.New("launch: the plan is placed on hosts: run it with RunOnHosts")
	}
	j, err := newJob(p, opts)
	if err != nil {
		return nil, err
	}
	return j.run(ctx)
}

type job struct {
	plan *Plan
	opts Options
	log  *slog.Logger
	res  *Result

	stdout, stderr *lineSink
	// stdinCopy lets one generation's copy of Options.Stdin read it at a
	// time (stdinFile).
	stdinCopy sync.Mutex

	procs  []*os.Process
	groups []int // process group of each started rank (its pid), 0 if not started

	mu        sync.Mutex // guards cause fields read by callbacks
	cause     string
	code      int
	announced bool
	// restarting: the failure is a rank's or a lost host's, and restarts
	// remain; it is printed by the loop's restart line, or when the job
	// ends on it after all.
	restarting bool
	held       bool // restarting, and the failure not yet printed
	terminated bool
	timeout    <-chan time.Time // Options.Timeout, over every generation
	loop       *RestartLoop     // the job's generations and restarts
	// traceDir holds the metrics segments of the job's ended generations,
	// for its trace (dropGeneration); "" until a generation ends.
	traceDir string

	pumps    sync.WaitGroup
	readEnds []*os.File
	guard    *guard
	coord    *rank.Coordinator
	rdzvFail chan error
	// coordLost: ranks the coordinator lost (OnLost), among them ranks whose
	// processes still run (stopped, hung) when the heartbeat found them.
	coordLost chan lostRank
	exits     chan exitEvent
	reaper    *reaper
	settle    *time.Timer // after a failed rendezvous: when to stop every rank
	settleC   <-chan time.Time
}

type exitEvent struct {
	rank   int
	status syscall.WaitStatus
	err    error
}

func newJob(p *Plan, opts Options) (*job, error) {
	if p == nil || len(p.Ranks) == 0 {
		return nil, errors.New("launch: empty plan")
	}
	if err := rank.CheckJobID(p.JobID); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("launch: timeout %v: must not be negative (0 means none)", opts.Timeout)
	}
	if opts.Grace < 0 {
		return nil, fmt.Errorf("launch: grace %v: must not be negative (0 means the default, %v)", opts.Grace, DefaultGrace)
	}
	if opts.Grace == 0 {
		opts.Grace = DefaultGrace
	}
	if opts.Drain <= 0 {
		opts.Drain = DefaultDrain
	}
	if opts.Name == "" {
		opts.Name = "gearrun"
	}
	if opts.ShmDir == "" {
		opts.ShmDir = "/dev/shm"
	}
	if opts.BaseEnv == nil {
		opts.BaseEnv = os.Environ()
	}
	opts.BaseEnv = metricsEnv(opts.BaseEnv, opts.ShmDir, opts.Trace, opts.TraceEvents)
	n := len(p.Ranks)
	p = p.copy() // Run fills in the master port
	j := &job{
		plan:   p,
		opts:   opts,
		res:    &Result{JobID: p.JobID, FailedRank: -1, Ranks: make([]RankResult, n)},
		stdout: &lineSink{w: opts.Stdout, hold: opts.LineHold},
		stderr: &lineSink{w: opts.Stderr, hold: opts.LineHold},
	}
	j.loop = &RestartLoop{Name: opts.Name, Max: p.MaxRestarts, Out: sinkWriter{j.stderr}}
	for i := range j.res.Ranks {
		j.res.Ranks[i] = RankResult{Rank: i, Code: -1, Status: "not started"}
	}
	j.log = opts.Logger
	if j.log == nil {
		// Warnings (refused connections) reach the launcher's stderr, whole lines
		// only, like the ranks' output.
		level := slog.LevelWarn
		if opts.Verbose {
			level = slog.LevelDebug
		}
		j.log = slog.New(slog.NewTextHandler(sinkWriter{j.stderr}, &slog.HandlerOptions{Level: level}))
	}
	return j, nil
}

func (j *job) run(ctx context.Context) (res *Result, err error) {
	p := j.plan
	j.cleanStale()
	lim := j.opts.Limits
	if lim == nil {
		l := ReadHostLimits(j.opts.ShmDir)
		lim = &l
	}
	if err := CheckHost(p, *lim, j.opts.BaseEnv); err != nil {
		return j.setupFailed(err)
	}
	// The lock is held, and the segments kept, across every generation of
	// the job: a restarted rank re-attaches to what its predecessor left in
	// shared memory. They go when the job ends for good.
	lock, err := rank.LockJob(j.opts.RuntimeDir, p.JobID, true)
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	defer func() {
		j.writeTrace()
		removed, _ := RemoveJobSegments(j.opts.ShmDir, p.JobID)
		for _, s := range removed {
			j.log.Debug("launch: removed segment", "name", s)
		}
		lock.Close()
	}()

	for _, gp := range p.GPUPlans {
		for _, w := range gp.Warnings {
			j.stderr.write([]byte(fmt.Sprintf("%s: warning: group %d: %s\n", j.opts.Name, gp.Group, w)))
		}
	}
	programs, cleanup, err := j.programs(ctx)
	defer cleanup()
	if err != nil {
		return j.setupFailed(err)
	}
	if p.CheckpointDir != "" {
		if err := os.MkdirAll(p.CheckpointDir, 0o700); err != nil {
			return j.setupFailed(fmt.Errorf("launch: checkpoint directory: %w", err))
		}
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return j.setupFailed(err)
	}
	defer devNull.Close()
	if j.opts.Timeout > 0 {
		t := time.NewTimer(j.opts.Timeout)
		defer t.Stop()
		j.timeout = t.C
	}
	j.guard = startGuard(j.opts.ShmDir, p.JobID, lock.Path(), j.log)
	defer j.guard.done()
	j.loop.Run(ctx, &localGenerations{job: j, programs: programs, devNull: devNull, autoPort: p.TorchEnv && p.MasterPort == 0})
	j.res.Restarts = j.loop.Restarts()

	res = j.res
	if j.cause != "" {
		res.Cause, res.ExitCode = j.cause, j.code
		return res, &JobError{Cause: j.cause, Code: j.code, Announced: j.announced}
	}
	return res, nil
}

// cleanStale removes what jobs that ended without cleaning up left behind (see
// CleanStale) and says what it freed.
func (j *job) cleanStale() {
	got, err := CleanStale(j.opts.ShmDir, j.opts.RuntimeDir)
	if len(got.Segments) > 0 {
		j.stderr.write([]byte(fmt.Sprintf("%s: removed %d shared-memory segments (%s) left by ended jobs %s\n",
			j.opts.Name, len(got.Segments), FormatBytes(got.Bytes), strings.Join(got.Jobs, ", "))))
	}
	if err != nil {
		j.log.Warn("launch: cleaning up after ended jobs", "err", err)
	}
}

func (j *job) setupFailed(err error) (*Result, error) {
	j.res.Cause, j.res.ExitCode = strings.TrimPrefix(err.Error(), "launch: "), exitCodeOf(err)
	return j.res, &JobError{Cause: j.res.Cause, Code: j.res.ExitCode}
}

// wait runs until every started rank has been reaped.
func (j *job) wait(ctx context.Context) {
	running := 0
	for _, proc := range j.procs {
		if proc != nil {
			running++
		}
	}
	timeout := j.timeout
	var grace <-chan time.Time
	var graceTimer *time.Timer
	startGrace := func() {
		if graceTimer == nil {
			graceTimer = time.NewTimer(j.opts.Grace)
			grace = graceTimer.C
		}
	}
	defer func() {
		if graceTimer != nil {
			graceTimer.Stop()
		}
	}()
	if j.cause != "" && running > 0 { // a later rank failed to start
		j.terminate(syscall.SIGTERM)
		startGrace()
	}
	done := ctx.Done()
	defer func() {
		if j.settle != nil {
			j.settle.Stop()
		}
	}()
	var signals <-chan os.Signal = j.opts.Signals
	interrupted := false
	pending := map[int]string{} // ranks the coordinator lost, their exits awaited
	var check <-chan time.Time
	for running > 0 {
		select {
		case l := <-j.coordLost:
			if j.res.Ranks[l.rank].Status == "running" {
				if len(pending) == 0 {
					check = time.After(localLostWait)
				}
				pending[l.rank] = l.reason
			}
		case <-check:
			check = nil
			for r, reason := range pending {
				j.lostRunning(r, reason)
			}
			clear(pending)
			if j.cause != "" && !j.terminated {
				j.terminated = true
				j.signalAll(syscall.SIGTERM)
				startGrace()
			}
		case ev := <-j.exits:
			running--
			j.exited(ev)
			if j.cause != "" && !j.terminated {
				j.terminated = true
				j.signalAll(syscall.SIGTERM)
				startGrace()
			}
		case err := <-j.rdzvFail:
			j.rendezvousFailed(err)
		case <-j.settleC:
			j.settleC = nil
			j.signalAll(syscall.SIGTERM)
			startGrace()
		case <-timeout:
			timeout = nil
			j.fail(-1, fmt.Sprintf("job timed out after %v", j.opts.Timeout), ExitTimeout)
			j.terminate(syscall.SIGTERM)
			startGrace()
		case <-done:
			done = nil
			j.fail(-1, fmt.Sprintf("job stopped: %v", context.Cause(ctx)), ExitLaunchFailed)
			j.terminate(syscall.SIGTERM)
			startGrace()
		case sig := <-signals:
			s, _ := sig.(syscall.Signal)
			if interrupted {
				j.log.Debug("launch: second signal; killing every rank", "signal", sig)
				j.signalAll(syscall.SIGKILL)
				continue
			}
			interrupted = true
			j.fail(-1, fmt.Sprintf("interrupted by %s", signalName(s)), 128+int(s))
			j.terminated = true
			j.signalAll(s)
			startGrace()
		case <-grace:
			j.log.Debug("launch: grace period over; killing every rank")
			j.signalAll(syscall.SIGKILL)
			grace = nil
		}
	}
}

// who names rank r of a job in the launcher's lines: "rank 2 (pid 123)",
// with its host ("pid 123 on node2") for a job on hosts and its role and
// role rank ("actor 1") in an MPMD job.
func (s RankSpec) who(r, pid int, onHost bool) string {
	w := fmt.Sprintf("rank %d (pid %d", r, pid)
	if onHost {
		w += " on " + s.Host
	}
	if s.Role != "" {
		w += fmt.Sprintf(", %s %d", s.Role, s.RoleRank)
	}
	return w + ")"
}

// localLostWait is how long a rank the coordinator lost may take to be
// reaped before the launcher takes it for hung: a rank that ended is
// reaped at once, and the coordinator hears of it from the launcher.
const localLostWait = 200 * time.Millisecond

// lostRunning fails the world on rank r, which the coordinator lost (its
// heartbeat went unanswered: the process is stopped or hung) while its
// process still runs: a restartable failure of that rank, as its exit
// would be. The stop that follows kills it (SIGKILL after the grace).
func (j *job) lostRunning(r int, reason string) {
	if j.res.Ranks[r].Status != "running" {
		return
	}
	j.fail(r, j.plan.Ranks[r].who(r, j.res.Ranks[r].PID, false)+" lost: "+reason, ExitLaunchFailed)
}

// rendezvousFailed ends a job whose world did not assemble. The ranks that
// joined have the same error and end on their own, saying so; the missing ones
// are stopped now, and the rest after a moment to settle.
func (j *job) rendezvousFailed(err error) {
	j.fail(-1, strings.TrimPrefix(err.Error(), "rank: "), ExitLaunchFailed)
	if j.terminated {
		return
	}
	j.terminated = true
	var re *rank.RendezvousError
	if errors.As(err, &re) {
		for _, r := range re.Missing {
			if r < len(j.groups) && j.groups[r] > 0 {
				syscall.Kill(-j.groups[r], syscall.SIGTERM)
			}
		}
	}
	j.settle = time.NewTimer(min(time.Second, j.opts.Grace/2))
	j.settleC = j.settle.C
}

func (j *job) terminate(sig syscall.Signal) {
	if !j.terminated {
		j.terminated = true
		j.signalAll(sig)
	}
}

// exited records a rank's end and tells the coordinator.
func (j *job) exited(ev exitEvent) {
	rr := &j.res.Ranks[ev.rank]
	if ev.err != nil {
		rr.Status, rr.Code = "lost: "+ev.err.Error(), ExitLaunchFailed
	} else {
		ws := ev.status
		switch {
		case ws.Signaled():
			rr.Signal = signalName(ws.Signal())
			rr.Code = 128 + int(ws.Signal())
			rr.Status = "killed by " + rr.Signal
		default:
			rr.Code = ws.ExitStatus()
			rr.Status = "exited with status " + strconv.Itoa(rr.Code)
		}
	}
	j.log.Debug("launch: rank ended", "rank", ev.rank, "status", rr.Status)
	j.coord.RankExited(ev.rank, rr.Code == 0, rr.Status)
	if rr.Code == 0 {
		return
	}
	// A world that failed to assemble explains a rank's failure better than the
	// failure itself.
	select {
	case err := <-j.rdzvFail:
		j.rendezvousFailed(err)
	default:
	}
	j.fail(ev.rank, j.plan.Ranks[ev.rank].who(ev.rank, rr.PID, false)+" "+rr.Status, rr.Code)
}

// fail records the world's first failure and prints it, once. A rank's
// failure (rank >= 0) while restarts remain is held for the RestartLoop,
// which prints the restart line if it starts the world again; the
// launcher's own failure (rank -1: a signal, the timeout, a world that did
// not assemble) ends the job for good, even after such a failure.
func (j *job) fail(rank int, cause string, code int) {
	j.failWorld(rank, cause, code, rank >= 0)
}

// failWorld is fail with the kind of failure said: restartable (a rank's
// failure, a lost host) or the launcher's own.
func (j *job) failWorld(rank int, cause string, code int, restartable bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cause != "" && !(j.restarting && !restartable) {
		return
	}
	if j.held {
		// The held failure ends the job after all: it is said first.
		j.say(j.cause)
	}
	j.cause, j.code = cause, code
	j.res.FailedRank = rank
	j.announced = true
	j.restarting = restartable && j.loop.left() > 0
	j.held = j.restarting
	if !j.restarting {
		j.say(cause)
	}
}

// giveUp ends the job on a held failure that no next world is left for:
// why is added to its cause, and the whole is printed.
func (j *job) giveUp(why string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cause += "; " + why
	j.res.FailedRank = -1
	j.restarting, j.held = false, false
	j.announced = true
	j.say(j.cause)
}

// say prints one of the launcher's own lines.
func (j *job) say(line string) {
	j.stderr.write([]byte(j.opts.Name + ": " + line + "\n"))
}

// signalAll signals the process group of every started rank, including ranks
// that already ended (their children may remain in the group).
func (j *job) signalAll(sig syscall.Signal) {
	for _, g := range j.groups {
		if g > 0 {
			syscall.Kill(-g, sig)
		}
	}
}

// finish kills what is left in the ranks' process groups of the current
// generation and drains their output for a short while.
func (j *job) finish() {
	j.signalAll(syscall.SIGKILL)
	drained := make(chan struct{})
	go func() {
		j.pumps.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(j.opts.Drain):
		j.log.Debug("launch: output still open after the ranks ended; closing it")
		for _, r := range j.readEnds {
			r.Close()
		}
		<-drained
	}
	for _, r := range j.readEnds {
		r.Close()
	}
}

func signalName(s syscall.Signal) string {
	names := map[syscall.Signal]string{
		syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
		syscall.SIGILL: "SIGILL", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS",
		syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL", syscall.SIGSEGV: "SIGSEGV",
		syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
		syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2",
	}
	if n, ok := names[s]; ok {
		return n
	}
	return "signal " + strconv.Itoa(int(s))
}
