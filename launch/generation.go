package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gear-rl/gear/rank"
)

// localGenerations runs a job's worlds on this machine, one a generation,
// under the job's RestartLoop.
type localGenerations struct {
	*job
	programs []string // each rank's program, resolved once
	devNull  *os.File
	autoPort bool // the torch contract's master port is reserved anew each generation
}

var _ Generations = (*localGenerations)(nil)

// decide asks the RestartLoop whether the current generation's world,
// which ended as its failure says, is followed by another; a restart's line
// has said the failure that was held.
func (j *job) decide(decide func(Ending) bool) bool {
	j.mu.Lock()
	e := Ending{Cause: j.cause, Restartable: j.restarting}
	j.mu.Unlock()
	if !decide(e) {
		return false
	}
	j.mu.Lock()
	j.held = false
	j.mu.Unlock()
	return true
}

// newGeneration resets what belongs to one world of the job: its processes,
// their results, its failure.
func (j *job) newGeneration(gen int) {
	n := len(j.plan.Ranks)
	j.plan.Restart = gen
	j.procs = make([]*os.Process, n)
	j.groups = make([]int, n)
	j.res.Ranks = make([]RankResult, n)
	for i := range j.res.Ranks {
		j.res.Ranks[i] = RankResult{Rank: i, Code: -1, Status: "not started"}
	}
	j.res.FailedRank = -1
	j.mu.Lock()
	j.cause, j.code, j.announced, j.restarting, j.held = "", 0, false, false, false
	j.mu.Unlock()
	j.terminated = false
	j.readEnds = nil
	j.rdzvFail = make(chan error, 1)
	j.coordLost = make(chan lostRank, n)
	j.exits = make(chan exitEvent, n)
	j.settle, j.settleC = nil, nil
}

// startCoordinator starts the rendezvous of the current generation. Later
// generations listen where the first did, so that a straggler of an older
// one reaches the coordinator that refuses it by name.
func (j *job) startCoordinator() error {
	p := j.plan
	cfg := rank.CoordinatorConfig{
		Addr: p.RdzvAddr, JobID: p.JobID, Token: p.Token, Size: len(p.Ranks),
		Generation: p.Restart,
		Timeout:    time.Duration(p.RdzvTimeout), Logger: j.log, ExitReports: true,
		Heartbeat: time.Duration(p.HeartbeatInterval), HeartbeatTimeout: time.Duration(p.HeartbeatTimeout),
		OnFail: func(err error) {
			select {
			case j.rdzvFail <- err:
			default:
			}
		},
		OnLost: func(r int, reason string) {
			select {
			case j.coordLost <- lostRank{r, reason}:
			default:
			}
		},
	}
	if p.Restart > 0 && j.res.RdzvAddr != "" {
		cfg.Addr = j.res.RdzvAddr
	}
	coord, err := rank.NewCoordinator(cfg)
	if err != nil && cfg.Addr != p.RdzvAddr {
		j.log.Debug("launch: the first generation's rendezvous address is taken; listening anew", "addr", cfg.Addr, "err", err)
		cfg.Addr = p.RdzvAddr
		coord, err = rank.NewCoordinator(cfg)
	}
	if err != nil {
		return err
	}
	j.coord = coord
	j.res.RdzvAddr = coord.Addr()
	j.log.Debug("launch: coordinator listening", "job", p.JobID, "generation", p.Restart, "rdzv", coord.Addr(), "ranks", len(p.Ranks))
	return nil
}

// dropGeneration removes the segments of the world that just ended that no
// later generation uses (RemoveGenerationSegments): its collectives' and
// role channels'. Every rank and what was left in their process groups has
// been killed by now.
func (j *job) dropGeneration() {
	removed, err := RemoveGenerationSegments(j.opts.ShmDir, j.plan.JobID)
	j.log.Debug("launch: removed the segments of the last generation", "generation", j.plan.Restart, "segments", len(removed))
	if err != nil {
		j.log.Warn("launch: removing the segments of the last generation", "err", err)
	}
	// Its ranks' metrics segments go too, into the trace's directory first
	// if the job keeps a trace.
	if j.opts.Trace != "" && j.traceDir == "" {
		if j.traceDir, err = os.MkdirTemp("", "gear-trace-"); err != nil {
			j.log.Warn("launch: trace", "err", err)
			j.traceDir = ""
			return // the segments stay, for the trace at the job's end
		}
	}
	if err := retireMetrics(j.opts.ShmDir, j.plan.JobID, j.plan.Restart, nil, j.traceDir); err != nil {
		j.log.Warn("launch: removing the metrics segments of the last generation", "err", err)
	}
}

// stopped reports whether the job was stopped since its world failed: a
// signal to the launcher, its timeout or a cancelled ctx that came meanwhile
// end the job instead of a restart, and become its cause.
func (j *job) stopped(ctx context.Context) bool {
	select {
	case sig := <-j.opts.Signals:
		s, _ := sig.(syscall.Signal)
		j.fail(-1, fmt.Sprintf("interrupted by %s", signalName(s)), 128+int(s))
		return true
	case <-j.timeout:
		j.fail(-1, fmt.Sprintf("job timed out after %v", j.opts.Timeout), ExitTimeout)
		return true
	case <-ctx.Done():
		j.fail(-1, fmt.Sprintf("job stopped: %v", context.Cause(ctx)), ExitLaunchFailed)
		return true
	default:
		return false
	}
}

// RunGeneration starts the world of generation gen, waits for its end and,
// when a next generation follows, drops the dead world's segments.
func (g *localGenerations) RunGeneration(ctx context.Context, gen int, decide func(Ending) bool) bool {
	j, p := g.job, g.plan
	j.newGeneration(gen)
	if err := j.startCoordinator(); err != nil {
		j.fail(-1, strings.TrimPrefix(err.Error(), "launch: "), ExitLaunchFailed)
		return false
	}
	if g.autoPort {
		// A port the kernel calls free now, given back at once so that rank 0
		// can bind it: the window is the ranks' start, as under torchrun.
		port, release, err := rank.ReservePort(p.MasterAddr)
		if err != nil {
			j.coord.Close()
			j.fail(-1, strings.TrimPrefix(err.Error(), "launch: "), ExitLaunchFailed)
			return false
		}
		p.MasterPort = port
		release()
	}
	if p.TorchEnv {
		j.res.MasterAddr = net.JoinHostPort(p.MasterAddr, strconv.Itoa(p.MasterPort))
	}
	j.reaper = newReaper(j.exits)
	startErr := j.spawnAll(g.programs, g.devNull)
	if startErr != nil {
		j.fail(-1, startErr.Error(), exitCodeOf(startErr))
	}
	j.wait(ctx)
	j.finish()
	j.reaper.close()
	j.coord.Close()
	j.log.Debug("launch: heartbeat", "generation", gen, "longest_silence", j.coord.LongestSilence())
	if !j.decide(decide) {
		return false
	}
	j.dropGeneration()
	return true
}

// Stopped ends the job on a signal, the timeout or ctx's end that came
// since the world failed.
func (g *localGenerations) Stopped(ctx context.Context) bool { return g.stopped(ctx) }

// Next is the same world again.
func (g *localGenerations) Next(context.Context) (string, bool) { return "", true }
