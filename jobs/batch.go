package jobs

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gear-rl/gear/rank"
)

// Batch is what a batch script needs besides the spec.
type Batch struct {
	// JobID is gear's job ID (a UUID).
	JobID string
	// Dir is the job's directory in the state directory (StateDir.JobDir).
	Dir string
	// StateDir is the state directory, exported to the job as GEAR_STATE_DIR.
	StateDir string
	// WorkDir is the directory the job runs in (sbatch --chdir).
	WorkDir string
	// Gearrun is the path of gearrun on the compute nodes; Spec.Slurm.Gearrun
	// wins when set.
	Gearrun string
}

// BatchScript writes the sbatch script of a validated spec. The script runs on
// the first node of the allocation: it exports the job's identity, runs
// `gearrun run --slurm` on the copy of the spec in the job directory (which
// starts the coordinator and the ranks with srun), and records gearrun's exit
// status in the job directory. The job token is not in the script: Submit passes
// it through the batch environment.
func BatchScript(s *Spec, b Batch) (string, error) {
	if b.JobID == "" || b.Dir == "" || b.WorkDir == "" {
		return "", fmt.Errorf("jobs: batch script: job ID, job directory and working directory are required")
	}
	gearrun := b.Gearrun
	if s.Slurm.Gearrun != "" {
		gearrun = s.Slurm.Gearrun
	}
	if gearrun == "" {
		return "", fmt.Errorf("jobs: batch script: slurm.gearrun: no path for gearrun on the compute nodes")
	}
	for _, p := range []string{b.Dir, b.WorkDir, b.StateDir, gearrun} {
		if strings.ContainsAny(p, "\n\r\x00\"") {
			return "", fmt.Errorf("jobs: batch script: path %q must be one line without '\"'", p)
		}
	}
	sl := s.Slurm
	var w strings.Builder
	opt := func(format string, args ...any) { fmt.Fprintf(&w, "#SBATCH "+format+"\n", args...) }
	w.WriteString("#!/bin/bash\n")
	opt("--job-name=%s", s.Name)
	opt("--nodes=%d", sl.Nodes)
	opt("--ntasks=%d", s.WorldSize())
	if sl.NTasksPerNode > 0 {
		opt("--ntasks-per-node=%d", sl.NTasksPerNode)
	}
	opt("--cpus-per-task=%d", sl.CPUsPerTask)
	if s.Launch.Restarts > 0 {
		// A node that fails does not end the allocation: the next
		// generation runs on the nodes left (launch.min_np) or on the same.
		opt("--no-kill")
	}
	if sl.GPUsPerNode > 0 {
		opt("--gpus-per-node=%d", sl.GPUsPerNode)
	}
	if sl.Time != "" {
		opt("--time=%s", sl.Time)
	}
	if sl.Partition != "" {
		opt("--partition=%s", sl.Partition)
	}
	if sl.Account != "" {
		opt("--account=%s", sl.Account)
	}
	if sl.QOS != "" {
		opt("--qos=%s", sl.QOS)
	}
	opt("--chdir=%s", sbatchValue(b.WorkDir))
	// In --output, SLURM expands %j and friends; %% is a literal %.
	opt("--output=%s", sbatchValue(strings.ReplaceAll(filepath.Join(b.Dir, OutputFile), "%", "%%")))
	opt("--open-mode=append")
	for _, e := range sl.Extra {
		opt("%s", e)
	}
	fmt.Fprintf(&w, `#
# gear job %s (%s), written by gearrun submit.
# %s reaches the job through the batch environment, not this file.
export %s=%s
export %s=%s
export %s=%s
job_dir=%s
%s run --slurm --job-dir "$job_dir" "$%s"
rc=$?
printf '%%d\n' "$rc" >"$job_dir/%s.tmp" && mv -f "$job_dir/%s.tmp" "$job_dir/%s"
exit "$rc"
`,
		b.JobID, s.Name, rank.EnvJobToken,
		rank.EnvJobID, shellQuote(b.JobID),
		rank.EnvJobSpec, shellQuote(filepath.Join(b.Dir, SpecFile)),
		rank.EnvStateDir, shellQuote(b.StateDir),
		shellQuote(b.Dir),
		shellQuote(gearrun), rank.EnvJobSpec,
		ExitFile, ExitFile, ExitFile)
	return w.String(), nil
}

// sbatchValue quotes an option value for an #SBATCH line: sbatch splits those
// lines at white space outside double quotes, and knows no escapes.
func sbatchValue(v string) string {
	if strings.ContainsAny(v, " \t") {
		return `"` + v + `"`
	}
	return v
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:@,+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// RendezvousPort is the coordinator's port for SLURM job slurmID when the spec
// does not fix one: rank.SlurmRdzvPortBase plus the job ID modulo 1000, the same
// port that rank.FromEnv derives for ranks started by srun alone.
func RendezvousPort(slurmID string) int {
	id, _ := strconv.ParseUint(slurmID, 10, 64)
	return rank.SlurmRdzvPortBase + int(id%1000)
}
