package gmi

import "fmt"

// Strategy is one of GMI-DRL's three layout-aware gradient reductions
// (section 4.1 of the paper).
type Strategy string

const (
	// MultiProcess reduces among all GMIs through host memory: every rank
	// copies its gradient to the host and the processes reduce there.
	MultiProcess Strategy = "multi-process"
	// MultiRing runs one ring per GMI index t across the GPUs (the t-th GMI
	// of every GPU), then one ring among the rings' ends, then broadcasts the
	// result back along each ring.
	MultiRing Strategy = "multi-ring"
	// Hierarchical reduces among the GMIs of each GPU to a leader, among the
	// leaders across GPUs, then broadcasts within each GPU.
	Hierarchical Strategy = "hierarchical"
)

// ParseStrategy reads a strategy name.
func ParseStrategy(s string) (Strategy, error) {
	switch st := Strategy(s); st {
	case MultiProcess, MultiRing, Hierarchical:
		return st, nil
	}
	return "", fmt.Errorf("gmi: strategy %q: want %s, %s or %s", s, MultiProcess, MultiRing, Hierarchical)
}

// ChooseStrategy is GMI-DRL's Algorithm 1 (Communication Strategy Selection):
//
//   - all GMIs on one GPU (at most one row): multi-process reduction;
//   - GPUs holding different numbers of GMIs: hierarchical;
//   - more GMIs per GPU than GPUs: hierarchical (a final NCCL ring among the
//     ring ends would put two of them on one GPU);
//   - otherwise: multi-ring.
func ChooseStrategy(m Mapping) Strategy {
	s, _ := chooseStrategy(m)
	return s
}

// chooseStrategy is Algorithm 1 with the line that decided, for the plan's
// explanation.
func chooseStrategy(m Mapping) (Strategy, string) {
	if len(m) <= 1 {
		return MultiProcess, "all GMIs share one GPU"
	}
	per := map[int]bool{}
	for _, row := range m {
		per[len(row)] = true
	}
	if len(per) > 1 {
		return Hierarchical, "GPUs hold different numbers of GMIs"
	}
	k := len(m[0])
	if k > len(m) {
		return Hierarchical, fmt.Sprintf("%d GMIs per GPU > %d GPUs", k, len(m))
	}
	return MultiRing, fmt.Sprintf("%d GMIs per GPU <= %d GPUs", k, len(m))
}
