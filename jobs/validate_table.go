package jobs

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/gear-rl/gear/sample/reverb"
	"github.com/gear-rl/gear/store"
)

// table checks t and builds what it describes, in store's and sample's terms,
// through their own parsers and rules (sample's in package reverb): Validate and Build both call it,
// so that a spec that validates builds. shards is the number of shards the
// table spans; below 1 it is unknown (a world size already refused) and the
// checks against it are skipped. The results are zero when a problem was
// added.
func (v *validator) table(t *Table, shards int) (store.Spec, reverb.Table) {
	errs := len(v.errs)
	if t.Name == "" || !columnRE().MatchString(t.Name) {
		v.add("table.name", "%q: use letters, digits, '_' and '.', starting with a letter or '_'", t.Name)
	}
	if len(t.Columns) == 0 {
		v.add("table.columns", "must list at least one column")
	}
	names := map[string]int{}
	cols := make([]store.Column, 0, len(t.Columns))
	for i, c := range t.Columns {
		field := fmt.Sprintf("table.columns[%d]", i)
		bad := len(v.errs)
		switch {
		case !columnRE().MatchString(c.Name):
			v.add(field+".name", "%q: use letters, digits, '_' and '.', starting with a letter or '_'", c.Name)
		default:
			if j, dup := names[c.Name]; dup {
				v.add(field+".name", "%q is also columns[%d]'s name", c.Name, j)
			} else {
				names[c.Name] = i
			}
		}
		dtype, err := store.ParseDType(c.DType)
		if err != nil {
			v.add(field+".dtype", "%v", err)
		}
		for j, d := range c.Shape {
			if d < 1 {
				v.add(fmt.Sprintf("%s.shape[%d]", field, j), "must be at least 1, got %d", d)
			}
		}
		if len(v.errs) > bad || t.TrajectoryLength < 1 {
			continue
		}
		sc := store.Column{Name: c.Name, DType: dtype, Shape: slices.Clone(c.Shape), Length: t.TrajectoryLength}
		if err := sc.Validate(); err != nil {
			v.add(field, "%v", err)
			continue
		}
		cols = append(cols, sc)
	}
	switch {
	case t.Capacity < 1:
		v.add("table.capacity", "must be at least 1, got %d", t.Capacity)
	case t.Capacity > store.MaxCapacity-1:
		v.add("table.capacity", "%d: at most %d (a shard's most rows, %d, less one for a writer)", t.Capacity, store.MaxCapacity-1, store.MaxCapacity)
	}
	if t.TrajectoryLength < 1 {
		v.add("table.trajectory_length", "must be at least 1, got %d", t.TrajectoryLength)
	}
	spec := store.Spec{Capacity: t.Capacity + 1, Columns: cols, Remover: store.RemoverNone, Packed: t.Packed}
	if len(cols) > 0 && len(cols) == len(t.Columns) && t.Capacity >= 1 {
		if err := spec.Validate(); err != nil {
			v.add("table.columns", "%v", err)
		}
	}

	// The selectors. priority_exponent is the prioritized ones'; with none, the
	// sampler is given it, and refuses it.
	sampler, serr := reverb.ParseSelector(t.Sampler)
	v.params(serr, "table.sampler", nil)
	remover, rerr := reverb.ParseSelector(t.Remover)
	v.params(rerr, "table.remover", nil)
	sexp, rexp := 0.0, 0.0
	switch {
	case sampler == reverb.Prioritized || remover == reverb.Prioritized:
		if sampler == reverb.Prioritized {
			sexp = t.PriorityExponent
		}
		if remover == reverb.Prioritized {
			rexp = t.PriorityExponent
		}
	default:
		sexp = t.PriorityExponent
	}
	exponent := map[string]string{"priority_exponent": "table.priority_exponent"}
	if serr == nil {
		v.params(reverb.CheckExponent(sampler, sexp), "table.sampler", exponent)
	}
	if rerr == nil {
		v.params(reverb.CheckExponent(remover, rexp), "table.remover", exponent)
	}
	if t.MaxTimesSampled < 0 {
		v.add("table.max_times_sampled", "must not be negative (0 means no limit), got %d", t.MaxTimesSampled)
	}

	// The rate limiter: a global one, over every shard.
	rl := &t.RateLimiter
	if rl.MinSizeToSample >= 1 && t.Capacity >= 1 && shards >= 1 && int64(rl.MinSizeToSample) > mulSat(t.Capacity, shards) {
		v.add("table.rate_limiter.min_size_to_sample", "%d exceeds the table's capacity (%d shards × %d)", rl.MinSizeToSample, shards, t.Capacity)
	}
	limit, err := reverb.NewLimit(rl.Kind, reverb.LimiterParams{
		MinSizeToSample:  int64(rl.MinSizeToSample),
		SamplesPerInsert: rl.SamplesPerInsert,
		ErrorBuffer:      rl.ErrorBuffer,
		MaxSize:          mulSat(max(t.Capacity, 1), max(shards, 1)),
	})
	v.params(err, "table.rate_limiter.kind", map[string]string{
		"min_size_to_sample": "table.rate_limiter.min_size_to_sample",
		"samples_per_insert": "table.rate_limiter.samples_per_insert",
		"error_buffer":       "table.rate_limiter.error_buffer",
		"max_size":           "table.capacity",
	})
	if rl.Kind == LimiterQueue || rl.Kind == LimiterStack {
		want := presetSelector(rl.Kind)
		if serr == nil && sampler != want {
			v.add("table.sampler", "is %q but a %s takes %q", t.Sampler, rl.Kind, want)
		}
		if rerr == nil && remover != want {
			v.add("table.remover", "is %q but a %s takes %q", t.Remover, rl.Kind, want)
		}
		if t.MaxTimesSampled != 1 {
			v.add("table.max_times_sampled", "is %d but a %s takes 1", t.MaxTimesSampled, rl.Kind)
		}
	}

	if len(v.errs) > errs {
		return store.Spec{}, reverb.Table{}
	}
	return spec, reverb.Table{
		Name:            t.Name,
		MaxSize:         t.Capacity,
		Sampler:         sampler,
		Remover:         remover,
		SamplerExponent: sexp,
		RemoverExponent: rexp,
		MaxTimesSampled: int64(t.MaxTimesSampled),
		Limit:           limit,
	}
}

