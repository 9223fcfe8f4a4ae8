package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/gear-rl/gear/internal/clock"
	"github.com/gear-rl/gear/rank"
)

// Cluster submits job specs to SLURM and keeps their records in a state
// directory. The zero value is not usable: set State (DefaultStateDir) and
// Gearrun.
type Cluster struct {
	State StateDir
	Sched Scheduler
	// Gearrun is the path of gearrun that batch scripts run when a spec's
	// slurm.gearrun is empty; usually os.Executable().
	Gearrun string
	// Clock stamps records; nil is the wall clock.
	Clock clock.Clock
}

func (c *Cluster) now() time.Time { return c.Clock.Now() }

// Prepared is a job that Prepare made ready for sbatch: its record (without a
// SLURM ID yet) and batch script.
type Prepared struct {
	Record *Record
	Script string
	token  string
}

// Prepare creates the job's directory in the state directory, with the resolved
// spec (job.toml) and the batch script (job.sh), and a fresh gear job ID and
// token. specPath is where the spec came from (for the record); workDir is the
// directory the job runs in. Submit calls it; `submit --dry-run` can call
// BatchScript alone instead.
func (c *Cluster) Prepare(s *Spec, specPath, workDir string) (*Prepared, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	resolved, err := Marshal(s)
	if err != nil {
		return nil, err
	}
	r := &Record{
		ID:          uuid.NewString(),
		Name:        s.Name,
		Spec:        specPath,
		WorkDir:     workDir,
		SubmittedAt: c.now().UTC(),
	}
	if err := c.State.Create(r); err != nil {
		return nil, err
	}
	script, err := BatchScript(s, Batch{
		JobID: r.ID, Dir: r.Dir, StateDir: string(c.State), WorkDir: workDir, Gearrun: c.Gearrun,
	})
	if err == nil {
		err = writeFileAtomic(filepath.Join(r.Dir, SpecFile), resolved, 0o600)
	}
	if err == nil {
		err = writeFileAtomic(filepath.Join(r.Dir, ScriptFile), []byte(script), 0o700)
	}
	if err != nil {
		os.RemoveAll(r.Dir)
		return nil, err
	}
	return &Prepared{Record: r, Script: script, token: rank.NewToken()}, nil
}

// Submit prepares the job (Prepare), runs sbatch with the job token in the batch
// environment, and records SLURM's job ID. When sbatch fails, the job's
// directory is removed again.
func (c *Cluster) Submit(ctx context.Context, s *Spec, specPath, workDir string) (*Record, error) {
	p, err := c.Prepare(s, specPath, workDir)
	if err != nil {
		return nil, err
	}
	r := p.Record
	id, err := c.Sched.Submit(ctx, filepath.Join(r.Dir, ScriptFile), []string{rank.EnvJobToken + "=" + p.token})
	if err != nil {
		os.RemoveAll(r.Dir)
		return nil, err
	}
	r.SlurmID = id
	if err := c.State.Save(r); err != nil {
		return r, fmt.Errorf("jobs: SLURM job %s was submitted but not recorded: %w", id, err)
	}
	return r, nil
}

// Job states that gear adds to SLURM's.
const (
	// StateUnknown: SLURM has forgotten the job and it left no exit status.
	StateUnknown = "UNKNOWN"
	// StateUnsubmitted: the record has no SLURM job ID (sbatch never answered).
	StateUnsubmitted = "UNSUBMITTED"
)

// terminal are the SLURM states of a job that has ended.
var terminal = []string{
	"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
	"PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
	StateUnknown, StateUnsubmitted,
}

// Terminal reports whether a job in state will not change any more.
func Terminal(state string) bool { return slices.Contains(terminal, state) }

// Status is a job's state as gear sees it.
type Status struct {
	Record *Record
	// State is SLURM's state name (PENDING, RUNNING, COMPLETED, FAILED,
	// CANCELLED, ...), or StateUnknown or StateUnsubmitted.
	State string
	// ExitCode is the batch script's exit status; -1 when unknown.
	ExitCode int
	// Signal is the signal that ended the batch script, 0 for none.
	Signal int
	// Reason is SLURM's reason, if any.
	Reason   string
	NodeList string
	// Source says where State came from: "squeue", "scontrol", "sacct",
	// "exit file", "record".
	Source string
	// Result is gearrun's account of the run, once it ended; nil before.
	Result *Result
}

