package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// envList collects repeated -x flags.
type envList []string

func (e *envList) String() string     { return strings.Join(*e, ",") }
func (e *envList) Set(v string) error { *e = append(*e, v); return nil }

// launchFlags are the flags of `gearrun [flags] -np N PROGRAM [ARGS...]`.
type launchFlags struct {
	tagOutput   bool
	outputDir   string
	timeout     time.Duration
	grace       time.Duration
	dryRun      bool
	json        bool
	rdzvAddr    string
	rdzvTimeout time.Duration
	// heartbeat and heartbeatTimeout: --heartbeat, --heartbeat-timeout (0: the defaults).
	heartbeat, heartbeatTimeout time.Duration
	jobID                       string
	verbose                     bool
	topology                    string
	torchEnv                    bool
	maxRestarts                 int
	ckptDir                     string
	hosts                       hostFlags
	trace                       string
	traceEvents                 int
	metricsAddr                 string
}

// groupFlags are the flags that describe one MPMD group; they may follow each ':'.
type groupFlags struct {
	np    int
	minNP int // -np MIN:MAX: MIN (np is MAX); 0: a fixed size
	role  string
	env   envList
	bind  bindFlags
}

// bindFlags are a group's GPU binding flags. Given before the first program
// they apply to every group; after a ':' they override those for that group.
type bindFlags struct {
	bind     string
	perGPU   int
	backend  string
	workload string
	memLimit string
	// set holds the names of the flags given on the command line.
	set map[string]bool
}

// gmiFlagNames are the binding flags other than --bind; each implies --bind gpu.
var gmiFlagNames = []string{"gmi-per-gpu", "gmi-backend", "gmi-workload", "mps-mem-limit"}

func (g *groupFlags) register(fs *flag.FlagSet) {
	fs.Var(npFlag{g}, "np", "`N` ranks in this group (required); MIN:MAX: an elastic size (a job of one group): MAX ranks, and after a lost host with --max-restarts as many as the hosts left hold, at least MIN")
	fs.Var(npFlag{g}, "n", "same as -np `N`")
	fs.StringVar(&g.role, "role", "", "role name of this group (default: program base name for MPMD jobs)")
	fs.Var(&g.env, "x", "pass `NAME=VALUE`, or NAME with the launcher's value, to the ranks (repeatable); not a variable the launcher sets for each rank (GEAR_RANK, CUDA_VISIBLE_DEVICES, ...)")
	b := &g.bind
	fs.StringVar(&b.bind, "bind", "none", "`gpu`: bind each rank to a GPU (CUDA_VISIBLE_DEVICES); none: no GPU binding")
	fs.IntVar(&b.perGPU, "gmi-per-gpu", 1, "`K` ranks share each GPU as GMIs (MPS shares or MIG instances); implies --bind gpu")
	fs.StringVar(&b.backend, "gmi-backend", "auto", "how ranks share a GPU: auto, mps or mig (auto: GMI-DRL's rules); implies --bind gpu")
	fs.StringVar(&b.workload, "gmi-workload", "training", "training (GMIs communicate: MPS) or serving (isolation pays: MIG where MIG mode is on); implies --bind gpu")
	fs.StringVar(&b.memLimit, "mps-mem-limit", "", "cap each MPS rank's pinned device memory: a `SIZE` such as 8G or 512M, or even (1/K of the GPU); implies --bind gpu")
}

// gmiSet reports whether any flag other than --bind was given.
func (b bindFlags) gmiSet() bool {
	for _, n := range gmiFlagNames {
		if b.set[n] {
			return true
		}
	}
	return false
}

// overlay returns def with the flags given in b put on top.
func (b bindFlags) overlay(def bindFlags) bindFlags {
	out := def
	out.set = map[string]bool{}
	for n := range def.set {
		out.set[n] = true
	}
	for n := range b.set {
		out.set[n] = true
		switch n {
		case "bind":
			out.bind = b.bind
		case "gmi-per-gpu":
			out.perGPU = b.perGPU
		case "gmi-backend":
			out.backend = b.backend
		case "gmi-workload":
			out.workload = b.workload
		case "mps-mem-limit":
			out.memLimit = b.memLimit
		}
	}
	return out
}

