package launch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/gear-rl/gear/rank"
)

// RemoveJobSegments removes every shared-memory segment of job jobID in shmDir
// ("" means /dev/shm) and returns their names.
func RemoveJobSegments(shmDir, jobID string) ([]string, error) {
	if shmDir == "" {
		shmDir = "/dev/shm"
	}
	names, err := filepath.Glob(filepath.Join(shmDir, rank.SegmentName(jobID, "*")))
	if err != nil {
		return nil, fmt.Errorf("launch: segments of job %s: %w", jobID, err)
	}
	var removed []string
	var errs []error
	for _, path := range names {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, filepath.Base(path))
	}
	return removed, errors.Join(errs...)
}

// CleanOptions says where Clean looks.
type CleanOptions struct {
	ShmDir     string // "" means /dev/shm
	RuntimeDir string // "" means rank.RuntimeDir()
	// DryRun lists what would be removed, removing nothing.
	DryRun bool
}

// Cleaned is what Clean removed (or would remove).
type Cleaned struct {
	Segments []string // segment names
	Locks    []string // stale lock files
}

// Clean removes the shared-memory segments of jobs that are gone (their lock is
// not held; for "local-<pid>" jobs, that process has ended), and the stale lock
// files of such jobs. Only segments owned by the calling user are considered.
func Clean(opts CleanOptions) (Cleaned, error) {
	var out Cleaned
	if opts.ShmDir == "" {
		opts.ShmDir = "/dev/shm"
	}
	if opts.RuntimeDir == "" {
		opts.RuntimeDir = rank.RuntimeDir()
	}
	entries, err := os.ReadDir(opts.ShmDir)
	if err != nil {
		return out, fmt.Errorf("launch: clean: %w", err)
	}
	uid := os.Getuid()
	alive := map[string]bool{}
	var errs []error
	for _, e := range entries {
		job, ok := rank.SegmentJob(e.Name())
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
			continue
		}
		live, seen := alive[job]
		if !seen {
			live = rank.JobAlive(opts.RuntimeDir, job)
			alive[job] = live
		}
		if live {
			continue
		}
		if !opts.DryRun {
			if err := os.Remove(filepath.Join(opts.ShmDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
		}
		out.Segments = append(out.Segments, e.Name())
	}
	locks, _ := filepath.Glob(filepath.Join(opts.RuntimeDir, "*.lock"))
	for _, path := range locks {
		job := strings.TrimSuffix(filepath.Base(path), ".lock")
		if rank.JobAlive(opts.RuntimeDir, job) {
			continue
		}
		if !opts.DryRun {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
		}
		out.Locks = append(out.Locks, path)
	}
	sort.Strings(out.Segments)
	return out, errors.Join(errs...)
}