// Status finds the job named by id (gear or SLURM job ID, see StateDir.Find) and
// reports its state.
func (c *Cluster) Status(ctx context.Context, id string) (*Status, error) {
	r, err := c.State.Find(id)
	if err != nil {
		return nil, err
	}
	return c.StatusOf(ctx, r)
}

// StatusOf reports the state of a recorded job: SLURM's view while SLURM
// remembers the job (Scheduler.Query), then the exit status the batch script
// wrote: 0 is COMPLETED, anything else FAILED; a job gear cancelled that left
// no exit status is CANCELLED.
func (c *Cluster) StatusOf(ctx context.Context, r *Record) (*Status, error) {
	st := &Status{Record: r, ExitCode: -1, Result: ReadResult(r.Dir)}
	if r.SlurmID == "" {
		st.State, st.Source = StateUnsubmitted, "record"
		return st, nil
	}
	q, err := c.Sched.Query(ctx, r.SlurmID)
	switch {
	case err == nil:
		st.State, st.ExitCode, st.Signal, st.Reason, st.NodeList, st.Source = q.State, q.ExitCode, q.Signal, q.Reason, q.NodeList, q.Source
		if st.ExitCode < 0 && Terminal(st.State) {
			if code, ok := ReadExit(r.Dir); ok {
				st.ExitCode = code
			}
		}
		return st, nil
	case !errors.Is(err, ErrUnknownJob):
		return nil, err
	}
	if code, ok := ReadExit(r.Dir); ok {
		st.ExitCode, st.Source = code, "exit file"
		st.State = "COMPLETED"
		if code != 0 {
			st.State = "FAILED"
		}
		if r.CancelledAt != nil && code != 0 {
			st.State = "CANCELLED"
		}
		return st, nil
	}
	st.Source = "record"
	st.State = StateUnknown
	if r.CancelledAt != nil {
		st.State = "CANCELLED"
	}
	return st, nil
}

// List reports the state of every recorded job, newest first.
func (c *Cluster) List(ctx context.Context) ([]*Status, error) {
	records, err := c.State.List()
	if err != nil {
		return nil, err
	}
	out := make([]*Status, 0, len(records))
	for _, r := range records {
		st, err := c.StatusOf(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// Cancel cancels the job named by id with scancel and records that gear
// cancelled it. Cancelling a job that has already ended is not an error and
// records nothing.
func (c *Cluster) Cancel(ctx context.Context, id string) (*Record, error) {
	r, err := c.State.Find(id)
	if err != nil {
		return nil, err
	}
	if r.SlurmID == "" {
		return r, fmt.Errorf("jobs: cancel %s: the job was never submitted", r.ID)
	}
	if err := c.Sched.Cancel(ctx, r.SlurmID); err != nil {
		if st, qerr := c.StatusOf(ctx, r); qerr == nil && Terminal(st.State) {
			return r, nil // it ended before scancel reached it
		}
		return r, err
	}
	if r.CancelledAt == nil {
		t := c.now().UTC()
		r.CancelledAt = &t
		if err := c.State.Save(r); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Wait polls the job's state every interval until it is terminal or ctx ends.
func (c *Cluster) Wait(ctx context.Context, r *Record, interval time.Duration) (*Status, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		st, err := c.StatusOf(ctx, r)
		if err != nil {
			return nil, err
		}
		if Terminal(st.State) {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("jobs: waiting for %s: %w", r.ID, ctx.Err())
		case <-t.C:
		}
	}
}

// Logs copies the job's output to w. With follow, it keeps copying what the job
// writes until the job reaches a terminal state or ctx ends.
func (c *Cluster) Logs(ctx context.Context, r *Record, w io.Writer, follow bool, interval time.Duration) error {
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for {
		if f == nil {
			var err error
			f, err = os.Open(r.Output())
			if err != nil && !(follow && errors.Is(err, os.ErrNotExist)) {
				return fmt.Errorf("jobs: logs of %s: %w", r.ID, err)
			}
		}
		if f != nil {
			if _, err := io.Copy(w, f); err != nil {
				return fmt.Errorf("jobs: logs of %s: %w", r.ID, err)
			}
		}
		if !follow {
			return nil
		}
		st, err := c.StatusOf(ctx, r)
		if err != nil {
			return err
		}
		if Terminal(st.State) {
			// Copy what was written before the end.
			if f == nil {
				if f, err = os.Open(r.Output()); err != nil {
					return fmt.Errorf("jobs: logs of %s: %w", r.ID, err)
				}
			}
			if _, err := io.Copy(w, f); err != nil {
				return fmt.Errorf("jobs: logs of %s: %w", r.ID, err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
