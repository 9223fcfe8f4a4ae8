package launch

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
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

// The per-host agent (`gearrun agent`, started over ssh by RunOnHosts) and the
// launcher speak over the ssh connection's stdin and stdout:
//
//   - launcher to agent: one line of JSON (an AgentJob, the token inside: it
//     travels through ssh, never on a command line), then control lines,
//     "signal N" (deliver signal N to every rank's process group), "ping",
//     and, once every host has reported its ranks' ends, the generation's
//     fate: "next" (a new generation follows: remove only the dead world's
//     segments, RemoveGenerationSegments) or "end". The end of the agent's
//     stdin means the launcher or the connection is gone: the agent kills its
//     ranks' process groups and exits.
//   - agent to launcher: frames of a 9-byte header (kind, rank as uint32, payload
//     length as uint32, big-endian) and a payload. Output frames hold one
//     rank's stdout or stderr bytes unchanged: for a launcher that tags
//     output (AgentJob.TagOutput), whole lines, a line longer than maxLine in
//     pieces that no other rank's lines come between (within DefaultLineHold)
//     and the last bytes without a newline as they are; else the bytes as
//     they come. An empty output frame ends the stream (for a launcher that
//     tags output, at the start of a line: never inside another rank's
//     open line).
const agentVersion = 2

// agentHello is the agent's first line, before its frames: what a login
// shell prints before the agent starts (a chatty .bashrc) is passed on as text
// until it.
const agentHello = "\x00gear-agent 1\n"

// Frame kinds.
const (
	frameStdout  = 'o' // bytes of the rank's stdout; none: its end
	frameStderr  = 'e' // bytes of the rank's stderr; none: its end
	frameStarted = 's' // the rank started; payload: its pid
	frameExited  = 'x' // the rank ended; payload: agentExit as JSON
	frameFailed  = 'f' // the agent could not go on; payload: agentExit as JSON
	frameDone    = 'd' // every rank ended and its output was sent
	frameMetrics = 'm' // the ranks' figures; payload: hostFigures as JSON
	frameSegment = 'g' // a chunk of a metrics segment for the trace: name, '\n', offset (uint64), bytes
)

// maxFrame bounds a frame's payload (an output frame holds at most a pump's
// buffer, maxLine).
const maxFrame = 16 << 20

// AgentJob is what the launcher sends a host's agent: the plan (the agent
// runs the ranks whose Host is Host), the coordinator's address and the
// launcher's working directory.
type AgentJob struct {
	Version  int    `json:"version"`
	Host     string `json:"host"`
	RdzvAddr string `json:"rdzv_addr"`
	// Dir is the ranks' working directory when the plan names none and it
	// exists on the host (else the agent's own, the home directory under
	// ssh), as under mpirun.
	Dir  string `json:"dir,omitempty"`
	Plan *Plan  `json:"plan"`
	// TagOutput says that the launcher tags the ranks' lines: the agent
	// sends whole lines, holding a line longer than maxLine for at most
	// LineHold (Options.LineHold; 0: DefaultLineHold).
	TagOutput bool     `json:"tag_output,omitempty"`
	LineHold  Duration `json:"line_hold,omitempty"`
}

// agentExit describes a rank's end, or the agent's failure.
type agentExit struct {
	Code   int    `json:"code"`
	Signal string `json:"signal,omitempty"`
	Status string `json:"status"`
}

// frameWriter writes frames; after the first failed write it writes nothing
// and closes broken.
type frameWriter struct {
	mu     sync.Mutex
	w      io.Writer
	buf    []byte
	failed bool
	broken chan struct{}
}

func newFrameWriter(w io.Writer) *frameWriter {
	return &frameWriter{w: w, broken: make(chan struct{})}
}

