package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gear-rl/gear/internal/clock"
	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// SlurmTask runs one rank of a job under srun: it is what `gearrun run
// --slurm-task` does in every task of the step that SlurmRun starts. It reads
// its place from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and
// SLURM_JOB_NODELIST (rank.FromEnv), finds its role in the spec, and runs the
// role's command with the GEAR_* contract in its environment.
type SlurmTask struct {
	Spec     *Spec
	SpecPath string
	// JobDir receives this rank's exit record when it fails; "" keeps none.
	JobDir string
	// Lookup reads the environment; nil means os.LookupEnv.
	Lookup func(string) (string, bool)
	// Environ is the environment the rank's command starts from; nil means
	// os.Environ().
	Environ []string
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
	// Clock stamps exit records; nil is the wall clock.
	Clock clock.Clock
}

// Run runs the rank's command and returns the exit status to exit with: the
// command's status, or 128+signal when a signal killed it. On a non-zero status
// it prints gear's message naming the rank on Stderr and records a RankExit in
// JobDir. Cancelling ctx (SIGTERM from SLURM) sends SIGTERM to the command's
// process group, and SIGKILL after [launch].grace. The error is for a rank that
// could not start.
func (t *SlurmTask) Run(ctx context.Context) (int, error) {
	if t.Stderr == nil {
		t.Stderr = io.Discard
	}
	lookup := t.Lookup
	if lookup == nil {
		lookup = os.LookupEnv
	}
	// Read SLURM's facts even if GEAR_RANK leaked into the environment.
	info, err := rank.FromLookup(func(k string) (string, bool) {
		if k == rank.EnvRank {
			return "", false
		}
		return lookup(k)
	})
	if err != nil {
		return 0, fmt.Errorf("jobs: run --slurm-task: %w", err)
	}
	if info.Source != rank.SourceSlurm {
		return 0, fmt.Errorf("jobs: run --slurm-task: %s is not set; srun starts these tasks", rank.EnvSlurmProcID)
	}
	s := t.Spec
	if info.Size != s.WorldSize() && (s.Launch.MinNP == 0 || info.Size < s.Launch.MinNP || info.Size > s.WorldSize()) {
		if s.Launch.MinNP > 0 {
			return 0, fmt.Errorf("jobs: run --slurm-task: srun started %d tasks but the spec has %d to %d ranks", info.Size, s.Launch.MinNP, s.WorldSize())
		}
		return 0, fmt.Errorf("jobs: run --slurm-task: srun started %d tasks but the spec has %d ranks", info.Size, s.WorldSize())
	}
	role, roleRank, _ := s.RoleOf(info.Rank)
	info.Role, info.RoleRank = role.Name, roleRank
	if d := s.Launch.RdzvTimeout.D(); d > 0 {
		info.RdzvTimeout = d
	}
	info.HeartbeatInterval, info.HeartbeatTimeout = s.Launch.Heartbeat.D(), s.Launch.HeartbeatTimeout.D()
	host, _ := lookup("SLURMD_NODENAME")
	if host == "" {
		host, _ = os.Hostname()
	}

	env := t.Environ
	if env == nil {
		env = os.Environ()
	}
	env, err = t.rankEnviron(ctx, info, role, env, lookup)
	if err != nil {
		return 0, fmt.Errorf("jobs: run --slurm-task: %w", err)
	}

	cmd := exec.CommandContext(ctx, role.Command[0], role.Command[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = t.Stdin, t.Stdout, t.Stderr
	if dir := s.Launch.OutputDir; dir != "" {
		// As the local launcher does: rank.<N>.stdout and rank.<N>.stderr.
		files, err := openRankOutput(dir, info.Rank)
		if err != nil {
			return 0, fmt.Errorf("jobs: run --slurm-task: launch.output_dir: %w", err)
		}
		defer files[0].Close()
		defer files[1].Close()
		cmd.Stdout, cmd.Stderr = files[0], files[1]
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = s.Launch.Grace.D()
	var stopped atomic.Int64 // when ctx ended (SLURM stopped the task), unix ns
	defer context.AfterFunc(ctx, func() { stopped.Store(t.now().UnixNano()) })()
	if err := cmd.Start(); err != nil {
		t.fail(RankExit{Rank: info.Rank, Role: info.Role, RoleRank: roleRank, Host: host, Status: 127})
		return 127, fmt.Errorf("jobs: rank %d: %w", info.Rank, err)
	}
	// The rank's figures for gearrun top, in the job's directory.
	figures := newFiguresWriter(t.JobDir, env, info)
	figuresDone := make(chan struct{})
	var figuresRun sync.WaitGroup
	figuresRun.Go(func() { figures.run(figuresDone) })
	err = cmd.Wait()
	// The time of the end, not of the report: peers that lost this rank fail
	// after it, and the first failure is the one gearrun names.
	ended := t.now()
	// Whatever the command left in its process group goes with it.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	close(figuresDone)
	figuresRun.Wait() // no write of the running rank lands after the last
	figures.write()   // the last figures: the rank ended
	keepTrace(t.JobDir, env, info)
	removeRankMetrics(env, info)
	if err == nil {
		return 0, nil
	}
	re := RankExit{Rank: info.Rank, Role: info.Role, RoleRank: roleRank, Host: host, Status: 1, At: ended}
	killed := false
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			re.Status = 128 + int(ws.Signal())
			re.Signal = ws.Signal().String()
			killed = ws.Signal() == syscall.SIGKILL
		} else {
			re.Status = exit.ExitCode()
		}
	}
	if (re.Signal != "" || re.Status > 128) && !killed && ctx.Err() == nil {
		// SLURM signals every process of the step at once (scancel, another
		// rank's failure): the command may die of it (or a shell may exit
		// 128+N) before this process has seen its own copy. Give that copy a
		// moment to arrive. SIGKILL is not such a signal: SLURM sends it only
		// KillWait after a SIGTERM that this process would have seen, so a
		// command killed before that was killed by something else (kill -9,
		// the OOM killer), and its step may be ending for that very reason.
		select {
		case <-ctx.Done():
		case <-time.After(signalSettle):
		}
	}
	if ctx.Err() == nil || killed && killedOutside(stopped.Load(), ended, cmd.WaitDelay) {
		// A rank stopped by SLURM is not the cause; only a rank that failed on
		// its own is reported.
		t.fail(re)
	}
	return re.Status, nil
}

// killedOutside reports whether a command that died of SIGKILL at ended, after
// SLURM began to stop its task at stopped (unix ns, 0: not yet seen), was
// killed from outside rather than by the task: the task sends SIGKILL only
// waitDelay after its SIGTERM, so a death well within that was another's
// doing (every rank of a node killed at once, the step's stop arriving as
// they died).
func killedOutside(stopped int64, ended time.Time, waitDelay time.Duration) bool {
	if stopped == 0 {
		return true
	}
	return ended.Sub(time.Unix(0, stopped)) < min(waitDelay/2, time.Second)
}

// signalSettle is how long a task waits for its own copy of a step-wide signal
// after its command died of a signal.
const signalSettle = 300 * time.Millisecond

func (t *SlurmTask) now() time.Time { return t.Clock.Now() }

// fail reports re, stamped now unless it has its time.
func (t *SlurmTask) fail(re RankExit) {
	if re.At.IsZero() {
		re.At = t.now()
	}
	fmt.Fprintf(t.Stderr, "gearrun: %s\n", re)
	if t.JobDir == "" {
		return
	}
	b, _ := json.Marshal(re)
	path := filepath.Join(t.JobDir, RanksDir, strconv.Itoa(re.Rank)+".json")
	if err := writeFileAtomic(path, b, 0o600); err != nil {
		fmt.Fprintf(t.Stderr, "gearrun: rank %d: %v\n", re.Rank, err)
	}
}

// openRankOutput creates dir/rank.<r>.stdout and dir/rank.<r>.stderr.
func openRankOutput(dir string, r int) ([2]*os.File, error) {
	var files [2]*os.File
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return files, err
	}
	for i, stream := range []string{"stdout", "stderr"} {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("rank.%d.%s", r, stream)))
		if err != nil {
			if i == 1 {
				files[0].Close()
			}
			return files, err
		}
		files[i] = f
	}
	return files, nil
}

