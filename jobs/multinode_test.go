package jobs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/jobs/jobstest"
)

// The tests in this file submit jobs of several nodes with `gearrun submit`
// to a cluster of at least three nodes, such as the one of
// scripts/slurm-local.sh up --nodes 3 (a network namespace per node); their
// rank program is cmd/internal/multinode. Without such a cluster they skip,
// unless GEAR_REQUIRE_MULTINODE=1 (jobstest.RequireNodes).

// multinodeCmds is the rank program, built once for the package's tests into
// a temporary directory that every node of the local cluster sees.
var multinodeCmds = geartest.NewCommands("github.com/gear-rl/gear/cmd/internal/multinode")

func multinodeBinary(t *testing.T) string { return multinodeCmds.Path(t, "multinode") }

// multinodeSpec is a job of the rank program in mode args, on 3 nodes of
// perNode ranks each; groups, when given, replace [launch] np and command.
func multinodeSpec(t *testing.T, name string, perNode int, groups string, args ...string) string {
	t.Helper()
	bin := multinodeBinary(t)
	command := strconv.Quote(bin)
	for _, a := range args {
		command += ", " + strconv.Quote(a)
	}
	launch := fmt.Sprintf("np = %d\ncommand = [%s]\n", 3*perNode, command)
	if groups != "" {
		launch = ""
		groups = strings.ReplaceAll(groups, "COMMAND", "["+command+"]")
	}
	return jobstest.WriteSpec(t, fmt.Sprintf(`
name = %q
[launch]
%stimeout = "5m"
grace = "2s"
rdzv_timeout = "2m"
%s
[slurm]
nodes = 3
ntasks_per_node = %d
time = "00:10:00"
extra = ["--overcommit"]
`, name, launch, groups, perNode))
}

// mnRank is what a rank of the program says of itself ("MN rank ...").
type mnRank struct {
	rank     int
	node     string
	nodeRank int
	local    int
	role     string
	host     string
}

var mnRankLine = regexp.MustCompile(`(?m)MN rank (\d+)/(\d+) node (\S+) \((\d+)/(\d+)\) local (\d+)/(\d+) role "([^"]*)" \d+/\d+ host (\S+)$`)

// mnRanks reads the ranks' lines of a job of size ranks.
func mnRanks(t *testing.T, log string, size int) []mnRank {
	t.Helper()
	out := make([]mnRank, size)
	seen := 0
	for _, m := range mnRankLine.FindAllStringSubmatch(log, -1) {
		r, _ := strconv.Atoi(m[1])
		if n, _ := strconv.Atoi(m[2]); n != size || r >= size {
			t.Fatalf("line %q: want a world of %d", m[0], size)
		}
		nr, _ := strconv.Atoi(m[4])
		local, _ := strconv.Atoi(m[6])
		if nn, _ := strconv.Atoi(m[5]); nn != 3 {
			t.Errorf("rank %d: GEAR_NUM_NODES %d, want 3", r, nn)
		}
		out[r] = mnRank{rank: r, node: m[3], nodeRank: nr, local: local, role: m[8], host: m[9]}
		seen++
	}
	if seen != size {
		t.Fatalf("%d of %d ranks reported; log:\n%s", seen, size, log)
	}
	return out
}

// checkPlacement checks that the ranks sit perNode to a node in blocks, with
// one host identity per node, named after it, and the contract's node and
// local ranks.
func checkPlacement(t *testing.T, ranks []mnRank, perNode int) {
	t.Helper()
	var nodes, hosts []string
	for _, r := range ranks {
		node := r.rank / perNode
		if node == len(nodes) {
			nodes = append(nodes, r.node)
			hosts = append(hosts, r.host)
		}
		if r.node != nodes[node] || r.host != hosts[node] {
			t.Errorf("rank %d on %s (host %s), want it with ranks of %s (host %s)", r.rank, r.node, r.host, nodes[node], hosts[node])
		}
		if r.nodeRank != node || r.local != r.rank%perNode {
			t.Errorf("rank %d: GEAR_NODE_RANK %d GEAR_LOCAL_RANK %d, want %d and %d", r.rank, r.nodeRank, r.local, node, r.rank%perNode)
		}
		if !strings.HasPrefix(r.host, r.node+"/") {
			t.Errorf("rank %d: host identity %q does not name its node %s", r.rank, r.host, r.node)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(nodes)))) != 3 {
		t.Errorf("nodes %v, want 3 different ones", nodes)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(hosts)))) != 3 {
		t.Errorf("host identities %v, want 3 different ones", hosts)
	}
}