// check refuses contradictions within the flags of one segment.
func (b bindFlags) check() error {
	if b.set["bind"] && b.bind != "gpu" && b.bind != "none" {
		return fmt.Errorf("--bind %q: want gpu or none", b.bind)
	}
	if b.set["bind"] && b.bind == "none" {
		for _, n := range gmiFlagNames {
			if b.set[n] {
				return fmt.Errorf("--bind none with --%s: GMIs need --bind gpu", n)
			}
		}
	}
	return nil
}

// request resolves a group's binding from the defaults (the flags before the
// first program) and the group's own flags: nil when the group binds nothing.
// The group's --bind wins, then its other binding flags (which imply --bind
// gpu), then the defaults in the same order.
func (b bindFlags) request(def bindFlags) (*gmi.PlanRequest, error) {
	var on bool
	switch {
	case b.set["bind"]:
		on = b.bind == "gpu"
	case b.gmiSet():
		on = true
	case def.set["bind"]:
		on = def.bind == "gpu"
	default:
		on = def.gmiSet()
	}
	if !on {
		return nil, nil
	}
	m := b.overlay(def)
	if m.perGPU < 1 || m.perGPU > gmi.MaxGMIPerGPU {
		return nil, fmt.Errorf("--gmi-per-gpu %d: want 1 to %d", m.perGPU, gmi.MaxGMIPerGPU)
	}
	req := &gmi.PlanRequest{GMIPerGPU: m.perGPU}
	var err error
	if req.Backend, err = gmi.ParseBackend(m.backend); err != nil {
		return nil, fmt.Errorf("--gmi-backend: %w", err)
	}
	if req.Workload, err = gmi.ParseWorkload(m.workload); err != nil {
		return nil, fmt.Errorf("--gmi-workload: %w", err)
	}
	if m.memLimit != "" {
		if req.MPSMemLimitMiB, req.MPSMemLimitEven, err = gmi.ParseMemLimit(m.memLimit); err != nil {
			return nil, fmt.Errorf("--mps-mem-limit: %w", err)
		}
	}
	return req, nil
}