// rankEnviron is the environment of the task's rank, whose place is info:
// base (the task's own, less any contract variable: see rank.MergeEnv) with,
// from the lowest precedence to the highest, torchrun's variables (so that
// the spec's env overrides them, as in a local run), the role's env, the
// contract (info.Environ) with GEAR_JOB_SPEC, and the device binding.
// torchrun's defaults (OMP_NUM_THREADS) apply only where base has no value.
func (t *SlurmTask) rankEnviron(ctx context.Context, info rank.Info, role Role, base []string, lookup func(string) (string, bool)) ([]string, error) {
	s := t.Spec
	var add []string
	if s.Launch.TorchEnvOn() {
		torch, err := taskTorchEnv(info, s, lookup)
		if err != nil {
			return nil, err
		}
		add = append(add, torch.Environ()...)
		base = append(torch.Defaults(), base...) // the task's own values win
	}
	add = append(add, envList(role.Env)...)
	add = append(add, info.Environ()...)
	if t.SpecPath != "" {
		path := t.SpecPath
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		add = append(add, rank.EnvJobSpec+"="+path)
	}
	dev, err := s.taskBinding(ctx, info, lookup)
	if err != nil {
		return nil, err
	}
	add = append(add, envList(dev)...)
	if s.Launch.Trace != "" && t.JobDir != "" {
		// The task keeps the rank's segment for the trace (keepTrace).
		add = append(add, rank.EnvTraceEvents+"="+strconv.Itoa(launch.DefaultTraceEvents))
	}
	return rank.MergeEnv(base, add), nil
}

