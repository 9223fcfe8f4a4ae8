package launch

import (
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"

	"github.com/gear-rl/gear/internal/shmname"
)

// A parent-death signal reaches only the ranks themselves, not their children. So
// that nothing of a job outlives a launcher that is killed with SIGKILL, Run starts
// a guard: a small shell, in a process group of its own, that reads the ranks'
// process groups from a pipe. When the pipe ends without "done" (the launcher
// died), it kills those groups and removes the job's segments (every name in
// the shm directory $1 that starts with $2, the job's shmname.Name(job, ""),
// as RemoveJobSegments does) and lock file ($3).
const guardScript = `g=
while read -r p; do
	[ "$p" = done ] && exit 0
	g="$g -$p"
done
[ -n "$g" ] && kill -KILL $g 2>/dev/null
rm -f -- "$1"/"$2"* "$3"
exit 0`

type guard struct {
	sh, shmDir, jobID, lockPath string
	log                         *slog.Logger
	starting                    sync.WaitGroup

	mu     sync.Mutex
	pgids  []int
	w      *os.File
	proc   *os.Process
	closed bool
}

// startGuard starts the guard beside the ranks' start-up, so that a launcher
// killed a moment after its ranks started still takes their children with it
// (only a grandchild started in the first millisecond or two, before the guard
// runs, could outlive it). Without a shell the guard is inert.
func startGuard(shmDir, jobID, lockPath string, log *slog.Logger) *guard {
	g := &guard{shmDir: shmDir, jobID: jobID, lockPath: lockPath, log: log}
	sh, err := exec.LookPath("sh")
	if err != nil {
		log.Debug("launch: no shell; grandchildren of ranks are not guarded", "err", err)
		return g
	}
	g.sh = sh
	g.starting.Add(1)
	go func() {
		defer g.starting.Done()
		g.start()
	}()
	return g
}

func (g *guard) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	r, w, err := os.Pipe()
	if err != nil {
		return
	}
	defer r.Close()
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		w.Close()
		return
	}
	defer devNull.Close()
	proc, err := os.StartProcess(g.sh, []string{"sh", "-c", guardScript, "gear-guard", g.shmDir, shmname.Name(g.jobID, ""), g.lockPath},
		&os.ProcAttr{Files: []*os.File{r, devNull, devNull}, Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		w.Close()
		g.log.Debug("launch: guard did not start", "err", err)
		return
	}
	g.proc, g.w = proc, w
	for _, p := range g.pgids {
		g.w.WriteString(strconv.Itoa(p) + "\n")
	}
	g.log.Debug("launch: guard started", "pid", proc.Pid)
}

// add tells the guard about a rank's process group.
func (g *guard) add(pgid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pgids = append(g.pgids, pgid)
	if g.w != nil {
		g.w.WriteString(strconv.Itoa(pgid) + "\n")
	}
}

// done stops the guard without it killing anything, and reaps it.
func (g *guard) done() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.starting.Wait()
	g.mu.Lock()
	g.closed = true
	w, proc := g.w, g.proc
	g.w, g.proc = nil, nil
	g.mu.Unlock()
	if w != nil {
		w.WriteString("done\n")
		w.Close()
		proc.Wait()
	}
}
