package launch

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
)

// The limits a launch is checked against before anything starts. NewPlan
// applies those that do not depend on the machine (rank.MaxWorldSize); Run
// applies the machine's: the user's process limit, the launcher's open files,
// and the shared memory that the ranks' communicators will take.

// filesPerRank is how many descriptors the launcher holds for each running
// rank: the read ends of its stdout and stderr pipes, its connection to the
// coordinator, and one to spare (stdin for rank 0, output files being opened).
const filesPerRank = 4

// launcherFiles is what the launcher holds besides its ranks' descriptors.
const launcherFiles = 64

// HostLimits are the limits of this machine that bound a launch on it.
type HostLimits struct {
	// Procs is the user's soft process limit (RLIMIT_NPROC); 0 means none (no
	// limit, or root, to whom the kernel does not apply it).
	Procs uint64
	// ProcsHard is the hard process limit, for the error's advice.
	ProcsHard uint64
	// ProcsUsed is the number of tasks (threads count) the user runs now.
	ProcsUsed int
	// Files is the launcher's soft open-file limit after raising it to the hard
	// one, and FilesHard the hard limit.
	Files, FilesHard uint64
	// ShmDir is the shared-memory file system, ShmFree its free bytes (-1:
	// unknown, not checked).
	ShmDir  string
	ShmFree int64
}

// ReadHostLimits reads this machine's limits for a launch, raising the soft
// open-file limit to the hard one first, as mpirun does (the ranks inherit
// it). shmDir "" means /dev/shm.
func ReadHostLimits(shmDir string) HostLimits {
	if shmDir == "" {
		shmDir = "/dev/shm"
	}
	lim := HostLimits{ShmDir: shmDir, ShmFree: -1}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		if rl.Cur < rl.Max {
			raised := rl
			raised.Cur = rl.Max
			if unix.Setrlimit(unix.RLIMIT_NOFILE, &raised) == nil {
				rl = raised
			}
		}
		lim.Files, lim.FilesHard = rl.Cur, rl.Max
	}
	if os.Geteuid() != 0 && unix.Getrlimit(unix.RLIMIT_NPROC, &rl) == nil && rl.Cur != unix.RLIM_INFINITY {
		lim.Procs, lim.ProcsHard = rl.Cur, rl.Max
		lim.ProcsUsed = userTasks(os.Getuid())
	}
	var st unix.Statfs_t
	if unix.Statfs(shmDir, &st) == nil {
		lim.ShmFree = int64(st.Bavail) * int64(st.Bsize)
	}
	return lim
}

// userTasks counts the threads of uid's processes, which is what RLIMIT_NPROC
// counts.
func userTasks(uid int) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/status")
	n := 0
	for _, path := range dirs {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		owner, threads := -1, 1
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					owner, _ = strconv.Atoi(f[0])
				}
			} else if v, ok := strings.CutPrefix(line, "Threads:"); ok {
				threads, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		if owner == uid {
			n += threads
		}
	}
	return n
}

// CheckHost checks plan p against the machine's limits: the error names the
// limit, what the plan needs and how to get past it. baseEnv is the launcher's
// environment, which the ranks inherit (it may choose the TCP transport).
func CheckHost(p *Plan, lim HostLimits, baseEnv []string) error {
	n := len(p.Ranks)
	if lim.Procs > 0 && uint64(n)+uint64(lim.ProcsUsed) > lim.Procs {
		return fmt.Errorf("launch: %d ranks and the %d tasks you run now exceed your process limit of %d (RLIMIT_NPROC, ulimit -u; every thread counts); raise it with ulimit -u (hard limit %s), or run fewer ranks",
			n, lim.ProcsUsed, lim.Procs, rlimString(lim.ProcsHard))
	}
	if need := uint64(n)*filesPerRank + launcherFiles; lim.Files > 0 && need > lim.Files {
		return fmt.Errorf("launch: %d ranks need about %d open files in the launcher (%d per rank), over its hard limit of %d (RLIMIT_NOFILE, ulimit -Hn); raise the hard limit (nofile in limits.conf, LimitNOFILE under systemd), or split the job",
			n, need, filesPerRank, lim.FilesHard)
	}
	if lim.ShmFree >= 0 {
		if err := checkShm(p, lim, baseEnv); err != nil {
			return err
		}
	}
	return nil
}

// shmRanks counts, per node, the ranks whose communicator may use shared
// memory: ranks that are told to use TCP (GEAR_TRANSPORT=tcp) take none.
func shmRanks(p *Plan, baseEnv []string) map[int]int {
	perNode := map[int]int{}
	for i := range p.Ranks {
		if transportOf(baseEnv, p.Env, p.Ranks[i].Env) == collective.TransportTCP {
			continue
		}
		perNode[p.Ranks[i].Node]++
	}
	return perNode
}

// checkShm checks the shared memory of the ranks' communicators: the ranks of
// each host share one segment, with an inbox per rank that holds a ring for
// every rank of the host, and this is every ring full.
func checkShm(p *Plan, lim HostLimits, baseEnv []string) error {
	local := 0
	for _, c := range shmRanks(p, baseEnv) {
		local = max(local, c)
	}
	t := collective.DefaultTuning()
	need := collective.ShmBytes(local, t)
	if need <= lim.ShmFree {
		return nil
	}
	return fmt.Errorf("launch: %d ranks on this host plan %s of shared memory for their communicator (%d inboxes of %d rings of %s, a board of %s), over the %s free in %s; run fewer ranks per host, free %s (gearrun clean), enlarge it (mount -o remount,size=... %s), or have the ranks use TCP (-x %s=tcp)",
		local, FormatBytes(need), local, local, FormatBytes(int64(collective.ShmRingBytes(local, t))), FormatBytes(collective.ShmBoardBytes(local)), FormatBytes(lim.ShmFree), lim.ShmDir, lim.ShmDir, lim.ShmDir, rank.EnvTransport)
}

// writeShmBudget prints, for every node with ranks that share memory, what
// their world communicator may take of it: every ring full (what the launcher
// checks against the free space), and what setting it up takes.
func (p *Plan) writeShmBudget(b *strings.Builder) {
	perNode := shmRanks(p, nil)
	t := collective.DefaultTuning()
	for node := range p.NumNodes {
		n := perNode[node]
		if need := collective.ShmBytes(n, t); need > 0 {
			fmt.Fprintf(b, "shared memory node %d: %d ranks, at most %s (%d inboxes of %d rings of %s, a board of %s), %s at setup\n",
				node, n, FormatBytes(need), n, n, FormatBytes(int64(collective.ShmRingBytes(n, t))), FormatBytes(collective.ShmBoardBytes(n)), FormatBytes(collective.ShmSetupBytes(n)))
		}
	}
}

// transportOf is the GEAR_TRANSPORT a rank sees: the last one set, in the
// order its environment is put together.
func transportOf(envs ...[]string) string {
	v := ""
	for _, env := range envs {
		for _, kv := range env {
			if val, ok := strings.CutPrefix(kv, rank.EnvTransport+"="); ok {
				v = val
			}
		}
	}
	return v
}

func rlimString(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return strconv.FormatUint(v, 10)
}

// FormatBytes writes n in binary units: "512 B", "2.0 MiB", "3.1 GiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
