package jobs

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/gear-rl/gear/internal/tomlerr"
	"github.com/gear-rl/gear/rank"
)

// FieldError is one problem with one field of a spec. Field is the path of the
// field as written in TOML, with indices for arrays of tables:
// "group[1].np", "table.columns[0].dtype", "launch.env.GEAR_RANK".
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return "jobs: " + e.Field + ": " + e.Problem }

// Validate checks a spec whose defaults are filled in (SetDefaults). It returns
// nil or every problem found, joined with errors.Join; each is a *FieldError
// (find them with errors.As, or list them by unwrapping the join).
func (s *Spec) Validate() error {
	v := &validator{}
	v.spec(s)
	return errors.Join(v.errs...)
}

type validator struct{ errs []error }

func (v *validator) add(field, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)})
}

// The patterns are compiled on first use: gearrun's start-up (a launch of
// /bin/true) should not pay for them.
var (
	// jobNameRE: the name goes into SLURM's --job-name and into file names.
	jobNameRE = lazyRE(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)
	roleRE    = lazyRE(`^[a-z][a-z0-9_-]{0,31}$`)
	envKeyRE  = lazyRE(`^[A-Za-z_][A-Za-z0-9_]*$`)
	columnRE  = lazyRE(`^[A-Za-z_][A-Za-z0-9_.]{0,63}$`)
	// slurmTimeRE: the formats sbatch --time accepts.
	slurmTimeRE = lazyRE(`^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2}|infinite|unlimited|UNLIMITED|INFINITE)$`)
	// slurmWordRE: partition, account and qos names; anything else would have
	// to be quoted in a batch script.
	slurmWordRE = lazyRE(`^[A-Za-z0-9_.,:+@=-]+$`)
)

