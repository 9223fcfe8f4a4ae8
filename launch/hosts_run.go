package launch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/rank"
)

// Remote says how RunOnHosts reaches the hosts and starts their agents.
type Remote struct {
	// SSH is the ssh command and its options ({"ssh", "-p", "2222", "-i",
	// "key"}); nil means {"ssh"}. RunOnHosts puts -o BatchMode=yes first,
	// so that ssh never waits for a password.
	SSH []string
	// Gearrun is the command that runs gearrun on the hosts, as their login
	// shell reads it ("/opt/gear/bin/gearrun"); RunOnHosts appends " agent".
	Gearrun string
	// Dir is the ranks' working directory on hosts where it exists, when the
	// plan names none ("": the launcher's working directory).
	Dir string
}

// RunOnHosts runs a plan placed on hosts (Plan.PlaceOnHosts): it starts the
// coordinator on the plan's RdzvAddr (which the hosts must reach) and, over
// ssh to each host, a per-host agent (`gearrun agent`, see RunAgent) that
// starts that host's ranks. Every host goes through ssh, localhost included.
// The agents send the ranks' output back over ssh, tagged and in whole lines
// as Run does, and report each rank's end. Failure and signals work as in Run
// across every host: the first failed rank, a timeout or a signal stops the
// ranks of every host (the signal, then SIGKILL after the grace period). A
// host whose agent or ssh connection ends before its ranks did is lost: the
// job fails with an error naming the host and its ranks (exit code
// ExitLaunchFailed), and the other hosts are stopped. An agent whose
// connection ends kills its ranks' process groups.
//
// With Plan.MaxRestarts, a rank's failure or a lost host stops every host as
// above, and then the next generation starts: a coordinator of that
// generation where the first listened, and new agents over ssh. A host lost
// while its ranks ran (its agent or connection gone, or cut off) is not part
// of the next generation: the plan is placed again on the hosts left
// (Plan.Survivors), with as many ranks if their slots hold them, else, for an
// elastic plan, as many as they hold down to Plan.MinSize; below that the
// job ends. A rank's failure alone restarts the world on the same hosts. Between generations
// each agent removes its host's collective and role-channel segments of the
// dead world and keeps the job's others (RemoveGenerationSegments).
//
// Options.Stdin, ShmDir, Limits and BaseEnv concern this machine and are
// unused: the ranks read /dev/null and inherit their agent's environment.
// RuntimeDir holds the file of the ranks' figures, which the agents send
// (LiveMetricsPath, read by gearrun top), and Trace is merged from copies of
// the ranks' metrics segments that the agents send at the end of each
// generation.
func RunOnHosts(ctx context.Context, p *Plan, opts Options, rem Remote) (*Result, error) {
	if p == nil || len(p.Hosts) == 0 {
		return nil, errors.New("launch: the plan names no hosts (Plan.PlaceOnHosts)")
	}
	if rem.Gearrun == "" {
		return nil, errors.New("launch: no gearrun command for the hosts")
	}
	j, err := newJob(p, opts)
	if err != nil {
		return nil, err
	}
	if len(rem.SSH) == 0 {
		rem.SSH = []string{"ssh"}
	}
	if rem.Dir == "" {
		rem.Dir, _ = os.Getwd()
	}
	hj := &hostJob{job: j, rem: rem}
	if opts.Trace != "" {
		events := opts.TraceEvents
		if events <= 0 {
			events = DefaultTraceEvents
		}
		hj.plan.Env = append(slices.Clone(hj.plan.Env), rank.EnvTraceEvents+"="+strconv.Itoa(min(events, metrics.MaxTraceEvents)))
	}
	if hj.live, err = newHostMetrics(opts.RuntimeDir, p.JobID, opts.Trace != ""); err != nil {
		return nil, err
	}
	defer hj.live.close()
	defer func() {
		if opts.Trace != "" {
			hj.writeTraceFrom(hj.live.traceDir)
		}
	}()
	return hj.run(ctx)
}

