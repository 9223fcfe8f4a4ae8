package sample

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// This file is the package's vocabulary: the names of its selectors and rate
// limiters, and their constructors from a name and parameters, as a job spec's
// [table] writes them (jobs.Table.Build calls these, and so does gearrun
// validate, so that a spec that validates builds). Parameters go by Reverb's
// names.

// kindAliases are the other spellings ParseKind accepts: earlier job specs
// wrote the heaps as Reverb's Python writes its selector classes' words.
var kindAliases = []struct {
	name string
	kind Kind
}{
	{"max_heap", KindMaxHeap},
	{"min_heap", KindMinHeap},
}

const firstKind, lastKind = KindUniform, KindMinHeap

// SelectorNames returns every selector name ParseKind accepts: first each
// kind's own name (Kind.String: "uniform", "prioritized", "fifo", "lifo",
// "maxheap", "minheap"), then the other spellings ("max_heap", "min_heap").
// The slice is the caller's.
func SelectorNames() []string {
	names := make([]string, 0, int(lastKind)+len(kindAliases))
	for k := firstKind; k <= lastKind; k++ {
		names = append(names, k.String())
	}
	for _, a := range kindAliases {
		names = append(names, a.name)
	}
	return names
}

// ParseKind reads a selector name: one of SelectorNames. Its error is a
// *ParamError with an empty Param (the name itself is wrong).
func ParseKind(name string) (Kind, error) {
	for k := firstKind; k <= lastKind; k++ {
		if k.String() == name {
			return k, nil
		}
	}
	for _, a := range kindAliases {
		if a.name == name {
			return a.kind, nil
		}
	}
	var own, other []string
	for k := firstKind; k <= lastKind; k++ {
		own = append(own, k.String())
	}
	for _, a := range kindAliases {
		other = append(other, a.name)
	}
	return 0, &ParamError{What: "selector", Problem: fmt.Sprintf("%q: want one of %s (or %s)", name, strings.Join(own, ", "), strings.Join(other, ", "))}
}

// NewSelector returns a fresh, empty selector of kind k. exponent is the
// prioritized selector's priority exponent (a finite number >= 0); every other
// kind takes 0. Errors are *ParamErrors; a bad exponent's Param is
// "priority_exponent".
func NewSelector(k Kind, exponent float64) (Selector, error) {
	if k != KindPrioritized && exponent != 0 {
		return nil, &ParamError{What: k.String() + " selector", Param: "priority_exponent",
			Problem: fmt.Sprintf("only applies to %q, not %q", KindPrioritized.String(), k.String())}
	}
	switch k {
	case KindUniform:
		return NewUniform(), nil
	case KindPrioritized:
		switch {
		case math.IsNaN(exponent) || math.IsInf(exponent, 0):
			return nil, &ParamError{What: "prioritized selector", Param: "priority_exponent", Problem: fmt.Sprintf("must be finite, got %g", exponent)}
		case exponent < 0:
			return nil, &ParamError{What: "prioritized selector", Param: "priority_exponent", Problem: fmt.Sprintf("must not be negative, got %g", exponent)}
		}
		p, err := NewPrioritized(exponent)
		if err != nil {
			return nil, &ParamError{What: "prioritized selector", Param: "priority_exponent", Problem: strings.TrimPrefix(err.Error(), "sample: ")}
		}
		return p, nil
	case KindFIFO:
		return NewFIFO(), nil
	case KindLIFO:
		return NewLIFO(), nil
	case KindMaxHeap:
		return NewMaxHeap(), nil
	case KindMinHeap:
		return NewMinHeap(), nil
	}
	return nil, &ParamError{What: "selector", Problem: fmt.Sprintf("unknown kind %d", int(k))}
}

// ParseSelector is ParseKind then NewSelector: a fresh selector named name
// ("prioritized" with its exponent; 0 for the others).
func ParseSelector(name string, exponent float64) (Selector, error) {
	k, err := ParseKind(name)
	if err != nil {
		return nil, err
	}
	return NewSelector(k, exponent)
}

// The rate limiters' names, Reverb's: NewRateLimit reads them.
const (
	// LimiterMinSize is MinSize(min_size_to_sample): sampling waits for that
	// many items, and nothing else ever waits.
	LimiterMinSize = "min_size"
	// LimiterSampleToInsertRatio is SampleToInsertRatio(samples_per_insert,
	// min_size_to_sample, error_buffer).
	LimiterSampleToInsertRatio = "sample_to_insert_ratio"
	// LimiterQueue is Queue(max_size): with FIFO selectors and
	// max_times_sampled 1, the table is a queue of max_size items.
	LimiterQueue = "queue"
	// LimiterStack is Stack(max_size), the queue's limiter; with LIFO
	// selectors and max_times_sampled 1, the table is a stack.
	LimiterStack = "stack"
)

var limiterNames = []string{LimiterMinSize, LimiterSampleToInsertRatio, LimiterQueue, LimiterStack}

// LimiterNames returns every rate limiter name NewRateLimit accepts. The slice
// is the caller's.
func LimiterNames() []string { return append([]string(nil), limiterNames...) }

// LimiterParams are the parameters of a rate limiter named by kind, by Reverb's
// names. Each kind reads some of them; the others must be 0.
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

// NewRateLimit returns the RateLimit of the rate limiter named kind (one of
// LimiterNames) with parameters p. It returns every problem found, joined;
// each is a *ParamError whose Param is the parameter's name, or empty when
// kind itself is unknown.
func NewRateLimit(kind string, p LimiterParams) (RateLimit, error) {
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
		return RateLimit{}, &ParamError{What: "rate limiter", Problem: fmt.Sprintf("%q: want %s or %s",
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
		return RateLimit{}, errors.Join(errs...)
	}
	var rl RateLimit
	switch kind {
	case LimiterMinSize:
		rl = MinSize(p.MinSizeToSample)
	case LimiterSampleToInsertRatio:
		var err error
		if rl, err = SampleToInsertRatio(p.SamplesPerInsert, p.MinSizeToSample, p.ErrorBuffer); err != nil {
			return RateLimit{}, &ParamError{What: what, Param: "error_buffer", Problem: strings.TrimPrefix(err.Error(), "sample: ")}
		}
	case LimiterQueue:
		rl = Queue(p.MaxSize)
		rl.MinSize = p.MinSizeToSample
	case LimiterStack:
		rl = Stack(p.MaxSize)
		rl.MinSize = p.MinSizeToSample
	}
	if err := rl.Validate(); err != nil {
		return RateLimit{}, &ParamError{What: what, Problem: strings.TrimPrefix(err.Error(), "sample: ")}
	}
	return rl, nil
}

// ParamError is a bad name or parameter given to ParseKind, NewSelector,
// ParseSelector or NewRateLimit.
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