func (l *launchFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&l.tagOutput, "tag-output", true, "prefix every output line with [rank]")
	fs.StringVar(&l.outputDir, "output-dir", "", "write rank.N.stdout and rank.N.stderr in `DIR` instead of the terminal")
	fs.DurationVar(&l.timeout, "timeout", 0, "stop the whole job after this long (0: never)")
	fs.DurationVar(&l.grace, "grace", launch.DefaultGrace, "time between SIGTERM and SIGKILL when stopping ranks")
	fs.BoolVar(&l.dryRun, "dry-run", false, "print the launch plan and run nothing")
	fs.BoolVar(&l.json, "json", false, "with --dry-run: print the plan as JSON")
	fs.StringVar(&l.rdzvAddr, "rdzv-addr", "127.0.0.1:0", "address the rendezvous coordinator listens on")
	fs.DurationVar(&l.rdzvTimeout, "rdzv-timeout", rank.DefaultRdzvTimeout, "how long the ranks may take to join, from the first arrival")
	fs.DurationVar(&l.heartbeat, "heartbeat", 0, "how often the coordinator pings each rank (0: "+rank.DefaultHeartbeat.String()+"); ranks see "+rank.EnvHeartbeatInterval)
	fs.DurationVar(&l.heartbeatTimeout, "heartbeat-timeout", 0, "how long the coordinator and a rank wait for a word from each other before the rank (or the coordinator) is taken for lost (0: "+rank.DefaultHeartbeatTimeout.String()+"); at least twice --heartbeat; ranks see "+rank.EnvHeartbeatTimeout)
	fs.StringVar(&l.jobID, "job-id", "", "job ID (default: a new UUID)")
	fs.BoolVar(&l.verbose, "v", false, "log the launcher's steps on stderr")
	fs.BoolVar(&l.torchEnv, "torch-env", true, "set torchrun's variables for every rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...), so that torch.distributed's env:// init works")
	fs.IntVar(&l.maxRestarts, "max-restarts", 0, "when a rank fails, stop the world and start it again, at most `N` times (torchrun's --max-restarts); ranks see GEAR_RESTART_COUNT")
	fs.StringVar(&l.ckptDir, "checkpoint-dir", "", "the job's checkpoint `DIR` (GEAR_CHECKPOINT_DIR), kept across restarts and after the job (default with --max-restarts: <state dir>/gear/checkpoints/<job ID>)")
	l.hosts.register(fs)
	fs.StringVar(&l.trace, "trace", "", "when the job ends, write its Chrome trace (collective calls, table inserts and samples, rate-limiter waits, restarts) to `FILE`, for Perfetto or chrome://tracing")
	fs.IntVar(&l.traceEvents, "trace-events", launch.DefaultTraceEvents, "with --trace: the last `N` events each rank keeps")
	fs.StringVar(&l.metricsAddr, "metrics-addr", "", "serve the job's metrics in Prometheus's text format at `ADDR` (host:port; a bare :port listens on loopback); nothing listens without it")
	fs.StringVar(&l.topology, "topology", "", "with GPU binding: read the GPUs from this topology `FILE` instead of NVML (default $"+gmi.EnvTopology+")")
}

// npFlag reads -np N or -np MIN:MAX into its group.
type npFlag struct{ g *groupFlags }

func (f npFlag) String() string {
	if f.g == nil || f.g.minNP == 0 {
		if f.g == nil {
			return "0"
		}
		return strconv.Itoa(f.g.np)
	}
	return strconv.Itoa(f.g.minNP) + ":" + strconv.Itoa(f.g.np)
}

func (f npFlag) Set(v string) error {
	lo, hi, elastic := strings.Cut(v, ":")
	if !elastic {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%q: want a number of ranks, or MIN:MAX", v)
		}
		f.g.np, f.g.minNP = n, 0
		return nil
	}
	minNP, err1 := strconv.Atoi(lo)
	maxNP, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil || minNP < 1 || minNP > maxNP {
		return fmt.Errorf("%q: want MIN:MAX with 1 <= MIN <= MAX", v)
	}
	f.g.np, f.g.minNP = maxNP, minNP
	return nil
}

