package launch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/shmname"
	"github.com/gear-rl/gear/rank"
)

// RemoveJobSegments removes every shared-memory segment of job jobID in shmDir
// ("" means /dev/shm), of every kind (shmname.Kinds), and returns their names.
func RemoveJobSegments(shmDir, jobID string) ([]string, error) {
	return removeJobSegments(shmDir, jobID, func(shmname.Kind) bool { return true })
}

// RemoveGenerationSegments removes the segments of job jobID in shmDir ("":
// /dev/shm) that belong to one generation of its world, and returns their
// names: those whose kind is shmname.Kind.PerGeneration, the collectives'
// ("gear.<job>.coll.<comm>.r<rank>.<nonce>", see collective.Comm) and the
// roles' channels ("gear.<job>.roles.<stream>.<name>...<nonce>"). Their names
// carry random nonces, so a new generation never re-attaches to them: it
// makes its own. The job's other segments (a store shard,
// "gear.<job>.dqn.replay.0") are kept. A launcher calls it between
// generations, once every rank of the old one has ended, so that the job's
// memory does not grow with each restart.
func RemoveGenerationSegments(shmDir, jobID string) ([]string, error) {
	return removeJobSegments(shmDir, jobID, shmname.Kind.PerGeneration)
}

// removeJobSegments removes the segments of job jobID in shmDir ("": /dev/shm)
// whose kind, as shmname reads their names, is one that remove accepts, and
// returns their names, sorted. A shmDir that does not exist holds none.
func removeJobSegments(shmDir, jobID string, remove func(shmname.Kind) bool) ([]string, error) {
	if shmDir == "" {
		shmDir = "/dev/shm"
	}
	entries, err := os.ReadDir(shmDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("launch: segments of job %s: %w", jobID, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		p, ok := shmname.Parse(e.Name())
		if !ok || p.Job != jobID || !remove(p.Kind) {
			continue
		}
		if err := os.Remove(filepath.Join(shmDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
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

// Cleaned is what Clean or CleanStale removed (or would remove).
type Cleaned struct {
	Segments []string // segment names
	Bytes    int64    // the segments' size
	Jobs     []string // the jobs they belonged to
	Locks    []string // stale lock files
}

// Clean removes the shared-memory segments of jobs that are gone (their lock is
// not held; for "local-<pid>" jobs, that process has ended), and the stale lock
// files of such jobs. Only segments owned by the calling user are considered.
func Clean(opts CleanOptions) (Cleaned, error) {
	if opts.ShmDir == "" {
		opts.ShmDir = "/dev/shm"
	}
	if opts.RuntimeDir == "" {
		opts.RuntimeDir = rank.RuntimeDir()
	}
	out, err := removeSegments(opts.ShmDir, opts.DryRun, func(job string) bool {
		return !rank.JobAlive(opts.RuntimeDir, job)
	})
	var errs []error
	if err != nil {
		errs = append(errs, err)
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
	return out, errors.Join(errs...)
}

// staleLockAge is how old a lock file without a launcher's PID (the ranks of a
// job without a launcher hold it shared) must be, unheld, before CleanStale
// takes its job for gone: a launcher writes its PID just after it locks.
const staleLockAge = 10 * time.Second

// CleanStale removes what jobs that are surely gone left behind, and is what a
// launch does before it starts: the segments and lock file of every job whose
// lock file in runtimeDir ("": rank.RuntimeDir()) nobody holds and whose
// launcher has ended (a launcher and its guard killed together leave both),
// and the segments of "local-<pid>" jobs whose process ended. Unlike Clean, it
// leaves alone the segments of jobs it knows nothing about (a job whose lock
// lives in another runtime directory). Only the calling user's segments are
// considered.
func CleanStale(shmDir, runtimeDir string) (Cleaned, error) {
	if shmDir == "" {
		shmDir = "/dev/shm"
	}
	if runtimeDir == "" {
		runtimeDir = rank.RuntimeDir()
	}
	stale := map[string]string{} // job -> its lock file
	locks, _ := filepath.Glob(filepath.Join(runtimeDir, "*.lock"))
	for _, path := range locks {
		if lockStale(path) {
			stale[strings.TrimSuffix(filepath.Base(path), ".lock")] = path
		}
	}
	out, err := removeSegments(shmDir, false, func(job string) bool {
		if _, ok := stale[job]; ok {
			return true
		}
		pid, local := shmname.LocalPID(job)
		return local && pid > 0 && !rank.ProcessAlive(pid)
	})
	errs := []error{err}
	for _, path := range stale {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		out.Locks = append(out.Locks, path)
	}
	sort.Strings(out.Locks)
	return out, errors.Join(errs...)
}

// lockStale reports whether the job lock at path is held by nobody and names a
// launcher that ended (or none, and is older than staleLockAge).
func lockStale(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false // held: the job runs
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	b, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return false
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		return !rank.ProcessAlive(pid)
	}
	fi, err := f.Stat()
	return err == nil && time.Since(fi.ModTime()) > staleLockAge
}

// removeSegments removes the calling user's segments in shmDir whose job gone
// says is gone (with dryRun, only lists them).
func removeSegments(shmDir string, dryRun bool, gone func(job string) bool) (Cleaned, error) {
	var out Cleaned
	entries, err := os.ReadDir(shmDir)
	if err != nil {
		return out, fmt.Errorf("launch: clean: %w", err)
	}
	uid := os.Getuid()
	verdict := map[string]bool{}
	var errs []error
	for _, e := range entries {
		seg, ok := shmname.Parse(e.Name())
		if !ok {
			continue
		}
		job := seg.Job
		info, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
			continue
		}
		isGone, seen := verdict[job]
		if !seen {
			isGone = gone(job)
			verdict[job] = isGone
		}
		if !isGone {
			continue
		}
		if !dryRun {
			if err := os.Remove(filepath.Join(shmDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
		}
		out.Segments = append(out.Segments, e.Name())
		out.Bytes += info.Size()
	}
	sort.Strings(out.Segments)
	for _, name := range out.Segments {
		if job, _ := shmname.Job(name); !slices.Contains(out.Jobs, job) {
			out.Jobs = append(out.Jobs, job)
		}
	}
	return out, errors.Join(errs...)
}
