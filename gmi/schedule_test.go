package gmi

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// inputs gives GMI id the vector [id+1, 10*(id+1), 100*(id+1)] (integers, so
// sums are exact), and returns the sum every GMI must end with.
func inputs(m Mapping) ([][]float64, []float64) {
	n := 0
	for _, row := range m {
		for _, id := range row {
			n = max(n, id+1)
		}
	}
	in := make([][]float64, n)
	want := make([]float64, 3)
	for id := range in {
		in[id] = []float64{float64(id + 1), float64(10 * (id + 1)), float64(100 * (id + 1))}
	}
	for _, row := range m {
		for _, id := range row {
			for j, x := range in[id] {
				want[j] += x
			}
		}
	}
	return in, want
}

func checkSchedule(t *testing.T, m Mapping, s Strategy) {
	t.Helper()
	sc, err := ReductionSchedule(m, s)
	if err != nil {
		t.Fatalf("ReductionSchedule(%s, %s): %v", m, s, err)
	}
	in, want := inputs(m)
	out, err := Simulate(sc, in)
	if err != nil {
		t.Fatalf("%s on %s: %v", s, m, err)
	}
	for _, row := range m {
		for _, id := range row {
			if !slices.Equal(out[id], want) {
				t.Errorf("%s on %s: GMI %d ends with %v, want %v", s, m, id, out[id], want)
			}
		}
	}
}

func TestSchedulesGiveTheSumOnEveryGMI(t *testing.T) {
	layouts := []Mapping{
		{{0, 1, 2}, {3, 4, 5}}, // 2 virtual GPUs x 3 GMIs
		{{0, 1}, {2, 3}, {4, 5}},
		{{0, 1}, {2, 3}},
		{{0, 1, 2, 3}},
		{{0}, {1}, {2}, {3}},
		{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}},
		{{0, 2, 4}, {1, 3, 5}}, // not a block layout
		{{5, 0, 3}, {1, 4, 2}},
		{{0}},
		{{0}, {1}},
	}
	uneven := []Mapping{
		{{0, 1, 2}, {3, 4}},
		{{0}, {1, 2, 3}},
		{{0, 1}, {2, 3}, {4, 5, 6, 7}},
		{{0, 1, 2, 3, 4, 5, 6}, {7}},
		{{0, 1, 2}, {3, 4, 5}, {6}},
	}
	for _, m := range layouts {
		for _, s := range []Strategy{MultiProcess, MultiRing, Hierarchical} {
			checkSchedule(t, m, s)
		}
	}
	for _, m := range uneven {
		for _, s := range []Strategy{MultiProcess, Hierarchical} {
			checkSchedule(t, m, s)
		}
		if _, err := ReductionSchedule(m, MultiRing); err == nil || !strings.Contains(err.Error(), "same number") {
			t.Errorf("multi-ring on uneven %s: error %v, want one about the same number of GMIs", m, err)
		}
	}
}

// Random layouts (random sizes, shuffled IDs): hierarchical and multi-process
// always give the sum; multi-ring does on even layouts.
func TestSchedulesOnRandomLayouts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		gpus := 1 + r.IntN(6)
		even := r.IntN(2) == 0
		k := 1 + r.IntN(5)
		var sizes []int
		n := 0
		for g := 0; g < gpus; g++ {
			sz := k
			if !even {
				sz = 1 + r.IntN(5)
			}
			sizes = append(sizes, sz)
			n += sz
		}
		ids := r.Perm(n)
		m := Mapping{}
		for _, sz := range sizes {
			m = append(m, ids[:sz])
			ids = ids[sz:]
		}
		checkSchedule(t, m, MultiProcess)
		checkSchedule(t, m, Hierarchical)
		if even {
			checkSchedule(t, m, MultiRing)
		}
		checkSchedule(t, m, ChooseStrategy(m))
	}
}

