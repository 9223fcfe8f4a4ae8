package jobs

import (
	"context"
	"encoding/json"
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
	runCtx := ctx
	if t := s.Launch.Timeout.D(); t > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	var res *Result
	nodes, world := hosts, s.WorldSize()
	for gen := 0; ; gen++ {
		g := slurmGeneration{sr: sr, s: s, gen: gen, jobID: jobID, token: token, slurmID: slurmID,
			hosts: nodes, allocation: hosts, world: world, firstAddr: firstAddr, specPath: specPath, ckpt: ckpt,
			getenv: getenv, logger: logger, stdout: stdout, stderr: stderr}
		var err error
		res, listen, err = g.run(ctx, runCtx, listen, port)
		if err != nil {
			return nil, err
		}
		if res.ExitCode == 0 || !g.restartable || gen >= s.Launch.Restarts || ctx.Err() != nil || runCtx.Err() != nil {
			break
		}
		next := ""
		if g.stuck {
			// A node gone with its slurmd: the next step runs on the
			// nodes of the allocation that still answer.
			dead := sr.deadNodes(runCtx, nodes, s.Launch.Grace.D(), logger)
			if len(dead) > 0 {
				left := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return slices.Contains(dead, n) })
				w, err := shrunkWorld(s, len(hosts), len(left))
				if err != nil {
					res.Message = fmt.Sprintf("%s; node %s lost: %v", res.Message, strings.Join(dead, ","), err)
					break
				}
				nodes, world = left, w
				if first := nodeAddr(ctx, nodes[0]); first != "" {
					firstAddr = first
				}
				next = fmt.Sprintf("; node %s lost; next world: %d ranks on %s", strings.Join(dead, ","), world, strings.Join(nodes, ","))
			}
		} else if killed := g.killedNodes(res.FailedRanks); len(killed) > 0 && s.Launch.MinNP > 0 && s.Launch.MinNP < s.WorldSize() {
			// Every rank of a node killed from outside (kill -9, the OOM
			// killer): an elastic job goes on without that node, as it would
			// without a dead one, if the nodes left hold min_np ranks.
			left := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return slices.Contains(killed, n) })
			if w, err := shrunkWorld(s, len(hosts), len(left)); err == nil {
				nodes, world = left, w
				if first := nodeAddr(ctx, nodes[0]); first != "" {
					firstAddr = first
				}
				next = fmt.Sprintf("; node %s: every rank died (killed by SIGKILL); next world: %d ranks on %s", strings.Join(killed, ","), world, strings.Join(nodes, ","))
			} else {
				next = fmt.Sprintf("; node %s: every rank died (killed by SIGKILL), but without it %v; next world on the same nodes", strings.Join(killed, ","), err)
			}
		}
		fmt.Fprintf(stderr, "gearrun: restart %d of %d: %s%s\n", gen+1, s.Launch.Restarts, g.cause, next)
	}
	fmt.Fprintf(stderr, "gearrun: %s\n", res.Message)
	if sr.JobDir != "" {
		if err := WriteResult(sr.JobDir, res); err != nil {
			fmt.Fprintf(stderr, "gearrun: %v\n", err)
		}
	}
	return res, nil
}

// shrunkWorld is the size of a world on left of the allocation's nodes
// nodes: as many ranks as they hold (slurm.ntasks_per_node each, else the
// first world's share of a node) up to launch.np, if that is the job's size
// or, for an elastic job (launch.min_np), at least min_np.
func shrunkWorld(s *Spec, nodes, left int) (int, error) {
	np := s.WorldSize()
	perNode := s.Slurm.NTasksPerNode
	if perNode == 0 {
		perNode = (np + nodes - 1) / nodes
	}
	w := min(np, perNode*left)
	switch {
	case left == 0:
		return 0, fmt.Errorf("no node is left")
	case s.Launch.MinNP > 0 && w < s.Launch.MinNP:
		return 0, fmt.Errorf("%d nodes left hold %d ranks, fewer than the %d the job needs at least (launch.min_np)", left, w, s.Launch.MinNP)
	case s.Launch.MinNP == 0 && w < np:
		return 0, fmt.Errorf("%d nodes left hold %d ranks, fewer than the job's %d (launch.min_np makes its size elastic)", left, w, np)
	}
	return w, nil
}

// probeWait bounds how long a node of the allocation may take to run a
// probe before deadNodes takes it for dead.
const probeWait = 10 * time.Second

