package roles

import (
	"errors"
	"testing"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/shmname"
)

type jobBoot struct {
	collective.Bootstrap
	job string
}

func (b jobBoot) JobID() string { return b.job }

// A role channel's segment is named by shmname as a role segment of the
// bootstrap's job (or of this process), so that the launcher removes it
// between generations and `gearrun clean` finds it.
func TestSegmentName(t *testing.T) {
	for _, c := range []struct {
		boot collective.Bootstrap
		job  string
	}{
		{jobBoot{job: "j1"}, "j1"},
		{jobBoot{job: ""}, shmname.LocalJobID()},
		{nil, shmname.LocalJobID()},
	} {
		name := segmentName(c.boot, "infer.pi.r2.1234abcd")
		p, ok := shmname.Parse(name)
		if !ok || p != (shmname.Parts{Job: c.job, Kind: shmname.Roles, Rest: "infer.pi.r2.1234abcd"}) {
			t.Errorf("segmentName = %q, which parses as %+v, %v; want a role segment of job %s", name, p, ok, c.job)
		}
		if !p.Kind.PerGeneration() {
			t.Errorf("segment %q outlives a generation", name)
		}
	}
}

// Bad names and parameter counts are refused before anything is set up, with
// errors that match ErrInvalid (libgear makes them Python's InvalidArgument).
func TestBadArgumentsMatchErrInvalid(t *testing.T) {
	for _, name := range []string{"", "a/b", "x y", string(make([]byte, 65))} {
		if err := checkName("parameter service", name); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v, want ErrInvalid", name, err)
		}
	}
	if err := checkName("parameter service", "theta-1.v_2"); err != nil {
		t.Errorf("a good name: %v", err)
	}
	for _, n := range []int{0, -1, 1<<34 + 1} {
		if _, err := NewPublisher(t.Context(), nil, "theta", n); !errors.Is(err, ErrInvalid) {
			t.Errorf("publisher of %d floats: %v, want ErrInvalid", n, err)
		}
	}
}
