package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/rank"
)

// The job-spec commands: validate, run, submit, status, cancel, logs. Each parses
// its flags and calls package jobs.

func validateCommand(args []string, s stdio) int {
	fs := newFlagSet("validate", "validate JOB.toml...", s)
	quiet := fs.Bool("q", false, "print nothing for valid specs")
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	code := 0
	for _, path := range fs.Args() {
		spec, err := jobs.Load(path)
		if err != nil {
			fmt.Fprintln(s.err, err)
			code = 1
			continue
		}
		if !*quiet {
			fmt.Fprintf(s.out, "%s: ok: job %q, %s\n", path, spec.Name, describeRoles(spec))
		}
	}
	return code
}

// describeRoles says "4 ranks" or "5 ranks: actor 4, trainer 1".
func describeRoles(spec *jobs.Spec) string {
	n := spec.WorldSize()
	if len(spec.Groups) == 0 {
		return fmt.Sprintf("%d ranks", n)
	}
	parts := make([]string, len(spec.Groups))
	for i, g := range spec.Groups {
		parts[i] = fmt.Sprintf("%s %d", g.Role, g.NP)
	}
	return fmt.Sprintf("%d ranks: %s", n, strings.Join(parts, ", "))
}

func runJobCommand(args []string, s stdio) int {
	fs := newFlagSet("run", "run [--dry-run] JOB.toml", s)
	dryRun := fs.Bool("dry-run", false, "print the resolved launch plan and exit")
	slurm := fs.Bool("slurm", false, "run inside a SLURM allocation (the batch script of gearrun submit does this)")
	slurmTask := fs.Bool("slurm-task", false, "run one rank under srun (gearrun run --slurm does this)")
	slurmSweep := fs.Bool("slurm-sweep", false, "remove, on this node, the segments of $GEAR_JOB_ID and of ended jobs (gearrun run --slurm does this on every node at the job's start and end)")
	jobDir := fs.String("job-dir", "", "the job's directory in the state directory (with --slurm and --slurm-task)")
	addr := fs.String("metrics-addr", "", "serve the job's metrics in Prometheus's text format at `ADDR` (host:port; a bare :port listens on loopback)")
	trace := fs.String("trace", "", "write the job's Chrome trace to `FILE` when it ends (overrides launch.trace)")
	if code, done := parseOneArg(fs, args); done {
		return code
	}
	path := fs.Arg(0)
	spec, err := jobs.Load(path)
	if err != nil {
		fmt.Fprintln(s.err, err)
		return 1
	}
	if *slurmSweep {
		if err := jobs.SweepNode("", "", os.Getenv(rank.EnvJobID), s.err); err != nil {
			return fail(s, err)
		}
		return 0
	}
	if *dryRun && (*slurm || *slurmTask) {
		fmt.Fprintln(s.err, "gearrun: run: --dry-run prints the local plan; use gearrun submit --dry-run for the batch script")
		return 2
	}
	if *trace != "" {
		spec.Launch.Trace = *trace
	}
	if !*slurm && !*slurmTask {
		return runLocal(spec, path, *dryRun, *addr, s)
	}
	ctx, stop := signalContext()
	defer stop()
	switch {
	case *slurmTask:
		t := &jobs.SlurmTask{Spec: spec, SpecPath: path, JobDir: *jobDir, Stdin: s.in, Stdout: s.out, Stderr: s.err}
		code, err := t.Run(ctx)
		if err != nil {
			fmt.Fprintf(s.err, "gearrun: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
		return code
	case *slurm:
		self, err := os.Executable()
		if err != nil {
			return fail(s, err)
		}
		sr := &jobs.SlurmRun{Spec: spec, SpecPath: path, JobDir: *jobDir, Gearrun: self, Stdout: s.out, Stderr: s.err}
		res, err := sr.Run(ctx)
		if err != nil {
			return fail(s, err)
		}
		return res.ExitCode
	}
	return 0
}

// stateDir is the --state-dir flag shared by submit, status, cancel and logs.
func stateDirFlag(fs *flag.FlagSet) *string {
	return fs.String("state-dir", "", "where gearrun records submitted jobs (default $GEAR_STATE_DIR, else $XDG_STATE_HOME/gear, else ~/.local/state/gear)")
}

func openCluster(stateDir string) (*jobs.Cluster, error) {
	dir := jobs.StateDir(stateDir)
	if stateDir == "" {
		var err error
		if dir, err = jobs.DefaultStateDir(); err != nil {
			return nil, err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return &jobs.Cluster{State: dir, Gearrun: self}, nil
}

func submitCommand(args []string, s stdio) int {
	fs := newFlagSet("submit", "submit [--dry-run] [--parsable] JOB.toml", s)
	dryRun := fs.Bool("dry-run", false, "print the batch script and exit")
	parsable := fs.Bool("parsable", false, "print only \"GEAR_ID SLURM_ID\"")
	stateDir := stateDirFlag(fs)
	if code, done := parseOneArg(fs, args); done {
		return code
	}
	path := fs.Arg(0)
	spec, err := jobs.Load(path)
	if err != nil {
		fmt.Fprintln(s.err, err)
		return 1
	}
	c, err := openCluster(*stateDir)
	if err != nil {
		return fail(s, err)
	}
	wd, err := os.Getwd()
	if err != nil {
		return fail(s, err)
	}
	if *dryRun {
		id := uuid.NewString()
		script, err := jobs.BatchScript(spec, jobs.Batch{
			JobID: id, Dir: c.State.JobDir(id), StateDir: string(c.State), WorkDir: wd, Gearrun: c.Gearrun,
		})
		if err != nil {
			return fail(s, err)
		}
		io.WriteString(s.out, script)
		return 0
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	ctx, stop := signalContext()
	defer stop()
	r, err := c.Submit(ctx, spec, path, wd)
	if err != nil {
		return fail(s, err)
	}
	if *parsable {
		fmt.Fprintf(s.out, "%s %s\n", r.ID, r.SlurmID)
		return 0
	}
	fmt.Fprintf(s.out, "submitted job %s\ngear job ID:  %s\nSLURM job ID: %s\noutput:       %s\n", r.Name, r.ID, r.SlurmID, r.Output())
	return 0
}

func statusCommand(args []string, s stdio) int {
	fs := newFlagSet("status", "status [--wait [--timeout D]] [ID]   (ID: gear job ID, a prefix of it, or SLURM job ID)\n\n"+
		"Without ID: list the jobs run on this machine (gearrun -np, gearrun run) that are\n"+
		"running or ended in the last week, then the jobs submitted to SLURM.\n", s)
	wait := fs.Bool("wait", false, "wait until the job has ended; exit 0 only if it COMPLETED")
	timeout := fs.Duration("timeout", 0, "with --wait: give up after this long (0: never)")
	stateDir := stateDirFlag(fs)
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 1 || (*wait && fs.NArg() != 1) {
		fs.Usage()
		return 2
	}
	c, err := openCluster(*stateDir)
	if err != nil {
		return fail(s, err)
	}
	ctx, stop := signalContext()
	defer stop()
	if fs.NArg() == 0 {
		local, err := c.State.ListLocal()
		if err != nil {
			return fail(s, err)
		}
		all, err := c.List(ctx)
		if err != nil {
			return fail(s, err)
		}
		if len(local) > 0 {
			writeLocalJobs(s.out, local)
			if len(all) == 0 {
				return 0
			}
			fmt.Fprintln(s.out)
		}
		tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "GEAR ID\tSLURM ID\tNAME\tSTATE\tEXIT\tSUBMITTED")
		for _, st := range all {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", st.Record.ID, orDash(st.Record.SlurmID), st.Record.Name,
				st.State, exitText(st), st.Record.SubmittedAt.Local().Format(time.DateTime))
		}
		tw.Flush()
		return 0
	}
	r, err := c.State.Find(fs.Arg(0))
	if errors.Is(err, jobs.ErrNotFound) {
		if l, lerr := c.State.FindLocal(fs.Arg(0)); lerr == nil {
			return localStatus(ctx, c.State, l, *wait, *timeout, s)
		} else if !errors.Is(lerr, jobs.ErrNotFound) {
			err = lerr
		}
	}
	if err != nil {
		return fail(s, err)
	}
	var st *jobs.Status
	if *wait {
		wctx := ctx
		if *timeout > 0 {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, *timeout)
			defer cancel()
		}
		st, err = c.Wait(wctx, r, 500*time.Millisecond)
	} else {
		st, err = c.StatusOf(ctx, r)
	}
	if err != nil {
		return fail(s, err)
	}
	printStatus(s.out, st)
	if *wait && st.State != "COMPLETED" {
		return 1
	}
	return 0
}

// localStatus prints the local job r; with wait, once it has ended (exit 0
// only if it COMPLETED), polling its record in dir every half second.
func localStatus(ctx context.Context, dir jobs.StateDir, r *jobs.LocalRecord, wait bool, timeout time.Duration, s stdio) int {
	if wait {
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for r.State() == jobs.LocalRunning {
			select {
			case <-ctx.Done():
				return fail(s, fmt.Errorf("status: job %s: %w", r.ID, ctx.Err()))
			case <-tick.C:
			}
			var err error
			if r, err = dir.FindLocal(r.ID); err != nil {
				return fail(s, err)
			}
		}
	}
	printLocalStatus(s.out, r)
	if wait && r.State() != jobs.LocalCompleted {
		return 1
	}
	return 0
}

func printStatus(w io.Writer, st *jobs.Status) {
	r := st.Record
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "gear job ID:\t%s\n", r.ID)
	fmt.Fprintf(tw, "SLURM job ID:\t%s\n", orDash(r.SlurmID))
	fmt.Fprintf(tw, "name:\t%s\n", r.Name)
	state := st.State
	switch {
	case st.Signal > 0:
		state += fmt.Sprintf(" (signal %d)", st.Signal)
	case st.ExitCode >= 0:
		state += fmt.Sprintf(" (exit %d)", st.ExitCode)
	}
	if st.Reason != "" {
		state += ", reason: " + st.Reason
	}
	fmt.Fprintf(tw, "state:\t%s\t[%s]\n", state, st.Source)
	if st.NodeList != "" {
		fmt.Fprintf(tw, "nodes:\t%s\n", st.NodeList)
	}
	fmt.Fprintf(tw, "submitted:\t%s\n", r.SubmittedAt.Local().Format(time.DateTime))
	if r.CancelledAt != nil {
		fmt.Fprintf(tw, "cancelled:\t%s\n", r.CancelledAt.Local().Format(time.DateTime))
	}
	fmt.Fprintf(tw, "spec:\t%s\n", r.Spec)
	fmt.Fprintf(tw, "output:\t%s\n", r.Output())
	if st.Result != nil && st.Result.Message != "" {
		fmt.Fprintf(tw, "gearrun:\t%s\n", st.Result.Message)
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// exitText is a job's EXIT column: its exit code, "signal N" for a job that a
// signal ended (scancel's SIGTERM: SLURM records exit code 0 with it, which
// the column would show as a success), "-" while it has none.
func exitText(st *jobs.Status) string {
	switch {
	case st.Signal > 0:
		return fmt.Sprintf("signal %d", st.Signal)
	case st.ExitCode < 0:
		return "-"
	}
	return fmt.Sprint(st.ExitCode)
}

func cancelCommand(args []string, s stdio) int {
	fs := newFlagSet("cancel", "cancel [--wait] ID", s)
	wait := fs.Bool("wait", false, "wait until the job has left the queue")
	stateDir := stateDirFlag(fs)
	if code, done := parseOneArg(fs, args); done {
		return code
	}
	c, err := openCluster(*stateDir)
	if err != nil {
		return fail(s, err)
	}
	ctx, stop := signalContext()
	defer stop()
	r, err := c.Cancel(ctx, fs.Arg(0))
	if err != nil {
		return fail(s, err)
	}
	fmt.Fprintf(s.out, "cancelled job %s (gear %s, SLURM %s)\n", r.Name, r.ID, r.SlurmID)
	if *wait {
		st, err := c.Wait(ctx, r, 500*time.Millisecond)
		if err != nil {
			return fail(s, err)
		}
		fmt.Fprintf(s.out, "state: %s\n", st.State)
	}
	return 0
}

func logsCommand(args []string, s stdio) int {
	fs := newFlagSet("logs", "logs [-f] ID", s)
	follow := fs.Bool("f", false, "follow the output until the job ends")
	stateDir := stateDirFlag(fs)
	if code, done := parseOneArg(fs, args); done {
		return code
	}
	c, err := openCluster(*stateDir)
	if err != nil {
		return fail(s, err)
	}
	r, err := c.State.Find(fs.Arg(0))
	if err != nil {
		return fail(s, err)
	}
	ctx, stop := signalContext()
	defer stop()
	if err := c.Logs(ctx, r, s.out, *follow, 500*time.Millisecond); err != nil {
		return fail(s, err)
	}
	return 0
}

// runLocal runs a spec on this machine with the launcher, or prints its plan.
func runLocal(spec *jobs.Spec, path string, dryRun bool, metricsAddr string, s stdio) int {
	plan, err := spec.Plan(context.Background(), path)
	if err != nil {
		return fail(s, err)
	}
	if dryRun {
		if err := plan.WriteText(s.out); err != nil {
			return fail(s, err)
		}
		return 0
	}
	if metricsAddr != "" {
		srv, err := serveMetrics(metricsAddr, jobRef{id: plan.JobID})
		if err != nil {
			return fail(s, err)
		}
		defer srv.Close()
	}
	return runPlan(plan, spec.Name, spec.Options(), s)
}