// TestMultiNodeAllReduce: six ranks, two on each of three nodes: the
// hierarchical AllReduce gives the right sums, ranks of one node share memory
// and hold no TCP connection to one another, and each rank holds TCP
// connections to the ranks of the other two nodes.
// noticeBound is how long a job may take to notice a killed rank or a dead
// node, end, and leave no rank process. On an idle machine it takes a few
// heartbeats (seconds); a busy one, with other tests beside this one, can take
// several times that. The bound still catches a job that waits for a timeout
// instead (the rendezvous's, SLURM's), or that leaves its ranks running.
const noticeBound = 30 * time.Second

func TestMultiNodeAllReduce(t *testing.T) {
	jobstest.RequireNodes(t, 3)
	j := submit(t, multinodeSpec(t, "mn-allreduce", 2, "", "allreduce"))
	state, log := j.Wait()
	if state != "COMPLETED" {
		t.Fatalf("state %s, want COMPLETED; log:\n%s", state, log)
	}
	ranks := mnRanks(t, log, 6)
	checkPlacement(t, ranks, 2)

	re := regexp.MustCompile(`(?m)MN allreduce rank (\d+) node (\S+) sum (\d+) big ok listen (\S+) shm-peers \[([\d,]*)\] tcp-peers \[([\d,]*)\] shm-segments (\d+) tcp-remotes (\S*)$`)
	ms := re.FindAllStringSubmatch(log, -1)
	if len(ms) != 6 {
		t.Fatalf("%d ranks reported the allreduce, want 6; log:\n%s", len(ms), log)
	}
	addrOf := map[string]string{} // node -> its address, as its ranks listen
	for _, m := range ms {
		if prev, ok := addrOf[m[2]]; ok && prev != m[4] {
			t.Errorf("node %s: ranks listen at %s and %s", m[2], prev, m[4])
		}
		addrOf[m[2]] = m[4]
	}
	for _, m := range ms {
		r, _ := strconv.Atoi(m[1])
		node, addr := m[2], m[4]
		if m[3] != "15" {
			t.Errorf("rank %d: allreduce of ranks %s, want 15", r, m[3])
		}
		mate := r ^ 1 // the other rank of its node
		if m[5] != strconv.Itoa(mate) {
			t.Errorf("rank %d: shared-memory peers [%s], want [%d]", r, m[5], mate)
		}
		var others []string
		for _, o := range ranks {
			if o.node != node {
				others = append(others, strconv.Itoa(o.rank))
			}
		}
		if m[6] != strings.Join(others, ",") {
			t.Errorf("rank %d: TCP peers [%s], want [%s]", r, m[6], strings.Join(others, ","))
		}
		if n, _ := strconv.Atoi(m[7]); n < 1 {
			t.Errorf("rank %d maps no shared-memory segment of the job", r)
		}
		// TCP connections by remote address, rendezvous left out: to both
		// other nodes, none within its own.
		remotes := map[string]int{}
		for _, rc := range strings.Split(m[8], ",") {
			if ip, n, ok := strings.Cut(rc, "*"); ok {
				remotes[ip], _ = strconv.Atoi(n)
			}
		}
		if _, ok := remotes[addr]; ok {
			t.Errorf("rank %d on %s holds TCP connections within its node (%s)", r, node, m[8])
		}
		for other, oaddr := range addrOf {
			if other != node && remotes[oaddr] < 1 {
				t.Errorf("rank %d on %s has no TCP connection to %s (%s): %s", r, node, other, oaddr, m[8])
			}
		}
		if len(remotes) != 2 {
			t.Errorf("rank %d on %s: TCP connections to %s, want the 2 other nodes", r, node, m[8])
		}
		t.Logf("rank %d on %s (%s): shm to [%s] (%s segments), TCP to %s", r, node, addr, m[5], m[7], m[8])
	}
	if !strings.Contains(log, "gearrun: job mn-allreduce completed: 6 ranks exited with status 0") {
		t.Errorf("log lacks gearrun's summary:\n%s", log)
	}
}

