package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gear-rl/gear/rank"
)

// shrunkWorld is the size of a world on left of the allocation's nodes
// nodes: as many ranks as they hold (slurm.ntasks_per_node each, else the
// first world's share of a node) up to launch.np, if that is the job's size
// or, for an elastic job (launch.min_np), at least min_np.
func shrunkWorld(s *Spec, nodes, left int) (int, error) {
	np := s.WorldSize()
	perNode := s.Slurm.NTasksPerNode
	if perNode == 0 {
		perNode = (np + nodes - 1) / nodes
	}
	w := min(np, perNode*left)
	switch {
	case left == 0:
		return 0, fmt.Errorf("no node is left")
	case s.Launch.MinNP > 0 && w < s.Launch.MinNP:
		return 0, fmt.Errorf("%d nodes left hold %d ranks, fewer than the %d the job needs at least (launch.min_np)", left, w, s.Launch.MinNP)
	case s.Launch.MinNP == 0 && w < np:
		return 0, fmt.Errorf("%d nodes left hold %d ranks, fewer than the job's %d (launch.min_np makes its size elastic)", left, w, np)
	}
	return w, nil
}

// probeWait bounds how long a node of the allocation may take to run a
// probe before deadNodes takes it for dead.
const probeWait = 10 * time.Second

// deadNodes runs a one-task probe step (`true`) on each of nodes at once,
// overlapping whatever SLURM still counts as running there, and returns
// those where it fails or does not end within probeWait (or grace, if
// longer): nodes whose slurmd is gone.
func (sr *SlurmRun) deadNodes(ctx context.Context, nodes []string, grace time.Duration, logger *slog.Logger) []string {
	srun := sr.Srun
	if srun == "" {
		srun = "srun"
	}
	wait := max(probeWait, grace)
	dead := make([]bool, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			cmd := exec.CommandContext(pctx, srun, "--overlap", "--nodelist="+n, "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--kill-on-bad-exit=1", "true")
			cmd.WaitDelay = time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				logger.Info("node does not answer a probe", "node", n, "err", err, "output", strings.TrimSpace(string(out)))
				dead[i] = true
			}
		}()
	}
	wg.Wait()
	var out []string
	for i, n := range nodes {
		if dead[i] {
			out = append(out, n)
		}
	}
	return out
}

// killedNodes lists the generation's nodes every rank of which died of
// SIGKILL on its own, as its task reported it (exits, the ranks' records):
// killed from outside the job, not stopped by SLURM or gearrun, which stop
// ranks with SIGTERM and do not report the ranks they stop. A node with a
// rank that failed otherwise, or that reported nothing, is not among them.
func (g *slurmGeneration) killedNodes(exits []RankExit) []string {
	killed := map[string]int{}
	for _, e := range exits {
		if e.Signal == syscall.SIGKILL.String() && e.Host != "" {
			killed[e.Host]++
		}
	}
	if len(killed) == 0 {
		return nil
	}
	ranks := map[string]int{}
	for r := range g.world {
		ranks[g.nodeOfRank(r)]++
	}
	var out []string
	for _, n := range g.hosts {
		if ranks[n] > 0 && killed[n] == ranks[n] {
			out = append(out, n)
		}
	}
	if len(out) == len(g.hosts) {
		return nil // every node: nothing to go on with
	}
	return out
}

// nodeOfRank names the node of rank r in the generation's step.
func (g *slurmGeneration) nodeOfRank(r int) string {
	tpn := g.getenv(rank.EnvSlurmTasksPerNode)
	if len(g.hosts) < len(g.allocation) {
		per := g.s.Slurm.NTasksPerNode
		if per == 0 {
			per = (g.world + len(g.hosts) - 1) / len(g.hosts)
		}
		tpn = fmt.Sprintf("%d(x%d)", per, len(g.hosts))
	}
	return nodeOfRank(g.hosts, tpn, r)
}

// nodeOfRank names the node of rank r in a step placed in blocks over hosts
// with SLURM_TASKS_PER_NODE tasksPerNode; "" when they do not say.
func nodeOfRank(hosts []string, tasksPerNode string, r int) string {
	if len(hosts) == 1 {
		return hosts[0]
	}
	first := 0
	for i, h := range hosts {
		n, err := rank.TasksOnNode(tasksPerNode, i)
		if err != nil {
			return ""
		}
		if r < first+n {
			return h
		}
		first += n
	}
	return ""
}

// SlurmNodeAddr returns SLURM's NodeAddr for node (scontrol show node), the
// address by which SLURM itself reaches it, or node when scontrol does not
// answer within a few seconds or knows no address apart from the name.
func SlurmNodeAddr(ctx context.Context, node string) string {
	if net.ParseIP(node) != nil {
		return node
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "scontrol", "show", "node", "--oneliner", node).Output()
	if err != nil {
		return node
	}
	if addr := nodeAddrField(string(out)); addr != "" {
		return addr
	}
	return node
}

// nodeAddrField reads NodeAddr=... from a line of scontrol show node.
func nodeAddrField(out string) string {
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "NodeAddr="); ok && v != "" && v != "(null)" {
			return v
		}
	}
	return ""
}
