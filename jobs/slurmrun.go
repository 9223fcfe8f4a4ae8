package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/google/uuid"

	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// SlurmRun runs a job inside a SLURM allocation, on its first node: it is what
// the batch script's `gearrun run --slurm` does. It starts the rendezvous
// coordinator on this node, at the port RendezvousPort derives from the SLURM
// job ID (or [slurm].rdzv_port), and one srun step whose tasks are
// `gearrun run --slurm-task` (RunSlurmTask), one per rank.
type SlurmRun struct {
	Spec *Spec
	// SpecPath is the spec's path, passed to the tasks (GEAR_JOB_SPEC).
	SpecPath string
	// JobDir is the job's directory in the state directory; the tasks write their
	// exit statuses there and Run writes result.json. "" keeps no records.
	JobDir string
	// Gearrun is the gearrun binary the tasks run; usually os.Executable().
	Gearrun string
	// TaskArgs are the arguments after Gearrun that make it a task; nil means
	// ["run", "--slurm-task"].
	TaskArgs []string
	// Srun is the srun binary; "" means "srun" from PATH.
	Srun string
	// ListenAddr is where the coordinator listens; "" means every interface at
	// the rendezvous port. The ranks dial the first node of the allocation at the
	// port the coordinator got.
	ListenAddr string
	// Getenv reads the environment (SLURM_*, GEAR_JOB_ID, GEAR_JOB_TOKEN); nil
	// means os.Getenv.
	Getenv func(string) string
	// NodeAddr returns the address by which the other nodes reach a node of
	// the allocation, given its name; nil means SLURM's NodeAddr for it
	// (SlurmNodeAddr). The ranks dial the first node's.
	NodeAddr func(ctx context.Context, node string) string
	// Stdout and Stderr receive srun's output and gearrun's messages (nil
	// discards).
	Stdout, Stderr io.Writer
	// Logger receives the coordinator's news; nil discards.
	Logger *slog.Logger
	// NoSweep leaves out the sweep of the allocation's nodes at the job's
	// start and end (SweepNode): for a Srun that runs no real step.
	NoSweep bool
}

