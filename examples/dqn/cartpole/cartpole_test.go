package cartpole

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(b)) }

func checkState(t *testing.T, got, want State) {
	t.Helper()
	if !near(got.X, want.X) || !near(got.XDot, want.XDot) || !near(got.Theta, want.Theta) || !near(got.ThetaDot, want.ThetaDot) {
		t.Fatalf("state = %+v, want %+v", got, want)
	}
}

// From rest with the pole upright (sin = 0, cos = 1) the equations reduce to
// fractions: temp = ±100/11, thetaAcc = ∓600/41, xAcc = ±4400/451.
func TestStepFromRestByHand(t *testing.T) {
	e := New()
	e.SetState(State{})
	obs := make([]float32, ObsSize)
	r, term, trunc, err := e.Step(1, obs)
	if err != nil || r != 1 || term || trunc {
		t.Fatalf("Step = %v %v %v %v", r, term, trunc, err)
	}
	checkState(t, e.State(), State{X: 0, XDot: 0.02 * 4400 / 451, Theta: 0, ThetaDot: -0.02 * 600 / 41})
	if obs[1] != float32(88.0/451) || obs[3] != float32(-12.0/41) {
		t.Fatalf("obs = %v", obs)
	}
	// Pushing back cancels the velocities exactly; positions move by one Euler step.
	if _, _, _, err := e.Step(0, obs); err != nil {
		t.Fatal(err)
	}
	checkState(t, e.State(), State{X: 0.02 * 88 / 451, XDot: 0, Theta: -0.02 * 12 / 41, ThetaDot: 0})
}

// Values from an independent transcription of Gym's step in Python (float64).
func TestStepTilted(t *testing.T) {
	s := State{X: 0.01, XDot: -0.02, Theta: 0.03, ThetaDot: 0.04}
	s = Next(s, 0)
	checkState(t, s, State{0.009600000000000001, -0.21553901710278936, 0.030799999999999998, 0.34199522377603914})
	s = Next(s, 1)
	checkState(t, s, State{0.005289219657944213, -0.020868498014729647, 0.03763990447552078, 0.059181706756417596})
}

func TestTermination(t *testing.T) {
	obs := make([]float32, ObsSize)
	cases := []struct {
		name string
		s    State
		want bool
	}{
		{"upright", State{}, false},
		{"theta past +12deg", State{Theta: ThetaThreshold + 1e-3}, true},
		{"theta past -12deg", State{Theta: -ThetaThreshold - 1e-3}, true},
		{"x past +2.4", State{X: XThreshold + 1e-3}, true},
		{"x past -2.4", State{X: -XThreshold - 1e-3}, true},
		{"near edge, inside", State{X: 2.3}, false},
	}
	for _, c := range cases {
		e := New()
		// Step from a state whose successor keeps the position and angle (zero
		// velocities): push so the angle changes only in its velocity.
		e.SetState(c.s)
		_, term, trunc, err := e.Step(1, obs)
		if err != nil || trunc {
			t.Fatalf("%s: err=%v trunc=%v", c.name, err, trunc)
		}
		if term != c.want {
			t.Errorf("%s: terminated = %v, want %v", c.name, term, c.want)
		}
		if term {
			if _, _, _, err := e.Step(0, obs); !errors.Is(err, ErrNeedsReset) {
				t.Errorf("%s: step after termination: err = %v, want ErrNeedsReset", c.name, err)
			}
		}
	}
}

// balance is a linear controller that keeps the pole up for the whole episode.
func balance(s State) int {
	if s.Theta+0.5*s.ThetaDot+0.01*s.X+0.1*s.XDot > 0 {
		return 1
	}
	return 0
}

func TestTruncationAt500(t *testing.T) {
	e := New()
	rng := rand.New(rand.NewPCG(1, 2))
	obs := make([]float32, ObsSize)
	for ep := 0; ep < 3; ep++ {
		e.Reset(rng, obs)
		for i := 1; ; i++ {
			_, term, trunc, err := e.Step(balance(e.State()), obs)
			if err != nil {
				t.Fatal(err)
			}
			if term {
				t.Fatalf("episode %d: pole fell at step %d with state %+v", ep, i, e.State())
			}
			if trunc {
				if i != MaxSteps {
					t.Fatalf("truncated at step %d, want %d", i, MaxSteps)
				}
				break
			}
		}
		if _, _, _, err := e.Step(0, obs); !errors.Is(err, ErrNeedsReset) {
			t.Fatalf("step after truncation: err = %v, want ErrNeedsReset", err)
		}
	}
}

func TestResetAndErrors(t *testing.T) {
	e := NewWithLimit(3)
	obs := make([]float32, ObsSize)
	if _, _, _, err := e.Step(0, obs); !errors.Is(err, ErrNeedsReset) {
		t.Fatalf("step before reset: err = %v", err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 1000; i++ {
		e.Reset(rng, obs)
		for j, v := range obs {
			if v < -InitBound || v > InitBound {
				t.Fatalf("initial obs[%d] = %v outside [-0.05, 0.05]", j, v)
			}
		}
	}
	if _, _, _, err := e.Step(2, obs); err == nil {
		t.Fatal("action 2 accepted")
	}
	var trunc bool
	for i := 0; i < 3; i++ {
		_, _, trunc, _ = e.Step(i%2, obs)
	}
	if !trunc || e.Steps() != 3 {
		t.Fatalf("truncated = %v after %d steps, want true after 3", trunc, e.Steps())
	}
}

func TestStepAllocatesNothing(t *testing.T) {
	e := NewWithLimit(0)
	obs := make([]float32, ObsSize)
	e.SetState(State{})
	a := testing.AllocsPerRun(100, func() {
		e.SetState(e.State())
		_, _, _, _ = e.Step(balance(e.State()), obs)
	})
	if a != 0 {
		t.Fatalf("Step allocates %v times", a)
	}
}