// lazyRE returns a function that compiles expr once, when first called.
func lazyRE(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

func (v *validator) spec(s *Spec) {
	switch {
	case s.Name == "":
		v.add("name", "must not be empty")
	case !jobNameRE().MatchString(s.Name):
		v.add("name", "%q: use letters, digits, '.', '_' and '-', starting with a letter or digit, at most 100", s.Name)
	}
	v.launch(&s.Launch, len(s.Groups) > 0, s.WorldSize())
	if w := s.WorldSize(); len(s.Groups) > 1 && w > rank.MaxWorldSize {
		total := strconv.Itoa(w)
		if w == math.MaxInt {
			total = "more than any int holds"
		}
		v.add("group", "the groups' np add up to %s, but a job has at most %d ranks (rank.MaxWorldSize); split the work into several jobs", total, rank.MaxWorldSize)
	}
	roles := map[string]int{}
	for i := range s.Groups {
		v.group(fmt.Sprintf("group[%d]", i), &s.Groups[i], roles, i)
	}
	v.gmi(s)
	v.slurm(&s.Slurm, s.WorldSize())
	if s.Table != nil {
		v.table(s.Table, s.WorldSize())
	}
}

func (v *validator) launch(l *Launch, mpmd bool, world int) {
	if mpmd {
		if l.NP != 0 && l.NP != world {
			v.add("launch.np", "is %d but the groups' np sum to %d; leave it out with [[group]]", l.NP, world)
		}
		if len(l.Command) > 0 {
			v.add("launch.command", "must be empty with [[group]]; give each group its command")
		}
		if l.GPUsPerRank != 0 {
			v.add("launch.gpus_per_rank", "must be 0 with [[group]]; give each group its gpus_per_rank")
		}
	} else {
		if l.NP < 1 {
			v.add("launch.np", "must be at least 1, got %d", l.NP)
		} else if l.NP > rank.MaxWorldSize {
			v.add("launch.np", "is %d, but a job has at most %d ranks (rank.MaxWorldSize); split the work into several jobs", l.NP, rank.MaxWorldSize)
		}
		v.command("launch.command", l.Command)
		if l.GPUsPerRank < 0 {
			v.add("launch.gpus_per_rank", "must not be negative, got %d", l.GPUsPerRank)
		}
	}
	v.env("launch.env", l.Env)
	if l.Timeout < 0 {
		v.add("launch.timeout", "must not be negative, got %s", l.Timeout)
	}
	if l.Grace < 0 {
		v.add("launch.grace", "must not be negative, got %s", l.Grace)
	} else if l.Grace == 0 {
		v.add("launch.grace", "must be positive, got %s (leave it out for the default, %s)", l.Grace, DefaultGrace)
	}
	if l.Restarts < 0 {
		v.add("launch.restarts", "must not be negative, got %d (0 means none)", l.Restarts)
	}
	if l.MinNP != 0 {
		switch {
		case mpmd:
			v.add("launch.min_np", "is for a job of one group; leave it out with [[group]]")
		case l.MinNP < 1 || l.MinNP > l.NP:
			v.add("launch.min_np", "must be from 1 to launch.np (%d), got %d", l.NP, l.MinNP)
		case l.Restarts == 0:
			v.add("launch.min_np", "needs launch.restarts: the world shrinks only when it starts again")
		case l.GPUsPerRank != 0:
			v.add("launch.min_np", "cannot be combined with launch.gpus_per_rank yet")
		}
	}
	if strings.ContainsAny(l.CheckpointDir, "\x00\n") {
		v.add("launch.checkpoint_dir", "must not contain NUL or newline")
	}
	if l.RdzvTimeout < 0 {
		v.add("launch.rdzv_timeout", "must not be negative, got %s", l.RdzvTimeout)
	}
	if l.Heartbeat < 0 {
		v.add("launch.heartbeat", "must not be negative, got %s", l.Heartbeat)
	}
	if l.HeartbeatTimeout < 0 {
		v.add("launch.heartbeat_timeout", "must not be negative, got %s", l.HeartbeatTimeout)
	}
	if l.Heartbeat >= 0 && l.HeartbeatTimeout >= 0 {
		if err := rank.CheckHeartbeat(l.Heartbeat.D(), l.HeartbeatTimeout.D()); err != nil {
			v.add("launch.heartbeat_timeout", "%v", err)
		}
	}
	if strings.ContainsAny(l.OutputDir, "\x00\n") {
		v.add("launch.output_dir", "must not contain NUL or newline")
	}
	if strings.ContainsAny(l.Trace, "\x00\n") {
		v.add("launch.trace", "must not contain NUL or newline")
	}
}

func (v *validator) command(field string, cmd []string) {
	if len(cmd) == 0 || cmd[0] == "" {
		v.add(field, "must name a program")
		return
	}
	for i, a := range cmd {
		if strings.ContainsRune(a, 0) {
			v.add(fmt.Sprintf("%s[%d]", field, i), "must not contain NUL")
		}
	}
}

// env checks a spec's env: a spec may not set a variable that the launcher
// sets for each rank (rank.LauncherEnv).
func (v *validator) env(field string, env map[string]string) {
	reserved := rank.LauncherEnv()
	for _, k := range sortedKeys(env) {
		switch {
		case !envKeyRE().MatchString(k):
			v.add(field+"."+tomlerr.Part(k), "not a valid environment variable name")
		case slices.Contains(reserved, k):
			v.add(field+"."+k, "set by the launcher for each rank; a spec may not set it")
		case strings.ContainsRune(env[k], 0):
			v.add(field+"."+k, "must not contain NUL")
		}
	}
}

func (v *validator) group(field string, g *Group, roles map[string]int, i int) {
	switch {
	case g.Role == "":
		v.add(field+".role", "must not be empty")
	case !roleRE().MatchString(g.Role):
		v.add(field+".role", "%q: use lower-case letters, digits, '_' and '-', starting with a letter, at most 32", g.Role)
	default:
		if j, dup := roles[g.Role]; dup {
			v.add(field+".role", "%q is also group[%d]'s role", g.Role, j)
		} else {
			roles[g.Role] = i
		}
	}
	if g.NP > rank.MaxWorldSize {
		v.add(field+".np", "is %d, but a job has at most %d ranks (rank.MaxWorldSize)", g.NP, rank.MaxWorldSize)
	}
	if g.NP < 1 {
		v.add(field+".np", "must be at least 1, got %d", g.NP)
	}
	v.command(field+".command", g.Command)
	v.env(field+".env", g.Env)
	if g.GPUsPerRank < 0 {
		v.add(field+".gpus_per_rank", "must not be negative, got %d", g.GPUsPerRank)
	}
}

func (v *validator) gmi(s *Spec) {
	g := s.GMI
	if g.PerGPU < 1 {
		v.add("gmi.per_gpu", "must be at least 1, got %d", g.PerGPU)
	}
	switch g.Backend {
	case BackendNone:
		if g.PerGPU > 1 {
			v.add("gmi.backend", "is \"none\" but per_gpu is %d; use \"mps\", \"mig\" or \"auto\"", g.PerGPU)
		}
	case BackendMPS, BackendMIG, BackendAuto:
	default:
		v.add("gmi.backend", "%q: want \"none\", \"mps\", \"mig\" or \"auto\"", g.Backend)
	}
	if g.PerGPU > 1 {
		for _, r := range s.Roles() {
			if r.GPUsPerRank > 1 {
				field := "launch.gpus_per_rank"
				for i, gr := range s.Groups {
					if gr.Role == r.Name {
						field = fmt.Sprintf("group[%d].gpus_per_rank", i)
					}
				}
				v.add(field, "is %d but gmi.per_gpu is %d: a rank that shares a GPU cannot span several", r.GPUsPerRank, g.PerGPU)
			}
		}
	}
}

func (v *validator) slurm(sl *Slurm, world int) {
	if sl.Nodes < 1 {
		v.add("slurm.nodes", "must be at least 1, got %d", sl.Nodes)
	}
	if sl.NTasksPerNode < 0 {
		v.add("slurm.ntasks_per_node", "must not be negative (0 lets SLURM choose), got %d", sl.NTasksPerNode)
	} else if sl.NTasksPerNode > 0 && sl.Nodes >= 1 && sl.Nodes*sl.NTasksPerNode < world {
		v.add("slurm.ntasks_per_node", "%d nodes × %d tasks per node hold fewer than the job's %d ranks", sl.Nodes, sl.NTasksPerNode, world)
	}
	if sl.Nodes > world && world > 0 {
		v.add("slurm.nodes", "%d nodes for %d ranks leaves nodes without a rank", sl.Nodes, world)
	}
	if sl.CPUsPerTask < 1 {
		v.add("slurm.cpus_per_task", "must be at least 1, got %d", sl.CPUsPerTask)
	}
	if sl.GPUsPerNode < 0 {
		v.add("slurm.gpus_per_node", "must not be negative, got %d", sl.GPUsPerNode)
	}
	if sl.Time != "" && !slurmTimeRE().MatchString(sl.Time) {
		v.add("slurm.time", "%q: want MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS", sl.Time)
	}
	for _, f := range []struct{ name, val string }{
		{"slurm.partition", sl.Partition}, {"slurm.account", sl.Account}, {"slurm.qos", sl.QOS},
	} {
		if f.val != "" && !slurmWordRE().MatchString(f.val) {
			v.add(f.name, "%q: must not contain spaces, quotes or shell characters", f.val)
		}
	}
	for i, opt := range sl.Extra {
		field := fmt.Sprintf("slurm.extra[%d]", i)
		switch {
		case !strings.HasPrefix(opt, "-"):
			v.add(field, "%q: want an sbatch option such as \"--exclusive\"", opt)
		case strings.ContainsAny(opt, "\n\r\x00"):
			v.add(field, "must be one line")
		case isManagedOption(opt):
			v.add(field, "%q: gearrun sets this option itself; use the [slurm] field for it", opt)
		}
	}
	if strings.ContainsAny(sl.Gearrun, "\n\r\x00") {
		v.add("slurm.gearrun", "must be one line")
	}
	if sl.RdzvPort < 0 || sl.RdzvPort > 65535 {
		v.add("slurm.rdzv_port", "must be a port number, 0 to 65535, got %d", sl.RdzvPort)
	}
}

// managedOptions are the sbatch options the batch script writes from [slurm];
// giving them again in extra would contradict the spec.
var managedOptions = []string{
	"--job-name", "-J", "--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node",
	"--cpus-per-task", "-c", "--gpus-per-node", "--time", "-t", "--partition", "-p",
	"--account", "-A", "--qos", "-q", "--output", "-o", "--error", "-e", "--parsable",
	"--export", "--chdir", "-D", "--open-mode",
}

func isManagedOption(opt string) bool {
	name, _, _ := strings.Cut(opt, "=")
	if len(name) > 2 && name[1] != '-' {
		name = name[:2] // "-N2"
	}
	return slices.Contains(managedOptions, name)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