// parseLaunch parses `[flags] -np N PROG [ARGS] [: -np M PROG2 [ARGS] ...]`.
func parseLaunch(args []string, stderr io.Writer) (launchFlags, launch.Request, error) {
	var lf launchFlags
	var req launch.Request
	segments := splitColon(args)
	var defaults bindFlags
	for i, seg := range segments {
		fs := flag.NewFlagSet("gearrun", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var g groupFlags
		g.register(fs)
		if i == 0 {
			lf.register(fs)
			fs.Usage = func() { usage(stderr) }
		}
		if err := fs.Parse(seg); err != nil {
			return lf, req, err
		}
		g.bind.set = map[string]bool{}
		fs.Visit(func(f *flag.Flag) { g.bind.set[f.Name] = true })
		if i == 0 {
			lf.hosts.rdzvSet = g.bind.set["rdzv-addr"]
		}
		if i == 0 {
			defaults = g.bind
		}
		prog := fs.Args()
		if len(prog) == 0 {
			return lf, req, fmt.Errorf("group %d: no program (usage: gearrun -np N PROGRAM [ARGS...])", i)
		}
		// With hosts, a job of one group may leave -np out: one rank per
		// slot, as under mpirun.
		slotsNP := i == 0 && len(segments) == 1 && lf.hosts.on() && !g.bind.set["np"] && !g.bind.set["n"]
		if g.np < 1 && !slotsNP {
			return lf, req, fmt.Errorf("group %d (%s): -np %d: -np N is required and must be at least 1", i, prog[0], g.np)
		}
		if g.np > rank.MaxWorldSize {
			return lf, req, fmt.Errorf("group %d (%s): -np %d: a job has at most %d ranks (rank.MaxWorldSize); split the work into several jobs", i, prog[0], g.np, rank.MaxWorldSize)
		}
		if err := g.bind.check(); err != nil {
			return lf, req, fmt.Errorf("group %d (%s): %w", i, prog[0], err)
		}
		bind, err := g.bind.request(defaults)
		if err != nil {
			return lf, req, fmt.Errorf("group %d (%s): %w", i, prog[0], err)
		}
		if err := checkEnvFlags(g.env); err != nil {
			if i == 0 {
				return lf, req, err
			}
			return lf, req, fmt.Errorf("group %d (%s): %w", i, prog[0], err)
		}
		if g.minNP > 0 && len(segments) > 1 {
			return lf, req, fmt.Errorf("group %d (%s): -np %d:%d: an elastic size is for a job of one group", i, prog[0], g.minNP, g.np)
		}
		group := launch.Group{Role: g.role, NP: g.np, MinNP: g.minNP, Argv: prog, Bind: bind}
		if i == 0 {
			req.Env = g.env // -x before the first program applies to every group
		} else {
			group.Env = g.env
		}
		req.Groups = append(req.Groups, group)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
		zero string
	}{{"timeout", lf.timeout, "0 means none"}, {"grace", lf.grace, "0 means the default, " + launch.DefaultGrace.String()}, {"rdzv-timeout", lf.rdzvTimeout, "0 means the default, " + rank.DefaultRdzvTimeout.String()},
		{"heartbeat", lf.heartbeat, "0 means the default, " + rank.DefaultHeartbeat.String()},
		{"heartbeat-timeout", lf.heartbeatTimeout, "0 means the default, " + rank.DefaultHeartbeatTimeout.String()}} {
		if d.v < 0 {
			return lf, req, fmt.Errorf("--%s %v: must not be negative (%s)", d.flag, d.v, d.zero)
		}
	}
	req.JobID = lf.jobID
	req.RdzvAddr = lf.rdzvAddr
	req.RdzvTimeout = lf.rdzvTimeout
	if err := rank.CheckHeartbeat(lf.heartbeat, lf.heartbeatTimeout); err != nil {
		return lf, req, fmt.Errorf("--heartbeat %v, --heartbeat-timeout %v: %w", lf.heartbeat, lf.heartbeatTimeout, err)
	}
	req.HeartbeatInterval, req.HeartbeatTimeout = lf.heartbeat, lf.heartbeatTimeout
	req.NoTorchEnv = !lf.torchEnv
	if lf.maxRestarts < 0 {
		return lf, req, fmt.Errorf("--max-restarts %d: must not be negative (0 means none)", lf.maxRestarts)
	}
	req.MaxRestarts = lf.maxRestarts
	req.CheckpointDir = lf.ckptDir
	if lf.json && !lf.dryRun {
		return lf, req, errors.New("--json needs --dry-run")
	}
	if err := lf.hosts.check(); err != nil {
		return lf, req, err
	}
	if lf.topology != "" && !bindsGPUs(req) {
		return lf, req, errors.New("--topology needs GPU binding (--bind gpu or --gmi-per-gpu K)")
	}
	return lf, req, nil
}

// checkEnvFlags refuses a -x of a variable that the launcher sets for each
// rank: the names of rank.LauncherEnv, which a job spec's env may not set
// either.
func checkEnvFlags(env []string) error {
	reserved := rank.LauncherEnv()
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); slices.Contains(reserved, name) {
			return fmt.Errorf("-x %s: set by the launcher for each rank; -x may not set it", name)
		}
	}
	return nil
}

