// Package shmname names gear's shared-memory segments (the files under
// /dev/shm), and reads such names back. It is the one place that knows the
// scheme: collective and roles make their segments' names here, rank forwards
// its public SegmentName, SegmentJob and LocalJobID here, and launch (the
// launcher's clean-up between restarts, at the end of a job and in `gearrun
// clean`) classifies what it finds in /dev/shm here.
//
// Every name is "gear.<job>.<what>": the job's ID (which has no '.') and what
// the segment holds. The first part of what, when a '.' follows it, may be a
// Kind that says whether the segment lives for one generation of a restarted
// job's world or for the whole job:
//
//	gear.<job>.coll.<comm>.r<rank>.<nonce>        Coll: a host's collective rings, per generation
//	gear.<job>.roles.<stream>.<name>....<nonce>   Roles: a role channel, per generation
//	gear.<job>.store.<what>                       Store: a replay store shard, per job
//	gear.<job>.metrics.r<rank>.g<gen>.p<pid>      Metrics: a rank's counters and trace ring, per job
//	gear.<job>.<anything else>                    Data: other job data, such as a store shard named dqn.replay.0, per job
//
// A caller that makes a segment picks its kind by its lifetime: a segment
// that a restarted rank must find again is per job (Store or Data), one that
// carries a random nonce and is made anew by each generation is per
// generation (Coll, Roles). Between generations the launcher removes exactly
// the per-generation kinds (Kind.PerGeneration).
package shmname

import (
	"os"
	"strconv"
	"strings"
)

// Prefix starts the name of every shared-memory segment gear makes.
const Prefix = "gear."

// localJob starts the job ID of a process started alone (LocalJobID).
const localJob = "local-"

// Kind is what a segment holds, named by the first part of what in
// "gear.<job>.<what>". Data, the empty Kind, is every name whose first part
// is none of the others.
type Kind string

// The kinds of segment, each with its lifetime (Kind.PerGeneration).
const (
	// Coll is a host's collective segment (the inboxes of its ranks' rings),
	// "coll.<comm>.r<rank>.<nonce>", made by collective for one world.
	Coll Kind = "coll"
	// Roles is a role channel (sample, param or infer stream),
	// "roles.<stream>.<name>[.r<rank>].<nonce>", made by roles for one world.
	Roles Kind = "roles"
	// Store is a replay store shard named "store.<what>" (store's tests,
	// gearbench); a restarted rank re-attaches to it.
	Store Kind = "store"
	// Metrics is a rank's metrics segment, "metrics.r<rank>.g<gen>.p<pid>",
	// made by internal/metrics: per job, so that the launcher merges every
	// generation's trace when the job ends.
	Metrics Kind = "metrics"
	// Data is any other segment of the job (a shard named "dqn.replay.0",
	// a user's own): kept for the whole job.
	Data Kind = ""
)

// kinds lists every Kind; Kinds returns a copy.
var kinds = [...]Kind{Coll, Roles, Store, Metrics, Data}

// Kinds returns every kind of segment, Data last.
func Kinds() []Kind { return append([]Kind(nil), kinds[:]...) }

// PerGeneration reports whether segments of kind k belong to one generation
// of a job's world, so that a launcher removes them before it restarts the
// job's ranks; the others (per job) are kept until the job ends.
func (k Kind) PerGeneration() bool { return k == Coll || k == Roles }

// String returns k's name; Data is "data".
func (k Kind) String() string {
	if k == Data {
		return "data"
	}
	return string(k)
}

// Name returns the name (without a leading slash) of a segment of job:
// "gear.<job>.<what>". job must be a job ID (no '.', see rank.CheckJobID) and
// what must not contain '/'. Name(job, "") is the prefix of all of job's
// segments.
func Name(job, what string) string { return Prefix + job + "." + what }

// Make returns the name of a segment of job of kind k: "gear.<job>.<k>.<rest>",
// or Name(job, rest) for Data. For Data, rest must not start with another
// kind's name followed by '.', or Parse would read that kind back.
func Make(job string, k Kind, rest string) string {
	if k == Data {
		return Name(job, rest)
	}
	return Name(job, string(k)+"."+rest)
}

// Parts is a segment name read back by Parse.
type Parts struct {
	Job  string // the job's ID, never empty
	Kind Kind   // what the segment holds
	Rest string // what follows the kind (for Data, all of what follows the job)
}

// Parse reads back a name made by Name or Make, and reports false for a name
// gear did not make (no "gear." prefix, or no non-empty job ID followed by '.').
func Parse(name string) (Parts, bool) {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return Parts{}, false
	}
	job, what, ok := strings.Cut(rest, ".")
	if !ok || job == "" {
		return Parts{}, false
	}
	p := Parts{Job: job, Kind: Data, Rest: what}
	if first, after, ok := strings.Cut(what, "."); ok {
		for _, k := range kinds {
			if k != Data && string(k) == first {
				p.Kind, p.Rest = k, after
			}
		}
	}
	return p, true
}

// Job returns the job ID in a segment name, and false for a name gear did not
// make (see Parse).
func Job(name string) (string, bool) {
	p, ok := Parse(name)
	return p.Job, ok
}

// LocalJobID is the job ID of a process started outside gearrun:
// "local-<pid>". Its segments belong to that process alone.
func LocalJobID() string { return localJob + strconv.Itoa(os.Getpid()) }

// LocalPID reports whether job is the job ID of a process started alone
// ("local-..."), and the process ID it names: LocalJobID's, or 0 when what
// follows "local-" is not a positive number (such a job has no process).
func LocalPID(job string) (pid int, local bool) {
	s, ok := strings.CutPrefix(job, localJob)
	if !ok {
		return 0, false
	}
	if n, err := strconv.Atoi(s); err == nil && n > 0 {
		return n, true
	}
	return 0, true
}
