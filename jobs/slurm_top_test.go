package jobs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gear-rl/gear/internal/geartest"
	"github.com/gear-rl/gear/internal/metrics"
	"github.com/gear-rl/gear/jobs/jobstest"
)

// obsjobCmds is cmd/internal/obsjob, the job of gearrun top's tests: each
// rank fills a table and samples it, with an AllReduce after each batch.
var obsjobCmds = geartest.NewCommands("github.com/gear-rl/gear/cmd/internal/obsjob")

// topJSON is what the test reads of a `gearrun top --json` line.
type topJSON struct {
	Job   string `json:"job"`
	Ranks []struct {
		Rank    int    `json:"rank"`
		Running bool   `json:"running"`
		Calls   uint64 `json:"collective_calls"`
	} `json:"ranks"`
	Tables []struct {
		Name    string `json:"name"`
		Rank    int    `json:"rank"`
		Size    int64  `json:"size"`
		Inserts int64  `json:"inserts"`
	} `json:"tables"`
}

// gearrun top shows a SLURM job's ranks on three nodes from the machine it
// was submitted from, with its tables growing; its trace, asked in the
// spec, holds every rank's collective calls.
func TestSlurmTopAndTrace(t *testing.T) {
	requireSlurm(t)
	jobstest.RequireNodes(t, 3)
	obs := obsjobCmds.Path(t, "obsjob")
	trace := filepath.Join(t.TempDir(), "trace.json")
	spec := jobstest.WriteSpec(t, fmt.Sprintf(`
name = "top-slurm"
[launch]
np = 3
command = [%q, "-steps", "6000", "-duration", "2m"]
timeout = "4m"
grace = "2s"
rdzv_timeout = "2m"
trace = %q
[slurm]
nodes = 3
ntasks_per_node = 1
time = "00:06:00"
extra = ["--overcommit"]
`, obs, trace))
	j := submit(t, spec)

	// Two readings while it runs, a few seconds apart: every rank, its
	// table growing.
	var seen []topJSON
	deadline := time.Now().Add(3 * time.Minute)
	last := ""
	for len(seen) < 2 && time.Now().Before(deadline) {
		out, code := j.Run("top", "--json", "--once", "--interval", "300ms", j.GearID)
		last = out
		var f topJSON
		if code == 0 && json.Unmarshal([]byte(strings.TrimSpace(out)), &f) == nil && len(f.Ranks) == 3 && len(f.Tables) == 3 {
			running := 0
			for _, r := range f.Ranks {
				if r.Running && r.Calls > 0 {
					running++
				}
			}
			if running == 3 && (len(seen) == 0 || f.Tables[0].Inserts > seen[0].Tables[0].Inserts) {
				seen = append(seen, f)
				continue
			}
		}
		time.Sleep(time.Second)
	}
	if len(seen) < 2 {
		state, log := j.Wait()
		t.Fatalf("gearrun top never showed 3 running ranks with growing tables; last:\n%s\njob %s, log:\n%s", last, state, log)
	}
	if seen[1].Job != j.GearID {
		t.Errorf("top shows job %q, want %q", seen[1].Job, j.GearID)
	}
	for i, tb := range seen[1].Tables {
		if tb.Name != "replay" || tb.Size <= 0 || tb.Inserts < tb.Size {
			t.Errorf("table %d: %+v, want replay with rows", i, tb)
		}
	}

	state, log := j.Wait()
	if state != "COMPLETED" {
		t.Fatalf("state %s, want COMPLETED; log:\n%s", state, log)
	}
	if !strings.Contains(log, "gearrun: trace of ") {
		t.Errorf("log does not say where the trace is:\n%s", log)
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, log)
	}
	var tf metrics.TraceFile
	if err := json.Unmarshal(b, &tf); err != nil {
		t.Fatal(err)
	}
	calls := map[int]int{}
	for _, e := range tf.TraceEvents {
		if e.Ph == "X" && e.Name == "allreduce" {
			calls[e.PID]++
		}
	}
	if len(calls) != 3 {
		t.Errorf("allreduce spans by rank track %v, want 3 ranks", calls)
	}
	// Once the job ended its figures say so, and top says it ended.
	out, _ := j.Run("top", "--json", "--once", j.GearID)
	var f topJSON
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &f); err != nil {
		t.Fatalf("top after the end: %v:\n%s", err, out)
	}
	for _, r := range f.Ranks {
		if r.Running {
			t.Errorf("rank %d still running after the job ended", r.Rank)
		}
	}
}
