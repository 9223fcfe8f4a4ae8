package gmi

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
)

// Measurement is what one profiling run of the benchmark gives.
type Measurement struct {
	// Runnable is false when the run failed: non-zero exit, timeout, or no
	// positive throughput printed.
	Runnable bool `json:"runnable"`
	// Throughput is one GMI's throughput, in the benchmark's own unit.
	Throughput float64 `json:"throughput"`
	// Memory is the run's device memory in bytes; 0 when unknown.
	Memory float64 `json:"memory"`
	// Why says why a run was not runnable.
	Why string `json:"why,omitempty"`
}

// ProfileFunc measures one GMI of the benchmark with gmiPerGPU GMIs per GPU
// and numEnv environments. A failed run is a Measurement with Runnable false;
// an error (the context ended) stops the search.
type ProfileFunc func(ctx context.Context, gmiPerGPU, numEnv int) (Measurement, error)

// SearchConfig bounds the profiling search. Zero fields take the defaults of
// GMI-DRL's Algorithm 2.
type SearchConfig struct {
	// GPUs is num_GPU, used by the estimate; default 1.
	GPUs int `json:"gpus"`
	// MaxGMIPerGPU and MinGMIPerGPU bound the outer loop, which runs from
	// the maximum down; defaults 10 and 1.
	MaxGMIPerGPU int `json:"max_gmi_per_gpu"`
	MinGMIPerGPU int `json:"min_gmi_per_gpu"`
	// MinEnv and MaxEnv bound the inner loop, which doubles num_env from
	// MinEnv while it stays at most MaxEnv; defaults 128 and 16384.
	MinEnv int `json:"min_env"`
	MaxEnv int `json:"max_env"`
	// Alpha is the saturation threshold: a series stops at the first run
	// whose Sat falls below it. Default 0.1; when set it must be positive.
	Alpha float64 `json:"alpha"`
	// Estimate projects the whole system's throughput from one GMI's; the
	// default is top × gmiPerGPU × gpus (every GMI of every GPU runs as fast
	// as the one measured).
	Estimate func(gmiPerGPU, gpus int, top float64) float64 `json:"-"`
}

// DefaultAlpha is Algorithm 2's saturation threshold unless set.
const DefaultAlpha = 0.1

// withDefaults fills zero fields.
func (c SearchConfig) withDefaults() SearchConfig {
	if c.GPUs == 0 {
		c.GPUs = 1
	}
	if c.MaxGMIPerGPU == 0 {
		c.MaxGMIPerGPU = 10
	}
	if c.MinGMIPerGPU == 0 {
		c.MinGMIPerGPU = 1
	}
	if c.MinEnv == 0 {
		c.MinEnv = 128
	}
	if c.MaxEnv == 0 {
		c.MaxEnv = 16384
	}
	if c.Alpha == 0 {
		c.Alpha = DefaultAlpha
	}
	if c.Estimate == nil {
		c.Estimate = func(k, gpus int, top float64) float64 { return top * float64(k) * float64(gpus) }
	}
	return c
}

// Validate checks the configuration after defaults.
func (c SearchConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.GPUs < 1:
		return fmt.Errorf("gmi: search: gpus %d: want at least 1", c.GPUs)
	case c.MinGMIPerGPU < 1 || c.MaxGMIPerGPU < c.MinGMIPerGPU || c.MaxGMIPerGPU > MaxGMIPerGPU:
		return fmt.Errorf("gmi: search: GMIs per GPU %d..%d: want 1 <= min <= max <= %d", c.MinGMIPerGPU, c.MaxGMIPerGPU, MaxGMIPerGPU)
	case c.MinEnv < 1 || c.MaxEnv < c.MinEnv:
		return fmt.Errorf("gmi: search: num_env %d..%d: want 1 <= min <= max", c.MinEnv, c.MaxEnv)
	case !(c.Alpha > 0) || math.IsInf(c.Alpha, 0):
		return fmt.Errorf("gmi: search: alpha %v: want a positive number", c.Alpha)
	}
	return nil
}

// EnvCounts is the inner loop's num_env values: MinEnv doubled while at most
// MaxEnv (128, 256, ..., 16384 by default).
func (c SearchConfig) EnvCounts() []int {
	c = c.withDefaults()
	var out []int
	for e := c.MinEnv; e > 0 && e <= c.MaxEnv; e *= 2 {
		out = append(out, e)
	}
	return out
}

// Verdicts of a search row.
const (
	VerdictNotRunnable = "not runnable"
	VerdictBaseline    = "baseline"
	VerdictOK          = "ok"
	VerdictSaturated   = "saturated"
)

// SearchRow is one profiled configuration.
type SearchRow struct {
	GMIPerGPU int `json:"gmi_per_gpu"`
	NumEnv    int `json:"num_env"`
	Measurement
	// Sat is R_top / R_mem against the series' previous runnable run; NaN
	// for a baseline or a run that was not runnable.
	Sat Ratio `json:"sat"`
	// Estimate is the projected system throughput (rows with verdict ok).
	Estimate float64 `json:"estimate,omitempty"`
	// Verdict is VerdictNotRunnable, VerdictBaseline (first runnable run of a
	// series: it only sets the reference), VerdictOK (not saturated: a
	// candidate) or VerdictSaturated (the series stops here).
	Verdict string `json:"verdict"`
}

