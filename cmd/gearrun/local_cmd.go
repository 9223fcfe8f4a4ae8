package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gear-rl/gear/jobs"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// Local jobs (gearrun -np N PROGRAM, gearrun run) are recorded in the state
// directory (jobs.LocalRecord) so that gearrun status lists them, and their
// checkpoint directories are listed by gearrun clean.

// localJob is the record of a job this gearrun runs; a nil *localJob records
// nothing.
type localJob struct {
	state jobs.StateDir
	rec   *jobs.LocalRecord
	s     stdio
}

// startLocalJob records that plan starts now, under name ("": the programs'
// base names), and, for a job with restarts, says once where its checkpoints
// are. A state directory that cannot be written only costs the record: the
// job runs regardless (with -v, gearrun says why).
func startLocalJob(plan *launch.Plan, name string, verbose bool, s stdio) *localJob {
	if plan.MaxRestarts > 0 && plan.CheckpointDir != "" {
		fmt.Fprintln(s.err, launch.CheckpointLine(plan.JobID, fmt.Sprintf("--max-restarts %d", plan.MaxRestarts), plan.CheckpointDir))
	}
	dir, err := jobs.DefaultStateDir()
	if err != nil {
		if verbose {
			fmt.Fprintf(s.err, "gearrun: job %s not recorded for gearrun status: %v\n", plan.JobID, err)
		}
		return nil
	}
	if name == "" {
		name = programNames(plan)
	}
	rec := &jobs.LocalRecord{
		ID:            plan.JobID,
		Name:          name,
		Ranks:         len(plan.Ranks),
		PID:           os.Getpid(),
		StartedAt:     time.Now().UTC(),
		CheckpointDir: plan.CheckpointDir,
	}
	if err := dir.StartLocal(rec); err != nil {
		if verbose {
			fmt.Fprintf(s.err, "gearrun: job %s not recorded for gearrun status: %v\n", plan.JobID, err)
		}
		return nil
	}
	return &localJob{state: dir, rec: rec, s: s}
}

// end records the job's exit code.
func (j *localJob) end(code int) {
	if j == nil {
		return
	}
	j.state.EndLocal(j.rec, code, time.Now().UTC())
}

// programNames names a job by its programs' base names, in rank order, each
// once: "hello", "actor,trainer".
func programNames(plan *launch.Plan) string {
	var names []string
	for _, r := range plan.Ranks {
		if len(r.Argv) == 0 {
			continue
		}
		n := filepath.Base(r.Argv[0])
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

// writeLocalJobs prints the local jobs as a table.
func writeLocalJobs(w io.Writer, all []*jobs.LocalRecord) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCAL JOB ID\tNAME\tRANKS\tSTATE\tEXIT\tSTARTED\tCHECKPOINTS")
	for _, r := range all {
		exit := "-"
		if r.ExitCode != nil {
			exit = fmt.Sprint(*r.ExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.Name, r.Ranks, r.State(), exit,
			r.StartedAt.Local().Format(time.DateTime), orDash(r.CheckpointDir))
	}
	tw.Flush()
}

// printLocalStatus prints one local job.
func printLocalStatus(w io.Writer, r *jobs.LocalRecord) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "local job ID:\t%s\n", r.ID)
	fmt.Fprintf(tw, "name:\t%s\n", r.Name)
	fmt.Fprintf(tw, "ranks:\t%d\n", r.Ranks)
	state := r.State()
	if r.ExitCode != nil {
		state += fmt.Sprintf(" (exit %d)", *r.ExitCode)
	}
	fmt.Fprintf(tw, "state:\t%s\n", state)
	fmt.Fprintf(tw, "launcher pid:\t%d\n", r.PID)
	fmt.Fprintf(tw, "started:\t%s\n", r.StartedAt.Local().Format(time.DateTime))
	if r.EndedAt != nil {
		fmt.Fprintf(tw, "ended:\t%s\n", r.EndedAt.Local().Format(time.DateTime))
	}
	fmt.Fprintf(tw, "checkpoints:\t%s\n", orDash(r.CheckpointDir))
	tw.Flush()
}

// checkpointDir is one job's directory under launch.CheckpointRoot().
type checkpointDir struct {
	job, path string
	bytes     int64
}

// listCheckpoints returns the job checkpoint directories under root, by job
// ID, with the size of the files in each.
func listCheckpoints(root string) ([]checkpointDir, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoints: %w", err)
	}
	var out []checkpointDir
	for _, e := range entries {
		if !e.IsDir() || rank.CheckJobID(e.Name()) != nil {
			continue
		}
		c := checkpointDir{job: e.Name(), path: filepath.Join(root, e.Name())}
		filepath.WalkDir(c.path, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					c.bytes += fi.Size()
				}
			}
			return nil
		})
		out = append(out, c)
	}
	return out, nil
}

// findCheckpoints returns the checkpoint directory under root of the job that
// id names: its ID or a unique prefix of one (jobs.MatchJobID).
func findCheckpoints(root, id string) (checkpointDir, error) {
	all, err := listCheckpoints(root)
	if err != nil {
		return checkpointDir{}, err
	}
	ids := make([]string, len(all))
	for i, c := range all {
		ids[i] = c.job
	}
	i, err := jobs.MatchJobID(id, ids)
	if errors.Is(err, jobs.ErrNotFound) {
		return checkpointDir{}, fmt.Errorf("job %s has no checkpoint directory in %s", id, root)
	}
	if err != nil {
		return checkpointDir{}, errors.New(strings.TrimPrefix(err.Error(), "jobs: "))
	}
	return all[i], nil
}

// byteSize writes n bytes in decimal units, as du --si does: "512 B", "4.5 MB".
func byteSize(n int64) string {
	if n < 1000 {
		return fmt.Sprintf("%d B", n)
	}
	f, unit := float64(n), ""
	for _, u := range []string{"kB", "MB", "GB", "TB"} {
		f /= 1000
		unit = u
		if f < 1000 {
			break
		}
	}
	return fmt.Sprintf("%.1f %s", f, unit)
}