type hostJob struct {
	*job
	rem    Remote
	live   *hostMetrics // the agents' figures and trace segments
	hosts  []*hostConn
	events chan hostEvent
	// sinks[r] are rank r's stdout and stderr pumps.
	sinks   [][2]*linePump
	files   []*os.File
	readers sync.WaitGroup
	// exited[r] is set when rank r's end is known.
	exited []bool
	// coordLost: ranks the coordinator lost (OnLost).
	coordLost chan lostRank
	// verdict is the current generation's fate, told to the agents once
	// every host has reported its ranks' ends: verdictNext, verdictEnd, or 0
	// before it is known.
	verdict int
	// next is the world of the next generation (verdictNext).
	next *Plan
	// decideNext is the RestartLoop's decision on the current generation.
	decideNext func(Ending) bool
	// listen is where the coordinators listen: the plan's RdzvAddr, then
	// the address the first generation's got.
	listen string
	// setupErr: the first generation's coordinator could not listen.
	setupErr error
}

const (
	verdictNext = 1 + iota
	verdictEnd
)

type lostRank struct {
	rank   int
	reason string
}

// Pings: the launcher writes a line to every agent each agentPing; an agent
// that hears nothing for agentSilence takes its launcher for unreachable (a
// host cut off without its connection closing) and kills its ranks.
const (
	agentPing    = time.Second
	agentSilence = 10 * time.Second
)

// lostReportWait is how long a rank the coordinator lost may take to be
// reported by its agent (a rank that crashed) before its host counts as
// unreachable.
const lostReportWait = 2 * time.Second

// hostConn is one host's ssh connection and agent.
type hostConn struct {
	index   int
	name    string
	ranks   []int
	cmd     *exec.Cmd
	ctl     chan string // control lines for the agent; closed: close its stdin
	started bool        // some rank of the host started
	done    bool        // the agent said every rank ended
	ended   bool        // ssh ended
	lost    bool        // the host was reported lost
	tail    *tailWriter
}

type hostEvent struct {
	host int
	kind byte // a frame kind, or hostEnded
	rank int
	data []byte
	err  error
}

const hostEnded = 'E'

func (hj *hostJob) run(ctx context.Context) (*Result, error) {
	if err := hj.openSinks(); err != nil {
		return hj.setupFailed(err)
	}
	defer func() {
		for _, f := range hj.files {
			f.Close()
		}
	}()
	if hj.opts.Timeout > 0 {
		t := time.NewTimer(hj.opts.Timeout)
		defer t.Stop()
		hj.timeout = t.C
	}
	hj.listen = hj.plan.RdzvAddr
	hj.loop.Run(ctx, hj)
	if hj.setupErr != nil {
		return hj.setupFailed(hj.setupErr)
	}
	hj.res.Restarts = hj.loop.Restarts()
	res := hj.res
	if hj.cause != "" {
		res.Cause, res.ExitCode = hj.cause, hj.code
		return res, &JobError{Cause: hj.cause, Code: hj.code, Announced: hj.announced}
	}
	return res, nil
}

var _ Generations = (*hostJob)(nil)

// RunGeneration runs the world of generation gen on its hosts; the next
// generation, if one follows, runs the world Next made.
func (hj *hostJob) RunGeneration(ctx context.Context, gen int, decide func(Ending) bool) bool {
	hj.decideNext = decide
	var err error
	if hj.listen, err = hj.generation(ctx, gen, hj.listen); err != nil {
		if gen == 0 {
			hj.setupErr = err
			return false
		}
		hj.fail(-1, strings.TrimPrefix(err.Error(), "launch: "), ExitLaunchFailed)
		return false
	}
	if hj.verdict != verdictNext || !hj.restarting {
		return false // a signal after the verdict ends the job all the same
	}
	hj.plan = hj.next
	return true
}

// Stopped ends the job on a signal, the timeout or ctx's end that came
// since the world failed.
func (hj *hostJob) Stopped(ctx context.Context) bool { return hj.stopped(ctx) }

// Next is the world of the next generation (nextWorld), or the job's end
// when the hosts left cannot hold it.
func (hj *hostJob) Next(context.Context) (string, bool) {
	next, line, err := hj.nextWorld()
	if err != nil {
		hj.giveUp(err.Error())
		return "", false
	}
	hj.next = next
	return line, true
}