// bindsGPUs reports whether any group asks for GPU binding.
func bindsGPUs(req launch.Request) bool {
	for _, g := range req.Groups {
		if g.Bind != nil {
			return true
		}
	}
	return false
}

// launchDiscover finds the machine's GPUs for a launch that binds them. Only
// such a launch calls it, so a launch without binding never loads NVML.
var launchDiscover = gmiDiscover

// splitColon splits args at lone ":" words, mpirun's MPMD separator.
func splitColon(args []string) [][]string {
	var out [][]string
	start := 0
	for i, a := range args {
		if a == ":" {
			out = append(out, args[start:i])
			start = i + 1
		}
	}
	return append(out, args[start:])
}

func launchCommand(args []string, s stdio) int {
	if len(args) == 0 {
		usage(s.err)
		return 2
	}
	lf, req, err := parseLaunch(args, s.err)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return failCode(s, 2, err)
	}
	if bindsGPUs(req) {
		topo, err := launchDiscover(context.Background(), lf.topology)
		if err != nil {
			return failCode(s, launch.ExitLaunchFailed, err)
		}
		req.Topology = topo
	}
	var hosts []launch.Host
	if lf.hosts.on() {
		if hosts, err = lf.hosts.list(); err != nil {
			return failCode(s, 2, err)
		}
		if req.Groups[0].NP == 0 {
			for _, h := range hosts {
				req.Groups[0].NP += h.Slots
			}
		}
	}
	plan, err := launch.NewPlan(req)
	if err != nil {
		var be *launch.BindError
		if errors.As(err, &be) {
			return failCode(s, launch.ExitLaunchFailed, err) // the binding does not fit this machine
		}
		return failCode(s, 2, err)
	}
	if plan.CheckpointDir == "" && plan.MaxRestarts > 0 {
		plan.CheckpointDir = launch.CheckpointDir("", plan.JobID)
	}
	if hosts != nil {
		if err := plan.PlaceOnHosts(hosts); err != nil {
			return failCode(s, 2, err)
		}
		if !lf.hosts.rdzvSet {
			// Where the hosts reach this machine, not every address.
			if plan.RdzvAddr, err = launch.RdzvAddrFor(hosts); err != nil {
				return failCode(s, launch.ExitLaunchFailed, err)
			}
		}
	}
	if lf.dryRun {
		if lf.json {
			err = plan.WriteJSON(s.out)
		} else {
			err = plan.WriteText(s.out)
			if err == nil && hosts != nil {
				err = writeHostsText(s.out, plan, lf.hosts)
			}
		}
		if err != nil {
			return fail(s, err)
		}
		return 0
	}
	opts := launch.Options{
		TagOutput:   lf.tagOutput,
		OutputDir:   lf.outputDir,
		Timeout:     lf.timeout,
		Grace:       lf.grace,
		Verbose:     lf.verbose,
		Trace:       lf.trace,
		TraceEvents: lf.traceEvents,
	}
	if lf.metricsAddr != "" {
		srv, err := serveMetrics(lf.metricsAddr, jobRef{id: plan.JobID})
		if err != nil {
			return failCode(s, 2, err)
		}
		defer srv.Close()
	}
	if hosts != nil {
		rem, err := lf.hosts.remote()
		if err != nil {
			return failCode(s, 2, err)
		}
		return runOnHosts(plan, opts, rem, s)
	}
	return runPlan(plan, "", opts, s)
}

// runPlan runs plan with opts on the command's stdio, passing SIGINT and
// SIGTERM on to the launcher, and returns gearrun's exit code: the job's, or
// launch.ExitLaunchFailed when it could not be started. The job is recorded
// for gearrun status under name ("": its programs).
func runPlan(plan *launch.Plan, name string, opts launch.Options, s stdio) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	opts.Stdout, opts.Stderr, opts.Stdin, opts.Signals = s.out, s.err, s.in, sigs
	job := startLocalJob(plan, name, opts.Verbose, s)
	res, err := launch.Run(context.Background(), plan, opts)
	code := jobExitCode(s, res, err)
	job.end(code)
	return code
}