// deadNodes runs a one-task probe step (`true`) on each of nodes at once,
// overlapping whatever SLURM still counts as running there, and returns
// those where it fails or does not end within probeWait (or grace, if
// longer): nodes whose slurmd is gone.
func (sr *SlurmRun) deadNodes(ctx context.Context, nodes []string, grace time.Duration, logger *slog.Logger) []string {
	srun := sr.Srun
	if srun == "" {
		srun = "srun"
	}
	wait := max(probeWait, grace)
	dead := make([]bool, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			cmd := exec.CommandContext(pctx, srun, "--overlap", "--nodelist="+n, "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--kill-on-bad-exit=1", "true")
			cmd.WaitDelay = time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				logger.Info("node does not answer a probe", "node", n, "err", err, "output", strings.TrimSpace(string(out)))
				dead[i] = true
			}
		}()
	}
	wg.Wait()
	var out []string
	for i, n := range nodes {
		if dead[i] {
			out = append(out, n)
		}
	}
	return out
}

// slurmGeneration is one world of a job under SLURM: one coordinator of its
// generation and one srun step.
type slurmGeneration struct {
	sr                        *SlurmRun
	s                         *Spec
	gen                       int
	jobID, token, slurmID     string
	hosts                     []string // the step's nodes
	allocation                []string // the allocation's nodes
	world                     int      // the step's ranks
	firstAddr, specPath, ckpt string
	getenv                    func(string) string
	logger                    *slog.Logger
	stdout, stderr            io.Writer
	restartable               bool   // a rank failed: the world may start again
	stuck                     bool   // srun did not end after a loss: a node may be gone
	cause                     string // the failure, for the restart line
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
		Addr:       listen,
		JobID:      g.jobID,
		Token:      g.token,
		Size:       world,
		Generation: g.gen,
		Timeout:    s.Launch.RdzvTimeout.D(),
		Logger:     g.logger,
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

// killedNodes lists the generation's nodes every rank of which died of
// SIGKILL on its own, as its task reported it (exits, the ranks' records):
// killed from outside the job, not stopped by SLURM or gearrun, which stop
// ranks with SIGTERM and do not report the ranks they stop. A node with a
// rank that failed otherwise, or that reported nothing, is not among them.
func (g *slurmGeneration) killedNodes(exits []RankExit) []string {
	killed := map[string]int{}
	for _, e := range exits {
		if e.Signal == syscall.SIGKILL.String() && e.Host != "" {
			killed[e.Host]++
		}
	}
	if len(killed) == 0 {
		return nil
	}
	ranks := map[string]int{}
	for r := range g.world {
		ranks[g.nodeOfRank(r)]++
	}
	var out []string
	for _, n := range g.hosts {
		if ranks[n] > 0 && killed[n] == ranks[n] {
			out = append(out, n)
		}
	}
	if len(out) == len(g.hosts) {
		return nil // every node: nothing to go on with
	}
	return out
}

// nodeOfRank names the node of rank r in the generation's step.
func (g *slurmGeneration) nodeOfRank(r int) string {
	tpn := g.getenv(rank.EnvSlurmTasksPerNode)
	if len(g.hosts) < len(g.allocation) {
		per := g.s.Slurm.NTasksPerNode
		if per == 0 {
			per = (g.world + len(g.hosts) - 1) / len(g.hosts)
		}
		tpn = fmt.Sprintf("%d(x%d)", per, len(g.hosts))
	}
	return nodeOfRank(g.hosts, tpn, r)
}

// nodeOfRank names the node of rank r in a step placed in blocks over hosts
// with SLURM_TASKS_PER_NODE tasksPerNode; "" when they do not say.
func nodeOfRank(hosts []string, tasksPerNode string, r int) string {
	if len(hosts) == 1 {
		return hosts[0]
	}
	first := 0
	for i, h := range hosts {
		n, err := rank.TasksOnNode(tasksPerNode, i)
		if err != nil {
			return ""
		}
		if r < first+n {
			return h
		}
		first += n
	}
	return ""
}

// SlurmNodeAddr returns SLURM's NodeAddr for node (scontrol show node), the
// address by which SLURM itself reaches it, or node when scontrol does not
// answer within a few seconds or knows no address apart from the name.
func SlurmNodeAddr(ctx context.Context, node string) string {
	if net.ParseIP(node) != nil {
		return node
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "scontrol", "show", "node", "--oneliner", node).Output()
	if err != nil {
		return node
	}
	if addr := nodeAddrField(string(out)); addr != "" {
		return addr
	}
	return node
}

// nodeAddrField reads NodeAddr=... from a line of scontrol show node.
func nodeAddrField(out string) string {
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "NodeAddr="); ok && v != "" && v != "(null)" {
			return v
		}
	}
	return ""
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