// taskTorchEnv is a task's place in torchrun's terms; MASTER_ADDR and
// MASTER_PORT come from srun's environment, where SlurmRun put them.
func taskTorchEnv(info rank.Info, s *Spec, lookup func(string) (string, bool)) (rank.TorchEnv, error) {
	addr, _ := lookup(rank.EnvTorchMasterAddr)
	port, _ := lookup(rank.EnvTorchMasterPort)
	if addr == "" || port == "" {
		return rank.TorchEnv{}, fmt.Errorf("%s and %s are not set; gearrun run --slurm sets them for [launch] torch_env", rank.EnvTorchMasterAddr, rank.EnvTorchMasterPort)
	}
	ro, _, _ := s.RoleOf(info.Rank)
	roleSize := ro.NP
	if s.Launch.MinNP > 0 {
		roleSize = info.Size // an elastic job of one role: this world's size
	}
	t, err := rank.TorchEnvOf(info, roleSize, net.JoinHostPort(addr, port))
	t.RestartCount, t.MaxRestarts = info.Restart, s.Launch.Restarts
	return t, err
}

// removeRankMetrics removes the metrics segments that the rank of info made
// on this node in its generation (rank.Init makes one; no launcher lives on
// a SLURM node to remove it; the task has written the rank's last figures
// and kept its trace by then, slurmmetrics.go). The directory is the rank's rank.EnvMetricsDir in env, else
// /dev/shm.
func removeRankMetrics(env []string, info rank.Info) {
	segs, _ := metrics.Segments(rank.EnvValue(env, rank.EnvMetricsDir), info.JobID)
	for _, sg := range segs {
		if sg.Rank == info.Rank && sg.Gen == info.Restart {
			_ = os.Remove(sg.Path)
		}
	}
}