// Run runs the job to its end and returns gearrun's account of it; the Result's
// ExitCode is what gearrun exits with. Cancelling ctx (SIGTERM from scancel)
// stops srun with SIGTERM, and with SIGKILL after [launch].grace. The error is
// for a job that could not start.
func (sr *SlurmRun) Run(ctx context.Context) (*Result, error) {
	stdout, stderr := sr.Stdout, sr.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	getenv := sr.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	logger := sr.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	slurmID := getenv(rank.EnvSlurmJobID)
	if slurmID == "" {
		return nil, fmt.Errorf("jobs: run --slurm: %s is not set; run it inside a SLURM allocation (gearrun submit)", rank.EnvSlurmJobID)
	}
	hosts, err := rank.ParseHostlist(getenv(rank.EnvSlurmNodeList))
	if err != nil {
		return nil, fmt.Errorf("jobs: run --slurm: %s: %w", rank.EnvSlurmNodeList, err)
	}
	jobID := getenv(rank.EnvJobID)
	if jobID == "" {
		jobID = uuid.NewString()
	}
	token := getenv(rank.EnvJobToken)
	if token == "" {
		token = rank.NewToken()
	}
	s, specPath, cleanup, err := sr.buildPrograms(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	port := s.Slurm.RdzvPort
	if port == 0 {
		port = RendezvousPort(slurmID)
	}

	listen := sr.ListenAddr
	if listen == "" {
		listen = net.JoinHostPort("", strconv.Itoa(port))
	}
	nodeAddr := sr.NodeAddr
	if nodeAddr == nil {
		nodeAddr = SlurmNodeAddr
	}
	// A node's name need not resolve (nodes named apart from their hosts, as
	// in scripts/slurm-local.sh up --nodes N): the ranks dial its address.
	firstAddr := nodeAddr(ctx, hosts[0])
	ckpt := s.Launch.CheckpointDir
	if ckpt == "" && s.Launch.Restarts > 0 {
		ckpt = launch.CheckpointDir("", jobID)
	}
	if ckpt != "" {
		if err := os.MkdirAll(ckpt, 0o700); err != nil {
			return nil, fmt.Errorf("jobs: run --slurm: launch.checkpoint_dir: %w", err)
		}
	}
	if s.Launch.Restarts > 0 && ckpt != "" {
		fmt.Fprintln(stderr, launch.CheckpointLine(jobID, fmt.Sprintf("restarts = %d", s.Launch.Restarts), ckpt))
	}
	runCtx := ctx
	if t := s.Launch.Timeout.D(); t > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	job := &slurmJob{sr: sr, s: s, jobID: jobID, token: token, slurmID: slurmID, allocation: hosts,
		specPath: specPath, ckpt: ckpt, getenv: getenv, logger: logger, stdout: stdout, stderr: stderr}
	gens := &slurmGenerations{slurmJob: job, nodeAddr: nodeAddr, runCtx: runCtx, listen: listen, port: port,
		nodes: hosts, world: s.WorldSize(), firstAddr: firstAddr}
	loop := &launch.RestartLoop{Name: "gearrun", Max: s.Launch.Restarts, Out: stderr}
	sr.sweep(ctx, hosts, jobID, stderr, "start")
	loop.Run(ctx, gens)
	writeSlurmTrace(s.Launch.Trace, sr.JobDir, jobID, stderr)
	sr.sweep(ctx, hosts, jobID, stderr, "end")
	if gens.err != nil {
		return nil, gens.err
	}
	res := gens.res
	fmt.Fprintf(stderr, "gearrun: %s\n", res.Message)
	if sr.JobDir != "" {
		if err := WriteResult(sr.JobDir, res); err != nil {
			fmt.Fprintf(stderr, "gearrun: %v\n", err)
		}
	}
	return res, nil
}

// slurmGenerations runs a job's worlds under SLURM, one srun step a
// generation, under a launch.RestartLoop; a node lost or killed from outside
// leaves the next world on the nodes that remain.
type slurmGenerations struct {
	*slurmJob
	nodeAddr func(ctx context.Context, node string) string
	runCtx   context.Context // ctx bounded by launch.timeout
	listen   string          // where the coordinators listen
	port     int             // the rendezvous port derived from the job
	// The next step's nodes, ranks and the address of its first node.
	nodes     []string
	world     int
	firstAddr string

	g   *slurmGeneration // the current generation
	res *Result          // its result
	err error            // a step that could not start
}

var _ launch.Generations = (*slurmGenerations)(nil)

// RunGeneration runs the step of generation gen to its end.
func (gs *slurmGenerations) RunGeneration(ctx context.Context, gen int, decide func(launch.Ending) bool) bool {
	gs.g = &slurmGeneration{slurmJob: gs.slurmJob, gen: gen, hosts: gs.nodes, world: gs.world, firstAddr: gs.firstAddr}
	res, listen, err := gs.g.run(ctx, gs.runCtx, gs.listen, gs.port)
	if err != nil {
		gs.err = err
		return false
	}
	gs.res, gs.listen = res, listen
	return decide(launch.Ending{Cause: gs.g.cause, Restartable: res.ExitCode != 0 && gs.g.restartable})
}

// Stopped reports whether scancel (ctx) or launch.timeout ended the job;
// its result says the world's failure.
func (gs *slurmGenerations) Stopped(ctx context.Context) bool {
	return ctx.Err() != nil || gs.runCtx.Err() != nil
}

// Next places the next world: on the nodes that still answer after a step
// that did not end (a node gone with its slurmd), or, for an elastic job,
// without a node every rank of which was killed from outside; else on the
// same nodes. No world is left when the nodes that answer hold too few
// ranks: the result's message says so.
func (gs *slurmGenerations) Next(ctx context.Context) (string, bool) {
	g, s, res := gs.g, gs.s, gs.res
	if g.stuck {
		// A node gone with its slurmd: the next step runs on the
		// nodes of the allocation that still answer.
		dead := gs.sr.deadNodes(gs.runCtx, gs.nodes, s.Launch.Grace.D(), gs.logger)
		if len(dead) == 0 {
			return "", true
		}
		left := slices.DeleteFunc(slices.Clone(gs.nodes), func(n string) bool { return slices.Contains(dead, n) })
		w, err := shrunkWorld(s, len(gs.allocation), len(left))
		if err != nil {
			res.Message = fmt.Sprintf("%s; node %s lost: %v", res.Message, strings.Join(dead, ","), err)
			return "", false
		}
		gs.shrink(ctx, left, w)
		return fmt.Sprintf("node %s lost; next world: %d ranks on %s", strings.Join(dead, ","), w, strings.Join(left, ",")), true
	}
	if killed := g.killedNodes(res.FailedRanks); len(killed) > 0 && s.Launch.MinNP > 0 && s.Launch.MinNP < s.WorldSize() {
		// Every rank of a node killed from outside (kill -9, the OOM
		// killer): an elastic job goes on without that node, as it would
		// without a dead one, if the nodes left hold min_np ranks.
		left := slices.DeleteFunc(slices.Clone(gs.nodes), func(n string) bool { return slices.Contains(killed, n) })
		w, err := shrunkWorld(s, len(gs.allocation), len(left))
		if err != nil {
			return fmt.Sprintf("node %s: every rank died (killed by SIGKILL), but without it %v; next world on the same nodes", strings.Join(killed, ","), err), true
		}
		gs.shrink(ctx, left, w)
		return fmt.Sprintf("node %s: every rank died (killed by SIGKILL); next world: %d ranks on %s", strings.Join(killed, ","), w, strings.Join(left, ",")), true
	}
	return "", true
}

// shrink makes the next world world ranks on nodes, which the ranks reach
// at the first one's address.
func (gs *slurmGenerations) shrink(ctx context.Context, nodes []string, world int) {
	gs.nodes, gs.world = nodes, world
	if first := gs.nodeAddr(ctx, nodes[0]); first != "" {
		gs.firstAddr = first
	}
}

// slurmJob is what every generation of a job under SLURM shares.
type slurmJob struct {
	sr                    *SlurmRun
	s                     *Spec
	jobID, token, slurmID string
	allocation            []string // the allocation's nodes
	specPath, ckpt        string
	getenv                func(string) string
	logger                *slog.Logger
	stdout, stderr        io.Writer
}

// slurmGeneration is one world of a job under SLURM: one coordinator of its
// generation and one srun step.
type slurmGeneration struct {
	*slurmJob
	gen         int
	hosts       []string // the step's nodes
	world       int      // the step's ranks
	firstAddr   string   // the address of the step's first node
	restartable bool     // a rank failed: the world may start again
	stuck       bool     // srun did not end after a loss: a node may be gone
	cause       string   // the failure, for the restart line
}

// run runs the generation's step: its coordinator listens on listen (the
// first generation's address for later ones, so that a straggler of an
// older world reaches the coordinator that refuses it by name), and returns
// the result and that address.
func (g *slurmGeneration) run(ctx, runCtx context.Context, listen string, port int) (*Result, string, error) {
	sr, s, stderr := g.sr, g.s, g.stderr
	world := g.world
	w := newStepWatch()
	var rdzvFailed atomic.Bool
	cfg := rank.CoordinatorConfig{
		Addr:             listen,
		JobID:            g.jobID,
		Token:            g.token,
		Size:             world,
		Generation:       g.gen,
		Timeout:          s.Launch.RdzvTimeout.D(),
		Heartbeat:        s.Launch.Heartbeat.D(),
		HeartbeatTimeout: s.Launch.HeartbeatTimeout.D(),
		Logger:           g.logger,
		OnFail: func(err error) {
			fmt.Fprintf(stderr, "gearrun: rendezvous failed: %v\n", err)
			w.note(fmt.Sprintf("rendezvous failed: %v", err))
			rdzvFailed.Store(true)
		},
		OnLost: func(r int, reason string) {
			who := fmt.Sprintf("rank %d", r)
			if node := g.nodeOfRank(r); node != "" {
				who += " on " + node
			}
			fmt.Fprintf(stderr, "gearrun: lost %s: %s\n", who, reason)
			w.note(fmt.Sprintf("lost %s: %s", who, reason))
		},
	}
	coord, err := rank.NewCoordinator(cfg)
	if err != nil && g.gen == 0 && sr.ListenAddr == "" && s.Slurm.RdzvPort == 0 {
		// The derived port is taken (another job whose ID ends alike, or another
		// service): any port will do, since the ranks are told the address.
		fmt.Fprintf(stderr, "gearrun: rendezvous port %d is taken (%v); using a free port\n", port, err)
		cfg.Addr = ":0"
		coord, err = rank.NewCoordinator(cfg)
	}
	if err != nil {
		return nil, listen, fmt.Errorf("jobs: run --slurm: %w", err)
	}
	defer coord.Close()
	_, gotPort, _ := net.SplitHostPort(coord.Addr())
	if host, _, err := net.SplitHostPort(cfg.Addr); err == nil {
		listen = net.JoinHostPort(host, gotPort)
	}
	rdzv := net.JoinHostPort(g.firstAddr, gotPort)

	if sr.JobDir != "" {
		// A requeued job, or the next generation, runs again in the same
		// directory: forget the last run's failed ranks.
		ranks := filepath.Join(sr.JobDir, RanksDir)
		os.RemoveAll(ranks)
		if err := os.MkdirAll(ranks, 0o700); err != nil {
			return nil, listen, fmt.Errorf("jobs: run --slurm: %w", err)
		}
	}
	taskArgs := sr.TaskArgs
	if taskArgs == nil {
		taskArgs = []string{"run", "--slurm-task"}
	}
	srun := sr.Srun
	if srun == "" {
		srun = "srun"
	}
	args := []string{
		"--ntasks=" + strconv.Itoa(world),
		"--nodes=" + strconv.Itoa(s.Slurm.Nodes),
		"--cpus-per-task=" + strconv.Itoa(s.Slurm.CPUsPerTask),
		"--distribution=block",
		"--kill-on-bad-exit=1",
		"--label",
	}
	if len(g.hosts) < len(g.allocation) {
		// The nodes of the allocation left after a node was lost; the lost
		// one's last step may still count as running to SLURM.
		args[1] = "--nodes=" + strconv.Itoa(len(g.hosts))
		args = append(args, "--nodelist="+strings.Join(g.hosts, ","), "--overlap")
		if n := s.Slurm.NTasksPerNode; n > 0 {
			args = append(args, "--ntasks-per-node="+strconv.Itoa(n))
		}
	}
	args = append(args, sr.Gearrun)
	args = append(args, taskArgs...)
	if sr.JobDir != "" {
		args = append(args, "--job-dir", sr.JobDir)
	}
	args = append(args, g.specPath)

	cmd := exec.CommandContext(runCtx, srun, args...)
	cmd.Env = append(os.Environ(),
		rank.EnvJobID+"="+g.jobID,
		rank.EnvJobToken+"="+g.token,
		rank.EnvRdzvAddr+"="+rdzv,
		rank.EnvJobSpec+"="+g.specPath,
		rank.EnvRestartCount+"="+strconv.Itoa(g.gen),
	)
	if g.ckpt != "" {
		cmd.Env = append(cmd.Env, rank.EnvCheckpointDir+"="+g.ckpt)
	}
	if s.Launch.TorchEnvOn() {
		// Rank 0 runs on this node (the first of the allocation: srun places
		// tasks in blocks), so its TCPStore port is reserved here, on every
		// interface, and given back as srun starts. The tasks read the
		// address from srun's environment (SlurmTask).
		port, release, err := rank.ReservePort("")
		if err != nil {
			return nil, listen, fmt.Errorf("jobs: run --slurm: %w", err)
		}
		release()
		cmd.Env = append(cmd.Env, rank.EnvTorchMasterAddr+"="+g.firstAddr, rank.EnvTorchMasterPort+"="+strconv.Itoa(port))
	}
	cmd.Stdout, cmd.Stderr = g.stdout, stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = s.Launch.Grace.D()

	gen := ""
	if g.gen > 0 {
		gen = fmt.Sprintf(", generation %d", g.gen)
	}
	fmt.Fprintf(stderr, "gearrun: job %s (%s, SLURM job %s%s): %d ranks on %s, rendezvous at %s\n",
		s.Name, g.jobID, g.slurmID, gen, world, strings.Join(g.hosts, ","), rdzv)
	runErr := cmd.Start()
	if runErr == nil {
		stopped := w.watch(cmd.Process, s.Launch.Grace.D(), stderr)
		runErr = cmd.Wait()
		w.stop()
		if stopped() && runErr != nil && ctx.Err() == nil && runCtx.Err() == nil {
			runErr = &stuckStepError{lost: w.first(), err: runErr}
		}
	}

	res := &Result{FailedRanks: readRankExits(sr.JobDir)}
	var stuck *stuckStepError
	switch {
	case runErr == nil:
		res.Message = fmt.Sprintf("job %s completed: %d ranks exited with status 0", s.Name, world)
	case runCtx.Err() != nil && ctx.Err() == nil:
		res.ExitCode = 124
		res.Message = fmt.Sprintf("job %s timed out after %s (launch.timeout)", s.Name, s.Launch.Timeout)
	case ctx.Err() != nil:
		res.ExitCode = 143
		res.Message = fmt.Sprintf("job %s was stopped", s.Name)
	case errors.As(runErr, &stuck):
		// A node gone with its slurmd: srun waits for tasks that nobody can
		// report on. The lost rank is the failure, whatever its peers said.
		res.ExitCode = 1
		if len(res.FailedRanks) > 0 {
			res.ExitCode = firstFailure(res.FailedRanks).Status
		}
		res.Message = fmt.Sprintf("job %s failed: %s", s.Name, stuck.lost)
		g.restartable, g.cause, g.stuck = !rdzvFailed.Load(), stuck.lost, true
	default:
		res.ExitCode = 1
		var exit *exec.ExitError
		if errors.As(runErr, &exit) && exit.ExitCode() > 0 {
			res.ExitCode = exit.ExitCode()
		}
		if len(res.FailedRanks) > 0 {
			// srun exits with the highest status of its tasks; gearrun exits
			// with the status of the rank that failed first.
			first := firstFailure(res.FailedRanks)
			res.ExitCode = first.Status
			res.Message = fmt.Sprintf("job %s failed: %s", s.Name, first)
			g.restartable, g.cause = !rdzvFailed.Load() && first.Status != 127, first.String()
		} else {
			res.Message = fmt.Sprintf("job %s failed: srun: %v", s.Name, runErr)
		}
	}
	return res, listen, nil
}

// buildPrograms builds the roles whose command names a Go package directory
// (as the local launcher does), once, into the job directory (or a temporary
// directory beside the spec, which cleanup removes), and returns the spec with
// those commands replaced, written next to the binaries for the tasks to read.
// Without Go packages it returns the spec and its path unchanged.
func (sr *SlurmRun) buildPrograms(ctx context.Context) (*Spec, string, func(), error) {
	s := sr.Spec
	noop := func() {}
	var build []int
	roles := s.Roles()
	for i, ro := range roles {
		if launch.IsGoPackageDir(ro.Command[0]) {
			build = append(build, i)
		}
	}
	if len(build) == 0 {
		return s, sr.SpecPath, noop, nil
	}
	dir, cleanup := sr.JobDir, noop
	if dir == "" {
		tmp, err := os.MkdirTemp(filepath.Dir(sr.SpecPath), ".gear-run-")
		if err != nil {
			return nil, "", noop, fmt.Errorf("jobs: run --slurm: %w", err)
		}
		dir, cleanup = tmp, func() { os.RemoveAll(tmp) }
	}
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o700); err != nil {
		cleanup()
		return nil, "", noop, fmt.Errorf("jobs: run --slurm: %w", err)
	}
	c := *s
	c.Launch.Command = slices.Clone(s.Launch.Command)
	c.Groups = slices.Clone(s.Groups)
	built := map[string]string{}
	for _, i := range build {
		pkg := roles[i].Command[0]
		bin, ok := built[pkg]
		if !ok {
			name := strings.Trim(filepath.Base(filepath.Clean(pkg)), ".")
			if name == "" {
				name = "main"
			}
			out := filepath.Join(binDir, fmt.Sprintf("%d-%s", len(built), name))
			var err error
			if bin, err = launch.BuildGo(ctx, pkg, out, sr.Stderr); err != nil {
				cleanup()
				return nil, "", noop, fmt.Errorf("jobs: run --slurm: %w", err)
			}
			built[pkg] = bin
		}
		if len(c.Groups) == 0 {
			c.Launch.Command[0] = bin
		} else {
			c.Groups[i].Command = slices.Clone(c.Groups[i].Command)
			c.Groups[i].Command[0] = bin
		}
	}
	b, err := Marshal(&c)
	if err == nil {
		err = writeFileAtomic(filepath.Join(dir, "run.toml"), b, 0o600)
	}
	if err != nil {
		cleanup()
		return nil, "", noop, fmt.Errorf("jobs: run --slurm: %w", err)
	}
	return &c, filepath.Join(dir, "run.toml"), cleanup, nil
}
