package rank

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/internal/shmname"
)

// A job is alive while some process holds the flock of its lock file,
// RuntimeDir()/<jobID>.lock: the launcher holds it exclusively for the whole job
// (ranks started without a launcher, under SLURM, hold it shared). A job whose ID
// is "local-<pid>" is alive while that process lives. `gearrun clean` removes the
// shared-memory segments of jobs that are not alive.

// RuntimeDir is the directory of job lock files: GEAR_RUNTIME_DIR, else
// $XDG_RUNTIME_DIR/gear, else gear-<uid> in the temporary directory.
func RuntimeDir() string {
	if d := os.Getenv(EnvRuntimeDir); d != "" {
		return d
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "gear")
	}
	return filepath.Join(os.TempDir(), "gear-"+strconv.Itoa(os.Getuid()))
}

// CheckJobID reports whether id can name a job: non-empty, at most 128 bytes of
// letters, digits, '-', '_' (no '.', which separates the parts of segment names).
func CheckJobID(id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("rank: job ID %q: want 1 to 128 characters", id)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("rank: job ID %q: character %q not allowed (want letters, digits, '-', '_')", id, c)
		}
	}
	return nil
}

// JobLock is a held job lock.
type JobLock struct {
	f         *os.File
	path      string
	exclusive bool
}

// LockJob takes the lock of jobID in dir ("" means RuntimeDir()): exclusive for a
// launcher, which fails if the job is already running; shared for the ranks of a
// job without a launcher.
func LockJob(dir, jobID string, exclusive bool) (*JobLock, error) {
	if err := CheckJobID(jobID); err != nil {
		return nil, err
	}
	if dir == "" {
		dir = RuntimeDir()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("rank: job lock: %w", err)
	}
	path := filepath.Join(dir, jobID+".lock")
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	var f *os.File
	for try := 0; ; try++ {
		var err error
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("rank: job lock: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) && !exclusive && try < sharedTries {
				// Maybe the last shared holder, for the moment it takes to
				// remove the file (Close): look again.
				time.Sleep(time.Millisecond)
				continue
			}
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("rank: job lock %s: job %s is already running", path, jobID)
			}
			return nil, fmt.Errorf("rank: job lock %s: %w", path, err)
		}
		// The last holder removes the file as it lets go (Close): a lock
		// taken on the file it was removing would be a lock on nothing that
		// JobAlive can see. Locked, the file must still be the one at path.
		if onPath(f, path) {
			break
		}
		f.Close()
		if try >= 100 {
			return nil, fmt.Errorf("rank: job lock %s: the file keeps being replaced", path)
		}
	}
	if exclusive {
		f.Truncate(0)
		f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	}
	return &JobLock{f: f, path: path, exclusive: exclusive}, nil
}

// Path is the lock file's path.
func (l *JobLock) Path() string { return l.path }

// Close releases the lock. The last holder also removes the file: an
// exclusive holder, or a shared one that finds no other (several agents or
// SLURM ranks of a job on one machine hold it shared, and the last to end
// removes it). Idempotent.
func (l *JobLock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	if l.exclusive || unix.Flock(int(l.f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		if onPath(l.f, l.path) {
			os.Remove(l.path)
		}
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// sharedTries bounds how many times a shared LockJob tries again, a
// millisecond apart, a lock held exclusively: long enough for a holder's
// Close, far too short for a launcher's job.
const sharedTries = 20

// onPath reports whether f is the file at path.
func onPath(f *os.File, path string) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	pi, err := os.Stat(path)
	return err == nil && os.SameFile(fi, pi)
}

// JobAlive reports whether the job jobID still runs: its lock in dir ("" means
// RuntimeDir()) is held, or, for "local-<pid>", that process lives.
func JobAlive(dir, jobID string) bool {
	if pid, local := shmname.LocalPID(jobID); local {
		return pid > 0 && ProcessAlive(pid)
	}
	if CheckJobID(jobID) != nil {
		return false
	}
	if dir == "" {
		dir = RuntimeDir()
	}
	f, err := os.Open(filepath.Join(dir, jobID+".lock"))
	if err != nil {
		return false
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return false
	}
	return errors.Is(err, unix.EWOULDBLOCK)
}

// ProcessAlive reports whether pid names a process that has not ended (a zombie
// counts as ended).
func ProcessAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// The state follows the command name, which is in parentheses and may hold
	// spaces or parentheses itself.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}
