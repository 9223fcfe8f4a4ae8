package sample_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/sample/reverb"
)

// paramErrors returns the *ParamErrors of err (joined or not), failing when
// err holds anything else.
func paramErrors(t *testing.T, err error) []*sample.ParamError {
	t.Helper()
	var out []*sample.ParamError
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var pe *sample.ParamError
		if !errors.As(err, &pe) {
			t.Fatalf("%v (%T) is not a *sample.ParamError", err, err)
		}
		out = append(out, pe)
	}
	if err != nil {
		walk(err)
	}
	return out
}

// Every selector name parses and builds a selector of its kind, and every
// kind has a name: SelectorNames is the whole vocabulary.
func TestSelectorNames(t *testing.T) {
	named := map[sample.Kind]bool{}
	for _, name := range sample.SelectorNames() {
		k, err := sample.ParseKind(name)
		if err != nil {
			t.Fatalf("ParseKind(%q): %v", name, err)
		}
		named[k] = true
		exp := 0.0
		if k == sample.KindPrioritized {
			exp = 0.6
		}
		s, err := sample.ParseSelector(name, exp)
		if err != nil {
			t.Fatalf("ParseSelector(%q, %g): %v", name, exp, err)
		}
		if s.Kind() != k || s.Len() != 0 {
			t.Errorf("ParseSelector(%q) is a %s holding %d", name, s.Kind(), s.Len())
		}
		if p, ok := s.(*sample.Prioritized); ok && p.Exponent() != exp {
			t.Errorf("%q: exponent %g, want %g", name, p.Exponent(), exp)
		}
		if k.String() != name && !strings.Contains(name, "_") {
			t.Errorf("%q parses to %s: only the underscore spellings are other names", name, k)
		}
	}
	for k := sample.Kind(1); !strings.HasPrefix(k.String(), "kind("); k++ {
		if !named[k] {
			t.Errorf("kind %s has no name in SelectorNames", k)
		}
	}
	if len(named) == 0 {
		t.Fatal("no selector names")
	}
	for _, bad := range []string{"", "random", "MaxHeap", "max-heap", "heap", "kind(1)"} {
		_, err := sample.ParseSelector(bad, 0)
		pes := paramErrors(t, err)
		if len(pes) != 1 || pes[0].Param != "" || !strings.Contains(pes[0].Problem, "want one of uniform, prioritized") {
			t.Errorf("ParseSelector(%q): %v, want a name error listing the selectors", bad, err)
		}
	}
}

func TestSelectorExponent(t *testing.T) {
	for _, tc := range []struct {
		kind sample.Kind
		exp  float64
		want string
	}{
		{sample.KindUniform, 0.5, `only applies to "prioritized", not "uniform"`},
		{sample.KindMinHeap, 1, `only applies to "prioritized", not "minheap"`},
		{sample.KindPrioritized, -1, "must not be negative, got -1"},
		{sample.KindPrioritized, math.NaN(), "must be finite"},
		{sample.KindPrioritized, math.Inf(1), "must be finite"},
	} {
		_, err := sample.NewSelector(tc.kind, tc.exp)
		pes := paramErrors(t, err)
		if len(pes) != 1 || pes[0].Param != "priority_exponent" || !strings.Contains(pes[0].Problem, tc.want) {
			t.Errorf("NewSelector(%s, %g): %v, want priority_exponent: %q", tc.kind, tc.exp, err, tc.want)
		}
	}
	if s, err := sample.NewSelector(sample.KindPrioritized, 0); err != nil || s.Kind() != sample.KindPrioritized {
		t.Errorf("prioritized with exponent 0 (uniform over the present items): %v", err)
	}
}

