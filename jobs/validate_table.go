package jobs

import (
	"fmt"
	"slices"
	"strings"
)

func (v *validator) table(t *Table, world int) {
	if t.Name == "" || !columnRE().MatchString(t.Name) {
		v.add("table.name", "%q: use letters, digits, '_' and '.', starting with a letter or '_'", t.Name)
	}
	if len(t.Columns) == 0 {
		v.add("table.columns", "must list at least one column")
	}
	names := map[string]int{}
	for i, c := range t.Columns {
		field := fmt.Sprintf("table.columns[%d]", i)
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
		if !slices.Contains(DTypes, c.DType) {
			v.add(field+".dtype", "%q: want one of %s", c.DType, strings.Join(DTypes, ", "))
		}
		for j, d := range c.Shape {
			if d < 1 {
				v.add(fmt.Sprintf("%s.shape[%d]", field, j), "must be at least 1, got %d", d)
			}
		}
	}
	if t.Capacity < 1 {
		v.add("table.capacity", "must be at least 1, got %d", t.Capacity)
	}
	if t.TrajectoryLength < 1 {
		v.add("table.trajectory_length", "must be at least 1, got %d", t.TrajectoryLength)
	}
	if !slices.Contains(Selectors, t.Sampler) {
		v.add("table.sampler", "%q: want one of %s", t.Sampler, strings.Join(Selectors, ", "))
	}
	if !slices.Contains(Selectors, t.Remover) {
		v.add("table.remover", "%q: want one of %s", t.Remover, strings.Join(Selectors, ", "))
	}
	if t.PriorityExponent < 0 {
		v.add("table.priority_exponent", "must not be negative, got %g", t.PriorityExponent)
	} else if t.PriorityExponent != 0 && t.Sampler != "prioritized" {
		v.add("table.priority_exponent", "only applies to the \"prioritized\" sampler, not %q", t.Sampler)
	}
	if t.MaxTimesSampled < 0 {
		v.add("table.max_times_sampled", "must not be negative (0 means no limit), got %d", t.MaxTimesSampled)
	}

	rl := &t.RateLimiter
	if rl.MinSizeToSample < 1 {
		v.add("table.rate_limiter.min_size_to_sample", "must be at least 1, got %d", rl.MinSizeToSample)
	} else if t.Capacity >= 1 && world >= 1 && rl.MinSizeToSample > t.Capacity*world {
		v.add("table.rate_limiter.min_size_to_sample", "%d exceeds the table's capacity (%d shards × %d)", rl.MinSizeToSample, world, t.Capacity)
	}
	switch rl.Kind {
	case LimiterMinSize:
		v.noRatio(rl)
	case LimiterSampleToInsertRatio:
		if rl.SamplesPerInsert <= 0 {
			v.add("table.rate_limiter.samples_per_insert", "must be positive, got %g", rl.SamplesPerInsert)
		}
		if rl.ErrorBuffer < 0 {
			v.add("table.rate_limiter.error_buffer", "must not be negative, got %g", rl.ErrorBuffer)
		}
	case LimiterQueue, LimiterStack:
		v.noRatio(rl)
		want := "fifo"
		if rl.Kind == LimiterStack {
			want = "lifo"
		}
		if t.Sampler != want {
			v.add("table.sampler", "is %q but a %s takes %q", t.Sampler, rl.Kind, want)
		}
		if t.Remover != want {
			v.add("table.remover", "is %q but a %s takes %q", t.Remover, rl.Kind, want)
		}
		if t.MaxTimesSampled != 1 {
			v.add("table.max_times_sampled", "is %d but a %s takes 1", t.MaxTimesSampled, rl.Kind)
		}
	default:
		v.add("table.rate_limiter.kind", "%q: want \"min_size\", \"sample_to_insert_ratio\", \"queue\" or \"stack\"", rl.Kind)
	}
}

func (v *validator) noRatio(rl *RateLimiter) {
	if rl.SamplesPerInsert != 0 {
		v.add("table.rate_limiter.samples_per_insert", "only applies to kind \"sample_to_insert_ratio\", not %q", rl.Kind)
	}
	if rl.ErrorBuffer != 0 {
		v.add("table.rate_limiter.error_buffer", "only applies to kind \"sample_to_insert_ratio\", not %q", rl.Kind)
	}
}