// generation runs one world of the job: its coordinator, listening on
// listen (the first generation's address for later ones, so that a
// straggler of an older world reaches the coordinator that refuses it by
// name), and an agent on each of its hosts. It returns the address the
// coordinator listened on; the error is for a coordinator that could not
// listen.
func (hj *hostJob) generation(ctx context.Context, gen int, listen string) (string, error) {
	p := hj.plan
	n := len(p.Ranks)
	hj.newGeneration(gen)
	hj.exited = make([]bool, n)
	hj.events = make(chan hostEvent, 64)
	hj.coordLost = make(chan lostRank, n)
	hj.hosts = nil
	hj.verdict, hj.next = 0, nil
	cfg := rank.CoordinatorConfig{
		Addr: listen, JobID: p.JobID, Token: p.Token, Size: n, Generation: gen,
		Timeout: time.Duration(p.RdzvTimeout), Logger: hj.log, ExitReports: true,
		Heartbeat: time.Duration(p.HeartbeatInterval), HeartbeatTimeout: time.Duration(p.HeartbeatTimeout),
		OnFail: func(err error) {
			select {
			case hj.rdzvFail <- err:
			default:
			}
		},
		OnLost: func(r int, reason string) {
			select {
			case hj.coordLost <- lostRank{r, reason}:
			default:
			}
		},
	}
	coord, err := rank.NewCoordinator(cfg)
	if err != nil && gen > 0 && listen != p.RdzvAddr {
		hj.log.Debug("launch: the first generation's rendezvous address is taken; listening anew", "addr", listen, "err", err)
		cfg.Addr = p.RdzvAddr
		coord, err = rank.NewCoordinator(cfg)
	}
	if err != nil {
		return listen, err
	}
	hj.coord = coord
	defer coord.Close()
	listen = coord.Addr()
	rdzv := listen
	if host, port, err := net.SplitHostPort(rdzv); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			// Listening everywhere, as asked: the hosts dial the address on
			// the route to them.
			hosts := make([]Host, len(p.Hosts))
			for i, h := range p.Hosts {
				hosts[i] = Host{Name: h, Slots: 1}
			}
			if a, err := RdzvAddrFor(hosts); err == nil {
				h, _, _ := net.SplitHostPort(a)
				rdzv = net.JoinHostPort(h, port)
			}
		}
	}
	hj.res.RdzvAddr = rdzv
	if p.TorchEnv {
		hj.res.MasterAddr = net.JoinHostPort(p.MasterAddr, strconv.Itoa(p.MasterPort))
	}
	hj.log.Debug("launch: coordinator listening", "job", p.JobID, "generation", gen, "rdzv", rdzv, "ranks", n, "hosts", len(p.Hosts))
	for i, name := range p.Hosts {
		h := &hostConn{index: i, name: name, ranks: p.HostRanks(name), ctl: make(chan string, 16)}
		hj.hosts = append(hj.hosts, h)
		if err := hj.start(h, rdzv); err != nil {
			hj.fail(-1, err.Error(), ExitLaunchFailed)
			break
		}
	}
	hj.wait(ctx)
	hj.decideGeneration()
	for _, h := range hj.hosts {
		close(h.ctl)
	}
	hj.readers.Wait()
	return listen, nil
}

// settled reports whether every host of the generation has reported its
// ranks' ends or ended.
func (hj *hostJob) settled() bool {
	for _, h := range hj.hosts {
		if h.cmd != nil && !h.done && !h.ended {
			return false
		}
	}
	return true
}

// decideGeneration settles the generation's fate once, through the
// RestartLoop: the next generation (a rank failed or a host was lost,
// restarts remain, no signal, timeout or cancellation came meanwhile, and
// the hosts left can hold the job) or the end. It is called once every
// host has reported its ranks' ends, while their agents wait for the word,
// or when every connection has ended. The agents still connected are told
// ("next": keep the job's segments but the dead world's; "end").
func (hj *hostJob) decideGeneration() {
	if hj.verdict != 0 {
		return
	}
	hj.verdict = verdictEnd
	if hj.decide(hj.decideNext) {
		hj.verdict = verdictNext
	}
	word := "end\n"
	if hj.verdict == verdictNext {
		word = "next\n"
	}
	for _, h := range hj.hosts {
		if h.cmd != nil && !h.ended {
			select {
			case h.ctl <- word:
			default: // the agent does not read; its connection's end ends it
			}
		}
	}
}

