package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gear-rl/gear/launch"
	"github.com/gear-rl/gear/rank"
)

// TestTopJSONOnceOnHosts runs the job on 2 hosts (gearrun -H) through a
// stand-in for ssh that runs the remote command on this machine, and reads
// it with gearrun top --json --once from a shared-memory directory that holds
// none of its segments: top shows what the agents sent the launcher (the
// figures' file in the runtime directory), both ranks with their calls and
// tables, and the shards' rows. What it does not test: a real ssh between
// machines (cmd/gearrun's TestHostsOverSSH machinery, which needs network
// namespaces) and SLURM jobs.
func TestTopJSONOnceOnHosts(t *testing.T) {
	job := jobID(t)
	bin := t.TempDir()
	ssh := "#!/bin/sh\n# the last argument is the remote command\nfor a; do last=$a; done\nexec /bin/sh -c \"$last\"\n"
	if err := os.WriteFile(filepath.Join(bin, "ssh"), []byte(ssh), 0o755); err != nil {
		t.Fatal(err)
	}
	rt := t.TempDir()
	env := append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), rank.EnvRuntimeDir+"="+rt)
	cmd := exec.Command(bins.Path(t, "gearrun"), "--job-id", job, "-H", "h1:1,h2:1", "--rdzv-addr", "127.0.0.1:0", "-np", "2", bins.Path(t, "obsjob"), "-duration", "2m")
	cmd.Env = env
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("gearrun output:\n%s", out.String())
		}
	})
	deadline := time.Now().Add(patience)
	for {
		lm, err := launch.ReadLiveMetrics(rt, job)
		ready := 0
		if err == nil {
			for _, s := range lm.Ranks {
				if s.Running && len(s.Tables) > 0 && s.Tables[0].Size > 0 && len(s.Ops) > 0 {
					ready++
				}
			}
		}
		if ready == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %d of 2 ranks in the launcher's figures after %v: %v %+v", job, ready, patience, err, lm)
		}
		time.Sleep(100 * time.Millisecond)
	}
	top := exec.Command(bins.Path(t, "gearrun"), "top", "--json", "--once", "--interval", "1500ms", "--shm-dir", t.TempDir(), job)
	top.Env = env
	b, err := top.Output()
	if err != nil {
		t.Fatalf("gearrun top --json --once: %v", err)
	}
	var f topJSON
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%v:\n%s", err, b)
	}
	if f.Job != job || len(f.Ranks) != 2 || len(f.Tables) != 2 || len(f.Shards) != 2 {
		t.Fatalf("job %q, %d ranks, %d tables, %d shards; want %q, 2, 2, 2:\n%s", f.Job, len(f.Ranks), len(f.Tables), len(f.Shards), job, b)
	}
	for i, r := range f.Ranks {
		if r.Rank != i || !r.Running || r.Calls == 0 || r.Top != "allreduce" {
			t.Errorf("rank %+v: want rank %d running, with allreduce calls", r, i)
		}
	}
	for _, tb := range f.Tables {
		if tb.Name != "replay" || tb.Size <= 0 || tb.InsertsPerSec <= 0 {
			t.Errorf("table %+v: want replay, growing", tb)
		}
	}
	// With no JOB, top finds the one job on hosts whose launcher runs here.
	top = exec.Command(bins.Path(t, "gearrun"), "top", "--json", "--once", "--interval", "100ms", "--shm-dir", t.TempDir())
	top.Env = env
	if b, err := top.Output(); err != nil || !strings.Contains(string(b), `"job":"`+job+`"`) {
		t.Errorf("gearrun top --json --once with no JOB: %v\n%s", err, b)
	}
}
