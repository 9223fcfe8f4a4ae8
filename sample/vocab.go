package sample

import (
	"fmt"
	"slices"

	"github.com/gear-rl/gear/sample/reverb"
)

// This file builds the package's selectors and rate limiters from their names
// and parameters. The names and the rules of the parameters are package
// reverb's, which has no GPU binding, so that package jobs (and gearrun
// validate) checks a job spec's [table] by the same rules: a spec that
// validates builds here.

// ParamError is a bad name or parameter given to ParseKind, NewSelector,
// ParseSelector, NewRateLimit or NewConfig.
type ParamError = reverb.ParamError

// LimiterParams are a named rate limiter's parameters (see NewRateLimit).
type LimiterParams = reverb.LimiterParams

// The rate limiters' names, Reverb's: NewRateLimit reads them.
const (
	LimiterMinSize             = reverb.LimiterMinSize
	LimiterSampleToInsertRatio = reverb.LimiterSampleToInsertRatio
	LimiterQueue               = reverb.LimiterQueue
	LimiterStack               = reverb.LimiterStack
)

// SelectorNames returns every selector name ParseKind accepts: each kind's own
// name (Kind.String: "uniform", "prioritized", "fifo", "lifo", "maxheap",
// "minheap"), then the other spellings ("max_heap", "min_heap"). The slice
// is the caller's.
func SelectorNames() []string { return reverb.SelectorNames() }

// LimiterNames returns every rate limiter name NewRateLimit accepts. The slice
// is the caller's.
func LimiterNames() []string { return reverb.LimiterNames() }

// ParseKind reads a selector name: one of SelectorNames. Its error is a
// *ParamError with an empty Param (the name itself is wrong).
func ParseKind(name string) (Kind, error) {
	own, err := reverb.ParseSelector(name)
	if err != nil {
		return 0, err
	}
	i := slices.Index(reverb.Selectors(), own)
	if i < 0 || KindUniform+Kind(i) > KindMinHeap {
		return 0, fmt.Errorf("sample: selector %q has no kind", own) // TestSelectorNames rules it out
	}
	return KindUniform + Kind(i), nil
}

// NewSelector returns a fresh, empty selector of kind k. exponent is the
// prioritized selector's priority exponent (a finite number >= 0); every
// other kind takes 0. Errors are *ParamErrors; a bad exponent's Param is
// "priority_exponent".
func NewSelector(k Kind, exponent float64) (Selector, error) {
	if err := reverb.CheckExponent(k.String(), exponent); err != nil {
		return nil, err
	}
	switch k {
	case KindUniform:
		return NewUniform(), nil
	case KindPrioritized:
		return NewPrioritized(exponent)
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

// NewRateLimit returns the RateLimit of the rate limiter named kind (one of
// LimiterNames) with parameters p: MinSize, SampleToInsertRatio, Queue or
// Stack. It returns every problem found, joined; each is a *ParamError whose
// Param is the parameter's name, or empty when kind itself is unknown.
func NewRateLimit(kind string, p LimiterParams) (RateLimit, error) {
	l, err := reverb.NewLimit(kind, p)
	if err != nil {
		return RateLimit{}, err
	}
	return RateLimit(l), nil
}

// NewConfig builds the Config of the table t describes, checked by package
// reverb's rules (a job spec's [table] gives one, through jobs.Table.Build):
// two fresh selectors, which the table built from it owns, and the rate
// limit. Name, MaxSize, Sampler, Remover, MaxTimesSampled and RateLimit are
// set; the caller sets Seed and the rest.
func NewConfig(t reverb.Table) (Config, error) {
	sampler, err := ParseSelector(t.Sampler, t.SamplerExponent)
	if err != nil {
		return Config{}, err
	}
	remover, err := ParseSelector(t.Remover, t.RemoverExponent)
	if err != nil {
		return Config{}, err
	}
	return Config{
		Name: t.Name, MaxSize: t.MaxSize, Sampler: sampler, Remover: remover,
		MaxTimesSampled: t.MaxTimesSampled, RateLimit: RateLimit(t.Limit),
	}, nil
}