// Ratio is a float that JSON writes as a number, "inf"/"-inf", or null (NaN).
type Ratio float64

// MarshalJSON writes finite values as numbers, infinities as strings, NaN as null.
func (r Ratio) MarshalJSON() ([]byte, error) {
	f := float64(r)
	switch {
	case math.IsNaN(f):
		return []byte("null"), nil
	case math.IsInf(f, 1):
		return []byte(`"inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-inf"`), nil
	}
	return json.Marshal(f)
}

// Choice is the search's answer.
type Choice struct {
	GMIPerGPU  int     `json:"gmi_per_gpu"`
	NumEnv     int     `json:"num_env"`
	Throughput float64 `json:"throughput"`
	Estimate   float64 `json:"estimate"`
}

// SearchResult is the table of runs and the best configuration.
type SearchResult struct {
	Config SearchConfig `json:"config"`
	Rows   []SearchRow  `json:"rows"`
	// Found is false when no run passed the saturation test.
	Found bool   `json:"found"`
	Best  Choice `json:"best"`
	// BestRow indexes Rows; -1 when not Found.
	BestRow int `json:"best_row"`
}

// Search is GMI-DRL's Algorithm 2 (Profiling-based GMI Exploration) over an
// injected profile function. For GMIPerGPU from the maximum down to the
// minimum, it profiles num_env = MinEnv, 2·MinEnv, ... MaxEnv:
//
//   - a run that is not runnable is skipped (the series goes on);
//   - the first runnable run of a series only becomes the reference
//     (pre_top, pre_mem);
//   - each later runnable run computes R_top = (top - pre_top) / pre_top,
//     R_mem = (mem - pre_mem) / pre_mem and Sat = R_top / R_mem, and becomes
//     the reference; if Sat < alpha the series stops; otherwise the
//     estimate is computed and the best estimate so far (strictly greater;
//     the earliest wins ties) is kept.
//
// Where the paper leaves a case open, Search decides so: when either run's
// memory is unknown (0), num_env stands in for memory; when R_mem <= 0,
// Sat is +Inf if throughput grew and 0 if it did not. The paper's test
// "pre_top == pre_mem == 0" becomes "no runnable run yet in this series",
// which is the same for positive measurements and also covers memory 0.
func Search(ctx context.Context, cfg SearchConfig, profile ProfileFunc) (SearchResult, error) {
	if err := cfg.Validate(); err != nil {
		return SearchResult{}, err
	}
	cfg = cfg.withDefaults()
	res := SearchResult{Config: cfg, Rows: []SearchRow{}, BestRow: -1}
	maxTop := math.Inf(-1)
	for k := cfg.MaxGMIPerGPU; k >= cfg.MinGMIPerGPU; k-- {
		var have bool
		var preTop, preMem float64
		var preEnv int
		for _, env := range cfg.EnvCounts() {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			m, err := profile(ctx, k, env)
			if err != nil {
				return res, err
			}
			if m.Runnable && !(m.Throughput > 0) {
				m.Runnable = false
				m.Why = fmt.Sprintf("throughput %v is not positive", m.Throughput)
			}
			row := SearchRow{GMIPerGPU: k, NumEnv: env, Measurement: m, Sat: Ratio(math.NaN())}
			if !m.Runnable {
				row.Verdict = VerdictNotRunnable
				res.Rows = append(res.Rows, row)
				continue
			}
			if !have {
				have, preTop, preMem, preEnv = true, m.Throughput, m.Memory, env
				row.Verdict = VerdictBaseline
				res.Rows = append(res.Rows, row)
				continue
			}
			sat := saturation(m.Throughput, preTop, m.Memory, preMem, env, preEnv)
			preTop, preMem, preEnv = m.Throughput, m.Memory, env
			row.Sat = Ratio(sat)
			if sat < cfg.Alpha {
				row.Verdict = VerdictSaturated
				res.Rows = append(res.Rows, row)
				break
			}
			row.Verdict = VerdictOK
			row.Estimate = cfg.Estimate(k, cfg.GPUs, m.Throughput)
			res.Rows = append(res.Rows, row)
			if row.Estimate > maxTop {
				maxTop = row.Estimate
				res.Found = true
				res.BestRow = len(res.Rows) - 1
				res.Best = Choice{GMIPerGPU: k, NumEnv: env, Throughput: m.Throughput, Estimate: row.Estimate}
			}
		}
	}
	return res, nil
}

// saturation is Sat = R_top / R_mem with Search's rules for the open cases.
func saturation(top, preTop, mem, preMem float64, env, preEnv int) float64 {
	rTop := (top - preTop) / preTop
	var rMem float64
	if mem > 0 && preMem > 0 {
		rMem = (mem - preMem) / preMem
	} else {
		rMem = float64(env-preEnv) / float64(preEnv)
	}
	if rMem <= 0 {
		if rTop > 0 {
			return math.Inf(1)
		}
		return 0
	}
	return rTop / rMem
}
