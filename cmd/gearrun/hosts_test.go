package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/shmname"
	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// The multi-host tests run gearrun against real sshd daemons, one in each of
// N network namespaces (the hosts, 10.252.X.2 and up), joined by a bridge in a
// switch namespace; gearrun runs in a namespace of its own (10.252.X.1). They
// need root, iproute2 and OpenSSH (server and client); without them they are
// skipped, unless GEAR_REQUIRE_MULTINODE=1, which makes a skip a failure.

// envHostsRank makes the test binary a rank of TestHostsRank's kind.
const envHostsRank = "GEARRUN_TEST_HOSTS_RANK"

// sshCluster is N hosts with an sshd each, and a namespace for gearrun.
type sshCluster struct {
	dir      string   // keys, configs, pid files
	key      string   // the client's private key
	launcher string   // gearrun's namespace
	rdzvHost string   // gearrun's address there
	hosts    []string // the hosts' addresses (as gearrun names them)
	netns    []string // the hosts' namespaces
	ifaces   []string // the hosts' interfaces on the bridge
	sshdPIDs []int
	nsID     []string // the hosts' network namespaces as /proc/PID/ns/net reads
}

// requireMultinode skips t, or fails it under GEAR_REQUIRE_MULTINODE=1.
func requireMultinode(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("GEAR_REQUIRE_MULTINODE") == "1" {
		t.Fatalf("%s (GEAR_REQUIRE_MULTINODE=1)", msg)
	}
	t.Skip(msg)
}

