package gmi

import (
	"fmt"
	"slices"
)

// Op is what the ranks of one group do together in a schedule step.
type Op string

const (
	// OpReduce: the group's root ends with the sum of the members' values;
	// the other members' buffers are undefined afterwards.
	OpReduce Op = "reduce"
	// OpAllReduce: every member ends with the sum of the members' values.
	OpAllReduce Op = "allreduce"
	// OpBroadcast: every member ends with the root's value.
	OpBroadcast Op = "broadcast"
)

// Link says which path a group's collective should take.
type Link string

const (
	// LinkHost: through host memory (shared memory among the GMIs of a host,
	// TCP between hosts). Used whenever two members share a GPU, since NCCL
	// refuses two ranks on one GPU.
	LinkHost Link = "host"
	// LinkNCCL: every member is on a different GPU, so NCCL may carry the
	// group where it is present; without NCCL, or on virtual GPUs, the host
	// path carries it instead.
	LinkNCCL Link = "nccl"
)

// Group is a set of GMIs that run one collective together.
type Group struct {
	// Ranks are the members' GMI IDs, in ring order (for a multi-ring ring,
	// GPU order).
	Ranks []int `json:"ranks"`
	// Root is the member that receives a reduce or sends a broadcast; -1 for
	// an allreduce.
	Root int `json:"root"`
	// Link is the path the collective should take.
	Link Link `json:"link"`
}

// Step is one phase of a schedule: its groups are disjoint and run at the
// same time; a step starts when the previous one has finished on its members.
type Step struct {
	// Phase names the step ("rings", "ring-ends", "intra-gpu", ...).
	Phase  string  `json:"phase"`
	Op     Op      `json:"op"`
	Groups []Group `json:"groups"`
}

// Schedule is a reduction strategy applied to a mapping: the steps that, run
// in order, leave every GMI with the sum of all GMIs' values. Groups of one
// member are left out, and so are steps left with no groups; a mapping of one
// GMI has no steps.
type Schedule struct {
	Strategy Strategy `json:"strategy"`
	Mapping  Mapping  `json:"mapping"`
	Steps    []Step   `json:"steps"`
}

// ReductionSchedule computes the groups of strategy s on mapping m:
//
//   - MultiProcess: one allreduce of all GMIs over the host.
//   - MultiRing: ring t holds the t-th GMI of every GPU; each ring reduces
//     to its end, the t-th GMI of GPU t mod G (so the ends sit on distinct
//     GPUs whenever GMIs per GPU <= GPUs); the ends allreduce; each end
//     broadcasts along its ring. Every GPU must hold the same number of GMIs.
//     With one GMI per GPU it is a single ring allreduce.
//   - Hierarchical: the GMIs of each GPU reduce to their leader; the leaders
//     allreduce; each leader broadcasts to its GPU's GMIs. The leader is the
//     GPU's first GMI: with block layouts ([[0,1,2],[3,4,5]]) that is the
//     paper's rule GMI_id % M == t with t = 0. Any layout works, uneven ones
//     included.
//
// The function is pure: every rank computes the same schedule from the same
// mapping, and a collective implementation only executes it.
func ReductionSchedule(m Mapping, s Strategy) (Schedule, error) {
	if err := m.Validate(); err != nil {
		return Schedule{}, err
	}
	sc := Schedule{Strategy: s, Mapping: m, Steps: []Step{}}
	all := []int{}
	for _, row := range m {
		all = append(all, row...)
	}
	switch s {
	case MultiProcess:
		sc.add("host", OpAllReduce, Group{Ranks: all, Root: -1, Link: LinkHost})
	case MultiRing:
		k := len(m[0])
		for g, row := range m {
			if len(row) != k {
				return Schedule{}, fmt.Errorf("gmi: multi-ring on %s: GPU %d holds %d GMIs and GPU 0 holds %d; multi-ring needs the same number on every GPU (use hierarchical)", m, g, len(row), k)
			}
		}
		if len(m) == 1 {
			sc.add("host", OpAllReduce, Group{Ranks: all, Root: -1, Link: LinkHost})
			break
		}
		if k == 1 {
			sc.add("ring", OpAllReduce, Group{Ranks: all, Root: -1, Link: LinkNCCL})
			break
		}
		var rings, bcast []Group
		ends := Group{Root: -1}
		for t := 0; t < k; t++ {
			ring := make([]int, len(m))
			for g := range m {
				ring[g] = m[g][t]
			}
			end := m[t%len(m)][t]
			rings = append(rings, Group{Ranks: ring, Root: end, Link: LinkNCCL})
			bcast = append(bcast, Group{Ranks: ring, Root: end, Link: LinkNCCL})
			ends.Ranks = append(ends.Ranks, end)
		}
		ends.Link = linkOf(m, ends.Ranks)
		sc.add("rings", OpReduce, rings...)
		sc.add("ring-ends", OpAllReduce, ends)
		sc.add("ring-broadcast", OpBroadcast, bcast...)
	case Hierarchical:
		if len(m) == 1 {
			sc.add("intra-gpu", OpAllReduce, Group{Ranks: all, Root: -1, Link: LinkHost})
			break
		}
		var intra, bcast []Group
		leaders := Group{Root: -1, Link: LinkNCCL}
		for _, row := range m {
			intra = append(intra, Group{Ranks: slices.Clone(row), Root: row[0], Link: LinkHost})
			bcast = append(bcast, Group{Ranks: slices.Clone(row), Root: row[0], Link: LinkHost})
			leaders.Ranks = append(leaders.Ranks, row[0])
		}
		sc.add("intra-gpu", OpReduce, intra...)
		sc.add("inter-gpu", OpAllReduce, leaders)
		sc.add("intra-gpu-broadcast", OpBroadcast, bcast...)
	default:
		return Schedule{}, fmt.Errorf("gmi: strategy %q: want %s, %s or %s", s, MultiProcess, MultiRing, Hierarchical)
	}
	return sc, nil
}