// params adds err, an error of reverb's checks, as FieldErrors: a
// *reverb.ParamError of a parameter at fields[Param], one of the name itself
// (or anything else) at field. A problem already added is not added again.
func (v *validator) params(err error, field string, fields map[string]string) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			v.params(e, field, fields)
		}
		return
	}
	fe := &FieldError{Field: field, Problem: err.Error()}
	var pe *reverb.ParamError
	if errors.As(err, &pe) {
		fe.Problem = pe.Problem
		if f, ok := fields[pe.Param]; ok {
			fe.Field = f
		} else if pe.Param != "" {
			fe.Problem = pe.Param + ": " + pe.Problem
		}
	}
	for _, e := range v.errs {
		if old, ok := e.(*FieldError); ok && *old == *fe {
			return
		}
	}
	v.errs = append(v.errs, fe)
}

// presetSelector is the selector of Reverb's queue (FIFO) or stack (LIFO).
func presetSelector(kind string) string {
	if kind == LimiterStack {
		return reverb.LIFO
	}
	return reverb.FIFO
}

// prioritized reports whether the sampler or the remover is prioritized.
func (t *Table) prioritized() bool {
	for _, name := range []string{t.Sampler, t.Remover} {
		if own, err := reverb.ParseSelector(name); err == nil && own == reverb.Prioritized {
			return true
		}
	}
	return false
}

// mulSat is a*b for a, b >= 1, saturating at the largest int64.
func mulSat(a, b int) int64 {
	if int64(a) > math.MaxInt64/int64(b) {
		return math.MaxInt64
	}
	return int64(a) * int64(b)
}
