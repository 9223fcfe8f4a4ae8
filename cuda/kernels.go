package cuda

import (
	"fmt"

	"github.com/gear-rl/gear/cuda/internal/kernels"
)

// PTX returns gear's embedded PTX module (compiled from cuda/internal/kernels for
// compute_80), for tools that load it themselves.
func PTX() string { return kernels.PTX }

// gearKernels is gear's PTX module loaded into one device, with its functions.
type gearKernels struct {
	mod                           *Module
	gatherV16, gatherV4, gatherV1 Function
	gatherRows, gatherRows256     [3]Function // indices in the parameters: v16, v4, v1
	wsTiles, wsDraws              [2]Function // [0] float32, [1] float64
	wsScan                        Function
	topkInit, topkSelect          Function
	topkHist, topkCollect         [2]Function
	mm, colsum, td, tdSum         Function
	sumsq, clipScale, adam, soft  Function
	prioScatter, isWeights        Function
}

// gear returns the device's kernels, loading the embedded PTX on first use.
func (dev *Device) gear() (*gearKernels, error) {
	dev.kernelsOnce.Do(func() {
		if dev.closed.Load() {
			return
		}
		dev.kernels, dev.kernelsErr = loadGearKernels(dev)
	})
	if dev.kernels == nil && dev.kernelsErr == nil {
		return nil, fmt.Errorf("%w: device %d", ErrClosed, dev.ordinal)
	}
	return dev.kernels, dev.kernelsErr
}

func loadGearKernels(dev *Device) (*gearKernels, error) {
	mod, err := dev.LoadModule(kernels.PTX)
	if err != nil {
		return nil, fmt.Errorf("%w (gear's embedded PTX)", err)
	}
	k := &gearKernels{mod: mod}
	for _, f := range []struct {
		fn   *Function
		name string
	}{
		{&k.gatherV16, "gear_gather_v16"}, {&k.gatherV4, "gear_gather_v4"}, {&k.gatherV1, "gear_gather_v1"},
		{&k.gatherRows[0], "gear_gather_rows_v16"}, {&k.gatherRows[1], "gear_gather_rows_v4"},
		{&k.gatherRows[2], "gear_gather_rows_v1"},
		{&k.gatherRows256[0], "gear_gather_rows256_v16"}, {&k.gatherRows256[1], "gear_gather_rows256_v4"},
		{&k.gatherRows256[2], "gear_gather_rows256_v1"},
		{&k.wsTiles[0], "gear_ws_tiles_f32"}, {&k.wsTiles[1], "gear_ws_tiles_f64"},
		{&k.wsScan, "gear_ws_scan"},
		{&k.wsDraws[0], "gear_ws_draws_f32"}, {&k.wsDraws[1], "gear_ws_draws_f64"},
		{&k.topkInit, "gear_topk_init"}, {&k.topkSelect, "gear_topk_select"},
		{&k.topkHist[0], "gear_topk_hist_f32"}, {&k.topkHist[1], "gear_topk_hist_f64"},
		{&k.topkCollect[0], "gear_topk_collect_f32"}, {&k.topkCollect[1], "gear_topk_collect_f64"},
		{&k.mm, "gear_mm_f32"}, {&k.colsum, "gear_colsum_f32"}, {&k.td, "gear_dqn_td"}, {&k.tdSum, "gear_dqn_td_sum"},
		{&k.sumsq, "gear_sumsq_f32"}, {&k.clipScale, "gear_clip_scale"}, {&k.adam, "gear_adam_f32"},
		{&k.soft, "gear_soft_update_f32"}, {&k.prioScatter, "gear_prio_scatter"}, {&k.isWeights, "gear_is_weights"},
	} {
		if *f.fn, err = mod.Function(f.name); err != nil {
			_ = mod.Unload()
			return nil, err
		}
	}
	return k, nil
}