// TestMultiNodeReplay: a distributed replay table across three nodes. Two
// actors, on two nodes, write their shards; the trainer, on the third, samples
// with the split draw and collects every sampled row from the actors' nodes.
// The frequencies pass the chi-square test of the single-host suite.
func TestMultiNodeReplay(t *testing.T) {
	jobstest.RequireNodes(t, 3)
	j := submit(t, multinodeSpec(t, "mn-replay", 1, `
[[group]]
role = "actor"
np = 2
command = COMMAND
[[group]]
role = "trainer"
np = 1
command = COMMAND
`, "replay"))
	state, log := j.Wait()
	if state != "COMPLETED" {
		t.Fatalf("state %s, want COMPLETED; log:\n%s", state, log)
	}
	ranks := mnRanks(t, log, 3)
	checkPlacement(t, ranks, 1)
	m := regexp.MustCompile(`MN replay trainer node (\S+) samples (\d+) remote (\d+) collected (\d+) chi2 (\S+) dof (\d+) p (\S+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("the trainer did not report; log:\n%s", log)
	}
	if ranks[2].role != "trainer" || m[1] != ranks[2].node || m[1] == ranks[0].node || m[1] == ranks[1].node {
		t.Errorf("trainer on %s, actors on %s and %s: want three nodes", m[1], ranks[0].node, ranks[1].node)
	}
	if m[2] != "20480" || m[3] != m[2] || m[4] != m[2] {
		t.Errorf("samples %s, remote %s, collected %s: want 20480 of each", m[2], m[3], m[4])
	}
	p, err := strconv.ParseFloat(m[7], 64)
	if err != nil || p < 0.001 {
		t.Errorf("chi-square %s on %s dof: p = %s < 0.001", m[5], m[6], m[7])
	}
	t.Logf("trainer on %s collected %s rows from the actors' nodes; chi-square %s on %s dof, p = %s", m[1], m[4], m[5], m[6], m[7])
}

// TestMultiNodeMPMD: four actors on two nodes and two trainers on the third,
// with a communicator per role besides the world's.
func TestMultiNodeMPMD(t *testing.T) {
	jobstest.RequireNodes(t, 3)
	j := submit(t, multinodeSpec(t, "mn-mpmd", 2, `
[[group]]
role = "actor"
np = 4
command = COMMAND
[[group]]
role = "trainer"
np = 2
command = COMMAND
`, "mpmd"))
	state, log := j.Wait()
	if state != "COMPLETED" {
		t.Fatalf("state %s, want COMPLETED; log:\n%s", state, log)
	}
	ranks := mnRanks(t, log, 6)
	checkPlacement(t, ranks, 2)
	re := regexp.MustCompile(`(?m)MN mpmd rank (\d+) role (\S+) (\d+)/(\d+) node (\S+) role-sum (\d+) role-hosts (\d+) world-sum (\d+)$`)
	ms := re.FindAllStringSubmatch(log, -1)
	if len(ms) != 6 {
		t.Fatalf("%d ranks reported, want 6; log:\n%s", len(ms), log)
	}
	nodesOf := map[string][]string{}
	for _, m := range ms {
		r, _ := strconv.Atoi(m[1])
		role, want := "actor", []string{"6", "2"} // sum of 0..3, two nodes
		if r >= 4 {
			role, want = "trainer", []string{"1", "1"}
		}
		if m[2] != role || m[6] != want[0] || m[7] != want[1] || m[8] != "6" {
			t.Errorf("rank %d: %q, want role %s, role-sum %s, role-hosts %s, world-sum 6", r, m[0], role, want[0], want[1])
		}
		if !slices.Contains(nodesOf[role], m[5]) {
			nodesOf[role] = append(nodesOf[role], m[5])
		}
	}
	if len(nodesOf["actor"]) != 2 || len(nodesOf["trainer"]) != 1 || slices.Contains(nodesOf["actor"], nodesOf["trainer"][0]) {
		t.Errorf("actors on %v, trainers on %v: want the roles on different nodes", nodesOf["actor"], nodesOf["trainer"])
	}
	t.Logf("actors on %v, trainers on %v", nodesOf["actor"], nodesOf["trainer"])
}

// TestMultiNodeLostNode kills (SIGKILL) every rank of the second node in the
// middle of AllReduce: the job must end FAILED within 5 s, gearrun's message
// must name that node, and no rank process may be left on any node.
func TestMultiNodeLostNode(t *testing.T) {
	jobstest.RequireNodes(t, 3)
	dir := t.TempDir()
	bin := multinodeBinary(t)
	j := submit(t, multinodeSpec(t, "mn-lost", 2, "", "hold", dir))

	// Wait for every rank to pass its first AllReduce.
	type proc struct {
		node string
		pid  int
	}
	procs := map[int]proc{}
	deadline := time.Now().Add(jobstest.WaitLimit)
	for len(procs) < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("the ranks never started; log:\n%s", j.Logs())
		}
		if s := j.SlurmState(); s != "" && s != "PENDING" && s != "RUNNING" && s != "CONFIGURING" {
			t.Fatalf("job %s before the kill; log:\n%s", s, j.Logs())
		}
		time.Sleep(100 * time.Millisecond)
		for r := range 6 {
			b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(r)))
			f := strings.Fields(string(b))
			if err != nil || len(f) != 2 {
				continue
			}
			pid, _ := strconv.Atoi(f[1])
			procs[r] = proc{f[0], pid}
		}
	}
	victim := procs[2].node
	var killed []int
	for r, p := range procs {
		if p.node == victim {
			killed = append(killed, r)
		}
	}
	slices.Sort(killed)
	// Let the ranks run their collectives a little longer, then kill.
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	for i, r := range killed {
		// A rank of the node may already have ended, of its neighbour's death.
		if err := syscall.Kill(procs[r].pid, syscall.SIGKILL); err != nil && (i == 0 || err != syscall.ESRCH) {
			t.Fatalf("kill rank %d (pid %d): %v", r, procs[r].pid, err)
		}
	}

	// The job's state and the processes left, polled until both settle
	// (bounded generously; the assertions are on the times).
	var failedAt, goneAt time.Duration
	var state string
	for time.Since(start) < 60*time.Second && (failedAt == 0 || goneAt == 0) {
		if failedAt == 0 {
			if state = j.SlurmState(); state != "" && state != "RUNNING" && state != "COMPLETING" {
				failedAt = time.Since(start)
			}
		}
		if goneAt == 0 && len(processesOf(bin)) == 0 {
			goneAt = time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	log := j.Logs()
	t.Logf("killed ranks %v on %s; job %s after %v, no rank process left after %v", killed, victim, state, failedAt, goneAt)
	if state != "FAILED" {
		t.Fatalf("state %s, want FAILED; log:\n%s", state, log)
	}
	if failedAt > noticeBound {
		t.Errorf("the job took %v to end FAILED, want at most %v", failedAt, noticeBound)
	}
	if goneAt == 0 || goneAt > noticeBound {
		t.Errorf("rank processes left after %v: %v (all gone after %v)", noticeBound, processesOf(bin), goneAt)
	}
	for r, p := range procs {
		if processAlive(p.pid) {
			t.Errorf("rank %d (pid %d on %s) is still running", r, p.pid, p.node)
		}
	}
	m := regexp.MustCompile(`gearrun: job mn-lost failed: rank (\d+) on (\S+) was killed by signal killed`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("log lacks gearrun's message naming the killed rank and its node:\n%s", log)
	}
	if r, _ := strconv.Atoi(m[1]); m[2] != victim || !slices.Contains(killed, r) {
		t.Errorf("gearrun names rank %s on %s, want one of ranks %v on %s", m[1], m[2], killed, victim)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "MN hold") || strings.Contains(line, "lost") {
			t.Log(line)
		}
	}
}

// TestMultiNodeDeadNode kills a node in the middle of AllReduce: its slurmd,
// and the job's slurmstepd, tasks and ranks there, as when the machine dies. srun would wait minutes for the dead node's tasks;
// gearrun must end non-zero within 5 s with a message naming the node, and no
// rank may be left on the other nodes. The node comes back through
// scripts/slurm-local.sh up afterwards.
func TestMultiNodeDeadNode(t *testing.T) {
	nodes := jobstest.RequireNodes(t, 3)
	dir := t.TempDir()
	bin := multinodeBinary(t)
	j := submit(t, multinodeSpec(t, "mn-dead", 2, "", "hold", dir))
	pids, rankNodes := waitForRanks(t, j, dir, 6)
	victimNode := rankNodes[2]
	// The node is the network namespace of its ranks; it must not be ours.
	netns := requireOwnNamespace(t, pids[2])
	// No other job may start on the node while it is dead (the tests of
	// other packages may submit jobs meanwhile): drain it first.
	scontrol := func(args ...string) { scontrolOrError(t, args...) }
	scontrol("update", "nodename="+victimNode, "state=drain", "reason=gear-test-dead-node")
	t.Cleanup(func() {
		// Bring the node back (its slurmd), let SLURM finish the job there,
		// and open the node again.
		cmd := exec.Command("../scripts/slurm-local.sh", "up", "--nodes", strconv.Itoa(len(nodes)))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("scripts/slurm-local.sh up: %v\n%s", err, out)
		}
		resumeNode(t, victimNode)
	})
	time.Sleep(500 * time.Millisecond)
	// The node's death, as far as this job and SLURM's hold on the node go:
	// its slurmd, the job's slurmstepd, and the job's processes there. Other
	// jobs' processes on the node are left alone.
	start := time.Now()
	var killed []string
	for _, pid := range processesIn(netns) {
		name := processName(pid)
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		ours := name == "slurmd" ||
			strings.Contains(string(cmdline), "["+j.SlurmID+".") ||
			strings.Contains("\x00"+string(environ), "\x00SLURM_JOB_ID="+j.SlurmID+"\x00")
		if ours && syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, name)
		}
	}
	slices.Sort(killed)
	t.Logf("killed node %s (%s): %v", victimNode, netns, slices.Compact(killed))

	var endedAt, goneAt time.Duration
	var log string
	for time.Since(start) < 60*time.Second && (endedAt == 0 || goneAt == 0) {
		if endedAt == 0 {
			if log = j.Logs(); strings.Contains(log, "gearrun: job mn-dead ") && strings.Contains(log, "mn-dead failed") {
				endedAt = time.Since(start)
			}
		}
		if goneAt == 0 && len(processesOf(bin)) == 0 {
			goneAt = time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("gearrun ended after %v, no rank process left after %v", endedAt, goneAt)
	if endedAt == 0 || endedAt > noticeBound {
		t.Errorf("gearrun took %v to end, want at most %v; log:\n%s", endedAt, noticeBound, log)
	}
	if goneAt == 0 || goneAt > noticeBound {
		t.Errorf("rank processes left after %v: %v", noticeBound, processesOf(bin))
	}
	m := regexp.MustCompile(`gearrun: job mn-dead failed: (.*)`).FindStringSubmatch(log)
	if m == nil || !strings.Contains(m[1], " on "+victimNode+":") && !strings.Contains(m[1], " on "+victimNode+" ") {
		t.Errorf("gearrun's message does not name node %s: %q; log:\n%s", victimNode, m, log)
	} else {
		t.Logf("gearrun: job mn-dead failed: %s", m[1])
	}
	if code, err := recordedExit(j); err != nil || code == "0" {
		t.Errorf("the batch script recorded exit %q (%v), want non-zero", code, err)
	}
}

// TestMultiNodeElastic: np = 6, min_np = 4, restarts = 1, two ranks on each
// of three nodes; a node dies in the middle of AllReduce (its slurmd, and
// the job's processes there). gearrun stops the step, finds the node gone,
// and starts the next generation on the two nodes left: 4 ranks, which pass
// their AllReduces, and the job ends 0. No rank process is left on any node,
// and the job is COMPLETED once the node is back.
func TestMultiNodeElastic(t *testing.T) {
	nodes := jobstest.RequireNodes(t, 3)
	dir := t.TempDir()
	bin := multinodeBinary(t)
	spec := multinodeSpec(t, "mn-elastic", 2, "", "hold", dir)
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(b), "np = 6\n", "np = 6\nmin_np = 4\nrestarts = 1\n", 1)
	if err := os.WriteFile(spec, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	j := submit(t, spec)
	pids, rankNodes := waitForRanks(t, j, dir, 6)
	victimNode := rankNodes[2]
	netns := requireOwnNamespace(t, pids[2])
	scontrol := func(args ...string) { scontrolOrError(t, args...) }
	scontrol("update", "nodename="+victimNode, "state=drain", "reason=gear-test-elastic")
	revived := false
	revive := func() {
		if revived {
			return
		}
		revived = true
		cmd := exec.Command("../scripts/slurm-local.sh", "up", "--nodes", strconv.Itoa(len(nodes)))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("scripts/slurm-local.sh up: %v\n%s", err, out)
		}
		resumeNode(t, victimNode)
	}
	t.Cleanup(revive)
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	for _, pid := range processesIn(netns) {
		name := processName(pid)
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if name == "slurmd" || strings.Contains(string(cmdline), "["+j.SlurmID+".") ||
			strings.Contains("\x00"+string(environ), "\x00SLURM_JOB_ID="+j.SlurmID+"\x00") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	log, endedAt := waitJobEnded(j, "mn-elastic", start, 90*time.Second)
	t.Logf("node %s killed; gearrun ended after %v", victimNode, endedAt)
	if !strings.Contains(log, "gearrun: job mn-elastic completed: 4 ranks exited with status 0") {
		t.Fatalf("the job did not complete with 4 ranks; log:\n%s", log)
	}
	m := regexp.MustCompile(`(?m)gearrun: restart 1 of 1: .*; node (\S+) lost; next world: 4 ranks on (\S+),(\S+)$`).FindStringSubmatch(log)
	if m == nil || m[1] != victimNode || m[2] == victimNode || m[3] == victimNode {
		t.Errorf("no restart line naming node %s and the next world; log:\n%s", victimNode, log)
	} else {
		t.Log(m[0])
	}
	for r := range 4 {
		line := regexp.MustCompile(fmt.Sprintf(`MN hold rank %d/4 generation 1 node (\S+): 20 allreduces`, r)).FindStringSubmatch(log)
		if line == nil || line[1] == victimNode {
			t.Errorf("rank %d of generation 1: %q; log:\n%s", r, line, log)
		}
		if !regexp.MustCompile(fmt.Sprintf(`MN rank %d/4 node \S+ \(\d/2\) local \d/2 `, r)).MatchString(log) {
			t.Errorf("rank %d of generation 1 does not see a world of 4 on 2 nodes; log:\n%s", r, log)
		}
	}
	if regexp.MustCompile(`MN rank [45]/`).MatchString(log[strings.Index(log, "gearrun: restart 1 of 1"):]) {
		t.Errorf("a rank 4 or 5 after the restart; log:\n%s", log)
	}
	if code, err := recordedExit(j); err != nil || code != "0" {
		t.Errorf("the batch script recorded exit %q (%v), want 0", code, err)
	}
	if left := processesOf(bin); len(left) > 0 {
		t.Errorf("rank processes left: %v", left)
	}
	revive()
	state := ""
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if state = j.SlurmState(); state == "COMPLETED" {
			break
		}
	}
	if state != "COMPLETED" {
		t.Errorf("SLURM state %q once the node is back, want COMPLETED", state)
	}
}

// TestMultiNodeElasticReplay: np = 6, min_np = 4, restarts = 1, two ranks on
// each of three nodes, each rank with a replay shard of its own, checkpointed
// to the job's checkpoint directory. Every rank of one node is killed at once
// (kill -9, its slurmd left alone): gearrun finds every rank of the node dead
// of SIGKILL and starts the next generation on the other two nodes, 4 ranks;
// the survivors restore the lost node's shards from their checkpoints (and
// the orphaned ranks 4 and 5's), every row of the 6 old shards is in the new
// world exactly once, and the job ends 0. No rank process and no shared-memory
// segment of the job is left.
func TestMultiNodeElasticReplay(t *testing.T) {
	jobstest.RequireNodes(t, 3)
	dir, ckpt := t.TempDir(), t.TempDir()
	bin := multinodeBinary(t)
	spec := multinodeSpec(t, "mn-elastic-replay", 2, "", "elastic", dir)
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(b), "np = 6\n", fmt.Sprintf("np = 6\nmin_np = 4\nrestarts = 1\ncheckpoint_dir = %q\n", ckpt), 1)
	if err := os.WriteFile(spec, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	j := submit(t, spec)
	// Whatever way the test ends, the job's segments go (on a real cluster
	// each node has its own /dev/shm; here they share this machine's), and
	// any that the job left are an error.
	t.Cleanup(func() {
		segs, _ := filepath.Glob("/dev/shm/*" + j.GearID + "*")
		for _, seg := range segs {
			os.Remove(seg)
		}
		if len(segs) > 0 {
			t.Errorf("shared-memory segments of the job left: %v", segs)
		}
	})
	pids, nodes := waitForRanks(t, j, dir, 6)
	victim := nodes[2]
	var killed, victims []int
	for r := range 6 {
		if nodes[r] == victim {
			killed = append(killed, r)
			victims = append(victims, pids[r])
		}
	}
	time.Sleep(500 * time.Millisecond)
	// Every rank of the node dies of SIGKILL, as when the OOM killer or an
	// operator takes the node's processes: all are stopped first, so that
	// none sees another's death and ends on its own before its SIGKILL
	// (the signals go out one after another).
	start := time.Now()
	for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGKILL} {
		for _, pid := range victims {
			if err := syscall.Kill(pid, sig); err != nil {
				t.Fatalf("%v to pid %d: %v\njob's log:\n%s", sig, pid, err, j.Logs())
			}
		}
	}
	log, endedAt := waitJobEnded(j, "mn-elastic-replay", start, 90*time.Second)
	t.Logf("ranks %v on %s killed; gearrun ended after %v", killed, victim, endedAt)
	if !strings.Contains(log, "gearrun: job mn-elastic-replay completed: 4 ranks exited with status 0") {
		t.Fatalf("the job did not complete with 4 ranks; log:\n%s", log)
	}
	m := regexp.MustCompile(`(?m)gearrun: restart 1 of 1: .*; node (\S+): every rank died \(killed by SIGKILL\); next world: 4 ranks on (\S+),(\S+)$`).FindStringSubmatch(log)
	if m == nil || m[1] != victim || m[2] == victim || m[3] == victim {
		t.Errorf("no restart line naming node %s, its ranks' deaths and the next world; log:\n%s", victim, log)
	} else {
		t.Log(m[0])
	}
	// Each old shard taken over once, by a rank of the new world; the lost
	// node's from their checkpoints, by ranks on the other nodes.
	took := regexp.MustCompile(`(?m)MN elastic rank (\d)/4 generation 1 node (\S+): (re-attached|restored) (\d+) rows of old rank (\d) \(node (\S+)\) from (.*)$`)
	by := map[int][]string{}
	for _, m := range took.FindAllStringSubmatch(log, -1) {
		old, _ := strconv.Atoi(m[5])
		by[old] = append(by[old], m[0])
		if m[4] != "300" {
			t.Errorf("%q: want 300 rows", m[0])
		}
		if m[2] == victim {
			t.Errorf("%q: a rank of generation 1 on the lost node", m[0])
		}
		if m[6] != nodes[old] {
			t.Errorf("%q: old rank %d ran on %s", m[0], old, nodes[old])
		}
		if slices.Contains(killed, old) {
			if m[3] != "restored" || !strings.HasPrefix(m[7], "checkpoint shard."+m[5]+".ckpt") {
				t.Errorf("%q: want the lost rank's shard restored from its checkpoint", m[0])
			}
			t.Logf("lost rank %d's shard: %s", old, m[0])
		}
	}
	for r := range 6 {
		if len(by[r]) != 1 {
			t.Errorf("old rank %d's shard taken over %d times: %q; log:\n%s", r, len(by[r]), by[r], log)
		}
	}
	if n := len(regexp.MustCompile(`(?m)MN elastic rank \d/4 generation 1 node \S+: every row accounted for: 6 old ranks x 300 = 1800 rows$`).FindAllString(log, -1)); n != 4 {
		t.Errorf("%d ranks of generation 1 found every row, want 4; log:\n%s", n, log)
	}
	if code, err := recordedExit(j); err != nil || code != "0" {
		t.Errorf("the batch script recorded exit %q (%v), want 0", code, err)
	}
	state := ""
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if state = j.SlurmState(); state == "COMPLETED" {
			break
		}
	}
	if state != "COMPLETED" {
		t.Errorf("SLURM state %q, want COMPLETED", state)
	}
	if left := processesOf(bin); len(left) > 0 {
		t.Errorf("rank processes left: %v", left)
	}
}

// processesIn lists the processes in network namespace netns ("net:[...]").
// waitJobEnded polls j's log until gearrun says job name completed or failed,
// or limit has passed since start, and returns the log and when (since start)
// the job ended: zero if it did not.
// recordedExit is the exit status that j's batch script recorded. gearrun
// prints its summary, sweeps the nodes and exits, and the script records
// its exit after that: a moment after the summary, longer under load; it
// waits up to a minute for the record.
func recordedExit(j *jobstest.Job) (string, error) {
	path := filepath.Join(StateDir(j.StateDir).JobDir(j.GearID), ExitFile)
	var b []byte
	var err error
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if b, err = os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) > 0 {
			break
		}
	}
	return string(bytes.TrimSpace(b)), err
}

func waitJobEnded(j *jobstest.Job, name string, start time.Time, limit time.Duration) (log string, endedAt time.Duration) {
	for time.Since(start) < limit {
		if log = j.Logs(); strings.Contains(log, "gearrun: job "+name+" completed") || strings.Contains(log, "gearrun: job "+name+" failed") {
			return log, time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return log, 0
}

func processesIn(netns string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if ns, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns/net")); err == nil && ns == netns {
			out = append(out, pid)
		}
	}
	return out
}

func processName(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// processesOf lists the pids of the running (not zombie) processes whose
// executable is path, on every node of the local cluster (they share this
// machine's process table).
func processesOf(path string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == path && processAlive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// waitForRanks waits until each of the job's n ranks has written its node
// and pid into dir/<rank> (the hold and elastic modes of the multinode
// program do), and returns both by rank. A job that ends first fails the test.
func waitForRanks(t *testing.T, j *jobstest.Job, dir string, n int) (pids map[int]int, nodes map[int]string) {
	t.Helper()
	pids, nodes = map[int]int{}, map[int]string{}
	deadline := time.Now().Add(jobstest.WaitLimit)
	for len(pids) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the ranks never started; log:\n%s", j.Logs())
		}
		if s := j.SlurmState(); s != "" && s != "PENDING" && s != "RUNNING" && s != "CONFIGURING" {
			t.Fatalf("job %s before its ranks started; log:\n%s", s, j.Logs())
		}
		time.Sleep(100 * time.Millisecond)
		for r := range n {
			b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(r)))
			if f := strings.Fields(string(b)); err == nil && len(f) == 2 {
				pids[r], _ = strconv.Atoi(f[1])
				nodes[r] = f[0]
			}
		}
	}
	return pids, nodes
}

// requireOwnNamespace returns the network namespace of a rank's pid
// ("net:[...]"), the rank's node. It skips the test when that is this
// process's namespace: the node is not one of scripts/slurm-local.sh up
// --nodes, and killing it would kill this machine's processes.
func requireOwnNamespace(t *testing.T, pid int) string {
	t.Helper()
	netns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	own, _ := os.Readlink("/proc/self/ns/net")
	if err != nil || netns == own {
		jobstest.SkipMultinode(t, fmt.Sprintf("pid %d is not in a network namespace of its own (%q, %v): not a node of scripts/slurm-local.sh up --nodes", pid, netns, err))
	}
	return netns
}

// scontrolOrError runs scontrol with args and fails the test (without
// stopping it) when scontrol does.
func scontrolOrError(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("scontrol", args...).CombinedOutput(); err != nil {
		t.Errorf("scontrol %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// resumeNode opens a node whose slurmd came back and waits until it takes
// jobs again, so that the next test's job does not land on a node SLURM is
// still bringing back. The node may be back in service already
// (ReturnToService=2 when its slurmd registers).
func resumeNode(t *testing.T, node string) {
	t.Helper()
	exec.Command("scontrol", "update", "nodename="+node, "state=resume").Run()
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, _ := exec.Command("sinfo", "--noheader", "--Node", "--nodes="+node, "--format=%t").Output()
		st := strings.TrimSpace(string(out))
		if strings.HasPrefix(st, "idle") || strings.HasPrefix(st, "mix") || strings.HasPrefix(st, "alloc") {
			return
		}
		if time.Now().After(end) {
			t.Errorf("node %s is %q 30s after its slurmd came back", node, st)
			return
		}
	}
}