func TestScheduleGroupsFor2GPUsx3GMIs(t *testing.T) {
	m := Mapping{{0, 1, 2}, {3, 4, 5}}
	type step struct {
		phase  string
		op     Op
		groups []Group
	}
	want := map[Strategy][]step{
		MultiProcess: {
			{"host", OpAllReduce, []Group{{Ranks: []int{0, 1, 2, 3, 4, 5}, Root: -1, Link: LinkHost}}},
		},
		// Ring t is the t-th GMI of each GPU; its end is on GPU t mod 2.
		MultiRing: {
			{"rings", OpReduce, []Group{
				{Ranks: []int{0, 3}, Root: 0, Link: LinkNCCL},
				{Ranks: []int{1, 4}, Root: 4, Link: LinkNCCL},
				{Ranks: []int{2, 5}, Root: 2, Link: LinkNCCL},
			}},
			// Three ends on two GPUs: two share GPU 0, so NCCL cannot carry
			// this ring (why Algorithm 1 picks hierarchical here).
			{"ring-ends", OpAllReduce, []Group{{Ranks: []int{0, 4, 2}, Root: -1, Link: LinkHost}}},
			{"ring-broadcast", OpBroadcast, []Group{
				{Ranks: []int{0, 3}, Root: 0, Link: LinkNCCL},
				{Ranks: []int{1, 4}, Root: 4, Link: LinkNCCL},
				{Ranks: []int{2, 5}, Root: 2, Link: LinkNCCL},
			}},
		},
		// Leaders satisfy GMI_id % 3 == 0.
		Hierarchical: {
			{"intra-gpu", OpReduce, []Group{
				{Ranks: []int{0, 1, 2}, Root: 0, Link: LinkHost},
				{Ranks: []int{3, 4, 5}, Root: 3, Link: LinkHost},
			}},
			{"inter-gpu", OpAllReduce, []Group{{Ranks: []int{0, 3}, Root: -1, Link: LinkNCCL}}},
			{"intra-gpu-broadcast", OpBroadcast, []Group{
				{Ranks: []int{0, 1, 2}, Root: 0, Link: LinkHost},
				{Ranks: []int{3, 4, 5}, Root: 3, Link: LinkHost},
			}},
		},
	}
	for s, steps := range want {
		sc, err := ReductionSchedule(m, s)
		if err != nil {
			t.Fatal(err)
		}
		var got []step
		for _, st := range sc.Steps {
			got = append(got, step{st.Phase, st.Op, st.Groups})
		}
		if !reflect.DeepEqual(got, steps) {
			t.Errorf("%s on %s:\n got %+v\nwant %+v", s, m, got, steps)
		}
	}
}

// With GMIs per GPU <= GPUs, the ring ends sit on distinct GPUs: the final
// ring can run on NCCL.
func TestMultiRingEndsOnDistinctGPUs(t *testing.T) {
	for _, m := range []Mapping{BlockMapping(9, 3), BlockMapping(8, 2), BlockMapping(16, 4), BlockMapping(12, 3), BlockMapping(20, 4)} {
		sc, err := ReductionSchedule(m, MultiRing)
		if err != nil {
			t.Fatal(err)
		}
		ends := sc.Steps[1]
		if ends.Phase != "ring-ends" || ends.Groups[0].Link != LinkNCCL {
			t.Errorf("%s: ring ends %+v, want an NCCL group", m, ends)
		}
	}
}

func TestScheduleDegenerateCases(t *testing.T) {
	cases := []struct {
		m      Mapping
		s      Strategy
		phases []string
		link   Link
	}{
		{Mapping{{0}}, MultiRing, nil, ""},
		{Mapping{{0}}, Hierarchical, nil, ""},
		{Mapping{{0, 1, 2}}, MultiRing, []string{"host"}, LinkHost},
		{Mapping{{0, 1, 2}}, Hierarchical, []string{"intra-gpu"}, LinkHost},
		{Mapping{{0}, {1}, {2}}, MultiRing, []string{"ring"}, LinkNCCL},
		{Mapping{{0}, {1}, {2}}, Hierarchical, []string{"inter-gpu"}, LinkNCCL},
		// Uneven: GPU 0's lone GMI has no intra-GPU group.
		{Mapping{{0}, {1, 2}}, Hierarchical, []string{"intra-gpu", "inter-gpu", "intra-gpu-broadcast"}, LinkHost},
	}
	for _, c := range cases {
		sc, err := ReductionSchedule(c.m, c.s)
		if err != nil {
			t.Fatal(err)
		}
		var phases []string
		for _, st := range sc.Steps {
			phases = append(phases, st.Phase)
		}
		if !slices.Equal(phases, c.phases) {
			t.Errorf("%s on %s: phases %v, want %v", c.s, c.m, phases, c.phases)
		}
		if len(sc.Steps) > 0 && sc.Steps[0].Groups[0].Link != c.link {
			t.Errorf("%s on %s: first link %s, want %s", c.s, c.m, sc.Steps[0].Groups[0].Link, c.link)
		}
		if len(sc.Steps) > 0 && len(sc.Steps[0].Groups) != 1 && c.m.String() == "[[0],[1,2]]" {
			t.Errorf("%s on %s: intra-gpu groups %v, want only GPU 1's", c.s, c.m, sc.Steps[0].Groups)
		}
	}
}

