package gmi

import "testing"

// The cases of GMI-DRL's Algorithm 1, section 4.1.
func TestChooseStrategyAlgorithm1(t *testing.T) {
	cases := []struct {
		name string
		m    Mapping
		want Strategy
	}{
		{"no GMIs", Mapping{}, MultiProcess},
		{"one GMI", Mapping{{0}}, MultiProcess},
		{"all GMIs on one GPU", Mapping{{0, 1, 2}}, MultiProcess},
		{"paper's list, 3 GPUs x 3 GMIs", Mapping{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}, MultiRing},
		{"2 GPUs x 3 GMIs: 3 > 2", Mapping{{0, 1, 2}, {3, 4, 5}}, Hierarchical},
		{"2 GPUs x 2 GMIs", Mapping{{0, 1}, {2, 3}}, MultiRing},
		{"4 GPUs x 1 GMI", Mapping{{0}, {1}, {2}, {3}}, MultiRing},
		{"2 GPUs x 1 GMI", Mapping{{0}, {1}}, MultiRing},
		{"3 GPUs x 4 GMIs", Mapping{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}}, Hierarchical},
		{"4 GPUs x 4 GMIs", Mapping{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}, MultiRing},
		{"uneven 3 and 2", Mapping{{0, 1, 2}, {3, 4}}, Hierarchical},
		{"uneven 1 and 3", Mapping{{0}, {1, 2, 3}}, Hierarchical},
		{"uneven on many GPUs", Mapping{{0, 1}, {2, 3}, {4, 5}, {6}}, Hierarchical},
		{"8 GPUs x 7 GMIs", BlockMapping(56, 7), MultiRing},
		{"8 GPUs x 9 GMIs", BlockMapping(72, 9), Hierarchical},
	}
	for _, c := range cases {
		if got := ChooseStrategy(c.m); got != c.want {
			t.Errorf("%s: ChooseStrategy(%s) = %s, want %s", c.name, c.m, got, c.want)
		}
	}
}

func TestParseStrategy(t *testing.T) {
	for _, s := range []Strategy{MultiProcess, MultiRing, Hierarchical} {
		got, err := ParseStrategy(string(s))
		if err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %q, %v", s, got, err)
		}
	}
	if _, err := ParseStrategy("ring"); err == nil {
		t.Error("ParseStrategy(ring): no error")
	}
}