// jobExitCode is gearrun's exit code for a job that ran (launch.Run or
// RunOnHosts): the job's, after saying why it failed unless the launcher
// already did.
func jobExitCode(s stdio, res *launch.Result, err error) int {
	if err != nil {
		var je *launch.JobError
		if !errors.As(err, &je) {
			return failCode(s, launch.ExitLaunchFailed, err)
		}
		if !je.Announced {
			fmt.Fprintf(s.err, "gearrun: %s\n", je.Cause)
		}
		return je.Code
	}
	return res.ExitCode
}

func cleanCommand(args []string, s stdio) int {
	fs := newFlagSet("gearrun clean", "clean [flags]\n\n"+
		"Remove the shared-memory segments of gear jobs that are gone, then list the\n"+
		"checkpoint directories kept (--checkpoints ID removes one).\n\nFlags:", s)
	var opts launch.CleanOptions
	fs.BoolVar(&opts.DryRun, "dry-run", false, "list what would be removed, remove nothing")
	fs.StringVar(&opts.ShmDir, "shm-dir", "/dev/shm", "directory of shared-memory segments")
	fs.StringVar(&opts.RuntimeDir, "runtime-dir", rank.RuntimeDir(), "directory of job lock files")
	ckpt := fs.String("checkpoints", "", "remove the checkpoint directory of job `ID` (or a prefix of it) instead; gearrun clean --dry-run lists them (see docs/elastic.md)")
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(s.err, "gearrun clean: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	root := launch.CheckpointRoot()
	if *ckpt != "" {
		c, err := findCheckpoints(root, *ckpt)
		if err != nil {
			fmt.Fprintf(s.err, "gearrun clean: %v\n", err)
			return 1
		}
		if opts.DryRun {
			fmt.Fprintf(s.out, "would remove checkpoints %s (%s)\n", c.path, byteSize(c.bytes))
			return 0
		}
		dir, err := launch.RemoveCheckpoints(root, c.job)
		if err != nil {
			fmt.Fprintf(s.err, "gearrun clean: %s\n", strings.TrimPrefix(err.Error(), "launch: "))
			return 1
		}
		fmt.Fprintf(s.out, "removed checkpoints %s\n", dir)
		return 0
	}
	got, err := launch.Clean(opts)
	verb := "removed"
	if opts.DryRun {
		verb = "would remove"
	}
	for _, seg := range got.Segments {
		fmt.Fprintf(s.out, "%s segment %s\n", verb, seg)
	}
	for _, l := range got.Locks {
		fmt.Fprintf(s.out, "%s stale lock %s\n", verb, l)
	}
	if len(got.Segments)+len(got.Locks) == 0 {
		fmt.Fprintln(s.out, "nothing to clean")
	}
	code := 0
	if err != nil {
		fmt.Fprintf(s.err, "gearrun clean: %v\n", err)
		code = 1
	}
	writeCheckpoints(s, root)
	return code
}

// writeCheckpoints lists the checkpoint directories under root, which gearrun
// clean keeps (a job's checkpoints outlive it on purpose), with their sizes.
func writeCheckpoints(s stdio, root string) {
	all, err := listCheckpoints(root)
	if err != nil {
		fmt.Fprintf(s.err, "gearrun clean: %v\n", err)
		return
	}
	if len(all) == 0 {
		return
	}
	jobsWord := "jobs"
	if len(all) == 1 {
		jobsWord = "job"
	}
	fmt.Fprintf(s.out, "kept checkpoints of %d %s in %s (remove one with gearrun clean --checkpoints ID):\n", len(all), jobsWord, root)
	tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	for _, c := range all {
		fmt.Fprintf(tw, "  %s\t%s\n", c.job, byteSize(c.bytes))
	}
	tw.Flush()
}
