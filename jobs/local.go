package jobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gear-rl/gear/rank"
)

// Jobs that gearrun runs on this machine (gearrun -np N PROGRAM, gearrun run)
// leave one record each in the state directory, beside the submitted jobs':
//
//	<dir>/local/<job ID>.json   a LocalRecord
//
// The launcher writes it when the job starts and again when it ends, so that
// `gearrun status` can list running and recently finished local jobs.

// LocalDir is the directory of local job records.
func (d StateDir) LocalDir() string { return filepath.Join(string(d), "local") }

// LocalKeep is how long StartLocal keeps the records of local jobs that have
// ended; older ones are removed when the next local job starts.
const LocalKeep = 7 * 24 * time.Hour

// The states of a local job.
const (
	LocalRunning   = "RUNNING"
	LocalCompleted = "COMPLETED"
	LocalFailed    = "FAILED"
	// LocalLost: the launcher ended without recording the job's end (it was
	// killed with SIGKILL, or the machine went down).
	LocalLost = "LOST"
)

// LocalRecord is what gearrun remembers of a job it ran on this machine.
type LocalRecord struct {
	// ID is the job ID (GEAR_JOB_ID of the ranks).
	ID string `json:"id"`
	// Name is the spec's name, or the program of each group ("hello",
	// "actor,trainer").
	Name  string `json:"name"`
	Ranks int    `json:"ranks"`
	// PID is the launcher's process ID.
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	// EndedAt and ExitCode are set when the job has ended.
	EndedAt  *time.Time `json:"ended_at,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	// CheckpointDir is the job's checkpoint directory, "" if it has none.
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
}

// State says whether the job runs, ended (COMPLETED: exit 0; FAILED) or was
// lost (its launcher is gone and recorded no end).
func (r *LocalRecord) State() string {
	switch {
	case r.ExitCode != nil && *r.ExitCode == 0:
		return LocalCompleted
	case r.ExitCode != nil:
		return LocalFailed
	case r.PID > 0 && rank.ProcessAlive(r.PID):
		return LocalRunning
	}
	return LocalLost
}

// StartLocal records that the local job r has started, and removes the
// records of local jobs that ended more than LocalKeep before r.StartedAt.
func (d StateDir) StartLocal(r *LocalRecord) error {
	if err := rank.CheckJobID(r.ID); err != nil {
		return fmt.Errorf("jobs: local job: %w", err)
	}
	if err := os.MkdirAll(d.LocalDir(), 0o700); err != nil {
		return fmt.Errorf("jobs: state directory: %w", err)
	}
	if old, err := d.ListLocal(); err == nil {
		for _, o := range old {
			if o.EndedAt != nil && r.StartedAt.Sub(*o.EndedAt) > LocalKeep {
				os.Remove(d.localPath(o.ID))
			}
		}
	}
	return d.saveLocal(r)
}

// EndLocal records that the local job r ended with exit code code at t.
func (d StateDir) EndLocal(r *LocalRecord, code int, t time.Time) error {
	r.EndedAt, r.ExitCode = &t, &code
	return d.saveLocal(r)
}

func (d StateDir) localPath(id string) string { return filepath.Join(d.LocalDir(), id+".json") }

func (d StateDir) saveLocal(r *LocalRecord) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("jobs: local job %s: %w", r.ID, err)
	}
	return writeFileAtomic(d.localPath(r.ID), append(b, '\n'), 0o600)
}

// ListLocal returns the records of local jobs, newest first. Unreadable
// records are skipped.
func (d StateDir) ListLocal() ([]*LocalRecord, error) {
	entries, err := os.ReadDir(d.LocalDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	var out []*LocalRecord
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() || rank.CheckJobID(id) != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.LocalDir(), e.Name()))
		if err != nil {
			continue
		}
		var r LocalRecord
		if json.Unmarshal(b, &r) != nil || r.ID != id {
			continue
		}
		out = append(out, &r)
	}
	slices.SortStableFunc(out, func(a, b *LocalRecord) int { return b.StartedAt.Compare(a.StartedAt) })
	return out, nil
}

// FindLocal returns the record of the local job named by id: its job ID, or a
// unique prefix of one (at least 4 characters, as Find takes). It returns an
// error wrapping ErrNotFound when none matches, and one naming the candidates
// when a prefix is ambiguous.
func (d StateDir) FindLocal(id string) (*LocalRecord, error) {
	all, err := d.ListLocal()
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(all))
	for i, r := range all {
		ids[i] = r.ID
	}
	i, err := MatchJobID(id, ids)
	if err != nil {
		return nil, err
	}
	return all[i], nil
}

// MatchJobID returns the index in ids of the job ID that id names: the ID
// itself, or a prefix (at least 4 characters) of exactly one of them. It
// returns an error wrapping ErrNotFound when none matches, and one naming the
// candidates when a prefix is ambiguous. gearrun's commands take job IDs this
// way everywhere.
func MatchJobID(id string, ids []string) (int, error) {
	id = strings.TrimSpace(id)
	if id == "" {
		return -1, errors.New("jobs: empty job ID")
	}
	if i := slices.Index(ids, id); i >= 0 {
		return i, nil
	}
	var matches []int
	if len(id) >= 4 {
		for i, c := range ids {
			if strings.HasPrefix(c, id) || strings.HasPrefix(c, strings.ToLower(id)) {
				matches = append(matches, i)
			}
		}
	}
	switch len(matches) {
	case 0:
		return -1, fmt.Errorf("%w: %s", ErrNotFound, id)
	case 1:
		return matches[0], nil
	}
	names := make([]string, len(matches))
	for i, m := range matches {
		names[i] = ids[m]
	}
	return -1, fmt.Errorf("jobs: job ID prefix %q is ambiguous: %s", id, strings.Join(names, ", "))
}