func (f *frameWriter) send(kind byte, r int, payload []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed {
		return io.ErrClosedPipe
	}
	f.buf = append(f.buf[:0], kind, 0, 0, 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(f.buf[1:], uint32(r))
	binary.BigEndian.PutUint32(f.buf[5:], uint32(len(payload)))
	f.buf = append(f.buf, payload...)
	_, err := f.w.Write(f.buf)
	if cap(f.buf) > 1<<20 {
		f.buf = nil
	}
	if err != nil {
		f.failed = true
		close(f.broken)
	}
	return err
}

// frameStream lets a rank's line pump write output frames.
type frameStream struct {
	f    *frameWriter
	kind byte
	rank int
}

func (s frameStream) Write(p []byte) (int, error) {
	if err := s.f.send(s.kind, s.rank, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// endStream sends the end of rank r's stream, whose pump has run dry. For
// a launcher that tags output it goes at the start of a line, as the rank's
// lines do, after any other rank's open line: the launcher ends the stream
// with the last bytes it holds, a line of its own, which must not land in
// another rank's open line (the launcher could only cut that line).
func endStream(out *frameWriter, kind byte, r int, pump *linePump, tagged bool) {
	if tagged {
		pump.sink.lock(nil)
		defer pump.sink.mu.Unlock()
	}
	out.send(kind, r, nil)
}

// readFrame reads one frame.
func readFrame(r io.Reader, payload []byte) (kind byte, rnk int, data []byte, err error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[5:])
	if n > maxFrame {
		return 0, 0, nil, fmt.Errorf("launch: agent frame of %d bytes (at most %d)", n, maxFrame)
	}
	if cap(payload) < int(n) {
		payload = make([]byte, n)
	}
	payload = payload[:n]
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, 0, nil, io.ErrUnexpectedEOF
	}
	return h[0], int(int32(binary.BigEndian.Uint32(h[1:]))), payload, nil
}

// AgentOptions says how RunAgent runs.
type AgentOptions struct {
	// In carries the AgentJob and the control lines; Out receives the frames
	// (under ssh: the agent's stdin and stdout).
	In  io.Reader
	Out io.Writer
	// Lost, if set, delivers the signals that mean the connection or the
	// launcher is gone (SIGHUP, SIGTERM, a parent-death signal): the agent
	// then kills its ranks as at the end of In.
	Lost <-chan os.Signal
	// BaseEnv is the environment ranks inherit (nil: os.Environ()).
	BaseEnv []string
	// ShmDir and RuntimeDir as in Options.
	ShmDir, RuntimeDir string
	// Drain as in Options (0: DefaultDrain).
	Drain time.Duration
	// Logger receives the agent's steps (nil: discarded).
	Logger *slog.Logger
}

// RunAgent runs one host's part of a job for a launcher (see RunOnHosts): it
// reads the AgentJob from In, starts the host's ranks, each in its own process
// group with a parent-death signal, sends their output and ends as frames on
// Out, and delivers the signals the launcher asks for. When In ends, Out
// breaks or Lost delivers, it kills its ranks' process groups at once. It
// returns when every rank has ended. What goes wrong once the job is read (a
// program missing on the host, the job's lock taken) is told to the launcher;
// the error is for what could not be told: In ended before the job, or Out
// failed. A
// goroutine reads In until it ends, which may be after RunAgent returns: the
// caller closes In (under ssh, the process exits).
func RunAgent(ctx context.Context, opts AgentOptions) error {
	in := bufio.NewReaderSize(opts.In, 64<<10)
	out := newFrameWriter(opts.Out)
	if _, err := io.WriteString(opts.Out, agentHello); err != nil {
		return fmt.Errorf("launch: agent: %w", err)
	}
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("launch: agent: reading the job: %w", err)
	}
	var aj AgentJob
	if err := json.Unmarshal(line, &aj); err != nil {
		return agentFailed(out, -1, fmt.Errorf("launch: agent: the job: %w", err))
	}
	if aj.Version != agentVersion {
		return agentFailed(out, -1, fmt.Errorf("launch: agent: protocol version %d, this gearrun speaks %d: install the same gearrun on every host", aj.Version, agentVersion))
	}
	if aj.Plan == nil || len(aj.Plan.HostRanks(aj.Host)) == 0 {
		return agentFailed(out, -1, fmt.Errorf("launch: agent: the job has no ranks on host %q", aj.Host))
	}
	if err := rank.CheckJobID(aj.Plan.JobID); err != nil {
		return agentFailed(out, -1, fmt.Errorf("launch: agent: %w", err))
	}
	a := &agent{job: &aj, opts: opts, out: out, in: in}
	for i := range a.lines {
		a.lines[i] = &lineSink{hold: time.Duration(aj.LineHold)}
	}
	return a.run(ctx)
}

// agentFailed tells the launcher why the agent cannot run its part, and
// that no rank of it runs.
// It returns err when the launcher could not be told, else nil.
func agentFailed(out *frameWriter, r int, err error) error {
	if reportFailure(out, r, err) != nil || out.send(frameDone, -1, nil) != nil {
		return err
	}
	return nil
}

func reportFailure(out *frameWriter, r int, err error) error {
	b, _ := json.Marshal(agentExit{Code: exitCodeOf(err), Status: strings.TrimPrefix(err.Error(), "launch: ")})
	return out.send(frameFailed, r, b)
}

type agent struct {
	job  *AgentJob
	opts AgentOptions
	out  *frameWriter
	in   *bufio.Reader
	log  *slog.Logger

	ranks  []int
	groups []int
	pumps  sync.WaitGroup
	reads  []*os.File
	// lines keep the ranks' lines whole in the frames (AgentJob.TagOutput):
	// one for their stdout, one for their stderr, as the launcher has.
	lines [2]*lineSink
}

