package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gear-rl/gear/gmi"
)

// gpusCommand: gearrun gpus [--json] [--topology FILE]
func gpusCommand(args []string, s stdio) int {
	fs := newFlagSet("gpus", "gpus [--json] [--topology FILE]\n\n"+
		"Lists GPUs, MIG instances and the MPS daemon's state.\n", s)
	asJSON := fs.Bool("json", false, "print JSON")
	topoFile := fs.String("topology", "", "read the GPUs from this topology file instead of NVML (default $"+gmi.EnvTopology+")")
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(s.err, "gearrun gpus: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	topo, err := gmiDiscover(ctx, *topoFile)
	if err != nil {
		return fail(s, err)
	}
	return gmiPrint(s, *asJSON, topo, topo.WriteText)
}

// gmiCommand: gearrun gmi plan|schedule|search ...
func gmiCommand(args []string, s stdio) int {
	usage := func(w io.Writer) {
		fmt.Fprint(w, `usage: gearrun gmi plan -np N [--gmi-per-gpu K] [--gmi-backend auto|mps|mig|none] [--json] ...
       gearrun gmi schedule --layout '[[0,1,2],[3,4,5]]' [--strategy NAME] [--json]
       gearrun gmi search [--gpus N] [--max-gmi 10] [--alpha 0.1] [--timeout 10m] [--json] -- CMD [ARGS...]

  plan      place ranks on GPUs and GMIs; print the bindings and the reduction strategy
  schedule  print Algorithm 1's strategy and the reduction steps for a mapping list
  search    run a benchmark over GMIs per GPU and environment counts (Algorithm 2)

Each subcommand takes -h.
`)
	}
	if len(args) == 0 {
		usage(s.err)
		return 2
	}
	switch args[0] {
	case "plan":
		return gmiPlanCommand(args[1:], s)
	case "schedule":
		return gmiScheduleCommand(args[1:], s)
	case "search":
		return gmiSearchCommand(args[1:], s)
	case "help", "-h", "-help", "--help":
		usage(s.out)
		return 0
	}
	fmt.Fprintf(s.err, "gearrun gmi: unknown subcommand %q\n", args[0])
	usage(s.err)
	return 2
}

func gmiPlanCommand(args []string, s stdio) int {
	fs := newFlagSet("gmi plan", "gmi plan -np N [flags]\n\n"+
		"Prints each rank's device binding, the mapping list and the reduction strategy.\n", s)
	np := fs.Int("np", 0, "number of ranks (required)")
	perGPU := fs.Int("gmi-per-gpu", 1, "ranks (GMIs) per GPU; 1 binds one rank per GPU")
	backend := fs.String("gmi-backend", "auto", "auto, mps, mig or none")
	workload := fs.String("workload", "training", "training (GMIs communicate: MPS) or serving (isolation pays: MIG where MIG mode is on)")
	devices := fs.String("devices", "", "use only these GPU indices, in this order (0,3)")
	memLimit := fs.String("mps-mem-limit", "", "per-rank MPS device memory limit: even (1/K of the GPU) or a size such as 8G")
	topoFile := fs.String("topology", "", "read the GPUs from this topology file instead of NVML (default $"+gmi.EnvTopology+")")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(s.err, "gearrun gmi plan: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *np < 1 {
		fmt.Fprintln(s.err, "gearrun gmi plan: -np N is required")
		return 2
	}
	req := gmi.PlanRequest{Ranks: *np, GMIPerGPU: *perGPU}
	b, err := gmi.ParseBackend(*backend)
	if err != nil {
		return failCode(s, 2, err)
	}
	req.Backend = b
	w, err := gmi.ParseWorkload(*workload)
	if err != nil {
		return failCode(s, 2, err)
	}
	req.Workload = w
	if *devices != "" {
		for _, f := range strings.Split(*devices, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				fmt.Fprintf(s.err, "gearrun gmi plan: --devices %q: want GPU indices such as 0,3\n", *devices)
				return 2
			}
			req.GPUs = append(req.GPUs, n)
		}
	}
	if *memLimit != "" {
		if req.MPSMemLimitMiB, req.MPSMemLimitEven, err = gmi.ParseMemLimit(*memLimit); err != nil {
			return failCode(s, 2, err)
		}
	}
	ctx, stop := signalContext()
	defer stop()
	topo, err := gmiDiscover(ctx, *topoFile)
	if err != nil {
		return fail(s, err)
	}
	p, err := gmi.NewPlan(topo, req)
	if err != nil {
		return fail(s, err)
	}
	return gmiPrint(s, *asJSON, p, p.WriteText)
}

func gmiScheduleCommand(args []string, s stdio) int {
	fs := newFlagSet("gmi schedule", "gmi schedule --layout LIST [--strategy NAME] [--json]\n\n"+
		"Prints which GMIs reduce together at each step.\n", s)
	layout := fs.String("layout", "", "mapping list, such as [[0,1,2],[3,4,5]] (default $"+gmi.EnvGMILayout+")")
	strategy := fs.String("strategy", "", "multi-process, multi-ring or hierarchical (default: Algorithm 1's choice)")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if *layout == "" {
		*layout = os.Getenv(gmi.EnvGMILayout)
	}
	if *layout == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	m, err := gmi.ParseMapping(*layout)
	if err != nil {
		return failCode(s, 2, err)
	}
	st := gmi.ChooseStrategy(m)
	if *strategy != "" {
		if st, err = gmi.ParseStrategy(*strategy); err != nil {
			return failCode(s, 2, err)
		}
	}
	sc, err := gmi.ReductionSchedule(m, st)
	if err != nil {
		return fail(s, err)
	}
	return gmiPrint(s, *asJSON, sc, sc.WriteText)
}

