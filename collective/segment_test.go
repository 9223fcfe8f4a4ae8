package collective

import (
	"testing"

	"github.com/gear-rl/gear/internal/shmname"
)

type jobBoot struct {
	Bootstrap
	job string
}

func (b jobBoot) JobID() string { return b.job }

// A communicator's host segment is named by shmname as a collective segment
// of the bootstrap's job (or of this process), so that the launcher removes it
// between generations and `gearrun clean` finds it.
func TestSegmentName(t *testing.T) {
	for _, c := range []struct {
		boot Bootstrap
		job  string
	}{
		{jobBoot{job: "j1"}, "j1"},
		{jobBoot{job: ""}, shmname.LocalJobID()},
		{nil, shmname.LocalJobID()},
	} {
		name := segmentName(c.boot, "world.r0.0a0b")
		p, ok := shmname.Parse(name)
		if !ok || p != (shmname.Parts{Job: c.job, Kind: shmname.Coll, Rest: "world.r0.0a0b"}) {
			t.Errorf("segmentName = %q, which parses as %+v, %v; want a collective segment of job %s", name, p, ok, c.job)
		}
		if !p.Kind.PerGeneration() {
			t.Errorf("segment %q outlives a generation", name)
		}
	}
}
