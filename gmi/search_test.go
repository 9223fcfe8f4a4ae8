package gmi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// table is a fake profile: measurements by (K, num_env); missing entries are
// not runnable. It records the calls.
type table struct {
	m     map[[2]int]Measurement
	calls [][2]int
}

func (tb *table) profile(ctx context.Context, k, env int) (Measurement, error) {
	tb.calls = append(tb.calls, [2]int{k, env})
	if m, ok := tb.m[[2]int{k, env}]; ok {
		return m, nil
	}
	return Measurement{Why: "out of memory"}, nil
}

func run(top, mem float64) Measurement {
	return Measurement{Runnable: true, Throughput: top, Memory: mem}
}

func TestSearchFollowsAlgorithm2(t *testing.T) {
	cfg := SearchConfig{GPUs: 2, MaxGMIPerGPU: 3, MinEnv: 100, MaxEnv: 800, Alpha: 0.1}
	if got := fmt.Sprint(cfg.EnvCounts()); got != "[100 200 400 800]" {
		t.Fatalf("env counts %s", got)
	}
	tb := &table{m: map[[2]int]Measurement{
		// K=3: 100 is not runnable (skipped, the series goes on); 200 is the
		// baseline; 400 doubles throughput for 50% more memory (Sat 2);
		// 800 gains 5% for 100% more memory (Sat 0.05 < 0.1): stop.
		{3, 200}: run(1000, 1e9),
		{3, 400}: run(2000, 1.5e9),
		{3, 800}: run(2100, 3e9),
		// K=2: 100 baseline; 200 +50% top for +100% mem (Sat 0.5): candidate
		// with estimate 1500*2*2 = 6000 < 2000*3*2 = 12000; 400: top falls: stop.
		{2, 100}: run(1000, 1e9),
		{2, 200}: run(1500, 2e9),
		{2, 400}: run(1400, 4e9),
		{2, 800}: run(9999, 5e9), // never reached
		// K=1: 100 baseline; 200 Sat 1 with estimate 4000*1*2 = 8000; 400 Sat
		// 0.1 is not below alpha: candidate 4400*2 = 8800; 800 not runnable.
		{1, 100}: run(2000, 1e9),
		{1, 200}: run(4000, 2e9),
		{1, 400}: run(4400, 4e9),
	}}
	res, err := Search(context.Background(), cfg, tb.profile)
	if err != nil {
		t.Fatal(err)
	}
	wantCalls := "[[3 100] [3 200] [3 400] [3 800] [2 100] [2 200] [2 400] [1 100] [1 200] [1 400] [1 800]]"
	if got := fmt.Sprint(tb.calls); got != wantCalls {
		t.Errorf("calls\n got %s\nwant %s", got, wantCalls)
	}
	var verdicts []string
	for _, r := range res.Rows {
		verdicts = append(verdicts, fmt.Sprintf("%d/%d:%s", r.GMIPerGPU, r.NumEnv, r.Verdict))
	}
	want := "3/100:not runnable 3/200:baseline 3/400:ok 3/800:saturated 2/100:baseline 2/200:ok 2/400:saturated 1/100:baseline 1/200:ok 1/400:ok 1/800:not runnable"
	if got := strings.Join(verdicts, " "); got != want {
		t.Errorf("verdicts\n got %s\nwant %s", got, want)
	}
	if !res.Found || res.Best != (Choice{GMIPerGPU: 3, NumEnv: 400, Throughput: 2000, Estimate: 12000}) || res.BestRow != 2 {
		t.Errorf("best %+v (row %d)", res.Best, res.BestRow)
	}
	sats := map[string]float64{"3/400": 2, "3/800": 0.05, "2/200": 0.5, "1/200": 1, "1/400": 0.1}
	for _, r := range res.Rows {
		key := fmt.Sprintf("%d/%d", r.GMIPerGPU, r.NumEnv)
		if want, ok := sats[key]; ok && math.Abs(float64(r.Sat)-want) > 1e-9 {
			t.Errorf("%s: Sat %v, want %v", key, r.Sat, want)
		}
		if !math.IsNaN(float64(r.Sat)) && (r.Verdict == VerdictBaseline || r.Verdict == VerdictNotRunnable) {
			t.Errorf("%s: Sat %v on a %s row", key, r.Sat, r.Verdict)
		}
	}
	if res.Rows[0].Why != "out of memory" {
		t.Errorf("row 0 why %q", res.Rows[0].Why)
	}
}

// A series whose only runnable run is its baseline contributes nothing, as
// in Algorithm 2 (the first run only initializes the reference).
func TestSearchBaselineIsNeverChosen(t *testing.T) {
	tb := &table{m: map[[2]int]Measurement{{1, 128}: run(1e6, 1e9)}}
	res, err := Search(context.Background(), SearchConfig{MaxGMIPerGPU: 1, MaxEnv: 512}, tb.profile)
	if err != nil {
		t.Fatal(err)
	}
	if res.Found || res.BestRow != -1 || len(res.Rows) != 3 {
		t.Errorf("result %+v", res)
	}
}

