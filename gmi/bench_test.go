package gmi

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

func fakeCommand(t *testing.T, mode string) *BenchCommand {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &BenchCommand{
		Args:    []string{exe},
		Env:     append(os.Environ(), fakeBenchEnv+"="+mode),
		Timeout: time.Minute,
	}
}

// The profiling search over a real program (this test binary re-executed as
// a fake benchmark) finds the configuration the benchmark was built around.
func TestSearchFindsFakeBenchmarkSaturation(t *testing.T) {
	cmd := fakeCommand(t, "saturating")
	res, err := Search(context.Background(), SearchConfig{GPUs: 2, MaxEnv: 4096}, cmd.Profile)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Found || res.Best.GMIPerGPU != 4 || res.Best.NumEnv != satEnv {
		var sb strings.Builder
		res.WriteText(&sb)
		t.Fatalf("best %+v, want 4 GMIs per GPU at num_env %d\n%s", res.Best, satEnv, sb.String())
	}
	wantTop := 1000 * gpuEfficiency[3] / 4 * satEnv
	if res.Best.Throughput != wantTop || res.Best.Estimate != wantTop*4*2 {
		t.Errorf("best %+v, want throughput %g", res.Best, wantTop)
	}
	// Every series stops at the first run past the saturation point.
	for _, r := range res.Rows {
		if r.NumEnv > 2*satEnv {
			t.Errorf("profiled past saturation: %+v", r)
		}
		if r.NumEnv == 2*satEnv && r.Verdict != VerdictSaturated {
			t.Errorf("row %+v: want saturated", r)
		}
		if r.NumEnv <= satEnv && r.NumEnv > 128 && r.Verdict != VerdictOK {
			t.Errorf("row %+v: want ok", r)
		}
		if r.Memory != 100e6+float64(r.NumEnv)*1e6 {
			t.Errorf("row %+v: memory not read", r)
		}
	}
}

func TestBenchCommandRuns(t *testing.T) {
	ctx := context.Background()
	m, err := fakeCommand(t, "no-memory").Profile(ctx, 2, 512)
	if err != nil || !m.Runnable || m.Throughput != 1000*1.6/2*512 || m.Memory != 0 {
		t.Errorf("no memory printed: %+v, %v", m, err)
	}
	m, err = fakeCommand(t, "fail").Profile(ctx, 1, 128)
	if err != nil || m.Runnable || !strings.Contains(m.Why, "exit status 1: CUDA error: out of memory") {
		t.Errorf("failing run: %+v, %v", m, err)
	}
	m, err = fakeCommand(t, "silent").Profile(ctx, 1, 128)
	if err != nil || m.Runnable || m.Why != "printed no throughput= line" {
		t.Errorf("silent run: %+v, %v", m, err)
	}
	m, err = (&BenchCommand{Args: []string{"/nonexistent/bench"}}).Profile(ctx, 1, 128)
	if err != nil || m.Runnable || !strings.Contains(m.Why, "cannot start") {
		t.Errorf("missing program: %+v, %v", m, err)
	}
	if _, err := (&BenchCommand{}).Profile(ctx, 1, 1); err == nil {
		t.Error("no command: no error")
	}
}

func TestBenchCommandTimeout(t *testing.T) {
	cmd := fakeCommand(t, "hang")
	cmd.Timeout = 300 * time.Millisecond
	m, err := cmd.Profile(context.Background(), 1, 128)
	if err != nil || m.Runnable || !strings.Contains(m.Why, "timed out after 300ms") {
		t.Errorf("hanging run: %+v, %v", m, err)
	}
	// The caller's context ending is an error, not a failed run.
	cmd.Timeout = 0
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := cmd.Profile(ctx, 1, 128); err != context.DeadlineExceeded {
		t.Errorf("cancelled run: %v", err)
	}
}

// The binding of a plan reaches the rank's process environment.
func TestBindingReachesTheProcess(t *testing.T) {
	topo := loadExample(t, "a100-2x.toml")
	p := mustPlan(t, topo, PlanRequest{Ranks: 6, GMIPerGPU: 3, MPSMemLimitMiB: 1024})
	for _, b := range p.Bindings {
		cmd := fakeCommand(t, "env")
		cmd.Env = append(cmd.Env, b.Environ()...)
		var out strings.Builder
		cmd.Output = &out
		if m, err := cmd.Profile(context.Background(), 3, 1); err != nil || !m.Runnable {
			t.Fatalf("rank %d: %+v, %v", b.Rank, m, err)
		}
		for k, v := range b.Env {
			if !strings.Contains(out.String(), k+"="+v+"\n") {
				t.Errorf("rank %d: process lacks %s=%s:\n%s", b.Rank, k, v, out.String())
			}
		}
	}
	// And the search's binding of one GMI.
	bind := ProfileBinding(topo, 1)
	cmd := fakeCommand(t, "env")
	cmd.Binding = bind
	var out strings.Builder
	cmd.Output = &out
	if _, err := cmd.Profile(context.Background(), 4, 1); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CUDA_VISIBLE_DEVICES=1\n", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\n", "CUDA_DEVICE_ORDER=PCI_BUS_ID\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("search binding lacks %q:\n%s", want, out.String())
		}
	}
	if ProfileBinding(topo, 9) != nil || ProfileBinding(loadExample(t, "a100-mig-mixed.toml"), 0) != nil {
		t.Error("binding for a missing GPU or a MIG GPU")
	}
	if env := ProfileBinding(topo, 0)(1); env[EnvMPSThreadPercent] != "" {
		t.Errorf("K=1 share: %v", env)
	}
}

type fixedSampler struct {
	mu     sync.Mutex
	calls  int
	closed bool
}

func (s *fixedSampler) Sample(pgid int) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return 5 << 30, true
}

func (s *fixedSampler) Close() error { s.closed = true; return nil }

func TestBenchCommandSamplesMemory(t *testing.T) {
	s := &fixedSampler{}
	cmd := fakeCommand(t, "no-memory")
	cmd.Memory = s
	m, err := cmd.Profile(context.Background(), 1, 128)
	if err != nil || m.Memory != 5<<30 || s.calls == 0 {
		t.Errorf("sampled memory: %+v, %v (%d samples)", m, err, s.calls)
	}
	// Printed memory wins over sampled.
	cmd = fakeCommand(t, "saturating")
	cmd.Memory = s
	m, _ = cmd.Profile(context.Background(), 1, 128)
	if m.Memory != 228e6 {
		t.Errorf("printed memory: %+v", m)
	}
}

func TestMetricWriter(t *testing.T) {
	w := &metricWriter{}
	for _, chunk := range []string{"warm", "ing up\nthroughput=1", "0 memory=2e9\n", "throughput=abc\n", "x=1,throughput=20.5,memory=-1\n", "epoch 3 done"} {
		w.Write([]byte(chunk))
	}
	top, mem, haveTop, haveMem, last := w.result()
	if top != 20.5 || mem != 2e9 || !haveTop || !haveMem || last != "epoch 3 done" {
		t.Errorf("got %v %v %v %v %q", top, mem, haveTop, haveMem, last)
	}
}