// nextWorld is the plan of the next generation: the same world when every
// host stays, else the plan resized onto the hosts that remain (Survivors),
// and the text the restart line adds; the error says why no world is left.
func (hj *hostJob) nextWorld() (*Plan, string, error) {
	var gone []string
	for _, h := range hj.hosts {
		if h.lost && h.started {
			gone = append(gone, h.name)
		}
	}
	if len(gone) == 0 {
		return hj.plan, "", nil
	}
	next, err := hj.plan.Survivors(gone)
	if err != nil {
		return nil, "", err
	}
	ranks := "ranks"
	if len(next.Ranks) == 1 {
		ranks = "rank"
	}
	return next, fmt.Sprintf("next world: %d %s on %s", len(next.Ranks), ranks, strings.Join(next.Hosts, ",")), nil
}

// openSinks makes each rank's output pumps: tagged lines on Stdout and
// Stderr, or files in OutputDir.
func (hj *hostJob) openSinks() error {
	hj.sinks = make([][2]*linePump, len(hj.plan.Ranks))
	if hj.opts.OutputDir != "" {
		if err := os.MkdirAll(hj.opts.OutputDir, 0o755); err != nil {
			return fmt.Errorf("launch: output dir: %w", err)
		}
	}
	for r := range hj.sinks {
		if hj.opts.OutputDir != "" {
			for s, stream := range []string{"stdout", "stderr"} {
				f, err := os.OpenFile(filepath.Join(hj.opts.OutputDir, fmt.Sprintf("rank.%d.%s", r, stream)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
				if err != nil {
					return fmt.Errorf("launch: output dir: %w", err)
				}
				hj.files = append(hj.files, f)
				hj.sinks[r][s] = newLinePump("", &lineSink{w: f})
			}
			continue
		}
		prefix := ""
		if hj.opts.TagOutput {
			prefix = "[" + strconv.Itoa(r) + "] "
		}
		hj.sinks[r] = [2]*linePump{newLinePump(prefix, hj.stdout), newLinePump(prefix, hj.stderr)}
	}
	return nil
}

// start starts host h's ssh and agent, and the goroutines that feed it and
// read it.
func (hj *hostJob) start(h *hostConn, rdzv string) error {
	job, err := json.Marshal(AgentJob{Version: agentVersion, Host: h.name, RdzvAddr: rdzv, Dir: hj.rem.Dir, Plan: hj.plan,
		TagOutput: hj.opts.TagOutput && hj.opts.OutputDir == "", LineHold: Duration(hj.opts.LineHold)})
	if err != nil {
		return fmt.Errorf("launch: host %s: %w", h.name, err)
	}
	job = append(job, '\n')
	args := append([]string{"-o", "BatchMode=yes"}, hj.rem.SSH[1:]...)
	args = append(args, h.name, hj.rem.Gearrun+" agent")
	cmd := exec.Command(hj.rem.SSH[0], args...)
	// Its own process group: a terminal's ^C reaches gearrun, which forwards
	// it, not ssh, which would drop the connection.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("launch: host %s: %w", h.name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("launch: host %s: %w", h.name, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("launch: host %s: %w", h.name, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("launch: host %s: start %s: %w", h.name, hj.rem.SSH[0], err)
	}
	h.cmd = cmd
	hj.log.Debug("launch: ssh started", "host", h.name, "pid", cmd.Process.Pid, "ranks", rank.FormatRanks(h.ranks))
	// The job, then control lines, on the agent's stdin.
	hj.readers.Add(1)
	go func() {
		defer hj.readers.Done()
		stdin.Write(job)
		ping := time.NewTicker(agentPing)
		defer ping.Stop()
		for {
			select {
			case line, ok := <-h.ctl:
				if !ok {
					stdin.Close()
					return
				}
				stdin.Write([]byte(line))
			case <-ping.C:
				stdin.Write([]byte("ping\n"))
			}
		}
	}()
	h.tail = &tailWriter{sink: hj.stderr}
	errPump := newLinePump(hj.opts.Name+": "+h.name+": ", &lineSink{w: h.tail})
	errDone := make(chan struct{})
	go func() {
		defer close(errDone)
		errPump.run(stderr)
	}()
	hj.readers.Add(1)
	go func() {
		defer hj.readers.Done()
		rerr := hj.read(h, bufio.NewReaderSize(stdout, 64<<10))
		if rerr != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		select {
		case <-errDone:
		case <-time.After(time.Second):
			// ssh ended, but a child of it (a ProxyCommand) holds its
			// stderr: end its process group.
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-errDone
		}
		werr := cmd.Wait()
		if rerr != nil {
			werr = rerr
		}
		hj.events <- hostEvent{host: h.index, kind: hostEnded, err: werr}
	}()
	return nil
}

// read reads host h's frames until the connection ends: output goes to the
// ranks' sinks, the rest to the events. Lines before the agent's hello (what
// the host's login shell printed) go to the launcher's stderr.
func (hj *hostJob) read(h *hostConn, r *bufio.Reader) error {
	junk := 0
	for {
		line, err := r.ReadString('\n')
		junkLine, hello := strings.CutSuffix(line, agentHello)
		if hello {
			if junkLine != "" {
				h.tail.Write([]byte(hj.opts.Name + ": " + h.name + ": " + junkLine + "\n"))
			}
			break
		}
		if line != "" {
			junk += len(line)
			h.tail.Write([]byte(hj.opts.Name + ": " + h.name + ": " + strings.TrimSuffix(line, "\n") + "\n"))
		}
		if err != nil {
			return nil // ended before the agent spoke: ssh's status says why
		}
		if junk > 1<<20 {
			return fmt.Errorf("launch: host %s: 1 MiB of output and no agent: is the remote gearrun command (%s) right?", h.name, hj.rem.Gearrun)
		}
	}
	mine := make(map[int]bool, len(h.ranks))
	for _, x := range h.ranks {
		mine[x] = true
		// This goroutine alone feeds the host's ranks' pumps, in the
		// order the agent sent: a rank's output that arrives while another
		// of them holds a line open cannot wait for the rest of that line,
		// which comes after it.
		hj.sinks[x][0].feeder, hj.sinks[x][1].feeder = h, h
	}
	// An agent that ended without ending a stream leaves its last line held
	// or open: end it.
	defer func() {
		for _, x := range h.ranks {
			hj.sinks[x][0].end()
			hj.sinks[x][1].end()
		}
	}()
	var buf []byte
	for {
		kind, rnk, data, err := readFrame(r, buf)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("launch: host %s: reading its agent: %w", h.name, err)
		}
		buf = data[:0]
		if rnk != -1 && !mine[rnk] {
			return fmt.Errorf("launch: host %s: its agent sent a frame of rank %d, not one of its ranks %s", h.name, rnk, rank.FormatRanks(h.ranks))
		}
		switch kind {
		case frameStdout, frameStderr:
			if rnk < 0 {
				return fmt.Errorf("launch: host %s: output frame without a rank", h.name)
			}
			s := 0
			if kind == frameStderr {
				s = 1
			}
			if len(data) == 0 {
				hj.sinks[rnk][s].end() // the rank's stream ended
			} else {
				hj.sinks[rnk][s].feed(data)
			}
		case frameMetrics:
			if err := hj.live.figures(h.index, data); err != nil {
				hj.log.Debug("launch: figures of a host", "host", h.name, "err", err)
			}
		case frameSegment:
			if err := hj.live.segment(data); err != nil {
				return fmt.Errorf("launch: host %s: %w", h.name, err)
			}
		case frameStarted, frameExited, frameFailed, frameDone:
			hj.events <- hostEvent{host: h.index, kind: kind, rank: rnk, data: append([]byte(nil), data...)}
		default:
			return fmt.Errorf("launch: host %s: unknown frame %q from its agent", h.name, kind)
		}
	}
}

