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
	"fmt"
	"io"
	"os"
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
	{"status", "show the state of submitted jobs", statusCommand},
	{"cancel", "cancel a submitted job", cancelCommand},
	{"logs", "print the output of a submitted job", logsCommand},
	{"gpus", "list GPUs, MIG instances and MPS", gpusCommand},
	{"gmi", "plan GMIs (gmi plan) or search the best GMIs per GPU (gmi search)", gmiCommand},
	{"clean", "remove shared-memory segments of jobs that are gone", cleanCommand},
}

func main() {
	os.Exit(run(os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr}))
}

func run(args []string, s stdio) int {
	if len(args) > 0 {
		switch args[0] {
		case "help", "-h", "-help", "--help":
			usage(s.out)
			return 0
		}
		for _, c := range commands {
			if c.name == args[0] {
				return c.run(args[1:], s)
			}
		}
	}
	return launchCommand(args, s)
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `usage: gearrun [flags] -np N PROGRAM [ARGS...] [: -np M PROGRAM2 ...]
       gearrun COMMAND [ARGS...]

Launch flags: gearrun -np 1 -h

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
}
