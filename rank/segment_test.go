package rank

import (
	"testing"

	"github.com/gear-rl/gear/internal/shmname"
)

// rank's segment names are shmname's: what a program names with SegmentName
// is what collective, roles and the launcher's clean-up read back.
func TestSegmentNamesAreShmnames(t *testing.T) {
	if SegmentPrefix != shmname.Prefix || LocalJobID() != shmname.LocalJobID() {
		t.Fatalf("SegmentPrefix %q, LocalJobID %q; shmname says %q, %q", SegmentPrefix, LocalJobID(), shmname.Prefix, shmname.LocalJobID())
	}
	for _, k := range shmname.Kinds() {
		want := shmname.Make("job-1", k, "world.r0.0a0b")
		what := want[len(shmname.Name("job-1", "")):]
		if got := SegmentName("job-1", what); got != want {
			t.Errorf("SegmentName(job-1, %q) = %q, want %q", what, got, want)
		}
		if job, ok := SegmentJob(want); !ok || job != "job-1" {
			t.Errorf("SegmentJob(%q) = %q, %v", want, job, ok)
		}
	}
	for _, name := range []string{"gear.job-1", "gear..x", "other.job-1.x"} {
		if job, ok := SegmentJob(name); ok {
			t.Errorf("SegmentJob(%q) = %q, true; want it refused", name, job)
		}
	}
	// A job whose ID reads as a process's own is alive while that process
	// lives, with no lock file.
	if !JobAlive(t.TempDir(), shmname.LocalJobID()) || JobAlive(t.TempDir(), "local-x") {
		t.Error("JobAlive disagrees with shmname.LocalPID")
	}
}
