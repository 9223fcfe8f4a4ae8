package agent

import (
	"math"
	"testing"

	"github.com/gear-rl/gear/examples/dqn/replay"
)

type emitted struct {
	obs, next float32
	action    int32
	reward    float64
	discount  float64
}

// feed adds steps whose observation is the step index, whose reward is
// rewards[i], and that end as told on the last step.
func feed(t *testing.T, s *NStep, rewards []float64, terminated, truncated bool) []emitted {
	t.Helper()
	var out []emitted
	emit := func(tr replay.Transition) error {
		out = append(out, emitted{tr.Obs[0], tr.NextObs[0], tr.Action, float64(tr.Reward), float64(tr.Discount)})
		return nil
	}
	for i, r := range rewards {
		last := i == len(rewards)-1
		if err := s.Add([]float32{float32(i)}, i%2, r, []float32{float32(i + 1)}, last && terminated, last && truncated, emit); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func check(t *testing.T, got []emitted, want []emitted) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("emitted %d transitions %+v, want %d %+v", len(got), got, len(want), want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.obs != w.obs || g.next != w.next || g.action != w.action ||
			math.Abs(g.reward-w.reward) > 1e-6 || math.Abs(g.discount-w.discount) > 1e-6 {
			t.Errorf("transition %d = %+v, want %+v", i, g, w)
		}
	}
}

// With γ = 0.5 and rewards 1, 2, 4, 8, 16, a 3-step transition from step t has
// reward r_t + r_{t+1}/2 + r_{t+2}/4 and discount 1/8.
func TestNStepMidEpisodeAndTermination(t *testing.T) {
	s := NewNStep(3, 0.5, 1)
	got := feed(t, s, []float64{1, 2, 4, 8, 16}, true, false)
	check(t, got, []emitted{
		{0, 3, 0, 1 + 1 + 1, 0.125},
		{1, 4, 1, 2 + 2 + 2, 0.125},
		// Termination after step 4: the pending steps 2, 3 and 4 end the episode,
		// with discount 0 and the terminal observation (never bootstrapped).
		{2, 5, 0, 4 + 4 + 4, 0},
		{3, 5, 1, 8 + 8, 0},
		{4, 5, 0, 16, 0},
	})
	if s.Pending() != 0 {
		t.Fatalf("%d steps pending after the episode", s.Pending())
	}
}

// Truncation flushes with the discounts of the shortened horizons, so the
// learner bootstraps from the last observation.
func TestNStepTruncation(t *testing.T) {
	s := NewNStep(3, 0.5, 1)
	got := feed(t, s, []float64{1, 1, 1, 1}, false, true)
	check(t, got, []emitted{
		{0, 3, 0, 1.75, 0.125},
		{1, 4, 1, 1.75, 0.125},
		{2, 4, 0, 1.5, 0.25},
		{3, 4, 1, 1, 0.5},
	})
	// An episode shorter than n.
	got = feed(t, s, []float64{1, 1}, true, false)
	check(t, got, []emitted{{0, 2, 0, 1.5, 0}, {1, 2, 1, 1, 0}})
}

func TestOneStep(t *testing.T) {
	s := NewNStep(1, 0.9, 1)
	got := feed(t, s, []float64{1, 1, 1}, false, true)
	check(t, got, []emitted{{0, 1, 0, 1, 0.9}, {1, 2, 1, 1, 0.9}, {2, 3, 0, 1, 0.9}})
	got = feed(t, s, []float64{1, 1}, true, false)
	check(t, got, []emitted{{0, 1, 0, 1, 0.9}, {1, 2, 1, 1, 0}})
}
