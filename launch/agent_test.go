package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/rank"
)

// These tests run RunOnHosts against a stand-in for ssh that runs the remote
// command on this machine, and agents played by this test binary
// (TestAgentProcess): the protocol, output, failure and loss without root or
// sshd. cmd/gearrun's TestHostsOverSSH runs the real thing.

const envAgentProcess = "GEAR_TEST_AGENT_PROCESS"

// envAgentShm is the agents' shared-memory directory ("": /dev/shm).
const envAgentShm = "GEAR_TEST_AGENT_SHM"

// TestAgentProcess is the agent when the test binary is started as one.
func TestAgentProcess(t *testing.T) {
	if os.Getenv(envAgentProcess) == "" {
		t.Skip("the agent of the RunOnHosts tests")
	}
	lost := make(chan os.Signal, 1)
	signal.Notify(lost, syscall.SIGTERM, syscall.SIGHUP)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	err := RunAgent(context.Background(), AgentOptions{In: os.Stdin, Out: os.Stdout, Lost: lost, ShmDir: os.Getenv(envAgentShm)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// fakeRemote is a Remote whose "ssh" runs the command here, and whose agent
// is this test binary.
func fakeRemote(t *testing.T) Remote {
	t.Helper()
	dir := t.TempDir()
	ssh := filepath.Join(dir, "ssh")
	script := "#!/bin/sh\n# the last argument is the remote command\nfor a; do last=$a; done\nexec /bin/sh -c \"$last\"\n"
	if err := os.WriteFile(ssh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Remote{
		SSH:     []string{ssh},
		Gearrun: envAgentProcess + "=1 " + rank.EnvRuntimeDir + "=" + t.TempDir() + " " + self + " -test.run=^TestAgentProcess$",
	}
}

func hostsPlan(t *testing.T, hosts string, np int, script string, env ...string) *Plan {
	t.Helper()
	return placedPlan(t, hosts, Request{Groups: []Group{{NP: np, Argv: []string{"/bin/sh", "-c", script}}},
		RdzvAddr: "127.0.0.1:0", Env: env, NoTorchEnv: true})
}

// placedPlan makes the plan of req and places it on hosts (a host list).
func placedPlan(t *testing.T, hosts string, req Request) *Plan {
	t.Helper()
	p, err := NewPlan(req)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := ParseHostList(hosts)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PlaceOnHosts(hs); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunOnHostsOutputAndPlaces(t *testing.T) {
	p := hostsPlan(t, "h1:2,h2:2", 3, `i=0; while [ $i -lt 200 ]; do echo "$GEAR_RANK $GEAR_NODE_NAME $GEAR_NODE_RANK/$GEAR_NUM_NODES $GEAR_LOCAL_RANK/$GEAR_LOCAL_SIZE $i"; i=$((i+1)); done; echo "e$GEAR_RANK" >&2`)
	var out, errw geartest.Buffer
	res, err := RunOnHosts(context.Background(), p, Options{Stdout: &out, Stderr: &errw, TagOutput: true, Timeout: time.Minute}, fakeRemote(t))
	if err != nil {
		t.Fatalf("RunOnHosts: %v\n%s", err, errw.String())
	}
	want := map[int]string{0: "h1 0/2 0/2", 1: "h1 0/2 1/2", 2: "h2 1/2 0/1"}
	next := map[int]int{}
	re := regexp.MustCompile(`^\[(\d)\] (\d) (\S+ \S+ \S+) (\d+)$`)
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil || m[1] != m[2] {
			t.Fatalf("torn or untagged line %q", line)
		}
		r, _ := strconv.Atoi(m[1])
		if m[3] != want[r] || m[4] != strconv.Itoa(next[r]) {
			t.Fatalf("line %q: want rank %d's line %d, %s", line, r, next[r], want[r])
		}
		next[r]++
	}
	for r := range 3 {
		if next[r] != 200 || !strings.Contains(errw.String(), fmt.Sprintf("[%d] e%d\n", r, r)) {
			t.Errorf("rank %d: %d lines, stderr %q", r, next[r], errw.String())
		}
		if !res.Ranks[r].Started || res.Ranks[r].PID == 0 || res.Ranks[r].Status != "exited with status 0" {
			t.Errorf("rank %d: %+v", r, res.Ranks[r])
		}
	}
}

func TestRunOnHostsFailFast(t *testing.T) {
	dir := t.TempDir()
	p := hostsPlan(t, "h1:2,h2:1", 3, `echo $$ > "$D/pid.$GEAR_RANK"; if [ "$GEAR_RANK" = 2 ]; then while [ ! -e "$D/go" ]; do sleep 0.01; done; exit 3; fi; exec sleep 60`, "D="+dir)
	var errw geartest.Buffer
	done := make(chan error, 1)
	var res *Result
	go func() {
		var err error
		res, err = RunOnHosts(context.Background(), p, Options{Stdout: &errw, Stderr: &errw, Grace: 2 * time.Second, Timeout: time.Minute}, fakeRemote(t))
		done <- err
	}()
	pids := waitPIDFiles(t, dir, 3)
	os.WriteFile(filepath.Join(dir, "go"), nil, 0o644)
	err := <-done
	var je *JobError
	if !errors.As(err, &je) || je.Code != 3 {
		t.Fatalf("RunOnHosts: %v, want a JobError with code 3\n%s", err, errw.String())
	}
	if !regexp.MustCompile(`(?m)^gearrun: rank 2 \(pid \d+ on h2\) exited with status 3$`).MatchString(errw.String()) {
		t.Fatalf("no line naming rank 2 on h2:\n%s", errw.String())
	}
	for r := range 2 {
		if res.Ranks[r].Status != "killed by SIGTERM" {
			t.Errorf("rank %d: %s, want killed by SIGTERM", r, res.Ranks[r].Status)
		}
	}
	waitGone(t, pids, 5*time.Second)
}

func TestRunOnHostsLostHost(t *testing.T) {
	dir := t.TempDir()
	// Each rank writes its pid and its agent's (its parent).
	p := hostsPlan(t, "h1:1,h2:2", 3, `echo $$ > "$D/pid.$GEAR_RANK"; echo $PPID > "$D/agent.$GEAR_RANK"; exec sleep 60`, "D="+dir)
	var errw geartest.Buffer
	done := make(chan error, 1)
	go func() {
		_, err := RunOnHosts(context.Background(), p, Options{Stdout: &errw, Stderr: &errw, Grace: 2 * time.Second, Timeout: time.Minute}, fakeRemote(t))
		done <- err
	}()
	pids := waitPIDFiles(t, dir, 6)
	syscall.Kill(pids["agent.1"], syscall.SIGKILL) // h2's agent
	err := <-done
	var je *JobError
	if !errors.As(err, &je) || je.Code != ExitLaunchFailed {
		t.Fatalf("RunOnHosts: %v, want a JobError with code %d\n%s", err, ExitLaunchFailed, errw.String())
	}
	if !regexp.MustCompile(`(?m)^gearrun: host h2 \(ranks 1-2\) lost: `).MatchString(errw.String()) {
		t.Fatalf("no line naming h2 and its ranks:\n%s", errw.String())
	}
	waitGone(t, pids, 5*time.Second)
}

func TestRunOnHostsProgramMissingOnHost(t *testing.T) {
	dir := t.TempDir()
	p, err := NewPlan(Request{Groups: []Group{
		{NP: 1, Argv: []string{"/bin/sh", "-c", `echo $$ > "$D/pid.$GEAR_RANK"; exec sleep 60`}, Env: []string{"D=" + dir}},
		{NP: 1, Argv: []string{filepath.Join(dir, "missing")}},
	}, RdzvAddr: "127.0.0.1:0", NoTorchEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PlaceOnHosts([]Host{{"h1", 1}, {"h2", 1}}); err != nil {
		t.Fatal(err)
	}
	runOnHostsNotFound(t, p, fmt.Sprintf("gearrun: rank 1 on h2: program %s does not exist\n", filepath.Join(dir, "missing")))
}

// runOnHostsNotFound runs p on fake hosts and checks that it fails with
// ExitNotFound, having printed want and nothing else.
func runOnHostsNotFound(t *testing.T, p *Plan, want string) {
	t.Helper()
	var errw geartest.Buffer
	_, err := RunOnHosts(context.Background(), p, Options{Stdout: &errw, Stderr: &errw, Grace: 2 * time.Second, Timeout: time.Minute}, fakeRemote(t))
	var je *JobError
	if !errors.As(err, &je) || je.Code != ExitNotFound {
		t.Fatalf("RunOnHosts: %v, want code %d\n%s", err, ExitNotFound, errw.String())
	}
	if errw.String() != want {
		t.Fatalf("stderr %q, want only %q", errw.String(), want)
	}
}

// On a host too, a script whose #! interpreter is missing names it.
func TestRunOnHostsScriptWithMissingInterpreter(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(script, []byte("#!/no/such/interpreter\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(Request{Groups: []Group{{NP: 1, Argv: []string{script}}}, RdzvAddr: "127.0.0.1:0", NoTorchEnv: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PlaceOnHosts([]Host{{"h1", 1}}); err != nil {
		t.Fatal(err)
	}
	runOnHostsNotFound(t, p, fmt.Sprintf("gearrun: rank 0 on h1: start %s: its #! line names the interpreter /no/such/interpreter, which does not exist\n", script))
}

func TestRunOnHostsOutputDirAndTimeout(t *testing.T) {
	p := hostsPlan(t, "h1:1,h2:1", 2, `echo "out $GEAR_RANK"; echo "err $GEAR_RANK" >&2; exec sleep 60`)
	out := t.TempDir()
	var errw geartest.Buffer
	_, err := RunOnHosts(context.Background(), p, Options{Stdout: &errw, Stderr: &errw, OutputDir: out, Timeout: 500 * time.Millisecond, Grace: time.Second}, fakeRemote(t))
	var je *JobError
	if !errors.As(err, &je) || je.Code != ExitTimeout {
		t.Fatalf("RunOnHosts: %v, want code %d\n%s", err, ExitTimeout, errw.String())
	}
	for r := range 2 {
		for _, stream := range []string{"out", "err"} {
			name := fmt.Sprintf("rank.%d.std%s", r, stream)
			b, _ := os.ReadFile(filepath.Join(out, name))
			if want := fmt.Sprintf("%s %d\n", stream, r); string(b) != want {
				t.Errorf("%s: %q, want %q", name, b, want)
			}
		}
	}
	if errw.String() != "gearrun: job timed out after 500ms\n" {
		t.Errorf("stderr %q", errw.String())
	}
}

func TestRunOnHostsChattyLoginShell(t *testing.T) {
	p := hostsPlan(t, "h1:1", 1, `echo "rank $GEAR_RANK"`)
	rem := fakeRemote(t)
	ssh := filepath.Join(t.TempDir(), "ssh")
	os.WriteFile(ssh, []byte("#!/bin/sh\necho 'Welcome to h1!'\nprintf 'no newline '\nexec "+rem.SSH[0]+" \"$@\"\n"), 0o755)
	rem.SSH = []string{ssh}
	var out, errw geartest.Buffer
	if _, err := RunOnHosts(context.Background(), p, Options{Stdout: &out, Stderr: &errw, TagOutput: true}, rem); err != nil {
		t.Fatalf("RunOnHosts: %v\n%s", err, errw.String())
	}
	if out.String() != "[0] rank 0\n" || !strings.Contains(errw.String(), "gearrun: h1: Welcome to h1!\n") {
		t.Fatalf("stdout %q, stderr %q", out.String(), errw.String())
	}
}

func TestRunRefusesAPlanOnHosts(t *testing.T) {
	p := hostsPlan(t, "h1:1", 1, "true")
	if _, err := Run(context.Background(), p, Options{}); err == nil || !strings.Contains(err.Error(), "RunOnHosts") {
		t.Fatalf("Run of a plan on hosts: %v", err)
	}
}

func TestRunOnHostsSSHFails(t *testing.T) {
	p := hostsPlan(t, "h1:1", 1, "true")
	rem := fakeRemote(t)
	ssh := filepath.Join(t.TempDir(), "ssh")
	os.WriteFile(ssh, []byte("#!/bin/sh\necho 'h1: Permission denied (publickey).' >&2\nexit 255\n"), 0o755)
	rem.SSH = []string{ssh}
	var errw geartest.Buffer
	_, err := RunOnHosts(context.Background(), p, Options{Stdout: &errw, Stderr: &errw}, rem)
	if err == nil || !strings.Contains(errw.String(), "gearrun: host h1 (rank 0) lost: ssh exited with status 255 before its agent started the ranks (h1: Permission denied (publickey).)") {
		t.Fatalf("RunOnHosts: %v\n%s", err, errw.String())
	}
}

func waitPIDFiles(t *testing.T, dir string, n int) map[string]int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		pids := map[string]int{}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				pids[e.Name()] = pid
			}
		}
		if len(pids) >= n {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pid files: %v", len(pids), n, pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitGone(t *testing.T, pids map[string]int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var alive []string
		for name, pid := range pids {
			if rank.ProcessAlive(pid) {
				alive = append(alive, name)
			}
		}
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			sort.Strings(alive)
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("still alive after %v: %v", d, alive)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