func (a *agent) run(ctx context.Context) error {
	p, opts := a.job.Plan, &a.opts
	a.log = opts.Logger
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if opts.ShmDir == "" {
		opts.ShmDir = "/dev/shm"
	}
	if opts.Drain <= 0 {
		opts.Drain = DefaultDrain
	}
	base := opts.BaseEnv
	if base == nil {
		base = os.Environ()
	}
	a.ranks = p.HostRanks(a.job.Host)
	// Shared: several agents of one job may share a machine (and its runtime
	// directory); a holder of the lock keeps `gearrun clean` and other
	// launchers off the job's segments.
	lock, err := rank.LockJob(opts.RuntimeDir, p.JobID, false)
	if err != nil {
		return agentFailed(a.out, -1, fmt.Errorf("launch: agent on %s: %w", a.job.Host, err))
	}
	keep := false // the launcher said a next generation follows
	defer func() {
		lock.Close()
		if keep {
			// The job goes on: its store shards stay for the next
			// generation's ranks; the dead world's channels go.
			removed, _ := RemoveGenerationSegments(opts.ShmDir, p.JobID)
			a.log.Debug("launch: agent: removed the segments of the generation", "segments", len(removed))
			// Its ranks' metrics segments too: the launcher has their
			// copies for the trace (sendTrace).
			if err := retireMetrics(opts.ShmDir, p.JobID, p.Restart, a.ranks, ""); err != nil {
				a.log.Warn("launch: agent: removing the metrics segments of the generation", "err", err)
			}
			return
		}
		// The last agent of the job on this machine (several may share it)
		// removes the job's segments.
		if !rank.JobAlive(opts.RuntimeDir, p.JobID) {
			RemoveJobSegments(opts.ShmDir, p.JobID)
		}
	}()
	dir := p.Dir
	if dir == "" && a.job.Dir != "" {
		if fi, err := os.Stat(a.job.Dir); err == nil && fi.IsDir() {
			dir = a.job.Dir
		}
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return agentFailed(a.out, -1, err)
	}
	defer devNull.Close()

	exits := make(chan exitEvent, len(a.ranks))
	reaper := newReaper(exits)
	defer reaper.close()
	guard := startGuard(opts.ShmDir, p.JobID, lock.Path(), a.log)
	defer guard.done()
	a.groups = make([]int, 0, len(a.ranks))

	// Control lines, pings, and the end of the connection.
	ctrl := make(chan syscall.Signal, 4)
	verdict := make(chan string, 1)
	gone := make(chan struct{})
	heard := make(chan struct{}, 1)
	go func() {
		defer close(gone)
		for {
			line, err := a.in.ReadString('\n')
			select {
			case heard <- struct{}{}:
			default:
			}
			word := strings.TrimSpace(line)
			if f, ok := strings.CutPrefix(word, "signal "); ok {
				if n, err := strconv.Atoi(f); err == nil && n > 0 && n < 65 {
					ctrl <- syscall.Signal(n)
				}
			}
			if word == "next" || word == "end" {
				select {
				case verdict <- word:
				default:
				}
			}
			if err != nil {
				return
			}
		}
	}()

	running := 0
	var startErr error
	for _, r := range a.ranks {
		proc, err := a.spawn(r, dir, devNull, base)
		if err != nil {
			startErr = err
			break
		}
		pid := proc.Pid
		guard.add(pid)
		a.groups = append(a.groups, pid)
		reaper.add(r, proc)
		running++
		a.out.send(frameStarted, r, []byte(strconv.Itoa(pid)))
	}
	if startErr != nil {
		if reportFailure(a.out, -1, startErr) == nil {
			startErr = nil // the launcher knows
		}
		a.signalAll(syscall.SIGTERM)
	}
	lost := false
	loseAll := func(why string) {
		if !lost {
			lost = true
			a.log.Debug("launch: agent: connection gone; killing the ranks", "why", why)
			a.signalAll(syscall.SIGKILL)
		}
	}
	broken := a.out.broken
	done := ctx.Done()
	lastHeard := time.Now()
	watch := time.NewTicker(agentPing / 2)
	defer watch.Stop()
	figures := time.NewTicker(agentMetricsEvery)
	defer figures.Stop()
	for running > 0 {
		select {
		case <-figures.C:
			a.sendFigures()
		case <-heard:
			lastHeard = time.Now()
		case <-watch.C:
			if time.Since(lastHeard) > agentSilence && !lost {
				loseAll(fmt.Sprintf("no word from the launcher for %v", agentSilence))
			}
		case ev := <-exits:
			running--
			b, _ := json.Marshal(exitOf(ev))
			a.out.send(frameExited, ev.rank, b)
		case sig := <-ctrl:
			a.signalAll(sig)
		case <-gone:
			gone = nil
			loseAll("stdin ended")
		case <-broken:
			broken = nil
			loseAll("output broken")
		case sig := <-opts.Lost:
			loseAll(fmt.Sprint(sig))
		case <-done:
			done = nil
			loseAll("stopped")
		}
	}
	a.signalAll(syscall.SIGKILL)
	a.drain()
	if !lost {
		a.sendFigures()
		a.sendTrace()
		a.out.send(frameDone, -1, nil)
	}
	if !lost && startErr == nil {
		// Whether the job's segments stay depends on what the other hosts
		// did: wait for the launcher's word, as long as it keeps talking. It
		// comes once every host's ranks have ended, so that an agent whose
		// ranks ended first does not take the job's segments from under
		// another agent of the job on the same machine that has yet to lock
		// the job.
		keep = a.awaitVerdict(verdict, gone, heard, broken, opts.Lost, done) && p.Restart < p.MaxRestarts
	}
	return startErr
}

