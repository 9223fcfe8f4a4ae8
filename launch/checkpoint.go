package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