// wait runs until every host's ssh has ended.
func (hj *hostJob) wait(ctx context.Context) {
	running := 0
	for _, h := range hj.hosts {
		if h.cmd != nil {
			running++
		}
	}
	timeout := hj.timeout
	// grace: from the first stop to SIGKILL of every rank; cut: a grace
	// later, ssh connections still open (a host that no longer answers) are
	// cut, which makes their hosts lost.
	var grace, cut <-chan time.Time
	var timers []*time.Timer
	defer func() {
		for _, t := range timers {
			t.Stop()
		}
	}()
	after := func(d time.Duration) <-chan time.Time {
		t := time.NewTimer(d)
		timers = append(timers, t)
		return t.C
	}
	stop := func(sig syscall.Signal) {
		if !hj.terminated {
			hj.terminated = true
			hj.signalHosts(sig)
			grace = after(hj.opts.Grace)
		}
	}
	if hj.cause != "" {
		stop(syscall.SIGTERM)
	}
	done := ctx.Done()
	signals := hj.opts.Signals
	interrupted := false
	pending := map[int]string{} // ranks the coordinator lost, their reports awaited
	var check <-chan time.Time
	for running > 0 {
		select {
		case l := <-hj.coordLost:
			if !hj.exited[l.rank] {
				if len(pending) == 0 {
					check = after(lostReportWait)
				}
				pending[l.rank] = l.reason
			}
		case <-check:
			check = nil
			for r, reason := range pending {
				if !hj.exited[r] {
					hj.cutHost(hj.hostOf(r), reason)
				}
			}
			clear(pending)
			if hj.cause != "" {
				stop(syscall.SIGTERM)
			}
		case ev := <-hj.events:
			if ev.kind == hostEnded {
				running--
			}
			hj.event(ev)
			if hj.cause != "" {
				stop(syscall.SIGTERM)
			}
			if running > 0 && hj.settled() {
				// Every agent still connected waits for the word on the
				// job's segments.
				hj.decideGeneration()
			}
		case err := <-hj.rdzvFail:
			hj.fail(-1, strings.TrimPrefix(err.Error(), "rank: "), ExitLaunchFailed)
			stop(syscall.SIGTERM)
		case <-timeout:
			timeout = nil
			hj.fail(-1, fmt.Sprintf("job timed out after %v", hj.opts.Timeout), ExitTimeout)
			stop(syscall.SIGTERM)
		case <-done:
			done = nil
			hj.fail(-1, fmt.Sprintf("job stopped: %v", context.Cause(ctx)), ExitLaunchFailed)
			stop(syscall.SIGTERM)
		case sig := <-signals:
			s, _ := sig.(syscall.Signal)
			if interrupted {
				hj.signalHosts(syscall.SIGKILL)
				continue
			}
			interrupted = true
			hj.fail(-1, fmt.Sprintf("interrupted by %s", signalName(s)), 128+int(s))
			if hj.terminated {
				hj.signalHosts(s)
			}
			stop(s)
		case <-grace:
			grace = nil
			hj.log.Debug("launch: grace period over; killing every rank")
			hj.signalHosts(syscall.SIGKILL)
			cut = after(hj.opts.Grace)
		case <-cut:
			cut = nil
			for _, h := range hj.hosts {
				if h.cmd != nil && !h.ended && !h.done {
					hj.log.Debug("launch: cutting the connection of a host that does not end", "host", h.name)
					syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
				}
			}
		}
	}
}