func gmiSearchCommand(args []string, s stdio) int {
	fs := flag.NewFlagSet("gmi search", flag.ContinueOnError)
	fs.SetOutput(s.err)
	gpus := fs.Int("gpus", 0, "GPUs the job will use, for the throughput estimate (default: all GPUs found, at least 1)")
	gpu := fs.Int("gpu", -1, "GPU index the benchmark runs on (default: the first GPU found)")
	maxGMI := fs.Int("max-gmi", 10, "most GMIs per GPU tried (the search counts down from here)")
	minGMI := fs.Int("min-gmi", 1, "fewest GMIs per GPU tried")
	minEnv := fs.Int("min-env", 128, "first num_env of each series (doubled each run)")
	maxEnv := fs.Int("max-env", 16384, "largest num_env tried")
	alpha := fs.Float64("alpha", gmi.DefaultAlpha, "saturation threshold: a series stops when Sat < alpha")
	timeout := fs.Duration("timeout", 10*time.Minute, "limit on each benchmark run; a run past it is not runnable")
	topoFile := fs.String("topology", "", "read the GPUs from this topology file instead of NVML (default $"+gmi.EnvTopology+")")
	asJSON := fs.Bool("json", false, "print JSON")
	verbose := fs.Bool("v", false, "copy the benchmark's output to stderr")
	fs.Usage = func() {
		fmt.Fprintf(s.err, `usage: gearrun gmi search [flags] -- CMD [ARGS...]

Runs CMD once per configuration with %s (GMIs per GPU) and %s set.
CMD prints throughput=X (one GMI's throughput) and optionally memory=BYTES;
a non-zero exit, a timeout or no throughput means the configuration does not run.

`, gmi.EnvGMIPerGPU, gmi.EnvNumEnv)
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args); done {
		return code
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fmt.Fprintln(s.err, "gearrun gmi search: no benchmark command (gearrun gmi search [flags] -- CMD ...)")
		return 2
	}
	if !(*alpha > 0) {
		fmt.Fprintf(s.err, "gearrun gmi search: --alpha %v: want a positive number\n", *alpha)
		return 2
	}
	cfg := gmi.SearchConfig{GPUs: *gpus, MaxGMIPerGPU: *maxGMI, MinGMIPerGPU: *minGMI, MinEnv: *minEnv, MaxEnv: *maxEnv, Alpha: *alpha}
	if *gpus < 0 || *maxGMI < 1 || *minGMI < 1 || *minEnv < 1 || *maxEnv < 1 {
		fmt.Fprintln(s.err, "gearrun gmi search: --gpus, --max-gmi, --min-gmi, --min-env and --max-env must be positive")
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	topo, err := gmiDiscover(ctx, *topoFile)
	if err != nil {
		return fail(s, err)
	}
	if cfg.GPUs == 0 {
		cfg.GPUs = max(1, len(topo.GPUs))
	}
	if err := cfg.Validate(); err != nil {
		return failCode(s, 2, err)
	}
	cmd := &gmi.BenchCommand{Args: argv, Timeout: *timeout}
	if *gpu < 0 && len(topo.GPUs) > 0 {
		*gpu = topo.GPUs[0].Index
	}
	if *gpu >= 0 {
		if _, ok := topo.GPU(*gpu); !ok {
			fmt.Fprintf(s.err, "gearrun gmi search: --gpu %d: no such GPU\n", *gpu)
			return 2
		}
		cmd.Binding = gmi.ProfileBinding(topo, *gpu)
		if g, _ := topo.GPU(*gpu); g.MIGMode {
			fmt.Fprintf(s.err, "gearrun gmi search: GPU %d is in MIG mode: its instances are fixed, so the benchmark runs without a device binding\n", *gpu)
		}
	}
	if topo.Source == gmi.SourceNVML {
		if sampler, err := gmi.OpenMemorySampler(); err == nil {
			defer sampler.Close()
			cmd.Memory = sampler
		}
	}
	if *verbose {
		cmd.Output = s.err
	}
	res, err := gmi.Search(ctx, cfg, cmd.Profile)
	if err != nil {
		fmt.Fprintf(s.err, "gearrun: %v\n", err)
		if len(res.Rows) > 0 {
			res.WriteText(s.err)
		}
		return 1
	}
	if code := gmiPrint(s, *asJSON, res, res.WriteText); code != 0 {
		return code
	}
	if !res.Found {
		return 1
	}
	return 0
}

// gmiDiscover reads the topology from file, else from GEAR_TOPOLOGY, else NVML.
func gmiDiscover(ctx context.Context, file string) (*gmi.Topology, error) {
	if file != "" {
		return gmi.Discover(ctx, gmi.WithTopologyFile(file))
	}
	return gmi.Discover(ctx)
}

// gmiPrint writes v as indented JSON or through its text writer.
func gmiPrint(s stdio, asJSON bool, v any, text func(io.Writer) error) int {
	var err error
	if asJSON {
		enc := json.NewEncoder(s.out)
		enc.SetIndent("", "  ")
		err = enc.Encode(v)
	} else {
		err = text(s.out)
	}
	if err != nil {
		return fail(s, err)
	}
	return 0
}