// Every limiter name builds Reverb's limiter of that name.
func TestLimiterNames(t *testing.T) {
	ratio, err := sample.SampleToInsertRatio(4, 10, 100)
	if err != nil {
		t.Fatal(err)
	}
	queue5 := sample.Queue(50)
	queue5.MinSize = 5
	want := map[string]struct {
		p    sample.LimiterParams
		want sample.RateLimit
	}{
		sample.LimiterMinSize:             {sample.LimiterParams{MinSizeToSample: 10}, sample.MinSize(10)},
		sample.LimiterSampleToInsertRatio: {sample.LimiterParams{MinSizeToSample: 10, SamplesPerInsert: 4, ErrorBuffer: 100}, ratio},
		sample.LimiterQueue:               {sample.LimiterParams{MinSizeToSample: 1, MaxSize: 50}, sample.Queue(50)},
		sample.LimiterStack:               {sample.LimiterParams{MinSizeToSample: 5, MaxSize: 50}, queue5},
	}
	names := sample.LimiterNames()
	if len(names) != len(want) {
		t.Errorf("LimiterNames() = %v, want the %d kinds tested here", names, len(want))
	}
	for _, name := range names {
		tc, ok := want[name]
		if !ok {
			t.Errorf("limiter %q has no test here", name)
			continue
		}
		got, err := sample.NewRateLimit(name, tc.p)
		if err != nil || got != tc.want {
			t.Errorf("NewRateLimit(%q, %+v) = %+v, %v; want %+v", name, tc.p, got, err, tc.want)
		}
		if _, err := sample.NewRateLimiter(got); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
}

func TestLimiterRefusals(t *testing.T) {
	for _, tc := range []struct {
		kind   string
		p      sample.LimiterParams
		params []string // the Params of the errors, in order
		want   string
	}{
		{"leaky", sample.LimiterParams{MinSizeToSample: 1}, []string{""}, `"leaky": want "min_size", "sample_to_insert_ratio", "queue" or "stack"`},
		{"", sample.LimiterParams{MinSizeToSample: 1}, []string{""}, `want "min_size"`},
		{sample.LimiterMinSize, sample.LimiterParams{}, []string{"min_size_to_sample"}, "must be at least 1, got 0"},
		{sample.LimiterMinSize, sample.LimiterParams{MinSizeToSample: 1, SamplesPerInsert: 2, ErrorBuffer: 3}, []string{"samples_per_insert", "error_buffer"}, `only applies to kind "sample_to_insert_ratio", not "min_size"`},
		{sample.LimiterSampleToInsertRatio, sample.LimiterParams{MinSizeToSample: 1}, []string{"samples_per_insert"}, "must be positive"},
		{sample.LimiterSampleToInsertRatio, sample.LimiterParams{MinSizeToSample: 1, SamplesPerInsert: math.Inf(1), ErrorBuffer: 10}, []string{"samples_per_insert"}, "must be finite"},
		{sample.LimiterSampleToInsertRatio, sample.LimiterParams{MinSizeToSample: 1, SamplesPerInsert: 1, ErrorBuffer: -1}, []string{"error_buffer"}, "must not be negative"},
		{sample.LimiterSampleToInsertRatio, sample.LimiterParams{MinSizeToSample: 1, SamplesPerInsert: 4}, []string{"error_buffer"}, "could block both inserts and samples"},
		{sample.LimiterQueue, sample.LimiterParams{MinSizeToSample: 1}, []string{"max_size"}, "must be at least 1, got 0"},
		{sample.LimiterStack, sample.LimiterParams{MinSizeToSample: 1, MaxSize: 3, ErrorBuffer: 1}, []string{"error_buffer"}, `not "stack"`},
	} {
		_, err := sample.NewRateLimit(tc.kind, tc.p)
		pes := paramErrors(t, err)
		var params []string
		for _, pe := range pes {
			params = append(params, pe.Param)
		}
		if len(pes) == 0 || strings.Join(params, ",") != strings.Join(tc.params, ",") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRateLimit(%q, %+v): %v (params %q), want params %q and %q", tc.kind, tc.p, err, params, tc.params, tc.want)
		}
	}
}

// reverb's sample_to_insert_ratio rule is SampleToInsertRatio's: over a grid,
// the one accepts what the other does and sets the same numbers.
func TestRateLimitRatioAgreesWithPreset(t *testing.T) {
	for _, spi := range []float64{0.25, 0.5, 1, 2, 4, 32} {
		for _, minSize := range []int64{1, 3, 1000} {
			for _, eb := range []float64{0, 0.5, 1, 1.5, 2, 4, 31.9, 32, 100} {
				want, werr := sample.SampleToInsertRatio(spi, minSize, eb)
				got, gerr := sample.NewRateLimit(sample.LimiterSampleToInsertRatio, sample.LimiterParams{
					MinSizeToSample: minSize, SamplesPerInsert: spi, ErrorBuffer: eb})
				if (werr == nil) != (gerr == nil) || got != want {
					t.Errorf("spi %g, min size %d, error buffer %g: NewRateLimit %+v, %v; SampleToInsertRatio %+v, %v",
						spi, minSize, eb, got, gerr, want, werr)
				}
			}
		}
	}
}

func TestNewConfig(t *testing.T) {
	cfg, err := sample.NewConfig(reverb.Table{Name: "t", MaxSize: 8, Sampler: reverb.Prioritized, SamplerExponent: 0.5,
		Remover: reverb.MinHeap, MaxTimesSampled: 2, Limit: reverb.Limit{SamplesPerInsert: 1, MinSize: 1, MinDiff: 0, MaxDiff: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Sampler.(*sample.Prioritized).Exponent() != 0.5 || cfg.Remover.Kind() != sample.KindMinHeap || cfg.RateLimit != sample.Queue(8) {
		t.Fatalf("config %+v", cfg)
	}
	tb, err := sample.NewTable(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tb.Close()
	if _, err := sample.NewConfig(reverb.Table{Sampler: reverb.Uniform, SamplerExponent: 1, Remover: reverb.FIFO}); err == nil {
		t.Error("NewConfig gave a uniform sampler an exponent")
	}
}
