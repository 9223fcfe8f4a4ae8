package rank

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func lookupMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFromLookupGear(t *testing.T) {
	info, err := FromLookup(lookupMap(map[string]string{
		EnvRank: "3", EnvWorldSize: "5", EnvLocalRank: "1", EnvLocalSize: "2",
		EnvNodeRank: "1", EnvNumNodes: "3", EnvRole: "trainer", EnvRoleRank: "0",
		EnvRdzvAddr: "127.0.0.1:7000", EnvJobID: "abc", EnvJobToken: "tok",
		EnvRdzvTimeout: "7s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := Info{Rank: 3, Size: 5, LocalRank: 1, LocalSize: 2, NodeRank: 1, NumNodes: 3,
		Role: "trainer", RoleRank: 0, RdzvAddr: "127.0.0.1:7000", RdzvTimeout: 7 * time.Second,
		JobID: "abc", Token: "tok", Source: SourceGear}
	if info != want {
		t.Fatalf("got  %+v\nwant %+v", info, want)
	}
	if strings.Contains(info.String(), "tok") {
		t.Fatalf("String prints the token: %s", info)
	}
}

func TestFromLookupRestartAndCheckpointDir(t *testing.T) {
	base := map[string]string{EnvRank: "0", EnvWorldSize: "1", EnvJobID: "abc"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		env     map[string]string
		restart int
		dir     string
	}{
		{with(), 0, ""},
		{with(EnvRestartCount, "2", EnvCheckpointDir, "/ckpt/abc"), 2, "/ckpt/abc"},
		{with(EnvTorchRestartCount, "3"), 3, ""},
		{with(EnvRestartCount, "1", EnvTorchRestartCount, "3"), 1, ""}, // gear's name wins
	} {
		info, err := FromLookup(lookupMap(c.env))
		if err != nil {
			t.Fatal(err)
		}
		if info.Restart != c.restart || info.CheckpointDir != c.dir {
			t.Errorf("%v: restart %d dir %q, want %d %q", c.env, info.Restart, info.CheckpointDir, c.restart, c.dir)
		}
	}
	_, err := FromLookup(lookupMap(with(EnvRestartCount, "-1")))
	if err == nil || !strings.Contains(err.Error(), EnvRestartCount) {
		t.Errorf("GEAR_RESTART_COUNT=-1: err %v, want one naming the variable", err)
	}
}

func TestFromLookupSlurm(t *testing.T) {
	info, err := FromLookup(lookupMap(map[string]string{
		EnvSlurmProcID: "5", EnvSlurmNTasks: "8", EnvSlurmLocalID: "1", EnvSlurmNodeID: "2",
		EnvSlurmNodeList: "gpu[01-04]", EnvSlurmJobID: "1234", EnvSlurmTasksPerNode: "2(x4)",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if info.Source != SourceSlurm || info.Rank != 5 || info.Size != 8 || info.LocalRank != 1 ||
		info.LocalSize != 2 || info.NodeRank != 2 || info.NumNodes != 4 || info.JobID != "slurm-1234" {
		t.Fatalf("got %+v", info)
	}
	if info.RdzvAddr != "gpu01:29734" || info.ServeRdzv {
		t.Fatalf("rdzv %q serve %v: want gpu01:29734 served by rank 0 only", info.RdzvAddr, info.ServeRdzv)
	}
	info, err = FromLookup(lookupMap(map[string]string{
		EnvSlurmProcID: "0", EnvSlurmNTasks: "2", EnvSlurmNodeList: "n1", EnvSlurmJobID: "9",
	}))
	if err != nil || !info.ServeRdzv {
		t.Fatalf("rank 0: %+v %v", info, err)
	}
}

func TestFromLookupErrorsNameTheVariable(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{EnvRank: "x", EnvWorldSize: "2"}, EnvRank},
		{map[string]string{EnvRank: "0"}, EnvWorldSize},
		{map[string]string{EnvRank: "2", EnvWorldSize: "2", EnvRdzvAddr: "a:1", EnvJobID: "j"}, EnvRank},
		{map[string]string{EnvRank: "0", EnvWorldSize: "2", EnvJobID: "j"}, EnvRdzvAddr},
		{map[string]string{EnvRank: "0", EnvWorldSize: "1", EnvRdzvTimeout: "soon", EnvJobID: "j"}, EnvRdzvTimeout},
		{map[string]string{EnvSlurmProcID: "0", EnvSlurmNTasks: "2", EnvSlurmNodeList: "n[1-"}, EnvSlurmNodeList},
		{map[string]string{EnvSlurmProcID: "0", EnvSlurmNTasks: "2", EnvSlurmNodeList: "n1", EnvSlurmTasksPerNode: "2(x"}, EnvSlurmTasksPerNode},
	} {
		_, err := FromLookup(lookupMap(c.env))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want it to name %s", c.env, err, c.want)
		}
	}
}

func TestTasksOnNode(t *testing.T) {
	for _, c := range []struct {
		s          string
		node, want int
	}{{"4", 0, 4}, {"2(x3),1", 2, 2}, {"2(x3),1", 3, 1}} {
		if got, err := tasksOnNode(c.s, c.node); err != nil || got != c.want {
			t.Errorf("tasksOnNode(%q, %d) = %d, %v; want %d", c.s, c.node, got, err, c.want)
		}
	}
	if _, err := tasksOnNode("2(x3)", 3); err == nil {
		t.Error("node past the list: no error")
	}
}

func TestHostIDDependsOnNetworkNamespace(t *testing.T) {
	host := func() (string, error) { return "node1", nil }
	boot := func(string) ([]byte, error) { return []byte("boot-a\n"), nil }
	a := deriveHostID(host, boot, func(string) (string, error) { return "net:[1]", nil })
	b := deriveHostID(host, boot, func(string) (string, error) { return "net:[2]", nil })
	a2 := deriveHostID(host, boot, func(string) (string, error) { return "net:[1]", nil })
	if a == b || a != a2 || !strings.HasPrefix(a, "node1/") {
		t.Fatalf("host IDs %q %q %q", a, b, a2)
	}
	t.Setenv(EnvHostID, "forced")
	if HostID() != "forced" {
		t.Fatalf("HostID ignores %s", EnvHostID)
	}
}

func TestJobLock(t *testing.T) {
	dir := t.TempDir()
	if JobAlive(dir, "job-a") {
		t.Fatal("job without a lock file is alive")
	}
	l, err := LockJob(dir, "job-a", true)
	if err != nil {
		t.Fatal(err)
	}
	if !JobAlive(dir, "job-a") {
		t.Fatal("locked job is not alive")
	}
	if _, err := LockJob(dir, "job-a", true); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second exclusive lock: %v", err)
	}
	l.Close()
	l.Close()
	if JobAlive(dir, "job-a") {
		t.Fatal("job alive after its lock was released")
	}
	if _, err := os.Stat(filepath.Join(dir, "job-a.lock")); !os.IsNotExist(err) {
		t.Fatalf("lock file left behind: %v", err)
	}
	if !JobAlive(dir, LocalJobID()) {
		t.Fatal("this process's local job is not alive")
	}
	if JobAlive(dir, "local-999999999") {
		t.Fatal("a local job of a pid that does not exist is alive")
	}
	if _, err := LockJob(dir, "../x", true); err == nil {
		t.Fatal("job ID with a slash accepted")
	}
}

// TestSharedJobLockLastRemoves: the shared holders of a job's lock (agents
// or SLURM ranks of one job on a machine) keep the job alive while any holds
// it, and the last to let go removes the file, as a launcher does with its
// exclusive lock: nothing is left in the runtime directory. A shared lock
// still fails while a launcher holds the job.
func TestSharedJobLockLastRemoves(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job-s.lock")
	a, err := LockJob(dir, "job-s", false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LockJob(dir, "job-s", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockJob(dir, "job-s", true); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("exclusive lock beside shared holders: %v", err)
	}
	a.Close()
	if !JobAlive(dir, "job-s") {
		t.Fatal("job not alive while a shared holder remains")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("lock file gone while a shared holder remains: %v", err)
	}
	b.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("lock file left behind by the last shared holder: %v", err)
	}
	if JobAlive(dir, "job-s") {
		t.Fatal("job alive after every holder let go")
	}
	l, err := LockJob(dir, "job-s", true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := LockJob(dir, "job-s", false); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("shared lock while a launcher holds the job: %v", err)
	}
}

func TestSegmentNamesRoundTrip(t *testing.T) {
	name := SegmentName("job-1", "shard.0")
	if job, ok := SegmentJob(name); !ok || job != "job-1" {
		t.Fatalf("SegmentJob(%q) = %q %v", name, job, ok)
	}
}
