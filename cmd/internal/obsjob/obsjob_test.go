package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
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
	"github.com/gear-rl/gear/internal/metrics"
)

// The tests of gearrun top, --metrics-addr and --trace on real jobs of this
// program, started by a built gearrun.

var bins = geartest.NewCommands("github.com/gear-rl/gear/cmd/gearrun", "github.com/gear-rl/gear/cmd/internal/obsjob")

func TestMain(m *testing.M) {
	code := m.Run()
	bins.Remove()
	os.Exit(code)
}

// patience bounds every wait for a job's state; the tests wait for what they
// check, and fail only when it never comes.
const patience = 60 * time.Second

// startJob starts gearrun with args (its flags, then "-np N obsjob ...") as job
// jobID and stops it when the test ends.
func startJob(t *testing.T, jobID string, args ...string) *exec.Cmd {
	t.Helper()
	gearrun, obsjob := bins.Path(t, "gearrun"), bins.Path(t, "obsjob")
	full := append([]string{"--job-id", jobID}, args...)
	for i, a := range full {
		if a == "obsjob" {
			full[i] = obsjob
		}
	}
	cmd := exec.Command(gearrun, full...)
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
	return cmd
}

func jobID(t *testing.T) string {
	return fmt.Sprintf("obs%d-%s", os.Getpid(), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
}

// waitRanks waits until n ranks of job run and every one has a table.
func waitRanks(t *testing.T, job string, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		snaps, _ := metrics.Job("", job)
		ready := 0
		for _, s := range snaps {
			if s.Running && len(s.Tables) > 0 && s.Tables[0].Size > 0 {
				ready++
			}
		}
		if ready == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %d of %d ranks running with a table after %v: %+v", job, ready, n, patience, snaps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTopInTerminal drives gearrun top in a real terminal (tmux): the ranks
// and the tables' sizes appear, the sizes change between refreshes, every
// line fits 80 columns, and q quits.
func TestTopInTerminal(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed (apt-get install tmux): gearrun top is not driven in a terminal")
	}
	job := jobID(t)
	startJob(t, job, "-np", "2", "obsjob", "-duration", "2m")
	waitRanks(t, job, 2)

	socket := fmt.Sprintf("gear-top-test-%d", os.Getpid())
	tmux := func(args ...string) (string, error) {
		out, err := exec.Command("tmux", append([]string{"-L", socket, "-f", "/dev/null"}, args...)...).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() { _, _ = tmux("kill-server") })
	// A pane wider than 80 columns, so that a line too long would show.
	shell := fmt.Sprintf("%s top %s; echo \"top exited with status $?\"; sleep 600", bins.Path(t, "gearrun"), job)
	if out, err := tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "40", shell); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	capture := func() string {
		out, err := tmux("capture-pane", "-p", "-t", "top")
		if err != nil {
			t.Fatalf("tmux capture-pane: %v\n%s", err, out)
		}
		return out
	}
	// Table rows: "replay  RANK  SIZE  MAX ...".
	sizes := func(screen string) map[int]int64 {
		out := map[int]int64{}
		for _, l := range strings.Split(screen, "\n") {
			f := strings.Fields(l)
			if len(f) >= 4 && f[0] == "replay" {
				r, err1 := strconv.Atoi(f[1])
				n, err2 := strconv.ParseInt(f[2], 10, 64)
				if err1 == nil && err2 == nil {
					out[r] = n
				}
			}
		}
		return out
	}
	ranks := func(screen string) []int {
		var out []int
		in := false
		for _, l := range strings.Split(screen, "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) > 0 && f[0] == "RANK":
				in = true
			case len(f) == 0:
				in = false
			case in:
				if r, err := strconv.Atoi(f[0]); err == nil {
					out = append(out, r)
				}
			}
		}
		return out
	}
	var first map[int]int64
	var screen string
	deadline := time.Now().Add(patience)
	for {
		screen = capture()
		for i, l := range strings.Split(strings.TrimRight(screen, "\n"), "\n") {
			if n := len([]rune(strings.TrimRight(l, " "))); n > 80 {
				t.Fatalf("line %d is %d columns wide, want at most 80:\n%s", i, n, screen)
			}
		}
		got := sizes(screen)
		if len(got) == 2 && slices.Equal(ranks(screen), []int{0, 1}) && strings.Contains(screen, "job "+job) {
			if first == nil {
				first = got
			} else if got[0] != first[0] || got[1] != first[1] {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v the screen shows no two ranks whose table sizes change (first %v):\n%s", patience, first, screen)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("gearrun top:\n%s", screen)
	if !strings.Contains(screen, "allreduce") {
		t.Errorf("no rank spends its collective time in allreduce:\n%s", screen)
	}
	if out, err := tmux("send-keys", "-t", "top", "q"); err != nil {
		t.Fatalf("tmux send-keys: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(patience); ; {
		screen = capture()
		if strings.Contains(screen, "top exited with status 0") {
			break
		}
		if strings.Contains(screen, "top exited with status") || time.Now().After(deadline) {
			t.Fatalf("gearrun top did not quit on q with status 0:\n%s", screen)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// topJSON is the part of a --json line the test reads.
type topJSON struct {
	Job   string `json:"job"`
	Ranks []struct {
		Rank    int    `json:"rank"`
		Running bool   `json:"running"`
		Calls   uint64 `json:"collective_calls"`
		Top     string `json:"top_collective"`
	} `json:"ranks"`
	Tables []struct {
		Name          string  `json:"name"`
		Rank          int     `json:"rank"`
		Size          int64   `json:"size"`
		Inserts       int64   `json:"inserts"`
		InsertsPerSec float64 `json:"inserts_per_second"`
		SamplesPerIns float64 `json:"samples_per_insert"`
	} `json:"tables"`
	Shards []struct {
		Name      string `json:"name"`
		Committed int    `json:"Committed"`
		Writers   int    `json:"Writers"`
	} `json:"shards"`
}

func TestTopJSONOnce(t *testing.T) {
	job := jobID(t)
	startJob(t, job, "-np", "2", "obsjob", "-duration", "2m")
	waitRanks(t, job, 2)
	out, err := exec.Command(bins.Path(t, "gearrun"), "top", "--json", "--once", "--interval", "500ms", job).Output()
	if err != nil {
		t.Fatalf("gearrun top --json --once: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 {
		t.Fatalf("--once printed %d lines, want 1:\n%s", len(lines), out)
	}
	var f topJSON
	dec := json.NewDecoder(strings.NewReader(lines[0]))
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%v:\n%s", err, lines[0])
	}
	if f.Job != job || len(f.Ranks) != 2 || len(f.Tables) != 2 || len(f.Shards) != 2 {
		t.Fatalf("job %q, %d ranks, %d tables, %d shards; want %q, 2, 2, 2:\n%s", f.Job, len(f.Ranks), len(f.Tables), len(f.Shards), job, lines[0])
	}
	for i, r := range f.Ranks {
		if r.Rank != i || !r.Running || r.Calls == 0 || r.Top != "allreduce" {
			t.Errorf("rank %+v: want rank %d running, with allreduce calls", r, i)
		}
	}
	for _, tb := range f.Tables {
		if tb.Name != "replay" || tb.Size <= 0 || tb.Inserts < tb.Size || tb.InsertsPerSec <= 0 {
			t.Errorf("table %+v: want replay, growing", tb)
		}
	}
	for _, s := range f.Shards {
		if s.Committed <= 0 || s.Writers < 1 {
			t.Errorf("shard %+v: want committed rows and a writer", s)
		}
	}
	// A prefix of the job's ID names it too, as for status.
	prefix := job[:len(job)-3]
	out, err = exec.Command(bins.Path(t, "gearrun"), "top", "--json", "--once", "--interval", "100ms", prefix).Output()
	if err != nil {
		t.Fatalf("gearrun top --json --once %s: %v", prefix, err)
	}
	f = topJSON{}
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &f); err != nil || f.Job != job {
		t.Errorf("top of the prefix %q: job %q (%v), want %q", prefix, f.Job, err, job)
	}
}

// promLine is one sample line of the text exposition format:
// metric_name [ "{" label_name "=" `"` label_value `"` { "," ... } [ "," ] "}" ] value [ timestamp ]
var (
	promName  = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promLabel = regexp.MustCompile(`^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"`)
)

// parseProm checks text against the exposition rules (version 0.0.4) and
// returns the samples by family: every sample belongs to a family whose TYPE
// came first and once, families are not interleaved, label names are unique
// within a sample and no series repeats, values parse as floats, counters'
// names end in _total.
func parseProm(t *testing.T, text string) map[string][]map[string]string {
	t.Helper()
	types := map[string]string{}
	helps := map[string]bool{}
	samples := map[string][]map[string]string{}
	series := map[string]bool{}
	var current string
	done := map[string]bool{}
	for n, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		bad := func(why string) { t.Fatalf("line %d %q: %s", n+1, l, why) }
		if strings.HasPrefix(l, "#") {
			f := strings.SplitN(l, " ", 4)
			if len(f) < 3 || (f[1] != "HELP" && f[1] != "TYPE") {
				continue // a comment
			}
			name := f[2]
			if !promName.MatchString(name) || promName.FindString(name) != name {
				bad("bad metric name")
			}
			if name != current && done[name] {
				bad("family interleaved with another")
			}
			if name != current && current != "" {
				done[current] = true
			}
			current = name
			switch f[1] {
			case "HELP":
				if helps[name] {
					bad("second HELP")
				}
				helps[name] = true
			case "TYPE":
				if _, ok := types[name]; ok || len(samples[name]) > 0 {
					bad("TYPE repeated or after samples")
				}
				if len(f) != 4 || !slices.Contains([]string{"counter", "gauge", "histogram", "summary", "untyped"}, f[3]) {
					bad("bad type")
				}
				types[name] = f[3]
			}
			continue
		}
		if l == "" {
			continue
		}
		name := promName.FindString(l)
		if name == "" {
			bad("no metric name")
		}
		if name != current {
			bad("sample outside its family (no TYPE line before it)")
		}
		rest := l[len(name):]
		labels := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			rest = rest[1:]
			for !strings.HasPrefix(rest, "}") {
				m := promLabel.FindStringSubmatch(rest)
				if m == nil {
					bad("bad label")
				}
				if _, dup := labels[m[1]]; dup || strings.HasPrefix(m[1], "__") {
					bad("label repeated or reserved")
				}
				labels[m[1]] = m[2]
				rest = strings.TrimPrefix(rest[len(m[0]):], ",")
			}
			rest = rest[1:]
		}
		f := strings.Fields(rest)
		if !strings.HasPrefix(rest, " ") || len(f) < 1 || len(f) > 2 {
			bad("want a value and an optional timestamp after one space")
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil && f[0] != "+Inf" && f[0] != "-Inf" && f[0] != "NaN" {
			bad("bad value")
		}
		if types[name] == "counter" && (!strings.HasSuffix(name, "_total") || v < 0 || math.IsNaN(v)) {
			bad("a counter ends in _total and is not negative")
		}
		keys := make([]string, 0, len(labels))
		for k, v := range labels {
			keys = append(keys, k+"="+v)
		}
		slices.Sort(keys)
		id := name + "{" + strings.Join(keys, ",") + "}"
		if series[id] {
			bad("series repeated")
		}
		series[id] = true
		samples[name] = append(samples[name], labels)
	}
	return samples
}

func TestMetricsAddrServesPrometheusText(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	job := jobID(t)
	startJob(t, job, "--metrics-addr", addr, "-np", "2", "obsjob", "-duration", "2m")
	waitRanks(t, job, 2)
	// Every family the job makes: the ranks' first collective calls and
	// inserts come a little after they joined, so wait for all of them.
	wants := []string{"gear_rank_up", "gear_collective_calls_total", "gear_collective_bytes_total",
		"gear_collective_seconds_total", "gear_table_size", "gear_table_inserts_total", "gear_table_samples_total",
		"gear_table_rate_limited_seconds_total", "gear_shard_rows", "gear_shard_writers"}
	hasAll := func(text string) bool {
		for _, w := range wants {
			if !strings.Contains(text, "\n"+w+"{") {
				return false
			}
		}
		return true
	}
	var text string
	deadline := time.Now().Add(patience)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
				text = string(b)
				if hasAll(text) {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every family of %v at %s after %v (last error %v):\n%s", wants, addr, patience, err, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fams := parseProm(t, text)
	for _, want := range wants {
		if len(fams[want]) == 0 {
			t.Errorf("no %s in:\n%s", want, text)
		}
	}
	for _, s := range fams["gear_table_size"] {
		if s["job_id"] != job || s["table"] != "replay" {
			t.Errorf("gear_table_size labels %v: want job_id %q, table replay", s, job)
		}
	}
}

// tracedJob runs gearrun args (flags, then "-np N obsjob ...") as job with
// --trace, waits for it to end well, and returns the trace it wrote.
func tracedJob(t *testing.T, job string, args ...string) metrics.TraceFile {
	t.Helper()
	file := filepath.Join(t.TempDir(), "job.json")
	cmd := startJob(t, job, append([]string{"--trace", file}, args...)...)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("job: %v", err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var tf metrics.TraceFile
	if err := json.Unmarshal(b, &tf); err != nil {
		t.Fatal(err)
	}
	return tf
}

// TestTraceAcrossRestarts: a job restarted once, with a trace, writes every
// generation of every rank into it, and a restart span between them: the
// launcher takes each ended generation's metrics segments out of shared
// memory (so that it does not grow with the restarts) into the trace's
// files, and nothing of the job is left in /dev/shm afterwards.
func TestTraceAcrossRestarts(t *testing.T) {
	job := jobID(t)
	tf := tracedJob(t, job, "--max-restarts", "1", "--checkpoint-dir", t.TempDir(), "-np", "2",
		"obsjob", "-steps", "20", "-fail-generations", "1")
	gens := map[[2]int]bool{} // rank, generation
	restarts := 0
	for _, e := range tf.TraceEvents {
		if e.Ph != "X" || e.TID != metrics.TrackRank {
			continue
		}
		var g int
		if _, err := fmt.Sscanf(e.Name, "generation %d", &g); err == nil {
			gens[[2]int{e.PID, g}] = true
		}
		if e.Name == "restart" {
			restarts++
		}
	}
	for _, want := range [][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}} {
		if !gens[want] {
			t.Errorf("no span of rank %d's generation %d in the trace (%v)", want[0], want[1], gens)
		}
	}
	if restarts == 0 {
		t.Error("no restart span in the trace")
	}
	segs, err := metrics.Segments("", job)
	if err != nil || len(segs) != 0 {
		t.Errorf("metrics segments left after the job: %v %v", segs, err)
	}
}

// TestTraceOfFourRanks: a 4-rank job's trace, written when the job ends, has
// one track per rank; on every track the spans nest (none overlaps another
// partly), every span lies within its rank's generation, and the spans of
// each collective call overlap on all four ranks (no rank left a call before
// the last one entered it).
func TestTraceOfFourRanks(t *testing.T) {
	job := jobID(t)
	tf := tracedJob(t, job, "-np", "4", "obsjob", "-steps", "100")
	type track struct{ pid, tid int }
	spans := map[track][]metrics.TraceEvent{}
	gens := map[int]metrics.TraceEvent{}
	names := map[int]string{}
	for _, e := range tf.TraceEvents {
		switch e.Ph {
		case "X":
			spans[track{e.PID, e.TID}] = append(spans[track{e.PID, e.TID}], e)
			if e.TID == metrics.TrackRank && strings.HasPrefix(e.Name, "generation") {
				gens[e.PID] = e
			}
		case "M":
			if e.Name == "process_name" {
				names[e.PID], _ = e.Args["name"].(string)
			}
		}
	}
	if len(gens) != 4 || len(names) != 4 {
		t.Fatalf("%d generation spans and %d named tracks, want 4 each", len(gens), len(names))
	}
	const eps = 0.002 // µs: the file's rounding
	kinds := map[string]int{}
	for tr, ss := range spans {
		slices.SortFunc(ss, func(a, b metrics.TraceEvent) int {
			if a.TS != b.TS {
				return cmpF(a.TS, b.TS)
			}
			return cmpF(b.Dur, a.Dur)
		})
		var open []metrics.TraceEvent // the enclosing spans, innermost last
		for _, s := range ss {
			kinds[s.Name]++
			g := gens[tr.pid]
			if s.TS < g.TS-eps || s.TS+s.Dur > g.TS+g.Dur+eps {
				t.Errorf("rank %d: %s at %.3f+%.3f outside its generation %.3f+%.3f", tr.pid, s.Name, s.TS, s.Dur, g.TS, g.Dur)
			}
			for len(open) > 0 && open[len(open)-1].TS+open[len(open)-1].Dur <= s.TS+eps {
				open = open[:len(open)-1]
			}
			if len(open) > 0 {
				p := open[len(open)-1]
				if s.TS+s.Dur > p.TS+p.Dur+eps {
					t.Errorf("rank %d track %d: %s at %.3f+%.3f overlaps %s at %.3f+%.3f partly", tr.pid, tr.tid, s.Name, s.TS, s.Dur, p.Name, p.TS, p.Dur)
				}
			}
			open = append(open, s)
		}
	}
	for _, want := range []string{"allreduce", "barrier", "insert", "sample"} {
		if kinds[want] == 0 {
			t.Errorf("no %s span in the trace (%v)", want, kinds)
		}
	}
	type call struct {
		comm string
		seq  float64
	}
	calls := map[call][]metrics.TraceEvent{}
	for tr, ss := range spans {
		if tr.tid != metrics.TrackCollectives {
			continue
		}
		for _, s := range ss {
			comm, _ := s.Args["comm"].(string)
			seq, _ := s.Args["seq"].(float64)
			calls[call{comm, seq}] = append(calls[call{comm, seq}], s)
		}
	}
	if len(calls) < 101 {
		t.Errorf("%d collective calls in the trace, want at least 101 (100 AllReduce and a Barrier)", len(calls))
	}
	for c, ss := range calls {
		if len(ss) != 4 {
			t.Errorf("call %v: %d spans, want one per rank", c, len(ss))
			continue
		}
		lastIn, firstOut := math.Inf(-1), math.Inf(1)
		for _, s := range ss {
			lastIn, firstOut = max(lastIn, s.TS), min(firstOut, s.TS+s.Dur)
			if s.Name != ss[0].Name {
				t.Errorf("call %v: %s on one rank, %s on another", c, s.Name, ss[0].Name)
			}
		}
		if lastIn > firstOut+eps {
			t.Errorf("call %v: a rank left at %.3f before the last came at %.3f", c, firstOut, lastIn)
		}
	}
	segs, _ := metrics.Segments("", job)
	if len(segs) != 0 {
		t.Errorf("the job's metrics segments outlived it: %v", segs)
	}
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
