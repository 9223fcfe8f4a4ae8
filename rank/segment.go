package rank

import (
	"fmt"
	"os"
	"strings"
)

// SegmentPrefix starts the name of every shared-memory segment gear creates in
// /dev/shm, so that `gearrun clean` and the launcher can find a job's segments.
const SegmentPrefix = "gear."

// SegmentName returns the name (without a leading slash) of a shared-memory
// segment of the job jobID: "gear.<jobID>.<what>". what must not contain '/'.
func SegmentName(jobID, what string) string {
	return SegmentPrefix + jobID + "." + what
}

// SegmentJob returns the job ID encoded in a segment name made by SegmentName, and
// false for names gear did not make.
func SegmentJob(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, SegmentPrefix)
	if !ok {
		return "", false
	}
	job, _, ok := strings.Cut(rest, ".")
	return job, ok && job != ""
}

// LocalJobID is the job ID of a process started outside gearrun: "local-<pid>".
// Its segments belong to that process alone.
func LocalJobID() string { return fmt.Sprintf("local-%d", os.Getpid()) }