func TestReductionScheduleRejects(t *testing.T) {
	if _, err := ReductionSchedule(Mapping{{0, 1}, {1, 2}}, Hierarchical); err == nil || !strings.Contains(err.Error(), "GMI 1") {
		t.Errorf("duplicate GMI: %v", err)
	}
	if _, err := ReductionSchedule(Mapping{{0}, {}}, Hierarchical); err == nil {
		t.Error("empty row: no error")
	}
	if _, err := ReductionSchedule(Mapping{{0}}, "tree"); err == nil || !strings.HasPrefix(err.Error(), "gmi: ") {
		t.Errorf("unknown strategy: %v", err)
	}
}

// The simulator is the reference: it must catch schedules that are wrong.
func TestSimulateCatchesBrokenSchedules(t *testing.T) {
	m := Mapping{{0, 1}, {2, 3}}
	in, _ := inputs(m)
	broken := []struct {
		name  string
		steps []Step
		want  string
	}{
		{"reads a reduced-away buffer", []Step{
			{Phase: "a", Op: OpReduce, Groups: []Group{{Ranks: []int{0, 1}, Root: 0}, {Ranks: []int{2, 3}, Root: 2}}},
			{Phase: "b", Op: OpAllReduce, Groups: []Group{{Ranks: []int{1, 3}, Root: -1}}},
		}, "undefined"},
		{"never broadcasts", []Step{
			{Phase: "a", Op: OpReduce, Groups: []Group{{Ranks: []int{0, 1, 2, 3}, Root: 0}}},
		}, "ends undefined"},
		{"overlapping groups", []Step{
			{Phase: "a", Op: OpAllReduce, Groups: []Group{{Ranks: []int{0, 1}, Root: -1}, {Ranks: []int{1, 2}, Root: -1}}},
		}, "two groups"},
		{"root outside its group", []Step{
			{Phase: "a", Op: OpBroadcast, Groups: []Group{{Ranks: []int{0, 1}, Root: 3}}},
		}, "not in group"},
	}
	for _, b := range broken {
		_, err := Simulate(Schedule{Mapping: m, Steps: b.steps}, in)
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: error %v, want one containing %q", b.name, err, b.want)
		}
	}
	// A schedule that leaves partial sums is "correct" to run but wrong in
	// value: the sums differ from the reference.
	partial := Schedule{Mapping: m, Steps: []Step{
		{Phase: "a", Op: OpAllReduce, Groups: []Group{{Ranks: []int{0, 1}, Root: -1}, {Ranks: []int{2, 3}, Root: -1}}},
	}}
	out, err := Simulate(partial, in)
	if err != nil {
		t.Fatal(err)
	}
	if out[0][0] != 3 || out[2][0] != 7 {
		t.Errorf("partial sums %v %v, want 3 and 7", out[0], out[2])
	}
}

func TestForRank(t *testing.T) {
	sc, err := ReductionSchedule(Mapping{{0, 1, 2}, {3, 4, 5}}, Hierarchical)
	if err != nil {
		t.Fatal(err)
	}
	leader := sc.ForRank(3)
	if len(leader) != 3 || leader[1].Phase != "inter-gpu" || !slices.Equal(leader[1].Group.Ranks, []int{0, 3}) {
		t.Errorf("ForRank(3) = %+v", leader)
	}
	member := sc.ForRank(4)
	if len(member) != 2 || member[0].Step != 0 || member[1].Step != 2 || member[1].Group.Root != 3 {
		t.Errorf("ForRank(4) = %+v", member)
	}
	if got := sc.ForRank(9); got != nil {
		t.Errorf("ForRank(9) = %+v, want none", got)
	}
}