// event handles one report of a host.
func (hj *hostJob) event(ev hostEvent) {
	h := hj.hosts[ev.host]
	switch ev.kind {
	case frameStarted:
		pid, _ := strconv.Atoi(string(ev.data))
		rr := &hj.res.Ranks[ev.rank]
		rr.PID, rr.Started, rr.Status = pid, true, "running"
		h.started = true
		hj.log.Debug("launch: rank started", "rank", ev.rank, "host", h.name, "pid", pid)
		if hj.opts.OnStart != nil {
			hj.opts.OnStart(ev.rank, pid)
		}
	case frameExited:
		var ax agentExit
		if err := json.Unmarshal(ev.data, &ax); err != nil {
			ax = agentExit{Code: ExitLaunchFailed, Status: "lost: unreadable report from its agent"}
		}
		hj.rankEnded(ev.rank, ax)
	case frameFailed:
		var ax agentExit
		if err := json.Unmarshal(ev.data, &ax); err != nil || ax.Code == 0 {
			ax.Code = ExitLaunchFailed
		}
		hj.fail(-1, ax.Status, ax.Code)
	case frameDone:
		h.done = true
	case hostEnded:
		h.ended = true
		hj.live.hostGone(h.index)
		if !h.done {
			hj.hostLost(h, ev.err)
		}
	}
}

