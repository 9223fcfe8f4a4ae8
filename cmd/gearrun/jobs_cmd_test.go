package main

import (
	"testing"

	"github.com/gear-rl/gear/jobs"
)

// TestExitText: status's EXIT column says that a signal ended a job (SLURM
// records exit code 0 with scancel's SIGTERM, which read as a success), and
// "-" for a job without an exit yet.
func TestExitText(t *testing.T) {
	for _, c := range []struct {
		st   jobs.Status
		want string
	}{
		{jobs.Status{State: "CANCELLED", ExitCode: 0, Signal: 15}, "signal 15"},
		{jobs.Status{State: "COMPLETED", ExitCode: 0}, "0"},
		{jobs.Status{State: "FAILED", ExitCode: 3}, "3"},
		{jobs.Status{State: "RUNNING", ExitCode: -1}, "-"},
	} {
		if got := exitText(&c.st); got != c.want {
			t.Errorf("%s, exit %d, signal %d: %q, want %q", c.st.State, c.st.ExitCode, c.st.Signal, got, c.want)
		}
	}
}