// add appends a step, leaving out groups of fewer than two members.
func (s *Schedule) add(phase string, op Op, groups ...Group) {
	var keep []Group
	for _, g := range groups {
		if len(g.Ranks) >= 2 {
			keep = append(keep, g)
		}
	}
	if len(keep) > 0 {
		s.Steps = append(s.Steps, Step{Phase: phase, Op: op, Groups: keep})
	}
}

// linkOf is LinkNCCL when the GMIs sit on distinct GPUs, else LinkHost.
func linkOf(m Mapping, ids []int) Link {
	seen := map[int]bool{}
	for _, id := range ids {
		g, _, _ := m.Locate(id)
		if seen[g] {
			return LinkHost
		}
		seen[g] = true
	}
	return LinkNCCL
}

// RankStep is one step of a schedule as one GMI sees it.
type RankStep struct {
	// Step is the index into Schedule.Steps.
	Step  int    `json:"step"`
	Phase string `json:"phase"`
	Op    Op     `json:"op"`
	// Group is the GMI's group in that step.
	Group Group `json:"group"`
}

// ForRank returns the steps GMI id takes part in, in order. A collective
// runs these, one sub-communicator per group.
func (s Schedule) ForRank(id int) []RankStep {
	var out []RankStep
	for i, st := range s.Steps {
		for _, g := range st.Groups {
			if slices.Contains(g.Ranks, id) {
				out = append(out, RankStep{Step: i, Phase: st.Phase, Op: st.Op, Group: g})
				break
			}
		}
	}
	return out
}

// Simulate executes the schedule serially on per-GMI vectors (values[id] is
// GMI id's input; all of equal length) and returns the vectors each GMI holds
// at the end. It is the reference a collective implementation is checked
// against, and it checks the schedule: groups of a step must be disjoint,
// roots must belong to their group, and no step may read a buffer that an
// earlier reduce left undefined. For a correct schedule every GMI of the
// mapping ends with the sum of all inputs.
func Simulate(s Schedule, values [][]float64) ([][]float64, error) {
	n := -1
	cur := make([][]float64, len(values))
	for i, v := range values {
		if n >= 0 && len(v) != n {
			return nil, fmt.Errorf("gmi: simulate: GMI %d has %d values, GMI 0 has %d", i, len(v), n)
		}
		n = len(v)
		cur[i] = slices.Clone(v)
	}
	defined := make([]bool, len(values))
	for _, row := range s.Mapping {
		for _, id := range row {
			if id >= len(values) {
				return nil, fmt.Errorf("gmi: simulate: GMI %d has no input (%d given)", id, len(values))
			}
			defined[id] = true
		}
	}
	undefinedBy := map[int]int{}
	for si, st := range s.Steps {
		used := map[int]bool{}
		for _, g := range st.Groups {
			for _, id := range g.Ranks {
				if id < 0 || id >= len(values) {
					return nil, fmt.Errorf("gmi: simulate: step %d (%s): GMI %d has no input", si, st.Phase, id)
				}
				if used[id] {
					return nil, fmt.Errorf("gmi: simulate: step %d (%s): GMI %d is in two groups", si, st.Phase, id)
				}
				used[id] = true
			}
			if st.Op != OpAllReduce && !slices.Contains(g.Ranks, g.Root) {
				return nil, fmt.Errorf("gmi: simulate: step %d (%s): root %d is not in group %v", si, st.Phase, g.Root, g.Ranks)
			}
			need := g.Ranks
			if st.Op == OpBroadcast {
				need = []int{g.Root}
			}
			for _, id := range need {
				if !defined[id] {
					return nil, fmt.Errorf("gmi: simulate: step %d (%s) reads GMI %d, undefined since step %d's reduce", si, st.Phase, id, undefinedBy[id])
				}
			}
			switch st.Op {
			case OpReduce, OpAllReduce:
				sum := make([]float64, n)
				for _, id := range g.Ranks {
					for j, x := range cur[id] {
						sum[j] += x
					}
				}
				for _, id := range g.Ranks {
					if st.Op == OpAllReduce || id == g.Root {
						cur[id] = slices.Clone(sum)
					} else {
						defined[id] = false
						undefinedBy[id] = si
					}
				}
			case OpBroadcast:
				for _, id := range g.Ranks {
					cur[id] = slices.Clone(cur[g.Root])
					defined[id] = true
				}
			default:
				return nil, fmt.Errorf("gmi: simulate: step %d (%s): unknown op %q", si, st.Phase, st.Op)
			}
		}
	}
	for _, row := range s.Mapping {
		for _, id := range row {
			if !defined[id] {
				return nil, fmt.Errorf("gmi: simulate: GMI %d ends undefined (step %d's reduce)", id, undefinedBy[id])
			}
		}
	}
	return cur, nil
}