// rankEnded records rank r's end and tells the coordinator.
func (hj *hostJob) rankEnded(r int, ax agentExit) {
	if hj.exited[r] {
		return
	}
	hj.exited[r] = true
	rr := &hj.res.Ranks[r]
	rr.Code, rr.Signal, rr.Status = ax.Code, ax.Signal, ax.Status
	hj.log.Debug("launch: rank ended", "rank", r, "status", rr.Status)
	hj.coord.RankExited(r, rr.Code == 0, rr.Status)
	if rr.Code == 0 {
		return
	}
	select {
	case err := <-hj.rdzvFail:
		hj.fail(-1, strings.TrimPrefix(err.Error(), "rank: "), ExitLaunchFailed)
	default:
	}
	hj.fail(r, hj.plan.Ranks[r].who(r, rr.PID, true)+" "+rr.Status, rr.Code)
}

// hostLost fails the job for a host whose connection ended before its agent
// said its ranks had ended.
func (hj *hostJob) hostLost(h *hostConn, err error) {
	how := "its connection ended"
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			how = "ssh killed by " + signalName(ws.Signal())
		} else {
			how = "ssh exited with status " + strconv.Itoa(ee.ExitCode())
		}
	case err != nil:
		how = err.Error()
	case h.started:
		how = "its agent ended without a word"
	}
	if !h.started {
		how += " before its agent started the ranks"
	}
	if t := h.tail.last(); t != "" {
		how += " (" + t + ")"
	}
	hj.loseHost(h, how)
}

// loseHost fails the job for host h, lost as how says, and tells the
// coordinator that its ranks are gone; once per host.
func (hj *hostJob) loseHost(h *hostConn, how string) {
	if h.lost {
		return
	}
	h.lost = true
	var lost []int
	for _, r := range h.ranks {
		if !hj.exited[r] {
			lost = append(lost, r)
		}
	}
	ranks := h.ranks
	if len(lost) > 0 && len(lost) < len(h.ranks) {
		ranks = lost
	}
	cause := fmt.Sprintf("host %s (%s) lost: %s", h.name, hostRanksText(ranks), how)
	for _, r := range lost {
		hj.exited[r] = true
		rr := &hj.res.Ranks[r]
		rr.Code, rr.Status = ExitLaunchFailed, "lost with host "+h.name
		hj.coord.RankExited(r, false, "host "+h.name+" lost")
	}
	hj.mu.Lock()
	first := hj.cause == ""
	hj.mu.Unlock()
	if first {
		// A host lost while its ranks ran is the world's failure, like a
		// rank's: restarts answer it. One that never started them (ssh
		// cannot reach it) is the launch's.
		hj.failWorld(-1, cause, ExitLaunchFailed, h.started)
	} else {
		hj.stderr.write([]byte(hj.opts.Name + ": " + cause + "\n"))
	}
}

// hostOf is the connection of rank r's host.
func (hj *hostJob) hostOf(r int) *hostConn {
	for _, h := range hj.hosts {
		if h.name == hj.plan.Ranks[r].Host {
			return h
		}
	}
	return nil
}

// cutHost ends the connection of a host whose ranks the coordinator lost
// without a report from its agent: the host no longer answers, and its ssh
// may wait long for a dead connection.
func (hj *hostJob) cutHost(h *hostConn, reason string) {
	if h == nil || h.cmd == nil || h.ended || h.lost {
		return
	}
	hj.loseHost(h, strings.TrimPrefix(reason, "host "+h.name+" "))
	syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
}

// signalHosts asks every host's agent to signal its ranks.
func (hj *hostJob) signalHosts(sig syscall.Signal) {
	for _, h := range hj.hosts {
		if h.cmd == nil || h.ended {
			continue
		}
		select {
		case h.ctl <- "signal " + strconv.Itoa(int(sig)) + "\n":
		default: // the agent does not read; the cut after the grace ends it
		}
	}
}

// tailWriter passes ssh's stderr lines on and keeps the last one.
type tailWriter struct {
	sink *lineSink
	mu   sync.Mutex
	line string
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.sink.write(p)
	lines := strings.Split(strings.TrimRight(string(p), "\n"), "\n")
	t.mu.Lock()
	t.line = lines[len(lines)-1]
	t.mu.Unlock()
	return len(p), nil
}

// last is the last line without the launcher's prefix.
func (t *tailWriter) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, rest, ok := strings.Cut(t.line, ": "); ok {
		if _, rest2, ok := strings.Cut(rest, ": "); ok {
			return strings.TrimSpace(rest2)
		}
	}
	return strings.TrimSpace(t.line)
}
