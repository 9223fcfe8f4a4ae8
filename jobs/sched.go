package jobs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Exec runs a SLURM client command (sbatch, squeue, scontrol, sacct, scancel)
// with env added to gearrun's environment, and returns its standard output. An
// error carries the command's standard error.
type Exec func(ctx context.Context, env []string, name string, args ...string) ([]byte, error)

// RunCommand is the Exec that runs the command with os/exec.
func RunCommand(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if len(env) > 0 {
		cmd.Env = append(cmd.Environ(), env...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return stdout.Bytes(), fmt.Errorf("%s: %w", name, err)
		}
		return stdout.Bytes(), fmt.Errorf("%s: %w: %s", name, err, msg)
	}
	return stdout.Bytes(), nil
}

// Scheduler talks to SLURM through its client commands.
type Scheduler struct {
	// Exec runs the commands; nil means RunCommand.
	Exec Exec
}

func (s *Scheduler) run(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	if s.Exec == nil {
		return RunCommand(ctx, env, name, args...)
	}
	return s.Exec(ctx, env, name, args...)
}

// Submit runs `sbatch --parsable script` with env added to the batch job's
// environment (sbatch exports the submitting environment by default), and
// returns SLURM's job ID.
func (s *Scheduler) Submit(ctx context.Context, script string, env []string) (string, error) {
	out, err := s.run(ctx, env, "sbatch", "--parsable", script)
	if err != nil {
		return "", fmt.Errorf("jobs: submit: %w", err)
	}
	// --parsable prints "jobid" or "jobid;cluster".
	id, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
	if _, err := strconv.ParseUint(id, 10, 64); err != nil {
		return "", fmt.Errorf("jobs: submit: sbatch printed %q, want a job ID", strings.TrimSpace(string(out)))
	}
	return id, nil
}

// Cancel runs `scancel id`. SLURM sends SIGTERM to the batch script and the job
// steps, then SIGKILL after its KillWait.
func (s *Scheduler) Cancel(ctx context.Context, slurmID string) error {
	if _, err := s.run(ctx, nil, "scancel", slurmID); err != nil {
		return fmt.Errorf("jobs: cancel %s: %w", slurmID, err)
	}
	return nil
}

// SlurmState is SLURM's view of a job.
type SlurmState struct {
	// State is SLURM's job state: PENDING, RUNNING, COMPLETING, COMPLETED,
	// FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...
	State string
	// ExitCode is the batch script's exit status; -1 when SLURM did not say.
	ExitCode int
	// Signal is the signal that ended the batch script, 0 for none.
	Signal int
	// Reason is SLURM's reason for a pending or failed job ("None" omitted).
	Reason string
	// NodeList is the job's nodes, or the nodes it waits for.
	NodeList string
	// Source names the command that answered: "squeue", "scontrol" or "sacct".
	Source string
}

// ErrUnknownJob is returned by Query when no SLURM command knows the job any
// more (it left the queue and slurmctld's memory, and there is no accounting).
var ErrUnknownJob = errors.New("jobs: SLURM does not know the job")

// Query asks SLURM about a job: squeue while it is queued or running, then
// `scontrol show job` (which keeps finished jobs for MinJobAge seconds), then
// sacct (which needs accounting). It returns ErrUnknownJob when none answers.
func (s *Scheduler) Query(ctx context.Context, slurmID string) (SlurmState, error) {
	if ctx.Err() != nil {
		return SlurmState{}, ctx.Err()
	}
	if out, err := s.run(ctx, nil, "squeue", "--noheader", "--jobs", slurmID, "--format", "%T|%r|%N"); err == nil {
		if line := firstLine(out); line != "" {
			f := strings.Split(line, "|")
			st := SlurmState{State: f[0], ExitCode: -1, Source: "squeue"}
			if len(f) > 1 && f[1] != "None" {
				st.Reason = f[1]
			}
			if len(f) > 2 {
				st.NodeList = f[2]
			}
			return st, nil
		}
	}
	if out, err := s.run(ctx, nil, "scontrol", "--oneliner", "show", "job", slurmID); err == nil {
		if st, ok := parseScontrolJob(out); ok {
			return st, nil
		}
	}
	if out, err := s.run(ctx, nil, "sacct", "--noheader", "--parsable2", "--allocations", "--jobs", slurmID, "--format", "State,ExitCode,NodeList"); err == nil {
		if st, ok := parseSacct(out); ok {
			return st, nil
		}
	}
	if ctx.Err() != nil {
		return SlurmState{}, ctx.Err()
	}
	return SlurmState{}, fmt.Errorf("%w %s", ErrUnknownJob, slurmID)
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(line)
}

// parseScontrolJob reads `scontrol --oneliner show job` output:
// "JobId=7 JobName=x ... JobState=FAILED Reason=NonZeroExitCode ... ExitCode=3:0 ...".
func parseScontrolJob(out []byte) (SlurmState, bool) {
	fields := map[string]string{}
	for _, kv := range strings.Fields(firstLine(out)) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if _, seen := fields[k]; !seen {
				fields[k] = v
			}
		}
	}
	state, ok := fields["JobState"]
	if !ok {
		return SlurmState{}, false
	}
	st := SlurmState{State: state, ExitCode: -1, Source: "scontrol", NodeList: fields["NodeList"]}
	if r := fields["Reason"]; r != "" && r != "None" {
		st.Reason = r
	}
	if st.NodeList == "(null)" {
		st.NodeList = ""
	}
	st.ExitCode, st.Signal = parseExitCode(fields["ExitCode"])
	return st, true
}

// parseSacct reads `sacct --parsable2 --format State,ExitCode,NodeList`:
// "FAILED|3:0|vm". A state such as "CANCELLED by 0" keeps its first word.
func parseSacct(out []byte) (SlurmState, bool) {
	f := strings.Split(firstLine(out), "|")
	if len(f) < 2 || f[0] == "" {
		return SlurmState{}, false
	}
	state, _, _ := strings.Cut(f[0], " ")
	st := SlurmState{State: state, Source: "sacct"}
	st.ExitCode, st.Signal = parseExitCode(f[1])
	if len(f) > 2 {
		st.NodeList = f[2]
	}
	return st, true
}

// parseExitCode reads SLURM's "status:signal"; -1 when absent.
func parseExitCode(s string) (code, signal int) {
	c, sig, ok := strings.Cut(s, ":")
	if !ok {
		return -1, 0
	}
	code, err1 := strconv.Atoi(c)
	signal, err2 := strconv.Atoi(sig)
	if err1 != nil || err2 != nil {
		return -1, 0
	}
	return code, signal
}