func (e RankExit) String() string {
	who := fmt.Sprintf("rank %d", e.Rank)
	if e.Role != "" {
		who += fmt.Sprintf(" (%s %d)", e.Role, e.RoleRank)
	}
	if e.Host != "" {
		who += " on " + e.Host
	}
	if e.Signal != "" {
		return who + " was killed by signal " + e.Signal
	}
	return fmt.Sprintf("%s exited with status %d", who, e.Status)
}

// killedWindow is how close to the earliest failure a rank killed by a signal
// must be for firstFailure to name it instead.
const killedWindow = time.Second

// firstFailure is the failure that gearrun names, of exits sorted earliest
// first: the earliest, unless a rank was killed by a signal within
// killedWindow of it. The ranks that lose a peer fail within milliseconds of
// its death, and one of them may report before the dead rank's own task has
// reaped it; the killed rank is the cause.
func firstFailure(exits []RankExit) RankExit {
	for _, e := range exits {
		if e.At.Sub(exits[0].At) > killedWindow {
			break
		}
		if e.Signal != "" {
			return e
		}
	}
	return exits[0]
}

// readRankExits reads the ranks' exit records, earliest first.
func readRankExits(dir string) []RankExit {
	if dir == "" {
		return nil
	}
	entries, _ := os.ReadDir(filepath.Join(dir, RanksDir))
	var out []RankExit
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, RanksDir, e.Name()))
		if err != nil {
			continue
		}
		var re RankExit
		if json.Unmarshal(b, &re) == nil {
			out = append(out, re)
		}
	}
	slices.SortStableFunc(out, func(a, b RankExit) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return a.Rank - b.Rank
	})
	return out
}

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
	// Now stamps exit records; nil means time.Now.
	Now func() time.Time
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
	host, _ := lookup("SLURMD_NODENAME")
	if host == "" {
		host, _ = os.Hostname()
	}

	env := t.Environ
	if env == nil {
		env = os.Environ()
	}
	set := map[string]string{}
	// torchrun's variables first, so that the spec's env can override them,
	// as in a local run.
	if s.Launch.TorchEnvOn() {
		torch, err := taskTorchEnv(info, s, lookup)
		if err != nil {
			return 0, fmt.Errorf("jobs: run --slurm-task: %w", err)
		}
		for _, kv := range torch.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			set[k] = v
		}
		for _, kv := range torch.Defaults() {
			if k, v, _ := strings.Cut(kv, "="); !inEnv(env, k) {
				set[k] = v
			}
		}
	}
	for k, v := range role.Env {
		set[k] = v
	}
	for k, v := range rankEnv(info, s, t.SpecPath) {
		set[k] = v
	}
	dev, err := s.taskBinding(ctx, info, lookup)
	if err != nil {
		return 0, fmt.Errorf("jobs: run --slurm-task: %w", err)
	}
	for k, v := range dev {
		set[k] = v
	}
	env = mergeEnv(env, set)

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
	err = cmd.Wait()
	// The time of the end, not of the report: peers that lost this rank fail
	// after it, and the first failure is the one gearrun names.
	ended := t.now()
	// Whatever the command left in its process group goes with it.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
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

func (t *SlurmTask) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

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

// rankEnv is the GEAR_* contract for one rank.
func rankEnv(info rank.Info, s *Spec, specPath string) map[string]string {
	env := map[string]string{
		rank.EnvRank:      strconv.Itoa(info.Rank),
		rank.EnvWorldSize: strconv.Itoa(info.Size),
		rank.EnvLocalRank: strconv.Itoa(info.LocalRank),
		rank.EnvLocalSize: strconv.Itoa(info.LocalSize),
		rank.EnvNodeRank:  strconv.Itoa(info.NodeRank),
		rank.EnvNumNodes:  strconv.Itoa(info.NumNodes),
		rank.EnvRole:      info.Role,
		rank.EnvRoleRank:  strconv.Itoa(info.RoleRank),
		rank.EnvRdzvAddr:  info.RdzvAddr,
		rank.EnvJobID:     info.JobID,
		rank.EnvJobToken:  info.Token,
	}
	if specPath != "" {
		if abs, err := filepath.Abs(specPath); err == nil {
			specPath = abs
		}
		env[rank.EnvJobSpec] = specPath
	}
	if d := s.Launch.RdzvTimeout; d > 0 {
		env[rank.EnvRdzvTimeout] = d.String()
	}
	return env
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

// inEnv reports whether env ("NAME=value" entries) sets name.
func inEnv(env []string, name string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

// mergeEnv returns env with the variables of set replacing or added, sorted by
// name for the added ones.
func mergeEnv(env []string, set map[string]string) []string {
	out := make([]string, 0, len(env)+len(set))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, replaced := set[k]; !replaced {
			out = append(out, kv)
		}
	}
	for _, k := range sortedKeys(set) {
		out = append(out, k+"="+set[k])
	}
	return out
}
