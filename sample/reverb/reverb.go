// Package reverb is the vocabulary of package sample's replay tables, as data:
// the names of the selectors and rate limiters (Reverb's), the rules their
// parameters follow, and a table described by them (Table). It imports no
// GPU binding, so that the launcher (gearrun validate, through package jobs)
// checks a job spec's [table] by the very rules that sample.NewConfig builds
// it with.
//
// In order: ParseSelector and CheckExponent for each selector, NewLimit for
// the rate limiter, a Table of what they return; then sample.NewConfig
// builds a sample.Config from the Table.
package reverb

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The selectors' names, as sample.Kind's String spells them, in the order of
// the kinds.
const (
	Uniform     = "uniform"
	Prioritized = "prioritized"
	FIFO        = "fifo"
	LIFO        = "lifo"
	MaxHeap     = "maxheap"
	MinHeap     = "minheap"
)

var selectorNames = []string{Uniform, Prioritized, FIFO, LIFO, MaxHeap, MinHeap}

// selectorAliases are other spellings ParseSelector accepts, each with the
// own name it stands for: earlier job specs wrote the heaps with an
// underscore.
var selectorAliases = [][2]string{{"max_heap", MaxHeap}, {"min_heap", MinHeap}}

// SelectorNames returns every selector name ParseSelector accepts: first the
// selectors' own names, then the other spellings ("max_heap", "min_heap").
// The slice is the caller's.
func SelectorNames() []string {
	names := append([]string(nil), selectorNames...)
	for _, a := range selectorAliases {
		names = append(names, a[0])
	}
	return names
}

// Selectors returns the selectors' own names, in the order of sample's kinds.
// The slice is the caller's.
func Selectors() []string { return append([]string(nil), selectorNames...) }

// ParseSelector returns the own name of the selector called name (one of
// SelectorNames). Its error is a *ParamError with an empty Param.
func ParseSelector(name string) (string, error) {
	for _, n := range selectorNames {
		if n == name {
			return n, nil
		}
	}
	others := make([]string, len(selectorAliases))
	for i, a := range selectorAliases {
		if a[0] == name {
			return a[1], nil
		}
		others[i] = a[0]
	}
	return "", &ParamError{What: "selector", Problem: fmt.Sprintf("%q: want one of %s (or %s)", name, strings.Join(selectorNames, ", "), strings.Join(others, ", "))}
}

// CheckExponent checks the priority exponent given to the selector named
// selector (an own name): the prioritized selector takes a finite number >= 0,
// every other one 0. Its error is a *ParamError of "priority_exponent".
func CheckExponent(selector string, exponent float64) error {
	bad := func(format string, args ...any) error {
		return &ParamError{What: selector + " selector", Param: "priority_exponent", Problem: fmt.Sprintf(format, args...)}
	}
	switch {
	case selector != Prioritized && exponent != 0:
		return bad("only applies to %q, not %q", Prioritized, selector)
	case math.IsNaN(exponent) || math.IsInf(exponent, 0):
		return bad("must be finite, got %g", exponent)
	case exponent < 0:
		return bad("must not be negative, got %g", exponent)
	}
	return nil
}

// The rate limiters' names, Reverb's.
const (
	// LimiterMinSize: sampling waits for min_size_to_sample items, and
	// nothing else ever waits.
	LimiterMinSize = "min_size"
	// LimiterSampleToInsertRatio keeps samples/inserts near
	// samples_per_insert once the table holds min_size_to_sample items, give
	// or take error_buffer samples.
	LimiterSampleToInsertRatio = "sample_to_insert_ratio"
	// LimiterQueue lets max_size items wait between inserts and samples:
	// with FIFO selectors and max_times_sampled 1, the table is a queue.
	LimiterQueue = "queue"
	// LimiterStack is the queue's limiter; with LIFO selectors and
	// max_times_sampled 1, the table is a stack.
	LimiterStack = "stack"
)

var limiterNames = []string{LimiterMinSize, LimiterSampleToInsertRatio, LimiterQueue, LimiterStack}

// LimiterNames returns every rate limiter name NewLimit accepts. The slice is
// the caller's.
func LimiterNames() []string { return append([]string(nil), limiterNames...) }

// LimiterParams are the parameters of a rate limiter named by kind, by
// Reverb's names. Each kind reads some of them; the others must be 0.
type LimiterParams struct {
	// MinSizeToSample (min_size_to_sample, every kind, >= 1) is the number of
	// items the table must hold before sampling starts. Reverb's queue and
	// stack sample from the first item (1); a larger value holds their first
	// sample back as it does for min_size.
	MinSizeToSample int64
	// SamplesPerInsert (samples_per_insert, > 0) and ErrorBuffer
	// (error_buffer, >= 0, in samples) are sample_to_insert_ratio's.
	SamplesPerInsert, ErrorBuffer float64
	// MaxSize (max_size, >= 1) is the length of a queue or a stack: the
	// table's max size. min_size and sample_to_insert_ratio ignore it.
	MaxSize int64
}

// Limit is a rate limiter's four numbers, sample.RateLimit's fields.
type Limit struct {
	SamplesPerInsert float64
	MinSize          int64
	MinDiff, MaxDiff float64
}

