package gmi_test

import (
	"testing"

	"github.com/gear-rl/gear/gmi"
	"github.com/gear-rl/gear/rank"
)

// gmi keeps its own copy of the names it shares with the launcher-to-rank
// contract (so that collective can import gmi); they must stay equal.
func TestEnvNamesMatchTheRankContract(t *testing.T) {
	pairs := [][2]string{
		{gmi.EnvTopology, rank.EnvTopology},
		{gmi.EnvGMILayout, rank.EnvGMILayout},
		{gmi.EnvGMIPerGPU, rank.EnvGMIPerGPU},
		{gmi.EnvNumEnv, rank.EnvNumEnv},
		{gmi.EnvCUDAVisibleDevices, rank.EnvCUDAVisibleDevices},
		{gmi.EnvCUDADeviceOrder, rank.EnvCUDADeviceOrder},
		{gmi.EnvMPSThreadPercent, rank.EnvMPSThreadPercent},
		{gmi.EnvMPSPinnedMemLimit, rank.EnvMPSPinnedMemLimit},
		{gmi.EnvMPSPipeDirectory, rank.EnvMPSPipeDirectory},
	}
	for _, p := range pairs {
		if p[0] != p[1] {
			t.Errorf("gmi has %q, rank has %q", p[0], p[1])
		}
	}
}
