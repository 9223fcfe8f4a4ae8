// Command gearrun launches SPMD and MPMD jobs on one machine or on SLURM.
//
//	gearrun -np 4 ./examples/hello
//	gearrun -np 2 ./actor : -np 1 ./trainer
//	gearrun run job.toml
//	gearrun submit job.toml
//
// gearrun holds no logic of its own: it parses flags and calls the packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
)

// stdio is where a subcommand reads and writes.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// command is one subcommand. run returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(args []string, s stdio) int
}

// commands lists the subcommands; anything else is a launch (gearrun -np N PROG).
var commands = []command{
	{"run", "run a TOML job spec on this machine", runJobCommand},
	{"validate", "check a TOML job spec", validateCommand},
	{"submit", "submit a TOML job spec to SLURM", submitCommand},
	{"status", "list local and submitted jobs, or show one", statusCommand},
	{"cancel", "cancel a submitted job", cancelCommand},
	{"logs", "print the output of a submitted job", logsCommand},
	{"gpus", "list GPUs, MIG instances and MPS", gpusCommand},
	{"gmi", "plan GMIs (gmi plan) or search the best GMIs per GPU (gmi search)", gmiCommand},
	{"clean", "remove shared-memory segments of jobs that are gone; list or remove checkpoints", cleanCommand},
	{"top", "show a running job's ranks, tables and collectives, live", topCommand},
}

func main() {
	// The launcher waits, copies output and answers the rendezvous: one
	// thread running Go code is plenty, and the ranks get the other CPUs
	// (measured: about 1.5 ms less per launch on 2 cores). GOMAXPROCS in the
	// environment still decides.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	os.Exit(run(os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr}))
}

func run(args []string, s stdio) int {
	if len(args) > 0 {
		switch args[0] {
		case "help", "-h", "-help", "--help":
			usage(s.out)
			return 0
		case "version", "-version", "--version":
			fmt.Fprintln(s.out, versionLine())
			return 0
		case "agent": // started by gearrun -H over ssh; not listed
			return agentCommand(args[1:], s)
		}
		for _, c := range commands {
			if c.name == args[0] {
				return c.run(args[1:], s)
			}
		}
	}
	return launchCommand(args, s)
}

// versionLine is what gearrun --version prints.
func versionLine() string {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(bi, runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH)
}

// versionOf describes a build from its build info: the module's version ("v0.3.0"
// from go install ...@v0.3.0, a pseudo-version from a checkout, "(devel)" from
// go run), its path, and the VCS revision it was built from: the vcs.revision
// setting of a build in a checkout, or the commit that a pseudo-version names
// (go install ...@latest of an untagged commit). bi may be nil.
func versionOf(bi *debug.BuildInfo, goRelease string) string {
	version, path, rev, modified := "(devel)", "", "", false
	if bi != nil {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		path = bi.Main.Path
		for _, st := range bi.Settings {
			switch st.Key {
			case "vcs.revision":
				rev = st.Value
			case "vcs.modified":
				modified = st.Value == "true"
			}
		}
	}
	if rev == "" {
		rev = pseudoRevision(version)
	}
	var about []string
	if path != "" {
		about = append(about, "module "+path)
	}
	if rev != "" {
		about = append(about, "revision "+rev[:min(len(rev), 12)])
	} else {
		about = append(about, "revision unknown")
	}
	if modified {
		about = append(about, "modified")
	}
	return fmt.Sprintf("gearrun %s (%s), %s", version, strings.Join(about, ", "), goRelease)
}

// pseudoRevision returns the commit prefix that a pseudo-version
// ("v0.0.0-20261125021500-7b9c7f8abcde", "v1.2.4-0.20261125021500-7b9c7f8abcde+dirty")
// ends with, or "" for any other version.
func pseudoRevision(version string) string {
	version, _, _ = strings.Cut(version, "+")
	i := strings.LastIndexByte(version, '-')
	if i < 0 {
		return ""
	}
	rev, stamp := version[i+1:], version[:i]
	if len(rev) != 12 || strings.Trim(rev, "0123456789abcdef") != "" || len(stamp) < 14 {
		return ""
	}
	stamp = stamp[len(stamp)-14:]
	if strings.Trim(stamp, "0123456789") != "" {
		return ""
	}
	return rev
}

// usage prints gearrun's help as mpirun -h does: how to launch, the launch
// flags, then the subcommands. gearrun -h, --help, help, a launch's -h and a
// bare gearrun (on stderr) all print it.
func usage(w io.Writer) {
	fmt.Fprint(w, `usage: gearrun [flags] -np N PROGRAM [ARGS...] [: -np M PROGRAM2 [ARGS...] ...]
       gearrun COMMAND [ARGS...]

PROGRAM may be a Go package directory (./examples/hello): gearrun builds it once.
After each ':' come that group's -np, --role, -x and GPU binding flags (--bind,
--gmi-*, --mps-mem-limit); binding flags before the first program apply to every group.

Launch flags:
`)
	fs := flag.NewFlagSet("gearrun", flag.ContinueOnError)
	fs.SetOutput(w)
	var g groupFlags
	var l launchFlags
	g.register(fs)
	l.register(fs)
	fs.Bool("version", false, "print gearrun's version and exit")
	fs.Bool("help", false, "print this help and exit (also -h)")
	fs.PrintDefaults()
	fmt.Fprint(w, "\nCommands (each takes -h):\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
}

// The helpers below are shared by the subcommands.

// signalContext is cancelled by SIGINT or SIGTERM (scancel sends SIGTERM), so
// that a command stops what it waits for (a job, a benchmark run).
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// newFlagSet makes a subcommand's flag set: errors go to s.err, and -h prints
// "usage: gearrun " and usage (whose first line may be followed by a
// description), then the flags.
func newFlagSet(name, usage string, s stdio) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(s.err)
	fs.Usage = func() {
		fmt.Fprintf(s.err, "usage: gearrun %s\n", usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args; done is true when the command should return code.
func parseFlags(fs *flag.FlagSet, args []string) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	return 0, false
}

// parseOneArg is parseFlags for a command that takes exactly one argument:
// another count prints the usage and returns 2.
func parseOneArg(fs *flag.FlagSet, args []string) (code int, done bool) {
	if code, done := parseFlags(fs, args); done {
		return code, true
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2, true
	}
	return 0, false
}

// fail reports err and returns exit code 1.
func fail(s stdio, err error) int { return failCode(s, 1, err) }

// failCode reports err and returns code.
func failCode(s stdio, code int, err error) int {
	fmt.Fprintf(s.err, "gearrun: %v\n", err)
	return code
}
