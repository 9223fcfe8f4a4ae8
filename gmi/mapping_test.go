package gmi

import (
	"reflect"
	"strings"
	"testing"
)

func TestBlockMapping(t *testing.T) {
	cases := []struct {
		n, k int
		want string
	}{
		{6, 3, "[[0,1,2],[3,4,5]]"},
		{7, 3, "[[0,1,2],[3,4,5],[6]]"},
		{4, 1, "[[0],[1],[2],[3]]"},
		{2, 4, "[[0,1]]"},
		{0, 2, "[]"},
	}
	for _, c := range cases {
		if got := BlockMapping(c.n, c.k).String(); got != c.want {
			t.Errorf("BlockMapping(%d, %d) = %s, want %s", c.n, c.k, got, c.want)
		}
	}
}

func TestParseMapping(t *testing.T) {
	m, err := ParseMapping(" [[0, 1, 2], [3,4,5]] ")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, Mapping{{0, 1, 2}, {3, 4, 5}}) {
		t.Errorf("got %v", m)
	}
	if g, s, ok := m.Locate(4); !ok || g != 1 || s != 1 {
		t.Errorf("Locate(4) = %d, %d, %v", g, s, ok)
	}
	if m.GMIs() != 6 {
		t.Errorf("GMIs() = %d", m.GMIs())
	}
	bad := map[string]string{
		"":            "want a list",
		"[[0,1],[1]]": "GMI 1",
		"[[0],[]]":    "no GMIs",
		"[[-1]]":      "negative",
		"[0,1]":       "want a list",
		"null":        "want a list",
		"[[0.5]]":     "want a list",
	}
	for in, want := range bad {
		_, err := ParseMapping(in)
		if err == nil || !strings.HasPrefix(err.Error(), "gmi: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseMapping(%q): error %v, want one containing %q", in, err, want)
		}
	}
}

func FuzzParseMapping(f *testing.F) {
	for _, s := range []string{"[[0,1,2],[3,4,5]]", "[]", "[[0]]", "[[1,0],[2]]", "[[0],[0]]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMapping(s)
		if err != nil {
			return
		}
		again, err := ParseMapping(m.String())
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip of %q: %v, %v", s, again, err)
		}
		// Every valid mapping has a working hierarchical schedule.
		sc, err := ReductionSchedule(m, Hierarchical)
		if err != nil {
			t.Fatal(err)
		}
		if m.GMIs() > 0 && m.GMIs() < 200 {
			maxID := 0
			for _, row := range m {
				for _, id := range row {
					maxID = max(maxID, id)
				}
			}
			if maxID < 1000 {
				in, want := inputs(m)
				out, err := Simulate(sc, in)
				if err != nil {
					t.Fatal(err)
				}
				for _, row := range m {
					for _, id := range row {
						if !reflect.DeepEqual(out[id], want) {
							t.Fatalf("%s: GMI %d has %v, want %v", m, id, out[id], want)
						}
					}
				}
			}
		}
	})
}
