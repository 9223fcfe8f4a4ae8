package rank

import "github.com/gear-rl/gear/internal/shmname"

// SegmentPrefix starts the name of every shared-memory segment gear creates in
// /dev/shm, so that `gearrun clean` and the launcher can find a job's segments.
const SegmentPrefix = shmname.Prefix

// SegmentName returns the name (without a leading slash) of a shared-memory
// segment of the job jobID: "gear.<jobID>.<what>". what must not contain '/'.
// A segment that a restarted rank must find again (a store shard) is named so
// that its what does not start with "coll." or "roles.": the launcher removes
// those between the generations of a job that restarts.
func SegmentName(jobID, what string) string { return shmname.Name(jobID, what) }

// SegmentJob returns the job ID encoded in a segment name made by SegmentName, and
// false for names gear did not make.
func SegmentJob(name string) (string, bool) { return shmname.Job(name) }

// LocalJobID is the job ID of a process started outside gearrun: "local-<pid>".
// Its segments belong to that process alone.
func LocalJobID() string { return shmname.LocalJobID() }
