package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"gear/launch"
	"gear/rank"
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
	jobID       string
	verbose     bool
}

// groupFlags are the flags that describe one MPMD group; they may follow each ':'.
type groupFlags struct {
	np   int
	role string
	env  envList
}

func (g *groupFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&g.np, "np", 0, "number of ranks of this group (required)")
	fs.IntVar(&g.np, "n", 0, "same as -np")
	fs.StringVar(&g.role, "role", "", "role name of this group (default: program base name for MPMD jobs)")
	fs.Var(&g.env, "x", "pass NAME=VALUE, or NAME with the launcher's value, to the ranks (repeatable)")
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
	fs.StringVar(&l.jobID, "job-id", "", "job ID (default: a new UUID)")
	fs.BoolVar(&l.verbose, "v", false, "log the launcher's steps on stderr")
}

// parseLaunch parses `[flags] -np N PROG [ARGS] [: -np M PROG2 [ARGS] ...]`.
func parseLaunch(args []string, stderr io.Writer) (launchFlags, launch.Request, error) {
	var lf launchFlags
	var req launch.Request
	segments := splitColon(args)
	for i, seg := range segments {
		fs := flag.NewFlagSet("gearrun", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var g groupFlags
		g.register(fs)
		if i == 0 {
			lf.register(fs)
			fs.Usage = func() {
				fmt.Fprintf(stderr, "usage: gearrun [flags] -np N PROGRAM [ARGS...] [: -np M PROGRAM2 [ARGS...] ...]\n\n"+
					"PROGRAM may be a Go package directory (./examples/hello): gearrun builds it once.\n"+
					"After each ':' come that group's -np, --role and -x.\n\nFlags:\n")
				fs.PrintDefaults()
			}
		}
		if err := fs.Parse(seg); err != nil {
			return lf, req, err
		}
		prog := fs.Args()
		if len(prog) == 0 {
			return lf, req, fmt.Errorf("group %d: no program (usage: gearrun -np N PROGRAM [ARGS...])", i)
		}
		if g.np < 1 {
			return lf, req, fmt.Errorf("group %d (%s): -np N is required and must be at least 1", i, prog[0])
		}
		group := launch.Group{Role: g.role, NP: g.np, Argv: prog}
		if i == 0 {
			req.Env = g.env // -x before the first program applies to every group
		} else {
			group.Env = g.env
		}
		req.Groups = append(req.Groups, group)
	}
	req.JobID = lf.jobID
	req.RdzvAddr = lf.rdzvAddr
	req.RdzvTimeout = lf.rdzvTimeout
	if lf.json && !lf.dryRun {
		return lf, req, errors.New("--json needs --dry-run")
	}
	return lf, req, nil
}

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
		fmt.Fprintf(s.err, "gearrun: %v\n", err)
		return 2
	}
	plan, err := launch.NewPlan(req)
	if err != nil {
		fmt.Fprintf(s.err, "gearrun: %v\n", err)
		return 2
	}
	if lf.dryRun {
		if lf.json {
			err = plan.WriteJSON(s.out)
		} else {
			err = plan.WriteText(s.out)
		}
		if err != nil {
			fmt.Fprintf(s.err, "gearrun: %v\n", err)
			return 1
		}
		return 0
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	opts := launch.Options{
		Stdout:    s.out,
		Stderr:    s.err,
		Stdin:     s.in,
		TagOutput: lf.tagOutput,
		OutputDir: lf.outputDir,
		Timeout:   lf.timeout,
		Grace:     lf.grace,
		Signals:   sigs,
		Verbose:   lf.verbose,
	}
	res, err := launch.Run(context.Background(), plan, opts)
	if err != nil {
		var je *launch.JobError
		if !errors.As(err, &je) {
			fmt.Fprintf(s.err, "gearrun: %v\n", err)
			return launch.ExitLaunchFailed
		}
		if !je.Announced {
			fmt.Fprintf(s.err, "gearrun: %s\n", je.Cause)
		}
		return je.Code
	}
	return res.ExitCode
}

func cleanCommand(args []string, s stdio) int {
	fs := flag.NewFlagSet("gearrun clean", flag.ContinueOnError)
	fs.SetOutput(s.err)
	var opts launch.CleanOptions
	fs.BoolVar(&opts.DryRun, "dry-run", false, "list what would be removed, remove nothing")
	fs.StringVar(&opts.ShmDir, "shm-dir", "/dev/shm", "directory of shared-memory segments")
	fs.StringVar(&opts.RuntimeDir, "runtime-dir", rank.RuntimeDir(), "directory of job lock files")
	fs.Usage = func() {
		fmt.Fprintf(s.err, "usage: gearrun clean [flags]\n\nRemove the shared-memory segments of gear jobs that are gone.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(s.err, "gearrun clean: unexpected argument %q\n", fs.Arg(0))
		return 2
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
	if err != nil {
		fmt.Fprintf(s.err, "gearrun clean: %v\n", err)
		return 1
	}
	return 0
}
