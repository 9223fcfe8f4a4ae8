package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gear-rl/gear/rank"
)

// CheckpointRoot is where jobs' checkpoint directories live unless a job
// names its own: $XDG_STATE_HOME/gear/checkpoints, else
// ~/.local/state/gear/checkpoints, else checkpoints under
// rank.RuntimeDir(). Unlike the runtime directory it survives a logout and
// a reboot, as a checkpoint must.
func CheckpointRoot() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "gear", "checkpoints")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "gear", "checkpoints")
	}
	return filepath.Join(rank.RuntimeDir(), "checkpoints")
}

// CheckpointDir is job jobID's checkpoint directory under root ("":
// CheckpointRoot()): <root>/<jobID>, the same for every generation of the
// job. Run creates it; nothing but RemoveCheckpoints removes it.
func CheckpointDir(root, jobID string) string {
	if root == "" {
		root = CheckpointRoot()
	}
	return filepath.Join(root, jobID)
}

// CheckpointLine is what gearrun says, once, as a job with restarts starts
// (the local launcher and a SLURM job's batch side alike): where the job's
// checkpoints go, that they stay, and the command that removes them. how is
// how the restarts were asked for ("--max-restarts 2", "restarts = 2"). It
// has no newline.
func CheckpointLine(jobID, how, dir string) string {
	return fmt.Sprintf("gearrun: job %s (%s): checkpoints in %s, kept after the job (gearrun clean --checkpoints %s removes them)",
		jobID, how, dir, ShortID(jobID))
}

// ShortID is the prefix of a UUID job ID that gearrun's commands take in its
// place (8 characters); other IDs are kept whole.
func ShortID(id string) string {
	if len(id) == 36 && strings.Count(id, "-") == 4 {
		return id[:8]
	}
	return id
}

// RemoveCheckpoints removes job jobID's checkpoint directory under root (""
// means CheckpointRoot()) and returns its path. A job without one is an error
// that names it.
func RemoveCheckpoints(root, jobID string) (string, error) {
	if err := rank.CheckJobID(jobID); err != nil {
		return "", fmt.Errorf("launch: checkpoints: %w", err)
	}
	dir := CheckpointDir(root, jobID)
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("launch: job %s has no checkpoint directory (no %s)", jobID, dir)
	case err != nil:
		return "", fmt.Errorf("launch: checkpoints of job %s: %w", jobID, err)
	case !fi.IsDir():
		return "", fmt.Errorf("launch: checkpoints of job %s: %s is not a directory", jobID, dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("launch: checkpoints of job %s: %w", jobID, err)
	}
	return dir, nil
}
