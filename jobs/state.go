package jobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/gear-rl/gear/rank"
)

// StateDir is where gearrun keeps one directory per submitted job:
//
//	<dir>/jobs/<gear job ID>/
//	    record.json   the Record
//	    job.toml      the spec as submitted (GEAR_JOB_SPEC of the ranks)
//	    job.sh        the batch script
//	    output.log    the job's output (sbatch --output)
//	    exit          the batch script's exit status, written when gearrun ends
//	    result.json   gearrun's account of the run (a Result)
//	    ranks/<r>     the exit status of rank r, when it ended with one
//
// On a cluster the directory must be on a file system that the compute nodes
// share with the submitting host (the default is under $HOME).
type StateDir string

// DefaultStateDir returns $GEAR_STATE_DIR, else $XDG_STATE_HOME/gear, else
// ~/.local/state/gear.
func DefaultStateDir() (StateDir, error) {
	if d := os.Getenv(rank.EnvStateDir); d != "" {
		return StateDir(d), nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return StateDir(filepath.Join(d, "gear")), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("jobs: state directory: set %s: %w", rank.EnvStateDir, err)
	}
	return StateDir(filepath.Join(home, ".local", "state", "gear")), nil
}

// JobDir is the directory of the job with gear ID id.
func (d StateDir) JobDir(id string) string { return filepath.Join(string(d), "jobs", id) }

// File names inside a job directory.
const (
	RecordFile = "record.json"
	SpecFile   = "job.toml"
	ScriptFile = "job.sh"
	OutputFile = "output.log"
	ExitFile   = "exit"
	ResultFile = "result.json"
	RanksDir   = "ranks"
)

// Record is what gearrun remembers of a submitted job.
type Record struct {
	// ID is gear's job ID, a UUID (GEAR_JOB_ID of the ranks).
	ID string `json:"id"`
	// SlurmID is SLURM's job ID, "" until sbatch answered.
	SlurmID string `json:"slurm_id,omitempty"`
	Name    string `json:"name"`
	// Spec is the path of the spec the job was submitted from.
	Spec string `json:"spec"`
	// Dir is the job's directory in the state directory.
	Dir         string    `json:"dir"`
	WorkDir     string    `json:"workdir"`
	SubmittedAt time.Time `json:"submitted_at"`
	// CancelledAt is set by Cancel, so that status can tell a cancelled job
	// from a failed one after SLURM has forgotten it.
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
}

// Output is the path of the job's output file.
func (r *Record) Output() string { return filepath.Join(r.Dir, OutputFile) }

// Result is written by gearrun at the end of a run under SLURM.
type Result struct {
	ExitCode int    `json:"exit_code"`
	Message  string `json:"message,omitempty"`
	// FailedRanks lists the ranks that ended with a non-zero status, in the
	// order gearrun learned of them.
	FailedRanks []RankExit `json:"failed_ranks,omitempty"`
}

// RankExit is one rank's end.
type RankExit struct {
	Rank     int    `json:"rank"`
	Role     string `json:"role,omitempty"`
	RoleRank int    `json:"role_rank"`
	Host     string `json:"host,omitempty"`
	// Status is the exit status, 128+N for a process killed by signal N.
	Status int `json:"status"`
	// Signal names the signal that killed the process, "" if none did.
	Signal string    `json:"signal,omitempty"`
	At     time.Time `json:"at"`
}

// ErrNotFound is returned by Find when no record matches.
var ErrNotFound = errors.New("jobs: no such job")

// Create makes the job's directory and writes its first record.
func (d StateDir) Create(r *Record) error {
	if err := uuid.Validate(r.ID); err != nil {
		return fmt.Errorf("jobs: job ID %q: %w", r.ID, err)
	}
	r.Dir = d.JobDir(r.ID)
	if err := os.MkdirAll(filepath.Join(r.Dir, RanksDir), 0o700); err != nil {
		return fmt.Errorf("jobs: state directory: %w", err)
	}
	return d.Save(r)
}

// Save writes r atomically (write a temporary file, rename).
func (d StateDir) Save(r *Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("jobs: record %s: %w", r.ID, err)
	}
	return writeFileAtomic(filepath.Join(d.JobDir(r.ID), RecordFile), append(b, '\n'), 0o600)
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("jobs: %w", err)
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("jobs: %w", err)
	}
	return nil
}

// Load reads the record of the job with gear ID id.
func (d StateDir) Load(id string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(d.JobDir(id), RecordFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("jobs: record %s: %w", id, err)
	}
	r.Dir = d.JobDir(r.ID)
	return &r, nil
}

// List returns every record, newest first. Unreadable records are skipped.
func (d StateDir) List() ([]*Record, error) {
	entries, err := os.ReadDir(filepath.Join(string(d), "jobs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	var out []*Record
	for _, e := range entries {
		if !e.IsDir() || uuid.Validate(e.Name()) != nil {
			continue
		}
		if r, err := d.Load(e.Name()); err == nil {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b *Record) int { return b.SubmittedAt.Compare(a.SubmittedAt) })
	return out, nil
}

// Find returns the record named by id: a gear job ID, a unique prefix of one
// (at least 4 characters), or a SLURM job ID. It returns an error wrapping
// ErrNotFound when none matches, and an error naming the candidates when a
// prefix is ambiguous.
func (d StateDir) Find(id string) (*Record, error) {
	id = strings.TrimSpace(id)
	if id == "" {
		return nil, fmt.Errorf("jobs: empty job ID")
	}
	if uuid.Validate(id) == nil {
		return d.Load(strings.ToLower(id))
	}
	all, err := d.List()
	if err != nil {
		return nil, err
	}
	if _, err := strconv.ParseUint(id, 10, 64); err == nil {
		for _, r := range all {
			if r.SlurmID == id {
				return r, nil
			}
		}
	}
	var matches []*Record
	if len(id) >= 4 {
		for _, r := range all {
			if strings.HasPrefix(r.ID, strings.ToLower(id)) {
				matches = append(matches, r)
			}
		}
	}
	switch len(matches) {
	case 0:
		return nil, fmt.Errorf("%w: %s (neither a gear job ID nor a SLURM job ID in %s)", ErrNotFound, id, d)
	case 1:
		return matches[0], nil
	}
	ids := make([]string, len(matches))
	for i, r := range matches {
		ids[i] = r.ID
	}
	return nil, fmt.Errorf("jobs: job ID prefix %q is ambiguous: %s", id, strings.Join(ids, ", "))
}

// ReadExit reads the exit status the batch script recorded; ok is false when
// there is none (the job has not ended, or was killed before it could write).
func ReadExit(dir string) (code int, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, ExitFile))
	if err != nil {
		return 0, false
	}
	code, err = strconv.Atoi(strings.TrimSpace(string(b)))
	return code, err == nil
}

// ReadResult reads the Result gearrun wrote; nil when there is none.
func ReadResult(dir string) *Result {
	b, err := os.ReadFile(filepath.Join(dir, ResultFile))
	if err != nil {
		return nil
	}
	var r Result
	if json.Unmarshal(b, &r) != nil {
		return nil
	}
	return &r
}

// WriteResult writes r into the job directory dir.
func WriteResult(dir string, r *Result) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("jobs: result: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, ResultFile), append(b, '\n'), 0o600)
}
