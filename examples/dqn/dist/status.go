package dist

import (
	"fmt"
	"math"
)

// status is what a trainer tells its actors, through a small parameter
// service of its own ("dqn-status-<rank>") next to the network's ("theta"):
//
//   - Admitted: the commit sequence its table has admitted up to. An actor
//     writing straight into the shard waits while its own commits run more
//     than Config.Backlog ahead of it, so the table's rate limiter, which
//     holds admissions back, holds the actor back too.
//   - Frames: environment frames inserted into every trainer's table, the
//     clock of the exploration schedule.
//   - MaxPriority: the priority new transitions are inserted with.
//   - GradSteps and Theta: the trainers' gradient steps and the newest
//     parameter version published.
//   - Stop: the run is over; actors and policy workers end cleanly, unless
//   - Failed: the trainer ended with an error; its actors end with one too
//     (naming a lost peer when the world reports one).
//
// It travels as float32s; integers are split into 24-bit pieces, which
// float32 holds exactly.
type status struct {
	Admitted    uint64
	Frames      uint64
	GradSteps   uint64
	Theta       uint64
	MaxPriority float64
	Stop        bool
	Failed      bool
}

const (
	statusAdmitted  = 0  // 3 floats
	statusFrames    = 3  // 3 floats
	statusGradSteps = 6  // 3 floats
	statusTheta     = 9  // 3 floats
	statusMaxPrio   = 12 // 1 float
	statusStop      = 13 // 1 float
	statusFailed    = 14 // 1 float
	statusLen       = 16
)

func putUint(v []float32, x uint64) {
	v[0] = float32(x & (1<<24 - 1))
	v[1] = float32(x >> 24 & (1<<24 - 1))
	v[2] = float32(x >> 48)
}

func getUint(v []float32) uint64 {
	return uint64(v[0]) | uint64(v[1])<<24 | uint64(v[2])<<48
}

// encode writes s into v (statusLen floats).
func (s status) encode(v []float32) {
	clear(v)
	putUint(v[statusAdmitted:], s.Admitted)
	putUint(v[statusFrames:], s.Frames)
	putUint(v[statusGradSteps:], s.GradSteps)
	putUint(v[statusTheta:], s.Theta)
	v[statusMaxPrio] = float32(s.MaxPriority)
	if s.Stop {
		v[statusStop] = 1
	}
	if s.Failed {
		v[statusFailed] = 1
	}
}

// decodeStatus reads a status from v.
func decodeStatus(v []float32) (status, error) {
	if len(v) != statusLen {
		return status{}, fmt.Errorf("dist: trainer status of %d values, want %d", len(v), statusLen)
	}
	s := status{
		Admitted:    getUint(v[statusAdmitted:]),
		Frames:      getUint(v[statusFrames:]),
		GradSteps:   getUint(v[statusGradSteps:]),
		Theta:       getUint(v[statusTheta:]),
		MaxPriority: float64(v[statusMaxPrio]),
		Stop:        v[statusStop] != 0,
		Failed:      v[statusFailed] != 0,
	}
	if !(s.MaxPriority > 0) || math.IsInf(s.MaxPriority, 0) {
		return status{}, fmt.Errorf("dist: trainer status with max priority %v", s.MaxPriority)
	}
	return s, nil
}

// statusName is the parameter service of trainer rank r's status.
func statusName(r int) string { return fmt.Sprintf("dqn-status-%d", r) }