// awaitVerdict waits for the launcher's word on the generation and reports
// whether it is "next". Silence, the end of the connection or a signal of
// loss mean the end.
func (a *agent) awaitVerdict(verdict <-chan string, gone <-chan struct{}, heard <-chan struct{}, broken <-chan struct{}, lostSig <-chan os.Signal, done <-chan struct{}) bool {
	silence := time.NewTimer(agentSilence)
	defer silence.Stop()
	for {
		select {
		case v := <-verdict:
			return v == "next"
		case <-heard:
			silence.Reset(agentSilence)
		case <-gone:
			// The word may have come with the end of the stream.
			select {
			case v := <-verdict:
				return v == "next"
			default:
				return false
			}
		case <-broken:
			return false
		case <-lostSig:
			return false
		case <-done:
			return false
		case <-silence.C:
			return false
		}
	}
}

// spawn starts rank r.
func (a *agent) spawn(r int, dir string, stdin *os.File, base []string) (*os.Process, error) {
	p := a.job.Plan
	spec := &p.Ranks[r]
	path, err := findProgram(spec.Argv[0], dir)
	if err != nil {
		return nil, &programError{fmt.Errorf("launch: rank %d on %s: %s", r, a.job.Host, strings.TrimPrefix(err.Error(), "launch: ")), exitCodeOf(err)}
	}
	if d := p.inheritDefaults(r); len(d) > 0 {
		base = append(d, base...)
	}
	env := rank.MergeEnv(base, p.Environ(r, a.job.RdzvAddr), p.inheritDrop(r)...)
	pipe := func(kind byte) (*os.File, error) {
		rd, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("launch: output pipe: %w", err)
		}
		a.reads = append(a.reads, rd)
		frames := frameStream{a.out, kind, r}
		pump := newLinePump("", &lineSink{w: frames})
		if a.job.TagOutput {
			lines := a.lines[0]
			if kind == frameStderr {
				lines = a.lines[1]
			}
			pump = newWholeLinePump(frames, lines)
		}
		a.pumps.Add(1)
		go func() {
			defer a.pumps.Done()
			pump.run(rd)
			endStream(a.out, kind, r, pump, a.job.TagOutput)
		}()
		return w, nil
	}
	stdout, err := pipe(frameStdout)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := pipe(frameStderr)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	proc, err := os.StartProcess(path, spec.Argv, &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []*os.File{stdin, stdout, stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		return nil, startFailed(err, path, dir, fmt.Sprintf("launch: rank %d on %s: start %s", r, a.job.Host, spec.Argv[0]))
	}
	return proc, nil
}

func (a *agent) signalAll(sig syscall.Signal) {
	for _, g := range a.groups {
		syscall.Kill(-g, sig)
	}
}

// drain waits for the output pumps, at most Drain after the ranks ended.
func (a *agent) drain() {
	drained := make(chan struct{})
	go func() {
		a.pumps.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(a.opts.Drain):
		for _, r := range a.reads {
			r.Close()
		}
		<-drained
	}
	for _, r := range a.reads {
		r.Close()
	}
}

// exitOf turns a reaped status into an agentExit.
func exitOf(ev exitEvent) agentExit {
	if ev.err != nil {
		return agentExit{Code: ExitLaunchFailed, Status: "lost: " + ev.err.Error()}
	}
	ws := ev.status
	if ws.Signaled() {
		name := signalName(ws.Signal())
		return agentExit{Code: 128 + int(ws.Signal()), Signal: name, Status: "killed by " + name}
	}
	return agentExit{Code: ws.ExitStatus(), Status: "exited with status " + strconv.Itoa(ws.ExitStatus())}
}