func newSSHCluster(t *testing.T, n int) *sshCluster {
	t.Helper()
	if os.Geteuid() != 0 {
		requireMultinode(t, "multi-host ssh test: needs root to create network namespaces")
	}
	for _, tool := range []string{"ip", "/usr/sbin/sshd", "ssh-keygen", "ssh"} {
		if _, err := exec.LookPath(tool); err != nil {
			requireMultinode(t, "multi-host ssh test: %s not installed (apt-get install -y iproute2 openssh-server openssh-client)", tool)
		}
	}
	var b [4]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:3])
	subnet := fmt.Sprintf("10.252.%d", b[3])
	c := &sshCluster{dir: t.TempDir()}
	run := func(name string, args ...string) error {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	sw, lns := "gearssh-"+id+"-s", "gearssh-"+id+"-l"
	if err := run("ip", "netns", "add", sw); err != nil {
		requireMultinode(t, "multi-host ssh test: cannot create network namespaces here: %v", err)
	}
	var made []string // namespaces, removed last
	made = append(made, sw)
	t.Cleanup(func() {
		for _, pid := range c.sshdPIDs {
			if p, err := os.FindProcess(pid); err == nil {
				p.Kill()
			}
		}
		// Whatever a failed test left on a host (an sshd session of a cut
		// connection) goes with it.
		for k := range c.nsID {
			for _, p := range c.hostProcesses(k) {
				pid, _ := strconv.Atoi(strings.Fields(p)[0])
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		for _, ns := range made {
			run("ip", "netns", "del", ns)
		}
		if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), id) {
			t.Errorf("namespaces left behind: %s", out)
		}
		if out, _ := exec.Command("ip", "link", "show").Output(); strings.Contains(string(out), id) {
			t.Errorf("links left behind: %s", out)
		}
	})
	must := func(name string, args ...string) {
		t.Helper()
		if err := run(name, args...); err != nil {
			t.Fatal(err)
		}
	}
	must("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
	must("ip", "-n", sw, "link", "set", "br0", "up")
	// join puts namespace ns on the bridge at addr, through a veth pair made
	// inside the switch namespace (so nothing touches the root namespace).
	join := func(ns, tag, addr string) string {
		in, out := "g"+tag+"a"+id, "g"+tag+"b"+id
		must("ip", "netns", "add", ns)
		made = append(made, ns)
		must("ip", "-n", sw, "link", "add", out, "type", "veth", "peer", "name", in, "netns", ns)
		must("ip", "-n", sw, "link", "set", out, "master", "br0")
		must("ip", "-n", sw, "link", "set", out, "up")
		must("ip", "-n", ns, "addr", "add", addr+"/24", "dev", in)
		must("ip", "-n", ns, "link", "set", in, "up")
		must("ip", "-n", ns, "link", "set", "lo", "up")
		return in
	}
	c.launcher, c.rdzvHost = lns, subnet+".1"
	join(lns, "l", subnet+".1")

	c.key = filepath.Join(c.dir, "id_ed25519")
	hostKey := filepath.Join(c.dir, "host_ed25519")
	must("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gear-test", "-f", c.key)
	must("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gear-test-host", "-f", hostKey)
	authorized := filepath.Join(c.dir, "authorized_keys")
	pub, err := os.ReadFile(c.key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(authorized, pub, 0o600); err != nil {
		t.Fatal(err)
	}
	// sshd needs its privilege separation directory.
	os.MkdirAll("/run/sshd", 0o755)
	for k := range n {
		ns := fmt.Sprintf("gearssh-%s-%d", id, k)
		addr := fmt.Sprintf("%s.%d", subnet, k+2)
		c.ifaces = append(c.ifaces, join(ns, strconv.Itoa(k), addr))
		pidFile := filepath.Join(c.dir, fmt.Sprintf("sshd.%d.pid", k))
		conf := filepath.Join(c.dir, fmt.Sprintf("sshd.%d.conf", k))
		cfg := strings.Join([]string{
			"ListenAddress " + addr,
			"Port 22",
			"HostKey " + hostKey,
			"PidFile " + pidFile,
			"AuthorizedKeysFile " + authorized,
			"UsePAM no",
			"StrictModes no",
			"PermitRootLogin prohibit-password",
			"PasswordAuthentication no",
			"KbdInteractiveAuthentication no",
			"PrintMotd no",
			"PrintLastLog no",
			"LogLevel ERROR",
			"",
		}, "\n")
		if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		// A file, not a pipe: sshd's sessions inherit it, and one left by a
		// cut connection must not hold up Wait.
		logPath := filepath.Join(c.dir, fmt.Sprintf("sshd.%d.log", k))
		logFile, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		sshd := exec.Command("ip", "netns", "exec", ns, "/usr/sbin/sshd", "-D", "-e", "-f", conf)
		sshd.Stdout, sshd.Stderr = logFile, logFile
		err = sshd.Start()
		logFile.Close()
		if err != nil {
			t.Fatal(err)
		}
		readLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
		c.sshdPIDs = append(c.sshdPIDs, sshd.Process.Pid)
		exited := make(chan struct{})
		go func() {
			sshd.Wait()
			close(exited)
		}()
		t.Cleanup(func() {
			sshd.Process.Kill()
			<-exited
			if l := readLog(); t.Failed() && l != "" {
				t.Logf("sshd on %s:\n%s", addr, l)
			}
		})
		deadline := time.Now().Add(underLoad)
		for !exists(pidFile) {
			select {
			case <-exited:
				t.Fatalf("sshd in %s ended: %s", ns, readLog())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("sshd in %s wrote no pid file in %v: %s", ns, underLoad, readLog())
			}
			time.Sleep(10 * time.Millisecond)
		}
		nsID, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", sshd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		c.hosts = append(c.hosts, addr)
		c.netns = append(c.netns, ns)
		c.nsID = append(c.nsID, nsID)
	}
	return c
}

// hostfile writes a hostfile giving each host slots slots.
func (c *sshCluster) hostfile(t *testing.T, slots int) string {
	var b strings.Builder
	b.WriteString("# the test's hosts\n\n")
	for _, h := range c.hosts {
		fmt.Fprintf(&b, "%s slots=%d   # a namespace\n", h, slots)
	}
	path := filepath.Join(t.TempDir(), "hostfile")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// gearrun returns gearrun (this test binary) in the launcher's namespace,
// reaching the hosts over ssh with the test's key; the remote agent is this
// binary too. rankArgs follow the program (this binary).
func (c *sshCluster) gearrun(t *testing.T, args []string, rankArgs ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	full := []string{"netns", "exec", c.launcher, self,
		"--ssh", "-i " + c.key + " -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
		"--remote-gearrun", envAsGearrun + "=1 " + rank.EnvRuntimeDir + "=" + runtime + " " + self}
	full = append(full, args...)
	full = append(full, self)
	full = append(full, rankArgs...)
	cmd := exec.Command("ip", full...)
	cmd.Env = append(os.Environ(), envAsGearrun+"=1", rank.EnvRuntimeDir+"="+runtime)
	t.Cleanup(func() {
		if cmd.Process != nil && cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// hostProcesses lists the processes in host k's network namespace other than
// its sshd listener: what a job left on the host.
func (c *sshCluster) hostProcesses(k int) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == c.sshdPIDs[k] {
			continue
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil || ns != c.nsID[k] {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if len(cmdline) == 0 {
			continue // a zombie on its way out, or a kernel thread
		}
		out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out
}

// waitHostsEmpty waits until no host has a process of the job left.
func (c *sshCluster) waitHostsEmpty(t *testing.T, d time.Duration, hosts ...int) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var left []string
		for _, k := range hosts {
			left = append(left, c.hostProcesses(k)...)
		}
		if len(left) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("processes left on the hosts after %v: %v", d, left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func allHosts(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestHostsRank is a rank of TestHostsOverSSH's allreduce (it does nothing in
// a plain test run): AllReduce over a world of 3 hosts of 2 ranks.
func TestHostsRank(t *testing.T) {
	if os.Getenv(envHostsRank) == "" {
		t.Skip("a rank of TestHostsOverSSH")
	}
	code := hostsRank()
	os.Exit(code) // the rank's verdict, without the test framework's lines
}

func hostsRank() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := rank.Init(ctx)
	if err != nil {
		fmt.Println("init:", err)
		return 1
	}
	defer w.Close()
	c, err := collective.New(ctx, w)
	if err != nil {
		fmt.Println("collective:", err)
		return 1
	}
	defer c.Close()
	// The shared-memory segments the rank maps: its host's, which holds the
	// inboxes of every rank of the host (unlinked once mapped, so it shows in
	// the maps only).
	maps, _ := os.ReadFile("/proc/self/maps")
	inboxes := map[string]bool{}
	for _, line := range strings.Split(string(maps), "\n") {
		if i := strings.Index(line, "/dev/shm/"+shmname.Make(w.JobID(), shmname.Coll, "")); i >= 0 {
			inboxes[line[i:]] = true
		}
	}
	const count = 100003
	f := make([]float64, count)
	n := make([]int64, 13)
	for i := range f {
		f[i] = float64((w.Rank() + 1) * (i + 1))
	}
	for i := range n {
		n[i] = int64(w.Rank()*1000 + i)
	}
	if err := collective.AllReduce(ctx, c, f, collective.Sum); err != nil {
		fmt.Println("allreduce:", err)
		return 1
	}
	if err := collective.AllReduce(ctx, c, n, collective.Max); err != nil {
		fmt.Println("allreduce max:", err)
		return 1
	}
	size := w.Size()
	for i := range f {
		if want := float64(size * (size + 1) / 2 * (i + 1)); f[i] != want {
			fmt.Printf("allreduce: element %d = %v, want %v\n", i, f[i], want)
			return 1
		}
	}
	for i := range n {
		if want := int64((size-1)*1000 + i); n[i] != want {
			fmt.Printf("allreduce max: element %d = %v, want %v\n", i, n[i], want)
			return 1
		}
	}
	if err := c.Barrier(ctx); err != nil {
		fmt.Println("barrier:", err)
		return 1
	}
	fmt.Printf("ok rank %d/%d node %s local %s/%s host %s hosts %v shm inboxes %d\n", w.Rank(), size, rank.NodeName(),
		os.Getenv(rank.EnvLocalRank), os.Getenv(rank.EnvLocalSize), w.Host(), c.Hosts(), len(inboxes))
	return 0
}

func TestHostsOverSSH(t *testing.T) {
	const nHosts, slots = 3, 2
	c := newSSHCluster(t, nHosts)
	hostfile := c.hostfile(t, slots)

	t.Run("dry-run", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		cmd := c.gearrun(t, []string{"--dry-run", "--json", "--hostfile", hostfile, "-np", "5"})
		if got := dryRunSize(t, c.gearrun(t, []string{"--dry-run", "--json", "--hostfile", hostfile})); got != nHosts*slots {
			t.Errorf("without -np: %d ranks, want one per slot, %d", got, nHosts*slots)
		}
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("gearrun: %v\n%s", err, stderr.String())
		}
		var plan launch.Plan
		if err := json.Unmarshal(stdout.Bytes(), &plan); err != nil {
			t.Fatal(err)
		}
		// The coordinator listens where the hosts reach gearrun, not on
		// every address.
		if plan.RdzvAddr != c.rdzvHost+":0" || !reflect.DeepEqual(plan.Hosts, c.hosts) || plan.NumNodes != 3 {
			t.Fatalf("rendezvous %s, hosts %v, %d nodes; want %s:0 and %v", plan.RdzvAddr, plan.Hosts, plan.NumNodes, c.rdzvHost, c.hosts)
		}
		if plan.Ranks[4].Host != c.hosts[2] || plan.Ranks[4].LocalSize != 1 || plan.Token != "****" {
			t.Fatalf("rank 4: %+v, token %q", plan.Ranks[4], plan.Token)
		}
	})

	t.Run("allreduce", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		cmd := c.gearrun(t, []string{"--hostfile", hostfile, "--timeout", "90s",
			"-x", envAsGearrun + "=0", "-x", envHostsRank + "=1", "-np", "6"},
			"-test.run=^TestHostsRank$", "-test.count=1")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			t.Fatalf("gearrun: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
		t.Logf("6 ranks on 3 hosts over ssh: %v", time.Since(start).Round(time.Millisecond))
		want := "hosts [[0 1] [2 3] [4 5]] shm inboxes 1"
		for r := range 6 {
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d\] ok rank %d/6 node %s local %d/2 host %s/\S+ %s$`,
				r, r, regexp.QuoteMeta(c.hosts[r/2]), r%2, regexp.QuoteMeta(c.hosts[r/2]), regexp.QuoteMeta(want)))
			if !re.MatchString(stdout.String()) {
				t.Errorf("no line of rank %d on %s with 3 hosts of 2 ranks; stdout:\n%s\nstderr:\n%s", r, c.hosts[r/2], stdout.String(), stderr.String())
			}
		}
		c.waitHostsEmpty(t, underLoad, allHosts(nHosts)...)
		t.Logf("stdout:\n%s", stdout.String())
	})

	t.Run("failfast", func(t *testing.T) {
		dir := t.TempDir()
		const grace = 2 * time.Second
		var stderr bytes.Buffer
		cmd := c.gearrun(t, []string{"--hostfile", hostfile, "--grace", grace.String(),
			"-x", envHelper + "=failfast", "-x", envDir + "=" + dir, "-x", envFailRank + "=3", "-np", "6"})
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// 6 ranks, 5 of them with a grandchild.
		pids := waitForFiles(t, dir, 11, underLoad)
		start := time.Now()
		writeFile(dir, "go", 0)
		var err error
		select {
		case err = <-done:
		case <-time.After(grace + underLoad):
			t.Fatalf("gearrun did not end after rank 3 failed; stderr:\n%s", stderr.String())
		}
		took := time.Since(start)
		if code := exitCode(err); code != 3 {
			t.Fatalf("gearrun exit code %d, want 3; stderr:\n%s", code, stderr.String())
		}
		assertAllGone(t, pids, time.Now().Add(underLoad))
		empty := c.waitHostsEmpty(t, underLoad, allHosts(nHosts)...)
		t.Logf("rank 3 failed on %s: gearrun ended in %v, every host empty %v later", c.hosts[1], took.Round(time.Millisecond), empty.Round(time.Millisecond))
		re := regexp.MustCompile(`(?m)^gearrun: rank 3 \(pid \d+ on ` + regexp.QuoteMeta(c.hosts[1]) + `\) exited with status 3$`)
		if !re.MatchString(stderr.String()) {
			t.Fatalf("no line naming rank 3, its host and its status; stderr:\n%s", stderr.String())
		}
		t.Logf("stderr:\n%s", stderr.String())
	})

	t.Run("ssh-dropped", func(t *testing.T) {
		dir := t.TempDir()
		var stderr bytes.Buffer
		cmd := c.gearrun(t, []string{"--hostfile", hostfile, "--grace", "5s",
			"-x", envHelper + "=hold", "-x", envDir + "=" + dir, "-np", "6"})
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		waitForFiles(t, dir, 12, underLoad)
		const lost = 2
		sshPID := sshClientOf(t, cmd.Process.Pid, c.hosts[lost])
		if len(c.hostProcesses(lost)) == 0 {
			t.Fatal("no processes on the host before its ssh was killed")
		}
		start := time.Now()
		syscall.Kill(sshPID, syscall.SIGKILL)
		// The bound: the host is empty within 2 s (measured
		// generously: polled until the deadline).
		empty := c.waitHostsEmpty(t, underLoad, lost)
		var err error
		select {
		case err = <-done:
		case <-time.After(underLoad):
			t.Fatalf("gearrun did not end after the ssh of %s was killed; stderr:\n%s", c.hosts[lost], stderr.String())
		}
		took := time.Since(start)
		if code := exitCode(err); code == 0 {
			t.Fatalf("gearrun exited 0 after losing a host; stderr:\n%s", stderr.String())
		}
		c.waitHostsEmpty(t, underLoad, allHosts(nHosts)...)
		t.Logf("ssh to %s killed: its host empty in %v, gearrun ended in %v (exit %d)", c.hosts[lost], empty.Round(time.Millisecond), took.Round(time.Millisecond), exitCode(err))
		re := regexp.MustCompile(`(?m)^gearrun: host ` + regexp.QuoteMeta(c.hosts[lost]) + ` \(ranks 4-5\) lost: ssh killed by SIGKILL`)
		if !re.MatchString(stderr.String()) {
			t.Fatalf("no line naming the lost host and its ranks; stderr:\n%s", stderr.String())
		}
		t.Logf("stderr:\n%s", stderr.String())
	})

	t.Run("sigint", func(t *testing.T) {
		dir := t.TempDir()
		var stdout, stderr bytes.Buffer
		cmd := c.gearrun(t, []string{"--hostfile", hostfile, "--grace", "5s",
			"-x", envHelper + "=sigint", "-x", envDir + "=" + dir, "-np", "6"})
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitForFiles(t, dir, 12, underLoad)
		start := time.Now()
		cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		took := time.Since(start)
		if code := exitCode(err); code != 130 {
			t.Fatalf("gearrun exit code %d, want 130; stderr:\n%s", code, stderr.String())
		}
		for r := range 6 {
			if !strings.Contains(stdout.String(), fmt.Sprintf("[%d] rank %d got SIGINT\n", r, r)) {
				t.Errorf("rank %d on %s did not get SIGINT; stdout:\n%s\nstderr:\n%s", r, c.hosts[r/2], stdout.String(), stderr.String())
			}
		}
		c.waitHostsEmpty(t, underLoad, allHosts(nHosts)...)
		t.Logf("SIGINT reached the 6 ranks on 3 hosts; gearrun ended in %v", took.Round(time.Millisecond))
	})

	t.Run("gearrun-killed", func(t *testing.T) {
		dir := t.TempDir()
		cmd := c.gearrun(t, []string{"--hostfile", hostfile, "-x", envHelper + "=hold", "-x", envDir + "=" + dir, "-np", "6"})
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitForFiles(t, dir, 12, underLoad)
		start := time.Now()
		cmd.Process.Kill()
		cmd.Wait()
		empty := c.waitHostsEmpty(t, underLoad, allHosts(nHosts)...)
		t.Logf("gearrun killed with SIGKILL: every host empty in %v", empty.Round(time.Millisecond))
		_ = start
	})

	t.Run("sshd-session-killed", func(t *testing.T) {
		dir := t.TempDir()
		var stderr bytes.Buffer
		cmd := c.gearrun(t, []string{"--hostfile", hostfile, "--grace", "5s",
			"-x", envHelper + "=hold", "-x", envDir + "=" + dir, "-np", "6"})
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		pids := waitForFiles(t, dir, 12, underLoad)
		const lost = 1
		// Rank 2's parent is host 1's agent, whose parent is sshd's session.
		agent := parentOf(t, pids["pid.2"])
		session := parentOf(t, agent)
		start := time.Now()
		syscall.Kill(session, syscall.SIGKILL)
		empty := c.waitHostsEmpty(t, underLoad, lost)
		var err error
		select {
		case err = <-done:
		case <-time.After(underLoad):
			t.Fatalf("gearrun did not end after the sshd session on %s was killed; stderr:\n%s", c.hosts[lost], stderr.String())
		}
		took := time.Since(start)
		if code := exitCode(err); code == 0 {
			t.Fatalf("gearrun exited 0 after losing a host; stderr:\n%s", stderr.String())
		}
		c.waitHostsEmpty(t, underLoad, allHosts(nHosts)...)
		re := regexp.MustCompile(`(?m)^gearrun: host ` + regexp.QuoteMeta(c.hosts[lost]) + ` \(ranks 2-3\) lost: `)
		if !re.MatchString(stderr.String()) {
			t.Fatalf("no line naming the lost host and its ranks; stderr:\n%s", stderr.String())
		}
		t.Logf("sshd session on %s killed: its host empty in %v, gearrun ended in %v (exit %d); stderr:\n%s",
			c.hosts[lost], empty.Round(time.Millisecond), took.Round(time.Millisecond), exitCode(err), stderr.String())
	})

	// Last: the host stays cut off.
	t.Run("elastic-restart", func(t *testing.T) { testElasticRestart(t, c, slots) })
	t.Run("host-cut-off", func(t *testing.T) { testHostCutOff(t, c, hostfile, 2) })
}

// shrinkHelper is a rank of an elastic job with a restart: it joins, says
// its generation, world and host, and writes its pid; generation 0 holds,
// later ones pass an AllReduce over the world and end.
func shrinkHelper(r int, dir string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := rank.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	defer w.Close()
	gen := w.RestartCount()
	fmt.Printf("rank %d gen %d size %d node %s\n", r, gen, w.Size(), rank.NodeName())
	writeFile(dir, fmt.Sprintf("pid.%d.%d", gen, r), os.Getpid())
	if gen == 0 {
		select {}
	}
	c, err := collective.New(ctx, w)
	if err != nil {
		fmt.Fprintln(os.Stderr, "collective:", err)
		return 1
	}
	defer c.Close()
	v := []int64{int64(r + 1)}
	if err := collective.AllReduce(ctx, c, v, collective.Sum); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		return 1
	}
	fmt.Printf("rank %d gen %d allreduce %d\n", r, gen, v[0])
	return 0
}

// testElasticRestart runs -np 2:4 with one restart on 2 hosts of 2 slots and
// cuts the second off: gearrun names it, and the next generation runs 2
// ranks on the first host and ends 0. No process of the job is left on any
// host, and no segment of it in /dev/shm.
func testElasticRestart(t *testing.T, c *sshCluster, slots int) {
	dir := t.TempDir()
	hostfile := filepath.Join(t.TempDir(), "hostfile")
	os.WriteFile(hostfile, []byte(fmt.Sprintf("%s slots=%d\n%s slots=%d\n", c.hosts[0], slots, c.hosts[1], slots)), 0o644)
	var b [6]byte
	rand.Read(b[:])
	jobID := "elastic-" + hex.EncodeToString(b[:])
	var stdout, stderr bytes.Buffer
	cmd := c.gearrun(t, []string{"--hostfile", hostfile, "--grace", "2s", "--max-restarts", "1", "--job-id", jobID,
		"-x", envHelper + "=shrink", "-x", envDir + "=" + dir, "-np", "2:4"})
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pids := waitForFiles(t, dir, 4, underLoad)
	cut := map[string]int{"agent": parentOf(t, pids["pid.0.2"]), "pid.0.2": pids["pid.0.2"], "pid.0.3": pids["pid.0.3"]}
	k := 1
	start := time.Now()
	if out, err := exec.Command("ip", "-n", c.netns[k], "link", "set", c.ifaces[k], "down").CombinedOutput(); err != nil {
		t.Fatalf("ip link set down: %v: %s", err, out)
	}
	defer func() {
		if out, err := exec.Command("ip", "-n", c.netns[k], "link", "set", c.ifaces[k], "up").CombinedOutput(); err != nil {
			t.Errorf("ip link set up: %v: %s", err, out)
		}
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("gearrun did not end after %s was cut off; stderr:\n%s\nstdout:\n%s", c.hosts[k], stderr.String(), stdout.String())
	}
	took := time.Since(start)
	if code := exitCode(err); code != 0 {
		t.Fatalf("gearrun exit code %d, want 0; stderr:\n%s\nstdout:\n%s", code, stderr.String(), stdout.String())
	}
	re := regexp.MustCompile(`(?m)^gearrun: restart 1 of 1: host ` + regexp.QuoteMeta(c.hosts[k]) + ` \(ranks 2-3\) lost: unreachable.*; next world: 2 ranks on ` + regexp.QuoteMeta(c.hosts[0]) + `$`)
	if !re.MatchString(stderr.String()) {
		t.Errorf("no restart line naming the lost host and the next world; stderr:\n%s", stderr.String())
	}
	out := stdout.String()
	for r := range 4 {
		if want := fmt.Sprintf("] rank %d gen 0 size 4 ", r); !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	for r := range 2 {
		for _, want := range []string{fmt.Sprintf("[%d] rank %d gen 1 size 2 node %s", r, r, c.hosts[0]), fmt.Sprintf("[%d] rank %d gen 1 allreduce 3", r, r)} {
			if !strings.Contains(out, want) {
				t.Errorf("stdout lacks %q", want)
			}
		}
	}
	if strings.Contains(out, "gen 1 size 4") || strings.Contains(out, "rank 2 gen 1") {
		t.Errorf("generation 1 is not 2 ranks:\n%s", out)
	}
	c.waitHostsEmpty(t, underLoad, 0)
	assertAllGone(t, cut, start.Add(agentSilenceForTest+underLoad))
	for end := time.Now().Add(underLoad); ; time.Sleep(50 * time.Millisecond) {
		left, _ := filepath.Glob("/dev/shm/" + rank.SegmentName(jobID, "*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Errorf("segments of the job left: %v", left)
			break
		}
	}
	t.Logf("%s cut off: the job went on with 2 ranks on %s and ended 0 after %v; stderr:\n%s\nstdout:\n%s",
		c.hosts[k], c.hosts[0], took.Round(time.Millisecond), stderr.String(), out)
}

// dryRunSize runs a dry run and returns the plan's number of ranks.
func dryRunSize(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gearrun --dry-run: %v", err)
	}
	var plan launch.Plan
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatal(err)
	}
	return len(plan.Ranks)
}

// testHostCutOff takes host k off the network in the middle of a job (its
// interface down: nothing is closed, nothing answers). The coordinator misses
// its ranks' heartbeats, gearrun names the host and stops the others, and the
// host's agent, hearing no more pings, kills its ranks.
func testHostCutOff(t *testing.T, c *sshCluster, hostfile string, k int) {
	dir := t.TempDir()
	var stderr bytes.Buffer
	cmd := c.gearrun(t, []string{"--hostfile", hostfile, "--grace", "2s",
		"-x", envHelper + "=rdzvwait", "-x", envDir + "=" + dir, "-np", "6"})
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pids := waitForFiles(t, dir, 6, underLoad)
	cut := map[string]int{"agent": parentOf(t, pids[fmt.Sprintf("pid.%d", 2*k)])}
	for r := 2 * k; r < 2*k+2; r++ {
		cut[fmt.Sprintf("pid.%d", r)] = pids[fmt.Sprintf("pid.%d", r)]
	}
	start := time.Now()
	if out, err := exec.Command("ip", "-n", c.netns[k], "link", "set", c.ifaces[k], "down").CombinedOutput(); err != nil {
		t.Fatalf("ip link set down: %v: %s", err, out)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(agentSilenceForTest + underLoad):
		t.Fatalf("gearrun did not end after %s was cut off; stderr:\n%s", c.hosts[k], stderr.String())
	}
	took := time.Since(start)
	if code := exitCode(err); code != 1 {
		t.Fatalf("gearrun exit code %d, want 1; stderr:\n%s", code, stderr.String())
	}
	re := regexp.MustCompile(`(?m)^gearrun: host ` + regexp.QuoteMeta(c.hosts[k]) + fmt.Sprintf(` \(ranks %d-%d\) lost: unreachable`, 2*k, 2*k+1))
	if !re.MatchString(stderr.String()) {
		t.Fatalf("no line naming the cut-off host and its ranks; stderr:\n%s", stderr.String())
	}
	others := []int{}
	for i := range c.hosts {
		if i != k {
			others = append(others, i)
		}
	}
	c.waitHostsEmpty(t, underLoad, others...)
	assertAllGone(t, cut, start.Add(agentSilenceForTest+underLoad))
	t.Logf("%s cut off: gearrun ended in %v naming it, its agent and ranks gone %v after the cut; stderr:\n%s",
		c.hosts[k], took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), stderr.String())
}

// agentSilenceForTest is launch's agentSilence: how long an agent waits for
// its launcher's pings.
const agentSilenceForTest = 10 * time.Second

// parentOf is pid's parent.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil || ppid <= 1 {
		t.Fatalf("parent of %d: %q", pid, f[1])
	}
	return ppid
}

// sshClientOf finds the ssh client that gearrun (pid) runs to host.
func sshClientOf(t *testing.T, gearrun int, host string) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := string(stat[bytes.LastIndexByte(stat, ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 2 || f[1] != strconv.Itoa(gearrun) {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) == "ssh" && slicesContains(args, host) {
			return pid
		}
	}
	t.Fatalf("no ssh client of gearrun (pid %d) to %s", gearrun, host)
	return 0
}

func slicesContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestHostFlagErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "hosts")
	os.WriteFile(bad, []byte("# rack 1\nnode1 slots=2\n\nnode2 slots=zero\n"), 0o644)
	good := filepath.Join(dir, "hosts.good")
	os.WriteFile(good, []byte("node1 slots=2\nnode2\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--hostfile", bad, "-np", "2", "true"}, "launch: hostfile " + bad + ":4: slots=zero: want a number from 1 to 65536"},
		{[]string{"--hostfile", good, "-np", "4", "true"}, "launch: 4 ranks but the hosts have 3 slots (node1:2,node2:1)"},
		{[]string{"-H", "node1:2", "-np", "1", "true", ":", "-np", "2", "true"}, "launch: 3 ranks but the hosts have 2 slots (node1:2)"},
		{[]string{"--hostfile", filepath.Join(dir, "missing"), "-np", "1", "true"}, "hostfile: open " + filepath.Join(dir, "missing")},
		{[]string{"-H", "a:x", "-np", "1", "true"}, `launch: -H "a:x": host "a": slots "x"`},
		{[]string{"-H", "a", "--hostfile", good, "-np", "1", "true"}, "-H and --hostfile: give one"},
		{[]string{"--ssh", "-p 22", "-np", "1", "true"}, "--ssh and --remote-gearrun need -H or --hostfile"},
		{[]string{"-H", "node1:2", "true", ":", "true"}, "group 0 (true): -np 0: -np N is required"},
		{[]string{"true"}, "group 0 (true): -np 0: -np N is required"},
		{[]string{"-H", "127.0.0.1", "--ssh", "-i 'key", "-np", "1", "true"}, `--ssh "-i 'key": unterminated '`},
	} {
		var out, errw bytes.Buffer
		code := run(c.args, stdio{strings.NewReader(""), &out, &errw})
		if code != 2 || !strings.Contains(errw.String(), "gearrun: "+c.want) {
			t.Errorf("gearrun %s: exit %d, stderr %q; want 2 and %q", strings.Join(c.args, " "), code, errw.String(), c.want)
		}
	}
}

func TestSplitWords(t *testing.T) {
	got, err := splitWords(` -p 2222 -i '/keys/my key' -o "ProxyJump=a b" x\ y  `)
	want := []string{"-p", "2222", "-i", "/keys/my key", "-o", "ProxyJump=a b", "x y"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("splitWords = %q, %v; want %q", got, err, want)
	}
	if q := shellQuote("/a b/it's"); q != `'/a b/it'\''s'` {
		t.Errorf("shellQuote: %s", q)
	}
}