// NewLimit returns the numbers of the rate limiter named kind (one of
// LimiterNames) with parameters p, as sample's presets (MinSize,
// SampleToInsertRatio, Queue, Stack) set them. It returns every problem
// found, joined; each is a *ParamError whose Param is the parameter's name,
// or empty when kind itself is unknown.
func NewLimit(kind string, p LimiterParams) (Limit, error) {
	what := "rate limiter " + kind
	var errs []error
	bad := func(param, format string, args ...any) {
		errs = append(errs, &ParamError{What: what, Param: param, Problem: fmt.Sprintf(format, args...)})
	}
	switch kind {
	case LimiterMinSize, LimiterSampleToInsertRatio, LimiterQueue, LimiterStack:
	default:
		quoted := make([]string, len(limiterNames))
		for i, n := range limiterNames {
			quoted[i] = strconv.Quote(n)
		}
		return Limit{}, &ParamError{What: "rate limiter", Problem: fmt.Sprintf("%q: want %s or %s",
			kind, strings.Join(quoted[:len(quoted)-1], ", "), quoted[len(quoted)-1])}
	}
	if p.MinSizeToSample < 1 {
		bad("min_size_to_sample", "must be at least 1, got %d", p.MinSizeToSample)
	}
	if kind == LimiterSampleToInsertRatio {
		switch {
		case math.IsNaN(p.SamplesPerInsert) || math.IsInf(p.SamplesPerInsert, 0):
			bad("samples_per_insert", "must be finite, got %g", p.SamplesPerInsert)
		case p.SamplesPerInsert <= 0:
			bad("samples_per_insert", "must be positive, got %g", p.SamplesPerInsert)
		}
		switch {
		case math.IsNaN(p.ErrorBuffer) || math.IsInf(p.ErrorBuffer, 0):
			bad("error_buffer", "must be finite, got %g", p.ErrorBuffer)
		case p.ErrorBuffer < 0:
			bad("error_buffer", "must not be negative, got %g", p.ErrorBuffer)
		}
	} else {
		if p.SamplesPerInsert != 0 {
			bad("samples_per_insert", "only applies to kind %q, not %q", LimiterSampleToInsertRatio, kind)
		}
		if p.ErrorBuffer != 0 {
			bad("error_buffer", "only applies to kind %q, not %q", LimiterSampleToInsertRatio, kind)
		}
	}
	if (kind == LimiterQueue || kind == LimiterStack) && p.MaxSize < 1 {
		bad("max_size", "must be at least 1, got %d", p.MaxSize)
	}
	if len(errs) > 0 {
		return Limit{}, errors.Join(errs...)
	}
	switch kind {
	case LimiterMinSize:
		return MinSizeLimit(p.MinSizeToSample), nil
	case LimiterSampleToInsertRatio:
		spi := p.SamplesPerInsert
		l := RatioLimit(spi, p.MinSizeToSample, p.ErrorBuffer)
		if w := l.MaxDiff - l.MinDiff; w < MinRatioWindow(spi) {
			return Limit{}, &ParamError{What: what, Param: "error_buffer", Problem: fmt.Sprintf(
				"%g: the window max_diff - min_diff = %g is under 2*max(1, samples_per_insert) = %g and could block both inserts and samples", p.ErrorBuffer, w, MinRatioWindow(spi))}
		}
		return l, nil
	}
	// Queue and stack.
	return QueueLimit(p.MinSizeToSample, p.MaxSize), nil
}

// MinSizeLimit is min_size's numbers: sampling waits for k items and
// otherwise nothing blocks (samples per insert 1, diffs -/+ the largest
// float64).
func MinSizeLimit(k int64) Limit {
	return Limit{SamplesPerInsert: 1, MinSize: k, MinDiff: -math.MaxFloat64, MaxDiff: math.MaxFloat64}
}

// RatioLimit is sample_to_insert_ratio's numbers: the diffs are
// spi*minSize -/+ errorBuffer. NewLimit refuses a window narrower than
// MinRatioWindow(spi).
func RatioLimit(spi float64, minSize int64, errorBuffer float64) Limit {
	offset := spi * float64(minSize)
	return Limit{SamplesPerInsert: spi, MinSize: minSize, MinDiff: offset - errorBuffer, MaxDiff: offset + errorBuffer}
}

// MinRatioWindow is the narrowest window max_diff - min_diff that a
// sample_to_insert_ratio limiter of spi samples per insert may have: one
// insert's worth of samples both ways, 2*max(1, spi). A narrower one could
// block inserts and samples at once.
func MinRatioWindow(spi float64) float64 { return 2 * max(1, spi) }

// QueueLimit is a queue's or a stack's numbers: n items may wait between
// inserts and samples (samples per insert 1, diffs [0, n]), and sampling
// waits for minSize items (Reverb's queue: 1).
func QueueLimit(minSize, n int64) Limit {
	return Limit{SamplesPerInsert: 1, MinSize: minSize, MinDiff: 0, MaxDiff: float64(n)}
}

// ParamError is a bad name or parameter.
type ParamError struct {
	// What is the selector or rate limiter: "prioritized selector", "rate
	// limiter queue".
	What string
	// Param is the parameter by Reverb's name ("priority_exponent",
	// "min_size_to_sample", "samples_per_insert", "error_buffer",
	// "max_size"), or empty when the name itself is wrong.
	Param string
	// Problem says what is wrong, without the package's prefix.
	Problem string
}

func (e *ParamError) Error() string {
	if e.Param == "" {
		return "sample: " + e.What + ": " + e.Problem
	}
	return "sample: " + e.What + ": " + e.Param + ": " + e.Problem
}

// Table is a replay table described by names and numbers checked by
// ParseSelector, CheckExponent and NewLimit; sample.NewConfig builds it.
type Table struct {
	Name string
	// MaxSize is the most items the table (one shard of it) holds.
	MaxSize int
	// Sampler and Remover are selectors' own names; SamplerExponent and
	// RemoverExponent their priority exponents (0 but for "prioritized").
	Sampler, Remover                 string
	SamplerExponent, RemoverExponent float64
	MaxTimesSampled                  int64
	Limit                            Limit
}