func TestSearchOpenCases(t *testing.T) {
	// Memory unknown: num_env stands in (doubling: R_mem = 1, Sat = R_top).
	tb := &table{m: map[[2]int]Measurement{
		{1, 128}: run(100, 0),
		{1, 256}: run(150, 0), // Sat 0.5
		{1, 512}: run(160, 0), // Sat 0.0667 < 0.1: stop
	}}
	res, err := Search(context.Background(), SearchConfig{MaxGMIPerGPU: 1, MaxEnv: 1024}, tb.profile)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 3 || math.Abs(float64(res.Rows[1].Sat)-0.5) > 1e-9 || res.Rows[2].Verdict != VerdictSaturated || res.Best.NumEnv != 256 {
		t.Errorf("memory unknown: %+v", res.Rows)
	}
	// Memory flat: a gain is +Inf saturation, no gain is 0.
	tb = &table{m: map[[2]int]Measurement{
		{1, 128}: run(100, 1e9),
		{1, 256}: run(200, 1e9),
		{1, 512}: run(200, 1e9),
	}}
	res, err = Search(context.Background(), SearchConfig{MaxGMIPerGPU: 1, MaxEnv: 512}, tb.profile)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsInf(float64(res.Rows[1].Sat), 1) || res.Rows[1].Verdict != VerdictOK || res.Rows[2].Sat != 0 || res.Rows[2].Verdict != VerdictSaturated {
		t.Errorf("flat memory: %+v", res.Rows)
	}
	b, err := json.Marshal(res)
	if err != nil || !strings.Contains(string(b), `"sat":"inf"`) || !strings.Contains(string(b), `"sat":null`) {
		t.Errorf("JSON %s, %v", b, err)
	}
	// Zero throughput is not runnable.
	tb = &table{m: map[[2]int]Measurement{{1, 128}: run(0, 1e9)}}
	res, _ = Search(context.Background(), SearchConfig{MaxGMIPerGPU: 1, MaxEnv: 128}, tb.profile)
	if res.Rows[0].Verdict != VerdictNotRunnable || !strings.Contains(res.Rows[0].Why, "not positive") {
		t.Errorf("zero throughput: %+v", res.Rows[0])
	}
}

func TestSearchDefaultsAndEstimate(t *testing.T) {
	tb := &table{m: map[[2]int]Measurement{}}
	res, err := Search(context.Background(), SearchConfig{}, tb.profile)
	if err != nil {
		t.Fatal(err)
	}
	if len(tb.calls) != 10*8 || tb.calls[0] != [2]int{10, 128} || tb.calls[len(tb.calls)-1] != [2]int{1, 16384} {
		t.Errorf("default ranges: %d calls, first %v last %v", len(tb.calls), tb.calls[0], tb.calls[len(tb.calls)-1])
	}
	if res.Config.Alpha != 0.1 || res.Config.GPUs != 1 {
		t.Errorf("defaults %+v", res.Config)
	}
	// A custom estimate: one GMI's figure only.
	tb = &table{m: map[[2]int]Measurement{
		{2, 128}: run(100, 1e9), {2, 256}: run(200, 1.5e9),
		{1, 128}: run(150, 1e9), {1, 256}: run(300, 1.5e9),
	}}
	res, _ = Search(context.Background(), SearchConfig{MaxGMIPerGPU: 2, MaxEnv: 256,
		Estimate: func(k, gpus int, top float64) float64 { return top }}, tb.profile)
	if res.Best.GMIPerGPU != 1 || res.Best.Estimate != 300 {
		t.Errorf("custom estimate: %+v", res.Best)
	}
}

func TestSearchConfigValidate(t *testing.T) {
	bad := map[string]SearchConfig{
		"gpus":      {GPUs: -1},
		"GMIs":      {MinGMIPerGPU: 5, MaxGMIPerGPU: 2},
		"too many":  {MaxGMIPerGPU: 101},
		"num_env":   {MinEnv: 1000, MaxEnv: 10},
		"alpha":     {Alpha: -0.5},
		"alpha NaN": {Alpha: math.NaN()},
	}
	for name, c := range bad {
		if _, err := Search(context.Background(), c, nil); err == nil || !strings.HasPrefix(err.Error(), "gmi: search: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestSearchStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err := Search(ctx, SearchConfig{}, func(ctx context.Context, k, env int) (Measurement, error) {
		n++
		if n == 3 {
			cancel()
		}
		return run(float64(env), float64(env)), nil
	})
	if !errors.Is(err, context.Canceled) || n != 3 {
		t.Errorf("err %v after %d runs", err, n)
	}
	boom := errors.New("boom")
	_, err = Search(context.Background(), SearchConfig{}, func(context.Context, int, int) (Measurement, error) { return Measurement{}, boom })
	if !errors.Is(err, boom) {
		t.Errorf("profile error: %v", err)
	}
}

func TestSearchText(t *testing.T) {
	tb := &table{m: map[[2]int]Measurement{{1, 128}: run(100, 1e9), {1, 256}: run(200, 1.5e9)}}
	res, _ := Search(context.Background(), SearchConfig{MaxGMIPerGPU: 1, MaxEnv: 512, GPUs: 4}, tb.profile)
	var sb strings.Builder
	if err := res.WriteText(&sb); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	for _, want := range []string{"GMI/GPU", "baseline", "2.000", "800", "ok (best)", "not runnable: out of memory", "best: 1 GMIs per GPU, num_env 256", "on 4 GPU(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
}
