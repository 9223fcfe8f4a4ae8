// Package clock is gear's one injectable clock: the type that every package
// taking a clock (store.WithClock, sample.Config.Clock, jobs.Cluster.Clock,
// jobs.SlurmTask.Clock, the DQN example's hooks) accepts, so that a test drives
// all of them with the same fake.
//
// A Clock is a function, so time.Now and any func() time.Time literal convert
// to it without a wrapper, and the zero value is the wall clock: a caller
// leaves the field nil unless it fakes time, and a user of the field calls Now,
// never the function itself.
package clock

import "time"

// Clock returns the current time; nil is the wall clock (time.Now). A fake
// should not go backwards.
type Clock func() time.Time

// Now returns c's current time, or time.Now() when c is nil. It allocates
// nothing: hot paths (store commits, sample inserts) pay a nil check and a call
// beside the clock's own.
func (c Clock) Now() time.Time {
	if c == nil {
		return time.Now()
	}
	return c()
}
