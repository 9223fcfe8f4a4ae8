package jobs

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// A job under SLURM leaves shared-memory segments on the nodes its ranks ran
// on: a trainer's replay shard, kept across restarts on purpose, and what
// ranks killed with SIGKILL could not remove. No launcher lives on those
// nodes to remove them, so gearrun run --slurm sweeps every node of the
// allocation, at the job's start and at its end, the nodes a later
// generation left out included: one small step on each
// (`srun --overlap --nodelist=NODE -N1 -n1 gearrun run --slurm-sweep`),
// whose task removes on its node what SweepNode removes.

// sweepWait bounds how long a node may take to run the sweep step; a node
// that does not (its slurmd gone) is skipped.
const sweepWait = 10 * time.Second

// SweepNode removes the shared-memory segments (in shmDir; "" means
// /dev/shm) that gear jobs surely gone left on this node (launch.CleanStale,
// with the runtime directory runtimeDir, "" for the default), and every
// segment of job jobID, and prints one line to w naming the node and what
// it removed (0 segments too: the line says the node was swept). It is what `gearrun run --slurm-sweep` runs on each node of
// a SLURM job at the job's start and end; the caller makes sure that no
// rank of jobID runs on the node.
func SweepNode(shmDir, runtimeDir, jobID string, w io.Writer) error {
	var errs []string
	stale, err := launch.CleanStale(shmDir, runtimeDir)
	if err != nil {
		errs = append(errs, err.Error())
	}
	var mine []string
	if jobID != "" {
		if mine, err = launch.RemoveJobSegments(shmDir, jobID); err != nil {
			errs = append(errs, err.Error())
		}
	}
	host, _ := os.Hostname()
	if node := os.Getenv(rank.EnvSlurmdNodeName); node != "" {
		host = node
	}
	fmt.Fprintf(w, "gearrun: sweep of %s: removed %d segments (%d of job %s, %d of ended jobs)\n",
		host, len(stale.Segments)+len(mine), len(mine), jobID, len(stale.Segments))
	if len(errs) > 0 {
		return fmt.Errorf("jobs: sweep: %s", strings.Join(errs, "; "))
	}
	return nil
}

// sweep runs the sweep step on each of nodes at once, at most sweepWait
// each, and logs the nodes where it failed (a node whose slurmd is gone).
// Its tasks' lines go to the job's stderr.
func (sr *SlurmRun) sweep(ctx context.Context, nodes []string, jobID string, stderr io.Writer, when string) {
	if sr.NoSweep || len(nodes) == 0 {
		return
	}
	srun := sr.Srun
	if srun == "" {
		srun = "srun"
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sweepWait)
			defer cancel()
			cmd := exec.CommandContext(sctx, srun, "--overlap", "--nodelist="+n, "--nodes=1", "--ntasks=1",
				"--cpus-per-task=1", "--kill-on-bad-exit=1", sr.Gearrun, "run", "--slurm-sweep", sr.SpecPath)
			cmd.Env = append(os.Environ(), rank.EnvJobID+"="+jobID)
			cmd.WaitDelay = time.Second
			out, err := cmd.CombinedOutput()
			mu.Lock()
			defer mu.Unlock()
			if len(out) > 0 {
				stderr.Write(out)
			}
			if err != nil {
				fmt.Fprintf(stderr, "gearrun: sweep of node %s at the job's %s failed: %v\n", n, when, err)
			}
		}()
	}
	wg.Wait()
}
